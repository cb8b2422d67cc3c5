"""The run's files the supervisor keeps: the one-writer lock under the checkpoints, and the bundle's record of the
requeues the job asked for. (The restarts file's one writer is launcher/node/restart.py: its decisions, and their
amendment where the job went against one.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P


def append_requeue_record(path: Path, why: str, attempt: int, saved: str, nodes: Sequence[str]) -> None:
    """One REQUEUE_FORMAT line: why the job requeued itself, in which attempt, from which step, without which nodes."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(P.REQUEUE_FORMAT.format(why=why, attempt=attempt, step=saved, nodes=" ".join(nodes) or "-") + "\n")


def requeued(path: Path, why: str) -> int:
    """How many times the job's records say it requeued for `why`."""
    try:
        return sum(line.startswith(why + " ") for line in path.read_text(encoding="utf-8").splitlines())
    except OSError:
        return 0


def take_lock(checkpoints: Path, job: str, job_state: Callable[[str], str]) -> tuple[str, str] | None:
    """One writer per run: the lock under the checkpoints path (a directory: mkdir is atomic, on shared filesystems
    too) names the job that trains the run. Taken (or this job's own, from an earlier attempt): None. Held by a job
    alive: (that job, its state). A dead job's lock is taken over."""
    lock = ckpt.lock_dir(checkpoints)
    checkpoints.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            pass
        holder = ckpt.lock_holder(checkpoints)
        if not holder:
            time.sleep(1)  # being written by the job that just made it
            holder = ckpt.lock_holder(checkpoints)
        if holder == job:
            break
        state = job_state(holder or "0")
        if state in P.LIVE_STATES:  # a holder alive: its lock stands
            return holder, state
        stale = lock.with_name(f"{lock.name}.stale.{job}")
        try:
            lock.rename(stale)
        except OSError:
            continue  # another job took it over first: look again
        for child in stale.iterdir():
            child.unlink()
        stale.rmdir()
    ckpt.hold_lock(checkpoints, job)
    return None
