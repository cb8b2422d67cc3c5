"""The bundle's rendered files, pure functions of the resolved spec and the bundle's paths: the nanotron config
(`config_yaml`, through the flag table of `launcher.nanotron_config.schema`), the job's settings (`job_settings`:
job.json, what the supervisor and the node step read) and the batch script (`sbatch_script`, from
templates/sbatch.sh.j2: its #SBATCH lines, the --extra_env exports, the pre-launch commands and one exec of the
supervisor with job.json).

Every value that reaches the shell goes through `shlex.quote` (the `q` filter); values on #SBATCH lines are
validated to a safe alphabet first (run name, partition, ...) or cannot hold what Slurm's parser chokes on (the
log path, see slurm_values.SBATCH_UNSAFE). Values in comments have line breaks escaped.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from launcher import protocol
from launcher.bundle import template_cache
from launcher.bundle.files import BundlePaths
from launcher.config import container
from launcher.config.slurm_values import PLACEMENT, SBATCH_UNSAFE
from launcher.config.spec import RunSpec
from launcher.evals import plan as eval_plan
from launcher.nanotron_config import mixture, schema
from launcher.nanotron_config.datasource import is_local_path
from launcher.node.job import Job
from launcher.perf.sizes import global_batch_tokens, retention_rules
from launcher.remote import plan as remote_plan

TEMPLATES = Path(__file__).resolve().parent / "templates"
HEARTBEAT_S = 60


def _comment(value: object) -> str:
    return str(value).replace("\r", "\\r").replace("\n", "\\n")


OPTIONS: dict[str, Any] = {  # the Environment's, besides its loader and cache
    "undefined": StrictUndefined,
    "trim_blocks": True,
    "lstrip_blocks": True,
    "keep_trailing_newline": True,
    "autoescape": False,
}


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), bytecode_cache=template_cache.cache_for(OPTIONS), **OPTIONS)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["comment"] = _comment
    return env


def config_yaml(spec: RunSpec, paths: BundlePaths) -> str:
    """The config.yaml's text: the base YAML with every flag's value at its path."""
    return schema.dump(schema.written(spec.config, spec.dialect.dialect, str(paths.checkpoints)))


PROJECT = Path(__file__).resolve().parents[2]  # the directory holding the launcher package: the job's PYTHONPATH


def _modules(spec: RunSpec) -> tuple[str, ...]:
    """What the job's Python must have for the torch engine (the node check looks for them)."""
    needed = ["torch", "numpy", "yaml", "transformers"]
    if spec.args.data.dataset is not None:
        needed += ["datasets"]
    if not spec.args.logging.wandb_disabled:
        needed += ["wandb"]
    return tuple(needed)


def _local_inputs(spec: RunSpec) -> tuple[str, ...]:
    """The local paths training reads besides its config and script (data, tokenizer), as every node must see them."""
    return tuple(v for v in (*mixture.names(spec.datasets), spec.args.data.tokenizer) if v and is_local_path(v))


def container_options(spec: RunSpec, paths: BundlePaths) -> list[str]:
    """pyxis's options for the node step, mounting every host path it touches at the same path (none without an
    image): the bundle, the script and the logs, the checkpoints, TMPDIR, local data and tokenizer, the project (the
    training script, the node check) and the Python's installation where it lives outside the system's directories."""
    c, a = spec.args.container, spec.args
    if not c.container_image:
        return []
    touched = [str(paths.bundle_dir), str(paths.script.parent), str(paths.log.parent), str(paths.checkpoints)]
    touched += [a.slurm.tmp_dir, str(Path(a.paths.run_train_script).parent), str(PROJECT)]
    touched += _local_inputs(spec)
    touched += _eval_inputs(spec)
    touched += container.python_prefixes(job_python(spec))
    return container.srun_options(
        c.container_image, touched, c.container_mounts, c.container_workdir, c.container_env, c.container_writable
    )


def _eval_inputs(spec: RunSpec) -> list[str]:
    """What the eval job reads beside the run's own inputs: the folders of task YAMLs (a preset's, --eval_include)
    and a held-out dataset given by its path (a task's own data files are mounted with its folder where they lie in
    it; elsewhere, --container_mounts)."""
    evals = eval_plan.settings_of(spec)
    if evals is None:
        return []
    held = [evals.heldout] if evals.heldout and is_local_path(evals.heldout) and Path(evals.heldout).exists() else []
    hf_home = Path(spec.extra_env.get("HF_HOME") or os.environ.get("HF_HOME") or Path.home() / ".cache/huggingface")
    cache = [str(hf_home)] if hf_home.is_dir() else []  # the datasets cache the checks looked in, as the job reads it
    return [*evals.include, *(str(Path(h).resolve()) for h in held), *cache]


