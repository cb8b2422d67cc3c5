"""JSON-lines records, the house's one reader and one appender: one JSON object a line, appended whole in one write
(the lines of two writers never interleave, O_APPEND), read back in order with a line a kill cut short skipped.
Standard library only (the ground floor: the launcher, the supervisor and training append and read through here)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path


def append(path: Path | str, row: Mapping[str, object]) -> None:
    """`row` as one line at the end of `path` (created where absent), in one write."""
    line = (json.dumps(row, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: Path | str) -> list[dict]:
    """Every object of `path`, in order; [] where there is no such file. A line that is not a JSON object (cut by a
    kill mid-write) is skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
