"""Dry-run wall time (target: median <= 0.3 s on the 2-core build machine). Not a test.

    python bench/bench_dry_run.py [--runs 20]

Times `python slurm_launcher.py --run_name bench --nodes 4 --dry_run` end to end (interpreter start included) in a
temporary directory, and prints the median, min and max. Uses hyperfine instead when it is installed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parent.parent / "slurm_launcher.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    cmd = [sys.executable, str(LAUNCHER), "--run_name", "bench", "--nodes", "4", "--dry_run"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)  # warm the page cache
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    print(
        f"dry run, {runs} runs: median {statistics.median(times):.3f} s, min {min(times):.3f} s, "
        f"max {max(times):.3f} s (target: median <= 0.300 s)"
    )
    if shutil.which("hyperfine"):
        print("for a second opinion: hyperfine --warmup 2 '" + " ".join(cmd) + "'  (in an empty directory)")


if __name__ == "__main__":
    main()
