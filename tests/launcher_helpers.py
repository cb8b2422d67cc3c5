"""Shared helpers for the launcher's tests (not fixtures: plain functions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.bundle.files import BundlePaths, paths_for
from launcher.config.flags import parse
from launcher.config.problems import Problem
from launcher.config.resolve import RunSpec, resolve
from launcher.config.schema import build_config
from launcher.config.validate import validate
from launcher.slurm import preflight

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "slurm_launcher.py"


def spec_for(*flags: str, cwd: Path | None = None) -> tuple[RunSpec, list]:
    """Resolve flags as the launcher would (run name defaults to "t")."""
    argv = list(flags) if "--run_name" in flags else ["--run_name", "t", *flags]
    args, explicit = parse(argv)
    return resolve(args, explicit, cwd=cwd)


def all_problems(spec: RunSpec, problems: list[Problem]) -> list[Problem]:
    """`problems` (resolution's) and every problem both validation phases find, as a dry run checks them."""
    problems = problems + validate(spec)
    return problems + preflight.problems(spec, problems, ask_slurm=False)


def config_of(spec: RunSpec, checkpoints: str) -> dict:
    """The nanotron config the launcher writes for `spec`, its checkpoints in `checkpoints`."""
    return build_config(spec.flag_values(), spec.base_config, checkpoints)


def fixed_paths(run_name: str, root: Path = Path("/project")) -> BundlePaths:
    """Bundle paths as a launch from `root` at a fixed time would get them."""
    return paths_for(
        run_name,
        "20260101-000000",
        root / "logs/configs",
        root / "logs/slurm_scripts",
        root / "logs/slurm_logs",
        root / "checkpoints" / run_name,
    )


def run_launcher(
    *flags: str, cwd: Path, env: dict | None = None, block: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run slurm_launcher.py in a subprocess; `block` names modules whose import must fail."""
    code = (
        "import sys, runpy\n"
        f"for name in {list(block)!r}: sys.modules[name] = None\n"
        f"sys.argv = [{str(LAUNCHER)!r}, *{list(flags)!r}]\n"
        f"runpy.run_path({str(LAUNCHER)!r}, run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
