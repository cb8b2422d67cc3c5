"""nanotron's `latest.txt` pointer to a run's newest checkpoint, written once per filesystem, atomically and durably
(`write_pointer`), while nanotron's own writes of it (and every rank's but the first of `model_config.json`) are
dropped (`pointer_writes_dropped`): nanotron 0.4 rewrites it from every rank with a truncating open as soon as
that rank is done, so a reader could see it empty, or naming a checkpoint other ranks are still writing."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from launcher import atomic
from launcher import protocol as P

POINTER = P.NANOTRON_POINTER  # nanotron's pointer to the newest checkpoint, in checkpoints_path


def write_pointer(checkpoints_path: Path, step: int) -> None:
    """Make `<checkpoints_path>/latest.txt` say `step`, atomically and durably: readers see the old pointer or the
    new one, never a partial one, and a crash after this returns cannot lose it."""
    atomic.replace(Path(checkpoints_path) / POINTER, str(step), durable=True)  # nanotron's format: no newline


@contextlib.contextmanager
def pointer_writes_dropped(module: ModuleType, is_main: bool = True) -> Iterator[None]:
    """While active, `open(<dir>/latest.txt, "w")` called from `module`'s functions writes into nothing (a
    discarded buffer), and so does `open(<step>/model_config.json, "w")` on every rank but the first (nanotron
    has every rank write it: 32,000 writers of one file at 4,000 nodes); every other `open` there is the builtin.
    `module` is nanotron.trainer, whose save_checkpoint writes both so; nothing else changes in it."""
    dropped = {POINTER} if is_main else {POINTER, "model_config.json"}

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and Path(file).name in dropped and "w" in mode:
            return contextlib.nullcontext(io.StringIO())
        return builtins.open(file, mode, *args, **kwargs)

    missing = object()
    previous = vars(module).get("open", missing)
    module.open = guarded_open  # type: ignore[attr-defined]  # a module global shadows the builtin
    try:
        yield
    finally:
        if previous is missing:
            del module.open  # type: ignore[attr-defined]
        else:
            module.open = previous  # type: ignore[attr-defined]
