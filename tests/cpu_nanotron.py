"""nanotron's trainer with several ranks on CPU, through the job's own door: a Python for the job (`--python`, or the
interpreter torchrun starts) that loads tests/cpu_nanotron/sitecustomize.py, the CPU-only patches of the test side
(their list, and why each: that module's docstring; ../shared/notes/NANOTRON-MULTIRANK.md). With `main=True`
nanotron main's vendored source comes first on its path (tests/nanotron_main.py extracts it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = HERE / "cpu_nanotron"
ROOT = HERE.parent


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
    config: Path, nproc: int, log: Path, main: bool = False, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node N run_train.py --config-file CONFIG --engine nanotron` with the CPU
    patches; its output goes to `log`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(ROOT / "run_train.py"), "--config-file", str(config), "--engine", "nanotron"]  # fmt: skip
    full_env = {**os.environ, **environment(main), **(env or {})}
    with open(log, "a") as out:
        return subprocess.run(command, env=full_env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT)
