"""What follows each complete checkpoint, run by the attempt between the step's polls: the eval submissions
(--eval_tasks, launcher/evals/submit.py), then retention's purge (--keep_last/--keep_every,
launcher/retention/purge.py), one after the other in one thread of their own while the step runs (training never
waits for them), at once where the step has ended. Whether a step may be removed while an eval is owed it is the
judgement's rule (launcher/retention/rules.py), not this order's: the order only saves a look.

One look at the folder every LOOK_EVERY_S while the step runs (a stat a pointer and one of the folder); the work only
where one of them moved since the last look, and always at the first look after the step ended."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from launcher import checkpoint_layout as ckpt

LOOK_EVERY_S = 2.0  # while the step runs: how often the pointers and the folder are looked at


class AfterCheckpoints:
    """`poll` between the step's polls: `work` (each a callable that never raises) where the folder moved."""

    def __init__(self, root: Path, work: Sequence[Callable[[], object]],
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.root, self.work, self.clock = root, list(work), clock
        self.stamp: tuple | None = None
        self.next_look = float("-inf")
        self.thread: threading.Thread | None = None
        self.stepping = False  # the last poll came while the step ran

    def _stamp(self) -> tuple:
        try:
            folder = os.stat(self.root).st_mtime_ns
        except OSError:
            folder = None
        return (*ckpt.pointer_stamp(self.root), folder)

    def poll(self, wait: bool = False) -> None:
        """Between the step's polls: where a pointer moved or the folder changed since the last look, the work, in a
        thread while the step runs; at once (after the one in flight) where `wait` (the step has ended)."""
        if not self.work:
            return
        if self.thread is not None and self.thread.is_alive():
            if not wait:
                return
            self.thread.join()
        ended, self.stepping = wait and self.stepping, not wait  # the first poll after the step ended looks anyway
        now = self.clock()
        if not wait and now < self.next_look:
            return
        self.next_look = now + LOOK_EVERY_S
        stamp = self._stamp()
        if stamp == self.stamp and not ended:
            return
        self.stamp = stamp
        if wait:
            self.run()
        else:
            self.thread = threading.Thread(target=self.run, daemon=True, name="after-checkpoints")
            self.thread.start()

    def run(self) -> None:
        """Each follower once, in order; the folder as they leave it is the next look's starting point (a purge's
        own renames start no second look)."""
        before = self._stamp()
        for work in self.work:
            work()
        after = self._stamp()
        if after[:-1] == before[:-1] and self.stamp == before:  # only the folder moved, by this work's renames
            self.stamp = after
