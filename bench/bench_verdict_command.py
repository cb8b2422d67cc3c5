"""`python -m launcher.jobs verdict` end to end on records on disk: a sweep of 32 arms x 3 seeds, each run evaluated at
10 steps on 10 tasks of 10,000 items (issue 52's scale), its per-item files as the eval job writes them; the
command's wall time and peak memory (RSS, the kernel's: wait4's ru_maxrss), --json (the records read, the
statistics) and the text with the picture. Not a test.

    python bench/bench_verdict_command.py [--arms 32] [--seeds 3] [--steps 10] [--tasks 10] [--items 10000] [--dir D]

Tasks 0-4 are multiple choice (acc 0/1, the gold answer's log-likelihood and bytes: judged on acc), 5-6 the same
judged on gold_bpb, 7-9 perplexity tasks (each document's log-likelihood and bytes: bits per byte, a ratio). Every
seed's last 10 evaluated steps are averaged (--last_k 10): every file is read; then --json with --last_k 1 (the
default: each seed's last step). The figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def records(where: Path, arms: int, seeds: int, steps: int, tasks: int, items: int) -> Path:
    """The sweep's records: manifests, results and items files (numpy's savez, as items.write)."""
    import numpy as np

    from launcher import atomic
    from launcher.bundle import sweep_record
    from launcher.evals import record
    from launcher.evals.items import digest

    rng = np.random.default_rng(0)
    hashes = {t: np.array([f"{t:02d}{j:014x}" for j in range(items)], dtype="S16") for t in range(tasks)}
    difficulty = rng.random(items)
    size = rng.integers(50, 4000, items)
    points = []
    for a in range(arms):
        for s in range(seeds):
            name = f"b-{a}-{s}"
            bundle, checkpoints = where / "configs" / name / "stamp", where / "ckpt" / name
            bundle.mkdir(parents=True)
            checkpoints.mkdir(parents=True)
            data = {"run_name": name, "resolved": {"training": {"learning_rate": a, "seed": s}},
                    "outputs": {"checkpoints": str(checkpoints), "log": str(where / f"{name}.out")}}  # fmt: skip
            (bundle / "manifest.json").write_text(json.dumps(data))
            for k in range(1, steps + 1):
                arrays, metrics = {}, {}
                for t in range(tasks):
                    arrays[f"t{t}|doc_id"] = np.arange(items, dtype=np.int32)
                    arrays[f"t{t}|doc_hash"] = hashes[t]
                    if t < 7:
                        right = rng.random(items) < np.clip(difficulty + 0.002 * a, 0, 1)
                        arrays[f"t{t}|acc"] = right.astype(np.uint8)
                        arrays[f"t{t}|gold_ll"] = -(1 + difficulty) * (1 - 0.001 * a) * 20
                        arrays[f"t{t}|gold_bytes"] = np.full(items, 20, dtype=np.int32)
                        metrics[f"t{t}"] = {"acc": float(right.mean())}
                    else:
                        ll = -size * (0.8 + difficulty) * (1 + 0.001 * a) * rng.lognormal(0, 0.05, items)
                        arrays[f"t{t}|ll"], arrays[f"t{t}|bytes"] = ll, size
                        metrics[f"t{t}"] = {"bits_per_byte": float(-ll.sum() / np.log(2) / size.sum())}
                buffer = io.BytesIO()
                np.savez(buffer, **arrays)
                name_of = f"step-{k * 100}-key.items.npz"
                (bundle / "evals").mkdir(exist_ok=True)
                atomic.replace(bundle / "evals" / name_of, buffer.getvalue())
                kept = {
                    "file": f"evals/{name_of}",
                    "items": {f"t{t}": items for t in range(tasks)},
                    "digests": {f"t{t}": digest({"doc_hash": hashes[t]}) for t in range(tasks)},
                }
                record.write_result(bundle, k * 100, "key", {"state": "done", "tokens": k * 100_000, "tasks": metrics,
                                                             "items": kept, "limit": None, "ended": k})  # fmt: skip
            points.append(sweep_record.SweepPoint(name, {"learning_rate": str(a), "seed": str(s)}, bundle, None))
    sweep = where / "configs" / "b" / "stamp"
    sweep.mkdir(parents=True)
    sweep_record.write(sweep, "learning_rate=... seed=...", points)
    return sweep


def timed(argv: list[str], where: Path) -> dict:
    """One command in a child process: its wall time and peak RSS (wait4's, of that child alone)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with open(where / "out.txt", "wb") as out, open(where / "err.txt", "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0, (where / "err.txt").read_text()[-2000:]
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, help="keep the records there, and reuse them if they are there")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.dir or Path(scratch)
        start = time.perf_counter()
        ready = tmp / "configs" / "b" / "stamp"
        sweep = ready if ready.is_dir() else records(tmp, args.arms, args.seeds, args.steps, args.tasks, args.items)
        made = time.perf_counter() - start
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*.npz"))
        tasks = [x for t in range(args.tasks) for x in ("--task", f"t{t}" + (":gold_bpb" if 5 <= t < 7 else ""))]
        base = [sys.executable, "-m", "launcher.jobs", "verdict", str(sweep), *tasks, "--last_k", str(args.steps)]
        as_json = timed([*base, "--json"], Path(tmp))
        as_text = timed(base, Path(tmp))
        last = timed([*base[:-2], "--json"], Path(tmp))  # --last_k 1 (the default): each run's last step alone
        print(json.dumps({"records_s": round(made, 1), "items_files_mib": round(size / 2**20, 1), "json": as_json,
                          "text_and_picture": as_text, "json_last_k_1": last}))  # fmt: skip


if __name__ == "__main__":
    main()
