"""What checkpoint retention adds to the save it follows (docs/checkpoints.md), on this machine's disk. Not a test:

    python bench/bench_retention.py [--repeats 5] [--work DIR] [--out bench/results/X.md]

Training waits for no purge: the job's supervisor purges in its own process, after the pointer has moved, while
training goes on. What a purge can cost a step is the disk it shares with the next save, and the one thing a save
itself does more: rank 0 notes the step in the folder's `saves` record (an append and an fsync) before its first
file. For each checkpoint size, the torch engine's own save (rank 0's part: launcher/train/torch_engine/checkpoint.py's
`_write`: state.pt written and fsynced into .tmp-*, renamed, the pointer) is timed alone, and again with the purge
of an older step of the same size (launcher/node/purge.py's `purge`, --keep_last 2: the step renamed out, fsynced,
deleted) started in another process at the same moment, as the supervisor does it; and the purge itself. Sizes: the
tiny preset's torch checkpoint (4.22M parameters x 12 bytes), one of 1.2 GB, and 1.2 GB in 150 files (nanotron
writes a file per parameter and shard) for the purge. Also the supervisor's poll when nothing changed, and a look
and judgement of a folder of 1,000 steps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher import checkpoint_layout as ckpt  # noqa: E402
from launcher import protocol as P  # noqa: E402
from launcher.retention import purge  # noqa: E402
from launcher.retention.rules import Rules, judge  # noqa: E402
from launcher.train.torch_engine import checkpoint  # noqa: E402

RULES = Rules(keep_last=2)
PURGER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from launcher.retention import purge
from launcher.retention.rules import Rules
print("ready", flush=True)
for line in sys.stdin:
    started = time.perf_counter()
    done = purge.purge(Path(line.strip()), Rules(keep_last=2), "")
    print(f"{{time.perf_counter() - started:.6f}} {{len(done.removed)}}", flush=True)
"""


def state_of(size: int) -> dict:
    return {"model": {"w": torch.randn(size // 4)}, "step": 0}


def saved(root: Path, step: int, state: dict) -> float:
    started = time.perf_counter()
    checkpoint._write(root, step, state, {"step": step})
    return time.perf_counter() - started


def bench_size(work: Path, size: int, repeats: int) -> dict:
    """Per repeat: a save with nothing beside it; then the purge of the step it left over (the third newest, under
    --keep_last 2) started in the purger's process as the next save starts. Seconds each."""
    root = work / f"torch-{size}"
    shutil.rmtree(root, ignore_errors=True)
    state = state_of(size)
    purger = subprocess.Popen([sys.executable, "-c", PURGER.format(root=str(ROOT))], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert purger.stdin is not None and purger.stdout is not None and purger.stdout.readline().strip() == "ready"

    def purge_now() -> None:
        purger.stdin.write(f"{root}\n")  # type: ignore[union-attr]
        purger.stdin.flush()  # type: ignore[union-attr]

    alone, beside, purges = [], [], []
    try:
        for step in range(1, 3):  # two steps on disk: each save from here on leaves one to remove
            saved(root, step, state)
        step = 2
        for _ in range(repeats):
            step += 1
            alone.append(saved(root, step, state))  # three on disk now: the oldest goes with the next save
            step += 1
            purge_now()
            beside.append(saved(root, step, state))
            seconds, removed = purger.stdout.readline().split()
            purges.append(float(seconds))
            assert int(removed) >= 1
            purge_now()  # (back to two on disk, untimed)
            purger.stdout.readline()
    finally:
        purger.stdin.close()
        purger.wait()
        shutil.rmtree(root, ignore_errors=True)
    return {"size": size, "alone": alone, "beside": beside, "purge": purges}


def bench_many_files(work: Path, size: int, files: int, repeats: int) -> list[float]:
    """The purge of a step of `size` bytes in `files` files (nanotron's layout: a file per parameter and shard)."""
    root = work / "many"
    shutil.rmtree(root, ignore_errors=True)
    chunk = os.urandom(size // files)
    times = []
    for step in range(1, repeats + 3):
        folder = root / str(step) / "model"
        folder.mkdir(parents=True)
        for n in range(files):
            with open(folder / f"p{n}.safetensors", "wb") as f:
                f.write(chunk)
                os.fsync(f.fileno())
        (root / str(step) / P.NANOTRON_METADATA).write_text("{}")
        ckpt.note_save(root, step)
        (root / P.NANOTRON_POINTER).write_text(str(step))
        if step > 2:
            started = time.perf_counter()
            done = purge.purge(root, RULES, "")
            times.append(time.perf_counter() - started)
            assert len(done.removed) == 1
    shutil.rmtree(root, ignore_errors=True)
    return times


def bench_looks(work: Path, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """The supervisor's poll with nothing changed; a look and judgement of 1,000 steps; a save's note."""
    root = work / "looks"
    for step in range(1, 1001):
        (root / str(step)).mkdir(parents=True)
        (root / str(step) / ckpt.TORCH_STATE).write_bytes(b"")
        (root / str(step) / ckpt.TORCH_META).write_bytes(b"")
    (root / P.TORCH_POINTER).write_text("1000\n")
    now = [0.0]
    keeper = purge.Retention(Rules(keep_every=1), root, "", lambda name, **f: None, clock=lambda: now[0])
    keeper.poll(wait=True)
    polls, looks, notes = [], [], []
    for _ in range(repeats * 20):
        now[0] += purge.LOOK_EVERY_S
        started = time.perf_counter()
        keeper.poll()
        polls.append(time.perf_counter() - started)
    for _ in range(repeats):
        started = time.perf_counter()
        judge(ckpt.look(root), Rules(keep_last=2, keep_every=100), {})
        looks.append(time.perf_counter() - started)
    for step in range(repeats * 4):
        started = time.perf_counter()
        ckpt.note_save(work / "notes", step)
        notes.append(time.perf_counter() - started)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work / "notes", ignore_errors=True)
    return polls, looks, notes


def span(values: list[float], unit: float = 1.0, digits: int = 3) -> str:
    v = [x * unit for x in values]
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None, help="where the checkpoints go (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-retention-"))
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    lines = [f"# bench_retention ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load {load:.1f}, "
             f"{work}: {shutil.disk_usage(work).free / 1e9:.0f} GB free)", "",
             "| checkpoint | save alone, s | save with a purge beside it, s | the purge, s |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for size in (4_220_000 * 12, 1_200_000_000):
        found = bench_size(work, size, args.repeats)
        lines.append(f"| {size / 1e6:,.0f} MB, 1 file (torch engine) | {span(found['alone'])} | "
                     f"{span(found['beside'])} | {span(found['purge'])} |")  # fmt: skip
        print(lines[-1], flush=True)
    many = bench_many_files(work, 1_200_000_000, 150, args.repeats)
    lines.append(f"| 1,200 MB, 150 files (nanotron's layout) | | | {span(many)} |")
    polls, looks, notes = bench_looks(work, args.repeats)
    lines += ["", f"- the supervisor's poll, nothing changed: {span(polls, 1e6, 1)} us (one stat a pointer and the "
              "folder, every 2 s)", f"- a look and judgement of a folder of 1,000 steps: {span(looks, 1e3, 1)} ms",
              f"- a save's note in the `saves` record (append + fsync, rank 0): {span(notes, 1e3, 2)} ms"]  # fmt: skip
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
