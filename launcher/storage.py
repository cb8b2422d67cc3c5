"""Where a run writes, checked before the queue: every output directory can be created and written, and the
checkpoints' filesystem has room for a checkpoint.

A checkpoints path nobody can write, or a disk without room for one checkpoint, stops a job at its first save:
after the queue and `--save_interval` steps of training. The bundle's own directories would stop the launcher
with an OSError. Both are problems now, named with the flag.

Checkpoint sizes: nanotron 0.4 writes bf16 weights, their fp32 master copies and AdamW's two fp32 moments
(14 bytes a parameter); the torch engine fp32 weights and the moments (12). Neither prunes old checkpoints.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from launcher.problems import Problem

BYTES_PER_PARAMETER = 14  # nanotron's checkpoint: what the summary plans with
MIN_BYTES_PER_PARAMETER = 12  # what either engine writes at least: what a refusal is based on


def nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (what a `mkdir -p` of `path` starts from)."""
    while not path.exists() and path != path.parent:
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


@dataclass(frozen=True)
class CheckpointPlan:
    """How much a run's checkpoints take, against the room their filesystem has now."""

    bytes_each: int
    count: int  # saves over the whole run (interval saves, the final one, the initial state)
    free: int | None  # bytes free where the checkpoints go; None when it cannot be read

    @property
    def total(self) -> int:
        return self.bytes_each * self.count


def checkpoint_plan(
    parameters: int, train_steps: int, save_interval: int, save_initial_state: bool, directory: str
) -> CheckpointPlan:
    if save_interval > 0:  # every interval, and the last step when it is not one
        count = train_steps // save_interval + int(train_steps % save_interval != 0)
    else:
        count = 1
    count += int(save_initial_state)
    try:
        free: int | None = shutil.disk_usage(nearest_existing(Path(directory))).free
    except OSError:
        free = None
    return CheckpointPlan(parameters * BYTES_PER_PARAMETER, count, free)


def space_problems(plan: CheckpointPlan, parameters: int, directory: str) -> list[Problem]:
    """A problem when not even one checkpoint fits where the checkpoints go."""
    least = parameters * MIN_BYTES_PER_PARAMETER
    if plan.free is None or plan.free >= least:
        return []
    return [
        Problem(
            "checkpoints_path",
            f"{human_bytes(plan.free)} free where {directory} lies, less than one checkpoint of this model "
            f"(at least {human_bytes(least)})",
            "make room, or give a --checkpoints_path on a larger filesystem",
        )
    ]


def human_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{max(0, 2 - int(math.log10(n / scale)))}f} {unit}"
    return f"{int(n)} B"
