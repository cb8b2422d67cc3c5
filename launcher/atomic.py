"""Files replaced whole: a reader sees the old file or the new one, never part of one. Standard library only, so
that the launcher and the job share it (manifests, pointers, the outcome and progress files, caches).

The new text goes to a temporary file beside the target (`.tmp-HOST-PID-TOKEN-NAME`: writers on other nodes of a
shared filesystem use other names; leftovers of a kill start with `.tmp-`), which is renamed over the target.
`durable` also flushes the file and the directory entry to disk, so a crash after the call cannot lose it.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Content = str | bytes | Callable[[BinaryIO], object]


def temporary_name(path: Path) -> Path:
    return path.with_name(f".tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}-{path.name}")


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (the directory entry itself reaches the disk)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(path: Path, content: Content, durable: bool = False) -> None:
    """Replace `path` with `content` (text, bytes, or a function that writes into the open binary file), whole."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dir(path.parent)
