"""`jobs verdict`'s statistics (launcher/evals/verdict.py) on synthetic records of 32 arms x 3 seeds x 10
checkpoints x 10 tasks x 10,000 items: the time and the peak memory (RSS) of every task's full verdict (10,000 paired
two-level bootstrap draws, 496 pairs a task; goal: under 10 s and 1 GiB on 2 cores). Not a test.

    python bench/bench_verdict.py [--runs 3] [--items same|distinct|both] [--alternatives]

Each run is a child process of its own (its peak RSS the kernel's, wait4's ru_maxrss): it makes the records as the
glue would hand them over (per seed a checkpoints x items array: 0/1 as uint8 for 5 accuracy tasks, per-item gold
bits per byte as float32 for 2, and for 3 perplexity-like tasks float32 NLL bits over int32 bytes, a ratio), then
times `verdicts` over the 10 tasks. `same`: every task has 10,000 items (the goal's case, and any --eval_limit
10000): they share one count matrix. `distinct`: 10,000 + i items for task i, nothing shared (the worst case).
`--alternatives` times the ways to draw and sum (per 250 draws of 10,000 items, 96 runs): the multinomial by
integers + bincount (kept), numpy's Poisson and multinomial samplers, the matmul in float32 (kept) and float64.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARMS, SEEDS, CHECKPOINTS, TASKS, ITEMS = 32, 3, 10, 10, 10_000


def records(distinct: bool) -> list:
    import numpy as np

    from launcher.evals.verdict import Arm, Comparison, Seed

    rng = np.random.default_rng(0)
    comparisons = []
    for t in range(TASKS):
        n = ITEMS + (t if distinct else 0)
        items = [f"task{t}-doc{j}" for j in range(n)]
        difficulty = rng.random(n)
        size = rng.integers(50, 4000, n).astype(np.int32)
        arms = []
        for a in range(ARMS):
            seeds = []
            for s in range(SEEDS):
                if t < 5:  # accuracy
                    right = rng.random((CHECKPOINTS, n)) < np.clip(difficulty + 0.002 * a, 0, 1)
                    seeds.append(Seed(str(s + 1), items, right.astype(np.uint8)))
                elif t < 7:  # gold bits per byte, a mean over items
                    bpb = difficulty * (1 + 0.001 * a) + 0.05 * rng.standard_normal((CHECKPOINTS, n))
                    seeds.append(Seed(str(s + 1), items, bpb.astype(np.float32)))
                else:  # NLL bits over bytes, a ratio
                    bits = size * (0.8 + difficulty) * (1 + 0.001 * a) * rng.lognormal(0, 0.05, (CHECKPOINTS, n))
                    seeds.append(Seed(str(s + 1), items, bits.astype(np.float32), np.broadcast_to(size, bits.shape)))
            arms.append(Arm(f"lr={a}", {"learning_rate": a}, seeds, steps=list(range(910, 1010, 10))))
        kind = "ratio" if t >= 7 else "mean"
        comparisons.append(Comparison(f"task{t}", "m", arms, kind=kind, lower_is_better=t >= 5))
    return comparisons


def child(distinct: bool) -> None:
    """One run: the records made, then the verdicts timed; one JSON line."""
    from launcher.evals.verdict import verdicts

    comparisons = records(distinct)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start, cpu = time.perf_counter(), time.process_time()
    results = verdicts(comparisons)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert len(results) == TASKS and all(len(v.pairs) == ARMS * (ARMS - 1) // 2 for v in results)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "records_rss_mib": before, "peak_rss_mib": peak}))


def alternatives() -> None:
    import numpy as np
    from threadpoolctl import threadpool_limits

    n, rows, runs = ITEMS, 250, ARMS * SEEDS
    rng = np.random.default_rng(0)
    values = rng.random((n, runs))

    def best(f, repeat: int = 5) -> float:
        times = []
        for _ in range(repeat):
            start = time.process_time()
            f()
            times.append(time.process_time() - start)
        return min(times)

    def multinomial_by_bincount():
        idx = rng.integers(0, n, size=(rows, n))
        idx += np.arange(0, rows * n, n)[:, None]
        return np.bincount(idx.ravel(), minlength=rows * n).reshape(rows, n).astype(np.float32)

    counts = multinomial_by_bincount()
    with threadpool_limits(limits=1, user_api="blas"):
        figures = {
            "multinomial: integers + bincount (kept)": best(multinomial_by_bincount),
            "Poisson(1) counts: rng.poisson": best(lambda: rng.poisson(1.0, (rows, n)).astype(np.float32)),
            "multinomial: rng.multinomial": best(lambda: rng.multinomial(n, np.full(n, 1 / n), size=rows), 1),
            "matmul float32 (kept), one BLAS thread": best(lambda: counts @ values.astype(np.float32)),
            "matmul float64, one BLAS thread": best(lambda: counts.astype(np.float64) @ values),
        }
    for name, seconds in figures.items():
        print(f"  {name}: {1000 * seconds:.0f} ms CPU per {rows} draws (x{10_000 // rows} for a task's 10,000)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--items", choices=["same", "distinct", "both"], default="both")
    parser.add_argument("--alternatives", action="store_true")
    parser.add_argument("--child", choices=["same", "distinct"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child == "distinct")
        return
    print(f"{ARMS} arms x {SEEDS} seeds x {CHECKPOINTS} checkpoints x {TASKS} tasks x {ITEMS:,} items, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    if args.alternatives:
        alternatives()
    for mode in ["same", "distinct"] if args.items == "both" else [args.items]:
        rows = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode], capture_output=True, text=True, check=True
            )
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        for key in ("wall_s", "cpu_s", "records_rss_mib", "peak_rss_mib"):
            values = sorted(r[key] for r in rows)
            print(f"  {mode:<8} {key:<16} min {values[0]:8.2f}  median {statistics.median(values):8.2f}  "
                  f"max {values[-1]:8.2f}")  # fmt: skip
    print(f"  load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
