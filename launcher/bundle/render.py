"""The bundle's rendered files, pure functions of the resolved spec and the bundle's paths: the nanotron config
(`config_yaml`, through the flag table of `launcher.nanotron_config.schema`), the sbatch script (`sbatch_script`, from
templates/sbatch.sh.j2) and the node script every node runs (`node_script`, from templates/node.sh.j2).

Every value that reaches the shell goes through `shlex.quote` (the `q` filter); values on #SBATCH lines are
validated to a safe alphabet first (run name, partition, ...) or cannot hold what Slurm's parser chokes on (the
log path, see slurm_values.SBATCH_UNSAFE). Values in comments have line breaks escaped.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from launcher import protocol
from launcher.bundle import template_cache
from launcher.bundle.files import BundlePaths
from launcher.config import container, evalcheck
from launcher.config.slurm_values import PLACEMENT, SBATCH_UNSAFE, time_limit_seconds
from launcher.config.spec import RunSpec
from launcher.nanotron_config import mixture, schema
from launcher.nanotron_config.datasource import is_local_path
from launcher.node import nodecheck
from launcher.node.evals import EvalSettings

TEMPLATES = Path(__file__).resolve().parent / "templates"
HEARTBEAT_S = 60
EVAL_TIME_LIMIT_S = 4 * 3600  # an eval job's time limit: the run's, at most this (a week's limit would hold it back)


def _comment(value: object) -> str:
    return str(value).replace("\r", "\\r").replace("\n", "\\n")


OPTIONS: dict[str, Any] = {  # the Environment's, besides its loader and cache
    "undefined": StrictUndefined,
    "trim_blocks": True,
    "lstrip_blocks": True,
    "keep_trailing_newline": True,
    "autoescape": False,
}


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), bytecode_cache=template_cache.cache_for(OPTIONS), **OPTIONS)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["comment"] = _comment
    env.globals["P"] = protocol  # the contract's names: files, variables, words
    env.globals["say"] = protocol.bash_line  # `log {{ say("name", field="bash expression") }}`
    return env


def config_yaml(spec: RunSpec, paths: BundlePaths) -> str:
    """The config.yaml's text: the base YAML with every flag's value at its path."""
    return schema.dump(schema.written(spec.config, spec.dialect.dialect, str(paths.checkpoints)))


PROJECT = Path(__file__).resolve().parents[2]  # the directory holding the launcher package: the node helpers' path


def _modules(spec: RunSpec) -> str:
    """What the job's Python must have for the torch engine (the node check looks for them)."""
    needed = ["torch", "numpy", "yaml", "transformers"]
    if spec.args.data.dataset is not None:
        needed += ["datasets"]
    if not spec.args.logging.wandb_disabled:
        needed += ["wandb"]
    return ",".join(needed)


def _local_inputs(spec: RunSpec, paths: BundlePaths) -> list[str]:
    """The paths the job reads, as every node must see them."""
    local = [v for v in (*mixture.names(spec.datasets), spec.args.data.tokenizer) if v and is_local_path(v)]
    return [str(paths.config), spec.args.paths.run_train_script, *local]


def container_options(spec: RunSpec, paths: BundlePaths) -> list[str]:
    """pyxis's options for the node step, mounting every host path it touches at the same path (none without an
    image): the bundle, the script and the logs, the checkpoints, TMPDIR, local data and tokenizer, the project (the
    training script, the node check) and the Python's installation where it lives outside the system's directories."""
    c, a = spec.args.container, spec.args
    if not c.container_image:
        return []
    touched = [str(paths.bundle_dir), str(paths.script.parent), str(paths.log.parent), str(paths.checkpoints)]
    touched += [a.slurm.tmp_dir, str(Path(a.paths.run_train_script).parent), str(PROJECT)]
    touched += [v for v in _local_inputs(spec, paths)[2:]]
    touched += container.python_prefixes(job_python(spec))
    return container.srun_options(
        c.container_image, touched, c.container_mounts, c.container_workdir, c.container_env, c.container_writable
    )


def job_python(spec: RunSpec) -> str:
    """The Python the job runs with on the nodes: --python, else the launcher's own."""
    return spec.args.slurm.python or sys.executable


def _values(spec: RunSpec, paths: BundlePaths) -> dict:
    """What both scripts are rendered from."""
    a = spec.args
    return {
        "run_name": a.run_name,
        "nodes": a.slurm.nodes,
        "gpus_per_node": a.slurm.gpus_per_node,
        "python": job_python(spec),
        "train_script": a.paths.run_train_script,
        "config_path": paths.config,
        "log_dir": paths.log.parent,
        "stop_file": paths.stop_file,
        "outcome_file": paths.outcome_file,
        "metrics_file": paths.metrics,
        "runtime_file": paths.runtime,
        "tmp_dir": a.slurm.tmp_dir,
        "wandb_disabled": a.logging.wandb_disabled,
        "extra_env": spec.extra_env,
        "script_path": paths.script,
        "node_script": paths.node_script,
        "progress_file": paths.progress_file,
        "preflight_report": paths.preflight_report,
        "port_taken_file": paths.port_taken_file,
        "project": PROJECT,
        "nodecheck": nodecheck.__name__,  # run as a module with the job's Python (standard library only)
        "preflight": a.job.preflight,
        "debug": a.job.debug,
        "engine": a.job.engine,
        "rdzv_backend": spec.rendezvous[0],
        "signal_grace": a.slurm.signal_grace if a.slurm.max_requeues else 0,
        "expedited_requeue": spec.expedited_requeue,
        "container": container_options(spec, paths),
        "image": a.container.container_image,
    }


