"""Where a run writes, checked before the queue (the cluster's checks): every output directory can be created and
written, and the checkpoints' filesystem has room for a checkpoint.

A checkpoints path nobody can write, or a disk without room for one checkpoint, stops a job at its first save:
after the queue and `--save_interval` steps of training. The bundle's own directories would stop the launcher
with an OSError. Both are problems now, named with the flag.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launcher.perf.sizes import MIN_BYTES_PER_PARAMETER, human_bytes
from launcher.problems import Problem


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
