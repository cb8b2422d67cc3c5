"""Dry-run time against its floor (aim: at most 2x). Not a test.

    python bench/bench_dry_run.py [--runs 21]

Times `python slurm_launcher.py --run_name bench --nodes 4 --dry_run` end to end (interpreter start included) in a
temporary directory, side by side with `python -c "import yaml, jinja2"`: the two libraries a dry run cannot do
without, and the interpreter's own start. The two alternate, run after run, so both see the same load on a shared
machine; it prints each one's median wall time and CPU time (user + system, the child's and its children's) and
their ratios. The CPU ratio is the steadier where others share the cores.

Both run as on a user's machine: Python writes the launcher's bytecode (PYTHONDONTWRITEBYTECODE is dropped for
them; the libraries' own is written at install), and the first, unmeasured run fills the page cache and the
launcher's cache of compiled templates (launcher/bundle/template_cache.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parent.parent / "slurm_launcher.py"
AIM = 2.0


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run."""
    cpu, start = _cpu(), time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    runs = parser.parse_args().runs
    floor = [sys.executable, "-c", "import yaml, jinja2"]
    dry_run = [sys.executable, str(LAUNCHER), "--run_name", "bench", "--nodes", "4", "--dry_run"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times: dict[str, list[tuple[float, float]]] = {"floor": [], "dry run": []}
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in (floor, dry_run):  # warm: page cache, bytecode, compiled templates
            subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
        for _ in range(runs):
            times["floor"].append(_timed(floor, tmp, env))
            times["dry run"].append(_timed(dry_run, tmp, env))
    wall = {name: statistics.median(t[0] for t in pairs) for name, pairs in times.items()}
    cpu = {name: statistics.median(t[1] for t in pairs) for name, pairs in times.items()}
    print(f"{runs} runs each, alternating; medians (min-max wall)")
    for name, pairs in times.items():
        walls = [t[0] for t in pairs]
        print(
            f"  {name:8} wall {wall[name]:.3f} s ({min(walls):.3f}-{max(walls):.3f}), cpu {cpu[name]:.3f} s"
            + ("   (python -c 'import yaml, jinja2')" if name == "floor" else "")
        )
    print(
        f"dry run / floor: wall {wall['dry run'] / wall['floor']:.2f}x, cpu {cpu['dry run'] / cpu['floor']:.2f}x "
        f"(aim: at most {AIM:.0f}x)"
    )


if __name__ == "__main__":
    main()
