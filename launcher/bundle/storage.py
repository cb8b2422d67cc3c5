"""Where a run writes, checked before the queue (the cluster's checks): every output directory can be created and
written, and the checkpoints' filesystem has room for a checkpoint, and for the most --keep_last/--keep_every keep
at once (the forecast; launcher/perf/sizes.py's `disk`).

A checkpoints path nobody can write, or a disk without room for one checkpoint, stops a job at its first save:
after the queue and `--save_interval` steps of training. The bundle's own directories would stop the launcher
with an OSError. Both are problems now, named with the flag.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from launcher.perf.sizes import MIN_BYTES_PER_PARAMETER, Disk, human_bytes
from launcher.problems import Problem
from launcher.retention.rules import Rules


def nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (what a `mkdir -p` of `path` starts from)."""
    while not os.path.exists(path) and path != path.parent:  # (os.path's: False for a name too long, not OSError)
        path = path.parent
    return path


def writable_problems(flag: str, directory: str) -> list[Problem]:
    """Problems creating and writing `directory` (absolute) as the user running the launcher."""
    path = Path(directory)
    base = nearest_existing(path)
    if not base.is_dir():
        return [Problem(flag, f"{directory} cannot be created: {base} is not a directory", "give a directory path")]
    if not os.access(base, os.W_OK | os.X_OK):
        what = "is not writable" if base == path else f"cannot be created: {base} is not writable"
        return [Problem(flag, f"{directory} {what} by you", "give a directory you can write")]
    return []


def free_bytes(directory: str) -> int | None:
    """Bytes free on the filesystem `directory` is (or would be created) on; None when it cannot be read."""
    try:
        return shutil.disk_usage(nearest_existing(Path(directory))).free
    except OSError:
        return None


def space_problems(parameters: int, directory: str) -> list[Problem]:
    """A problem when not even one checkpoint fits where the checkpoints go."""
    least = parameters * MIN_BYTES_PER_PARAMETER
    free = free_bytes(directory)
    if free is None or free >= least:
        return []
    return [
        Problem(
            "checkpoints_path",
            f"{human_bytes(free)} free where {directory} lies, less than one checkpoint of this model "
            f"(at least {human_bytes(least)})",
            "make room, or give a --checkpoints_path on a larger filesystem",
        )
    ]


def peak_problems(disk: Disk, directory: str) -> list[Problem]:
    """A problem when the most checkpoints the run's --keep_last/--keep_every keep at once do not fit the free space
    where they go (where one does not fit, `space_problems` says so), with the rules that would fit. A run that
    removes nothing is told so in the summary (`launcher/report/summary.py`), as before retention: not refused."""
    free = free_bytes(directory)
    if free is None or disk.peak <= free or not disk.rules.active:
        return []
    fixes = fitting(disk, free)
    fix = f"keep fewer ({' or '.join(fixes)} fits), or " if fixes else ""
    fix += f"give a --checkpoints_path with {human_bytes(disk.peak)} free, or make room"
    writing = "one being written" if disk.most < disk.saves else "the last"
    what = (f"the run keeps up to {disk.most} checkpoints at once ({disk.rules.describe()}, {writing}) of "
            f"~{human_bytes(disk.each)} each: {human_bytes(disk.peak)} at its peak")  # fmt: skip
    flag = "keep_last" if disk.rules.keep_last is not None else "keep_every"
    return [Problem(flag, f"{what}, more than the {human_bytes(free)} free where {directory} lies", fix)]


def fitting(disk: Disk, free: int) -> list[str]:
    """The rules that would fit the run's peak in `free` bytes: the largest --keep_last (with --keep_every as it
    is), and the smallest --keep_every (with --keep_last as it is), where any fits."""
    rules, room = disk.rules, free // disk.each

    def fits(rules: Rules) -> bool:
        most = disk.most_with(rules)
        return most is not None and most <= room

    fixes = []
    last = _largest(lambda n: fits(Rules(n, rules.keep_every)), disk.saves)
    if last:
        fixes.append(f"--keep_last {last}")
    interval = disk.save_interval
    if interval > 0 and rules.keep_every is not None:
        most_m = max(disk.train_steps // interval, 1)
        m = _smallest(lambda m: fits(Rules(rules.keep_last, m * interval)), most_m)
        if m is not None:
            fixes.append(f"--keep_every {m * interval}")
    return fixes


def _largest(ok: Callable[[int], bool], most: int) -> int | None:
    """The largest n in 1..most with ok(n) (ok holds up to some n, then no more), None where ok(1) does not."""
    if most < 1 or not ok(1):
        return None
    low, high = 1, most
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low


def _smallest(ok: Callable[[int], bool], most: int) -> int | None:
    """The smallest m in 1..most with ok(m) (ok fails up to some m, then holds), None where ok(most) does not."""
    if most < 1 or not ok(most):
        return None
    low, high = 1, most
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if ok(mid) else (mid + 1, high)
    return low
