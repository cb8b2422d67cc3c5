"""Follow jobs to their real end (their state; while pending, Slurm's reason and its estimate of the start, the one
`squeue --start` prints, read in the same query; the log from the first byte as it grows, across requeues, until a
terminal state) at a rate of controller queries sites allow (docs/running.md):

- a running job: one query every `quiet` seconds while nothing changes (LAUNCHER_POLL_SECONDS, default 30);
- the job's own log says when an attempt starts and ends (the batch script's `[launcher ...] job N attempt K
  started|ended` lines): such a line brings the next query forward to `soon` seconds after it; while Slurm still
  shows the attempt that ended, it is asked again after 1, 2, 4, ... s, up to `quiet`;
- a pending job: a first look soon after submission (the scheduler has not given its reason yet), then every
  `quiet` seconds, backing off x1.5 up to 4 x `quiet` the longer it waits;
- many jobs (a sweep): one query for all of them (`client.job_states_many`), when the first of them is due.

The logs are read every `tick` seconds: a read of a file, no controller query.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from launcher import protocol as P
from launcher.errors import LauncherError
from launcher.problems import Problem
from launcher.slurm import client
from launcher.slurm.parse import JobState

POLL_ENV = "LAUNCHER_POLL_SECONDS"
# The batch script's lines at an attempt's start and end (the contract's formats, as sbatch.sh.j2 prints them)
ATTEMPT_LINES = (("started", P.pattern("attempt_started", whole=False)), ("ended", P.pattern("attempt_ended")))
START = P.LINE_START.encode()
ENDING = frozenset({"COMPLETING", "SIGNALING", "STAGE_OUT", "REQUEUED"})  # on the way to an end or a requeue
CHUNK, KEEP = 1 << 20, 4096  # bytes read at a time; bytes of an unfinished line kept (an attempt line's start)
PUMP_CHUNKS = 64  # at most 64 MiB copied between two looks at the controller's clock (a 2 GiB log: ~32 ticks)


@dataclass(frozen=True)
class Cadence:
    """How often the controller is asked (seconds); see the module's docstring."""

    quiet: float = 30.0
    soon: float = 0.5
    first_look: float = 5.0
    tick: float = 0.25

    @property
    def pending_max(self) -> float:
        return 4 * self.quiet

    @classmethod
    def from_env(cls) -> Cadence:
        """The default cadence, `quiet` from LAUNCHER_POLL_SECONDS where set (a site's rule: e.g. 120)."""
        text = os.environ.get(POLL_ENV, "").strip()
        if not text:
            return cls()
        problem = poll_problem(text)
        if problem:
            raise LauncherError(f"{problem.message}: {problem.fix}")
        return cls(quiet=float(text), first_look=min(5.0, float(text)))

    def next_wait(self, watched: Watched, state: JobState, changed: bool) -> float:
        """Seconds until the next query about a job that has not ended, given what the last one said."""
        ended = watched.mark is not None and watched.mark[1] == "ended" and watched.mark[0] >= state.restarts + 1
        if ended or state.state in ENDING:  # the log says this attempt ended, or Slurm says it is ending
            return min(max(2 * watched.wait, 2 * self.soon), self.quiet)
        if state.state == "RUNNING":
            return self.quiet
        if changed:  # pending (or held, suspended, ...): a first look until the scheduler has given its reason
            return self.first_look if state.reason in ("None", "") else self.quiet
        return min(max(self.quiet, watched.wait * 1.5), self.pending_max)


def poll_problem(text: str) -> Problem | None:
    """What is wrong with a LAUNCHER_POLL_SECONDS value (it governs --show_logs and `launcher.jobs attach`)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if 1 <= seconds <= 86400:
        return None
    return Problem(
        "show_logs",
        f"{POLL_ENV}={text!r} is not a number of seconds from 1 to 86400",
        f"set {POLL_ENV} to the seconds between controller queries your site allows (default 30), or unset it",
    )


def env_problems() -> list[Problem]:
    """The follower's settings from the environment, checked before a job is submitted."""
    text = os.environ.get(POLL_ENV, "").strip()
    problem = poll_problem(text) if text else None
    return [problem] if problem else []


@dataclass
class LogTail:
    """Copies what is appended to a file, from its first byte, to `out` (None: copies nothing), and finds the
    batch script's attempt lines in it."""

    path: Path
    out: BinaryIO | None
    offset: int = 0
    line: bytes = b""  # the start of the last, unfinished line

    def pump(self) -> tuple[int, list[tuple[int, str]]]:
        """Copy new bytes, a chunk at a time up to PUMP_CHUNKS of them (attaching to a 2 GiB log holds 1 MiB, not
        2 GiB); return how many, and the (attempt, "started" | "ended") lines among them."""
        copied, marks = 0, []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                for _ in range(PUMP_CHUNKS):
                    if not (data := f.read(CHUNK)):
                        break
                    if self.out is not None:
                        self.out.write(data)
                    self.offset += len(data)
                    copied += len(data)
                    text = self.line + data
                    done = text.rfind(b"\n") + 1
                    self.line = text[done:][:KEEP]
                    marks += attempt_marks(text[:done]) if START in text[:done] else []
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            pass
        if copied and self.out is not None:
            self.out.flush()
        return copied, marks