def job_python(spec: RunSpec) -> str:
    """The Python the job runs with on the nodes: --python, else the launcher's own."""
    return spec.args.slurm.python or sys.executable


def job_settings(spec: RunSpec, paths: BundlePaths) -> Job:
    """The job's settings (the bundle's job.json): everything the supervisor and the node step read of the run."""
    a = spec.args
    return Job(
        run_name=a.run_name,
        bundle=paths.bundle_dir,
        log=paths.log,
        checkpoints=paths.checkpoints,
        python=Path(job_python(spec)),
        project=PROJECT,
        train_script=Path(a.paths.run_train_script),
        config=paths.config,
        engine=a.job.engine,
        nodes=a.slurm.nodes,
        gpus_per_node=a.slurm.gpus_per_node,
        tmp_dir=Path(a.slurm.tmp_dir),
        train_steps=a.training.train_steps,
        tokens_per_step=global_batch_tokens(spec),
        spare_nodes=a.slurm.spare_nodes,
        max_requeues=a.slurm.max_requeues,
        max_restarts=a.slurm.max_restarts,
        signal_grace=a.slurm.signal_grace if a.slurm.max_requeues else 0,
        rdzv_backend=spec.rendezvous[0],
        compile_layers=a.job.compile_layers,
        hang_timeout=float(a.job.hang_timeout or 0),
        hang_factor=float(a.job.hang_factor),
        startup_timeout=None if a.job.startup_timeout is None else float(a.job.startup_timeout),
        node_check=a.job.preflight,
        modules=_modules(spec),
        inputs=_local_inputs(spec),
        image=a.container.container_image or "",
        container_options=tuple(container_options(spec, paths)),
        debug=a.job.debug,
        wandb_disabled=a.logging.wandb_disabled,
        extra_env=dict(spec.extra_env),
        heartbeat_s=float(HEARTBEAT_S),
        retention=retention_rules(spec),
        evals=eval_plan.settings_of(spec),
        remote=remote_plan.settings_of(spec, paths.checkpoints),
    )


def sbatch_script(spec: RunSpec, paths: BundlePaths) -> str:
    """The batch script's text."""
    a = spec.args
    # Validation refuses such log paths (slurm_values.SBATCH_UNSAFE); reaching here with one is a launcher bug.
    assert not SBATCH_UNSAFE.search(str(paths.log)), f"unsafe #SBATCH path {paths.log!r}"
    values = {
        "job": job_settings(spec, paths),
        "job_file": paths.job,
        "script_path": paths.script,
        "bundle_dir": paths.bundle_dir,
        "log_path": paths.log,
        "cpus_per_node": a.slurm.cpus_per_node,
        "time_limit": a.slurm.time_limit,
        "partition": a.slurm.partition,
        "qos": a.slurm.qos,
        "account": a.slurm.account,
        "email": a.slurm.email,
        "dependency": a.slurm.dependency,
        "placement": {name: getattr(a.slurm, name) for name in PLACEMENT},  # values checked by validation
        "exclusive": a.slurm.exclusive,
        "expedited_requeue": spec.expedited_requeue,
        "pre_launch_commands": a.slurm.pre_launch_commands,
    }
    return environment().get_template("sbatch.sh.j2").render(**values)


def export_script(spec: RunSpec, paths: BundlePaths) -> str:
    """--export_hf: the export job's batch script (templates/export.sh.j2), in the bundle; its log beside the run's."""
    a = spec.args
    values = {
        "run_name": a.run_name,
        "python": job_python(spec),
        "project": PROJECT,
        "config_path": paths.config,
        "tmp_dir": a.slurm.tmp_dir,
        "extra_env": spec.extra_env,
        "time_limit": a.slurm.time_limit,
        "partition": a.slurm.export_partition or a.slurm.partition,
        "qos": a.slurm.qos,
        "account": a.slurm.account,
        "log_path": export_log(paths),
        "script_path": paths.bundle_dir / protocol.EXPORT_SCRIPT,
        "result": paths.bundle_dir / protocol.EXPORT_RESULT,
        "bundle_dir": paths.bundle_dir,
    }
    return environment().get_template("export.sh.j2").render(**values)


def export_log(paths: BundlePaths) -> Path:
    return paths.log.with_name(paths.log.name.removesuffix(protocol.LOG_SUFFIX) + protocol.EXPORT_LOG_SUFFIX)
