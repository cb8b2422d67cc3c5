"""Follow a job to its real end: its state and reason while pending, its log from the first byte as it grows,
across requeues, until a terminal state. No busy loop: the log is polled every `tick` seconds (a stat), the
controller every `state_every` seconds, backing off while nothing changes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from launcher.errors import LauncherError
from launcher.slurm import client
from launcher.slurm.parse import JobState

CHUNK = 1024 * 1024


@dataclass
class LogTail:
    """Copies what is appended to a file, from its first byte, to `out`."""

    path: Path
    out: BinaryIO
    offset: int = 0

    def pump(self) -> int:
        """Copy new bytes, a chunk at a time (attaching to a 2 GiB log holds 1 MiB, not 2 GiB); return how many."""
        copied = 0
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while data := f.read(CHUNK):
                    self.out.write(data)
                    self.offset += len(data)
                    copied += len(data)
        except FileNotFoundError:
            return copied
        if copied:
            self.out.flush()
        return copied


def describe(state: JobState) -> str:
    text = f"job {state.job_id} {state.state}"
    if state.state == "PENDING" and state.reason not in ("None", ""):
        text += f" (reason: {state.reason}" + (f", waiting for {state.dependency})" if state.dependency else ")")
    if state.state == "RUNNING" and state.nodes:
        text += f" on {state.nodes}"
    if state.restarts:
        text += f", requeued {state.restarts}x"
    return text


def follow(
    job_id: str,
    log: Path,
    *,
    out: BinaryIO | None = None,
    say: Callable[[str], None] | None = None,
    tick: float = 0.25,
    state_every: float = 1.0,
    max_state_every: float = 5.0,
) -> JobState:
    """Stream the job's log and report state changes until the job ends; return its final state."""
    out = out or sys.stdout.buffer
    say = say or (lambda text: print(f"[follow] {text}", file=sys.stderr, flush=True))
    tail = LogTail(log, out)
    last_text, state, interval, next_poll = "", None, state_every, 0.0
    while True:
        grew = tail.pump()
        now = time.monotonic()
        if now >= next_poll:
            state = client.job_state(job_id)
            if state is None:
                raise LauncherError(f"Slurm no longer knows job {job_id} and has no accounting record")
            text = describe(state)
            if text != last_text:
                say(text)
                last_text, interval = text, state_every
            elif state.state == "PENDING":
                interval = min(interval * 1.5, max_state_every)  # back off while nothing happens
            if state.terminal:
                break
            next_poll = now + interval
        if not grew:
            time.sleep(tick)
    settle = time.monotonic() + 1.0  # the last lines may land just after the state changes
    while time.monotonic() < settle:
        if not tail.pump():
            time.sleep(tick)
    return state