def attempt_marks(lines: bytes) -> list[tuple[int, str]]:
    """The batch script's attempt lines among whole lines: (attempt, "started" | "ended"), in order."""
    marks = []
    for raw in lines.split(b"\n"):
        if raw.startswith(START):
            line = raw.decode("utf-8", "replace")
            marks += [(int(m["attempt"]), word) for word, pattern in ATTEMPT_LINES if (m := pattern.match(line))]
    return marks


@dataclass
class Watched:
    """A job being followed: its log, what was last said of it, and when the controller is next asked."""

    job_id: str
    tail: LogTail
    label: str = ""  # how the job is named when its state is said ("" for a lone job)
    said: str = ""
    mark: tuple[int, str] | None = None  # the log's last attempt line
    wait: float = 0.0
    due: float = 0.0
    state: JobState | None = field(default=None, repr=False)


# Slurm 26.05's topology rejections, where earlier releases said "Resources" (squeue spells them with spaces, scontrol
# with underscores): a pending job's reason followed by TOPOLOGY_WAIT
TOPOLOGY_REASONS = (
    "no suitable topology unit found", "insufficient resources in topology unit", "no available nodes in topology",
    "required nodes lack available resources", "required nodes do not fit topology",
    "exceeded maximum node limit during topology allocation",
    "weight-based selection could not satisfy request within topology unit",
)  # fmt: skip
TOPOLOGY_WAIT = (
    "no block of the cluster's network topology has enough free nodes for it now (Slurm before 26.05 says "
    "Resources); if it never starts, ask for no more nodes than a block holds (`scontrol show topology`)"
)


def reason_said(reason: str) -> str:
    """A pending job's reason as the follower says it: Slurm's word, and what a topology rejection means."""
    words = reason.replace("_", " ").lower()
    return f"{reason}: {TOPOLOGY_WAIT}" if words.startswith(TOPOLOGY_REASONS) else reason


def describe(state: JobState) -> str:
    """The job's state in one line; a pending job's with Slurm's reason and its estimate of the start."""
    text = f"job {state.job_id} {state.state}"
    if state.state == "PENDING":
        why = [f"reason: {reason_said(state.reason)}"] if state.reason not in ("None", "") else []
        why += [f"waiting for {state.dependency}"] if state.dependency else []
        why += [f"Slurm expects it to start at {state.start.replace('T', ' ')}"] if state.start else []
        text += f" ({', '.join(why)})" if why else ""
    if state.state == "RUNNING" and state.nodes:
        text += f" on {state.nodes}"
    if state.restarts:
        text += f", requeued {state.restarts}x"
    return text


Query = Callable[[list[str]], dict[str, JobState]]


def one_by_one(job_ids: list[str]) -> dict[str, JobState]:
    """`scontrol show job` for each job (for a lone job: the cheapest query, two RPCs)."""
    return {job_id: state for job_id in job_ids if (state := client.job_state(job_id)) is not None}


def watch(
    jobs: list[Watched],
    say: Callable[[Watched, str], None],
    *,
    query: Query | None = None,
    cadence: Cadence | None = None,
    on_end: Callable[[Watched, JobState], None] | None = None,
) -> dict[str, JobState]:
    """Follow the jobs until all have ended: pump their logs, ask the controller when the first is due (`query`,
    about all that have not ended at once; `client.job_states_many` unless given), `say` each change, `on_end`
    each end; return their final states."""
    cadence, query = cadence or Cadence.from_env(), query or client.job_states_many
    finals: dict[str, JobState] = {}
    while live := [w for w in jobs if w.job_id not in finals]:
        now, grew = time.monotonic(), False
        for w in live:
            count, marks = w.tail.pump()
            grew = grew or count > 0
            if marks:
                w.mark = marks[-1]
                if w.due > now + cadence.soon:
                    w.due, w.wait = now + cadence.soon, cadence.soon
        if min(w.due for w in live) <= now:
            states = query([w.job_id for w in live])
            now = time.monotonic()
            for w in live:
                state = states.get(w.job_id)
                if state is None:
                    named = f" ({w.label})" if w.label else ""
                    raise LauncherError(f"Slurm no longer knows job {w.job_id}{named} and has no accounting record")
                text = describe(state)
                changed, w.said, w.state = text != w.said, text, state
                if changed:
                    say(w, text)
                if not state.terminal:
                    w.wait = cadence.next_wait(w, state, changed)
                    w.due = now + w.wait
                    continue
                finals[w.job_id] = state
                if on_end is not None:
                    on_end(w, state)
        elif not grew:
            time.sleep(cadence.tick)
    return finals


def follow(
    job_id: str,
    log: Path,
    *,
    out: BinaryIO | None = None,
    say: Callable[[str], None] | None = None,
    cadence: Cadence | None = None,
) -> JobState:
    """Stream the job's log and report state changes until the job ends; return its final state."""
    out = out or sys.stdout.buffer
    tell = say or (lambda text: print(f"[follow] {text}", file=sys.stderr, flush=True))
    cadence = cadence or Cadence.from_env()
    watched = Watched(job_id, LogTail(log, out))
    final = watch([watched], lambda _, text: tell(text), query=one_by_one, cadence=cadence)[job_id]
    settle = time.monotonic() + 1.0  # the last lines may land just after the state changes
    while time.monotonic() < settle:
        if not watched.tail.pump()[0]:
            time.sleep(cadence.tick)
    return final
