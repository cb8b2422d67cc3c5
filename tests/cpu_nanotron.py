"""nanotron's trainer with several ranks on CPU, through the job's own door: a Python for the job (`--python`, or the
interpreter torchrun starts) that loads tests/cpu_nanotron/sitecustomize.py, the CPU-only patches of the test side
(their list, and why each: that module's docstring; ../shared/notes/NANOTRON-MULTIRANK.md). With `main=True`
nanotron main's vendored source comes first on its path (tests/nanotron_main.py extracts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SITE = HERE / "cpu_nanotron"
ROOT = HERE.parent
STEPS = 5  # a layout's run: five steps of a global batch of 8 sequences of 64 tokens


def environment(main: bool = False) -> dict[str, str]:
    """The variables that make a Python run nanotron's trainer on CPU (and main's, where asked)."""
    paths = [str(SITE)]
    if main:
        from nanotron_main import source

        paths.insert(0, str(source() / "src"))
    return {"PYTHONPATH": os.pathsep.join(paths + [str(ROOT)]), "LAUNCHER_TEST_NANOTRON_ON_CPU": "1",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}  # fmt: skip


def python(tmp_path: Path, main: bool = False) -> Path:
    """An executable that runs this Python with the CPU patches (and main's source, where asked): a job's
    --python on the local cluster."""
    wrapper = tmp_path / ("python-cpu-nanotron-main" if main else "python-cpu-nanotron")
    exports = " ".join(f"{k}='{v}'" for k, v in environment(main).items())
    wrapper.write_text(f'#!/bin/sh\nexport {exports}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def torchrun(
    config: Path,
    nproc: int,
    log: Path,
    main: bool = False,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node N run_train.py --config-file CONFIG --engine nanotron [ARGS]` with the
    CPU patches; its output goes to `log`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(ROOT / "run_train.py"), "--config-file", str(config), "--engine", "nanotron", *args]  # fmt: skip
    full_env = {**os.environ, **environment(main), **(env or {})}
    with open(log, "a") as out:
        return subprocess.run(command, env=full_env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT)


def layout_spec(where: Path, demo: Any, dialect: str, dp: int, tp: int, pp: int, *flags: str) -> tuple[Any, list]:
    """The launcher's resolved run for a tiny Llama on dp x tp x pp processes (global batch 8, the demo data, one
    node), and every problem its pure validation finds."""
    from launcher_helpers import spec_for

    from launcher.config.validate import validate

    spec, problems = spec_for(
        "--nodes", "1", "--gpus_per_node", str(dp * tp * pp), "--tp", str(tp), "--pp", str(pp),
        "--model_size", "tiny", "--hidden_size", "64", "--num_layers", "2", "--max_seq_len", "64",
        "--micro_batch_size", "2", "--grad_accum_steps", str(8 // (2 * dp)), "--train_steps", str(STEPS),
        "--warmup_steps", "1", "--learning_rate", "1e-3", "--log_interval", "1", "--nanotron_dialect", dialect,
        "--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer), *flags, cwd=where,
    )  # fmt: skip
    return spec, problems + validate(spec)


def parameters_line(where: Path, demo: Any, dialect: str) -> str:
    """The line the nanotron engine's rank 0 says of dp 2 x tp 2 x pp 2 (`say_parameters_per_rank`), with the counts
    the launcher's memory model assumes for that layout: the two must agree."""
    from launcher.perf import memory
    from launcher.perf.fit import layout_of
    from launcher.train.nanotron_engine.trainer import PARAMETERS_LINE

    spec, _ = layout_spec(where, demo, dialect, 2, 2, 2)
    lay = layout_of(spec)
    assumed = [[memory.stage_params(spec.shape, stage, 2, lay.vocab_multiple)] * 2
               for stage in memory.stages(spec.shape, 2, 2, lay.vocab_multiple)]  # fmt: skip
    return PARAMETERS_LINE.format(counts=assumed)


def written_config(spec: Any, where: Path, name: str, **yaml_paths: Any) -> Path:
    """The config the launcher writes for `spec` (checkpoints in `where/ckpt/name`), with `yaml_paths` (dotted)
    set afterwards and one LR schedule whatever train_steps (decay over 7 steps)."""
    from launcher_helpers import config_of

    config = config_of(spec, str(where / "ckpt" / name))
    config["optimizer"]["learning_rate_scheduler"]["lr_decay_steps"] = 7
    for dotted, value in yaml_paths.items():
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[last] = value
    path = where / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def launcher_config(
    where: Path, name: str, demo: Any, dialect: str, dp: int, tp: int, pp: int, *flags: str, **yaml_paths: Any
) -> Path:
    """`written_config` of `layout_spec`, which must have no problem."""
    spec, problems = layout_spec(where, demo, dialect, dp, tp, pp, *flags)
    assert problems == [], problems
    return written_config(spec, where, name, **yaml_paths)


def train(
    config: Path, nproc: int, dialect: str, metrics: Path | None = None, args: tuple[str, ...] = (), **env: str
) -> dict[int, dict]:
    """One torchrun of the nanotron engine on `config` (`args`: run_train.py's others); the metrics it logged (the
    test fails with its log). Its
    bundle (LAUNCHER_BUNDLE, where it writes its metrics) is named after `metrics` (the config's name by default):
    two runs given the same one append to one metrics file, as a resumed job does."""
    bundle = (metrics or config.with_suffix(".jsonl")).with_suffix(".bundle")
    bundle.mkdir(parents=True, exist_ok=True)
    log = config.with_suffix(".log")
    done = torchrun(config, nproc, log, main=dialect == "main", env={"LAUNCHER_BUNDLE": str(bundle), **env}, args=args)
    assert done.returncode == 0, log.read_text()[-6000:]
    return {m["step"]: m for m in map(json.loads, (bundle / "metrics.jsonl").read_text().splitlines())}