def sbatch_script(spec: RunSpec, paths: BundlePaths) -> str:
    """The batch script's text."""
    return _batch(spec, paths, "sbatch.sh.j2")


def _batch(spec: RunSpec, paths: BundlePaths, template: str) -> str:
    a = spec.args
    # Validation refuses such log paths (slurm_values.SBATCH_UNSAFE); reaching here with one is a launcher bug.
    assert not SBATCH_UNSAFE.search(str(paths.log)), f"unsafe #SBATCH path {paths.log!r}"
    return (
        _environment()
        .get_template(template)
        .render(
            **_values(spec, paths),
            cpus_per_node=a.slurm.cpus_per_node,
            time_limit=a.slurm.time_limit,
            partition=a.slurm.partition,
            qos=a.slurm.qos,
            account=a.slurm.account,
            email=a.slurm.email,
            dependency=a.slurm.dependency,
            placement={name: getattr(a.slurm, name) for name in PLACEMENT},  # values checked by validation
            exclusive=a.slurm.exclusive,
            max_requeues=a.slurm.max_requeues,
            log_path=paths.log,
            requeues_file=paths.requeues_file,
            restarts_file=paths.restarts_file,
            ranks_file=paths.ranks_file,
            stragglers_file=paths.stragglers_file,
            spare_nodes=a.slurm.spare_nodes,
            max_restarts=a.slurm.max_restarts,
            hung_file=paths.hung_file,
            hang_timeout=a.job.hang_timeout,
            startup_timeout=a.job.startup_timeout,
            hang_factor=a.job.hang_factor,
            checkpoints=paths.checkpoints,
            pre_launch_commands=a.slurm.pre_launch_commands,
            bundle_dir=paths.bundle_dir,
            heartbeat_s=HEARTBEAT_S,
            evals=eval_settings(spec, paths),
        )
    )


def export_script(spec: RunSpec, paths: BundlePaths) -> str:
    """--export_hf: the export job's batch script (templates/export.sh.j2), in the bundle; its log beside the run's."""
    a = spec.args
    values = {
        **_values(spec, paths),
        "time_limit": a.slurm.time_limit,
        "partition": a.slurm.export_partition or a.slurm.partition,
        "qos": a.slurm.qos,
        "account": a.slurm.account,
        "log_path": export_log(paths),
        "script_path": paths.bundle_dir / protocol.EXPORT_SCRIPT,
        "result": paths.bundle_dir / protocol.EXPORT_RESULT,
        "bundle_dir": paths.bundle_dir,
    }
    return _environment().get_template("export.sh.j2").render(**values)


def export_log(paths: BundlePaths) -> Path:
    return paths.log.with_name(paths.log.name.removesuffix(protocol.LOG_SUFFIX) + protocol.EXPORT_LOG_SUFFIX)


def eval_settings(spec: RunSpec, paths: BundlePaths) -> str:
    """--eval_tasks: what the supervisor needs to submit the eval jobs (launcher/node/evals.py), as the JSON the batch
    script exports; "" without it."""
    found, _ = evalcheck.tasks_of(spec.args.evals)
    if found is None:
        return ""
    a = spec.args
    settings = EvalSettings(str(paths.bundle_dir / protocol.EVAL_SCRIPT), str(paths.bundle_dir), str(paths.checkpoints),
                            a.run_name, str(eval_log(paths)), a.evals.eval_every or 0, a.training.train_steps,
                            found.said)  # fmt: skip
    return settings.to_json()


def eval_log(paths: BundlePaths, step: str = "{step}") -> Path:
    """An eval job's log, beside the run's: `{step}` for the step (the supervisor's `--output`)."""
    stem = paths.log.name.removesuffix(protocol.LOG_SUFFIX)
    return paths.log.with_name(stem + protocol.EVAL_LOG_SUFFIX.replace("{step}", step))


def eval_time_limit(time_limit: str) -> str:
    """The run's time limit, at most EVAL_TIME_LIMIT_S (as HH:MM:SS)."""
    try:
        seconds = min(time_limit_seconds(time_limit), EVAL_TIME_LIMIT_S)
    except ValueError:  # UNLIMITED, INFINITE
        seconds = EVAL_TIME_LIMIT_S
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eval_script(spec: RunSpec, paths: BundlePaths) -> str:
    """--eval_tasks: the eval job's batch script (templates/eval.sh.j2), in the bundle; its argument is the step."""
    a, e = spec.args, spec.args.evals
    found, _ = evalcheck.tasks_of(e)
    assert found is not None, "rendered only with --eval_tasks"
    values = {
        **_values(spec, paths),
        "time_limit": eval_time_limit(a.slurm.time_limit),
        "partition": e.eval_partition or a.slurm.partition,
        "qos": a.slurm.qos,
        "account": a.slurm.account,
        "gpus": e.eval_gpus,
        "tasks": found.said,
        "limit": e.eval_limit,
        "heldout": e.eval_heldout,
        "log_path": eval_log(paths, "%j"),
        "script_path": paths.bundle_dir / protocol.EVAL_SCRIPT,
        "bundle_dir": paths.bundle_dir,
    }
    return _environment().get_template("eval.sh.j2").render(**values)


def node_script(spec: RunSpec, paths: BundlePaths) -> str:
    """The node script's text: what srun runs on every node."""
    return (
        _environment()
        .get_template("node.sh.j2")
        .render(
            **_values(spec, paths),
            modules=_modules(spec),
            writable=[str(paths.checkpoints), str(paths.log.parent), str(paths.bundle_dir)],
            readable=_local_inputs(spec, paths),
        )
    )
