"""The planner's full search for 1024 nodes x 8 GPUs (target: under 1 s, no torch import). Not a test.

    python bench/bench_plan.py [--runs 5]

Times `launcher.perf.planner.search` in-process for the 70b, 8b and 1b presets on 8192 GPUs with a 4096-sequence
batch (every layout nanotron accepts, each with its memory and step time), and then
`python slurm_launcher.py --model_size 70b --nodes 1024 --plan --dry_run` end to end (interpreter start included),
checking that the command imported no torch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher.nanotron_config import gpus  # noqa: E402
from launcher.nanotron_config.shape import ModelShape  # noqa: E402
from launcher.perf.memory import Layout  # noqa: E402
from launcher.perf.planner import search  # noqa: E402

MODELS = {
    "70b": ModelShape(8192, 28672, 80, 64, 8, 128256, 4096),
    "8b": ModelShape(4096, 14336, 32, 32, 8, 128256, 4096),
    "1b": ModelShape(2048, 8192, 16, 32, 8, 128256, 4096, tie_word_embeddings=True),
}
CHECK_NO_TORCH = (
    "import runpy, sys\n"
    "sys.argv = ['slurm_launcher.py', '--run_name', 'b', '--model_size', '70b', '--nodes', '1024', '--plan', "
    "'--dry_run']\n"
    "try:\n"
    f"    runpy.run_path({str(ROOT / 'slurm_launcher.py')!r}, run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "assert 'torch' not in sys.modules, 'torch was imported'\n"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    h100 = gpus.table()["h100"]
    for name, model in MODELS.items():
        times, count = [], 0
        for _ in range(runs):
            start = time.perf_counter()
            plans = search(model, 8192, 8, 4096, h100, {}, Layout(1, 1, 1, 1, 1))
            times.append(time.perf_counter() - start)
            count = len(plans)
        fitting = sum(p.fits for p in plans)
        print(
            f"search {name} on 1024 x 8 GPUs: {count} layouts ({fitting} fit), median "
            f"{statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms (target < 1000 ms)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", CHECK_NO_TORCH]
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)  # warm the page cache
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    print(f"--plan --nodes 1024 end to end, no torch imported: median {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
