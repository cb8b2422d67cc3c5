"""Reading a job's log without loading it: a multi-GB log (thousands of ranks, a day of steps) is read from its
end, a bounded number of bytes, in lines of bounded length."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

TAIL_BYTES = 64 * 1024 * 1024  # what triage reads of a log at most: its last attempt's end is there
CHUNK = 1024 * 1024


def tail_lines(path: Path, max_bytes: int = TAIL_BYTES, line_chars: int = 4096) -> Iterator[str]:
    """The lines of the last `max_bytes` of a file (from the first whole line there), each at most `line_chars`
    characters at a time; memory: one chunk. OSError when it cannot be opened."""
    with open(path, "rb") as raw:
        size = raw.seek(0, io.SEEK_END)
        start = max(0, size - max_bytes)
        raw.seek(max(0, start - 1))
        if start and raw.read(1) != b"\n":  # inside a line: from the next one (read a chunk at a time)
            while (piece := raw.readline(CHUNK)) and not piece.endswith(b"\n"):
                pass
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        yield from iter(lambda: text.readline(line_chars), "")
