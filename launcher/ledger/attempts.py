"""A run's attempts as the job itself records them: the batch script's lines in the job's log (each attempt's start and
end, to the second, why it requeued, and each restart of training inside its allocation) and training's (the
checkpoint it resumed from, one saved on a notice), and the steps in metrics.jsonl (each with its time). An attempt
that restarted training in its allocation is split at each restart: its parts (segments) are the ledger's rows. The
ledger's source where Slurm keeps no accounting, and what its steps are measured by where it does. Reads the log line
by line: bounded memory whatever its size.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

from launcher import jsonl
from launcher import protocol as P
from launcher.ledger.breakdown import COMPLETED, Attempt, Work

STARTED, ENDED = P.pattern("attempt_started", whole=False), P.pattern("attempt_ended")
RESUMED = re.compile("^" + re.escape(P.RESUMED_LINE[: P.RESUMED_LINE.index("{")]) + r"(?P<step>\d+) ")
SAVED_AT = P.LINES["requeue_preemption"][: P.LINES["requeue_preemption"].index("{")]  # in STOP_MESSAGE too
SAVED = re.compile(re.escape(SAVED_AT) + r"(?P<step>\d+)")
CAUSES = (  # the batch script's lines -> why an attempt ended (the first that matches wins)
    (P.pattern("requeue_preemption", whole=False), "preemption"),
    (P.pattern("requeue_time_limit", whole=False), "time limit"),
    (P.pattern("hung", whole=False), "hang"),
    (P.pattern("node_check_failed", whole=False), "node check"),
    (P.pattern("preemption", whole=False), "preemption"),
)
TERMINATED = P.pattern("terminated", whole=False)
REQUEUED_WITHOUT = P.pattern("requeue_without")  # no healthy nodes left: requeued, after what
RESTARTED = P.pattern("restart")
RESTART_CAUSES = (("a node failure", "node failure"), ("a hang", "hang"), ("a failed node check", "node check"),
                  ("a failure", "failure"))  # the restart line's why -> the ledger's cause  # fmt: skip
FINAL = {  # Slurm's final state -> why the last attempt ended
    "COMPLETED": COMPLETED, "FAILED": "failure", "OUT_OF_MEMORY": "failure", "CANCELLED": "cancel",
    "TIMEOUT": "time limit", "DEADLINE": "time limit", "NODE_FAIL": "node failure", "PREEMPTED": "preemption",
    "BOOT_FAIL": "node failure", "REQUEUED": "requeue",
}  # fmt: skip


class _Segment:
    """One node step of an attempt: from the attempt's start, or a restart in its allocation."""

    def __init__(self, start: float, cause: str | None = None, excised: int = 0) -> None:
        self.start = start
        self.cause = cause  # why the step before it ended (None for the attempt's first)
        self.excised = excised  # nodes that left the allocation before it (node failures)
        self.resumed_from: int | None = None
        self.saved: int | None = None


class _Seen:
    """What the log says of one attempt."""

    def __init__(self, start: float) -> None:
        self.start, self.last_seen = start, start
        self.end: float | None = None
        self.code: int | None = None
        self.cause: str | None = None
        self.terminated = False  # a termination signal reached the batch script (cancel, time limit, grace's end)
        self.segments = [_Segment(start)]

    @property
    def resumed_from(self) -> int | None:
        return self.segments[0].resumed_from

    @property
    def saved(self) -> int | None:
        return self.segments[-1].saved


def restart_cause(said: str) -> str:
    """The ledger's cause for a restart line's `why`."""
    return next((cause for start, cause in RESTART_CAUSES if said.startswith(start)), "failure")


def _clock(when: float, clock: str) -> float:
    """A `[launcher HH:MM:SS.mmm]` stamp as unix time: the first such moment at or after `when` - 1 s."""
    day = datetime.fromtimestamp(when).astimezone()
    hh, mm, ss = clock.split(":")
    at = day.replace(hour=int(hh), minute=int(mm), second=0, microsecond=0) + timedelta(seconds=float(ss))
    if at.timestamp() < when - 1:
        at += timedelta(days=1)
    return at.timestamp()


def _stamp(line: str) -> str | None:
    """The HH:MM:SS.mmm of a `[launcher ...]` line, else None."""
    if not line.startswith(P.LINE_START):
        return None
    end = line.find("] ", len(P.LINE_START))
    return line[len(P.LINE_START) : end] if end > 0 else None


def read_log(lines: Iterable[str], job_id: str) -> dict[int, _Seen]:
    """The attempts of job `job_id` the log records, by number."""
    seen: dict[int, _Seen] = {}
    current: _Seen | None = None
    for line in lines:
        clock = _stamp(line)
        if clock is not None and (m := STARTED.match(line)):
            if m["job"] != job_id:
                current = None
                continue
            when = _clock(datetime.fromisoformat(m["when"]).timestamp(), clock)  # to the millisecond
            current = seen.setdefault(int(m["attempt"]), _Seen(when))
            continue
        if current is None:
            continue
        if clock is not None:
            current.last_seen = max(current.last_seen, _clock(current.start, clock))
            if m := ENDED.match(line):
                current.end = _clock(datetime.fromisoformat(m["when"]).timestamp(), clock)
                current.code = int(m["code"]) if m["code"].isdigit() else None
            if m := RESTARTED.match(line):
                cause = restart_cause(m["why"])
                gone = len([n for n in m["left"].split(",") if n and m["left"] != "none"])
                excised = current.segments[-1].excised + (gone if cause == "node failure" else 0)
                current.segments.append(_Segment(_clock(current.start, clock), cause, excised))
                continue
            if current.cause is None and (m := REQUEUED_WITHOUT.match(line)):  # after a failure, a node's...
                current.cause = restart_cause(m["why"])
            for pattern, cause in CAUSES:
                if current.cause is None and pattern.match(line):
                    current.cause = cause
            current.terminated |= TERMINATED.match(line) is not None
        if m := RESUMED.match(line):
            current.segments[-1].resumed_from = int(m["step"])
        if m := SAVED.search(line):
            current.segments[-1].saved = int(m["step"])
    return seen


Key = tuple[int, int]  # (attempt number, segment): a node step of an attempt


def steps_by_attempt(rows: list[dict], spans: list[tuple[Key, float, float]]) -> dict[Key, list[tuple[float, int]]]:
    """metrics.jsonl's rows, each to the attempt's node step (key, start, end) it was logged in: from its start (an
    attempt's: 1 s before, its start line's date is whole seconds; a restart's: its line, written after the failed
    step's training ended) to the next one's start. Not to its end: training can outlive the batch script by
    Slurm's KillWait, and a checkpoint it saves then is one the next attempt resumes from."""
    out: dict[Key, list[tuple[float, int]]] = {n: [] for n, _, _ in spans}
    starts = [start - (1 if segment == 0 else 0) for (_, segment), start, _ in spans] + [float("inf")]
    for row in rows:
        t, step = row.get("time"), row.get("step")
        if not isinstance(t, (int, float)) or not isinstance(step, int):
            continue
        for (n, _, _), begin, until in zip(spans, starts, starts[1:], strict=False):
            if begin <= t < until:
                out[n].append((float(t), step))
                break
    return {n: sorted(v, key=lambda ts: ts[0]) for n, v in out.items()}


def works(seen: dict[int, _Seen], metrics: Path, spans: list[tuple[Key, float, float]]) -> dict[Key, Work]:
    """What training did in each node step (its steps by time within `spans`, its resume, its last save)."""
    steps = steps_by_attempt(jsonl.read(metrics) if metrics.is_file() else [], spans)
    out = {}
    for (n, k), _, _ in spans:
        segments = seen[n].segments if n in seen else []
        done = tuple(steps.get((n, k), []))
        out[(n, k)] = Work(done, segments[k].resumed_from, segments[k].saved) if k < len(segments) else Work(done)
    return out


def spans(chain: list[Attempt]) -> list[tuple[Key, float, float]]:
    """The node steps' (key, start, end), for `works`."""
    return [((a.number, a.segment), a.start, a.end) for a in chain]


def split(chain: list[Attempt], seen: dict[int, _Seen], gpus_per_node: int) -> list[Attempt]:
    """Each attempt that restarted training in its allocation, split into its node steps at the restarts: every
    part but the last ended by its restart's cause (`restarted`); a node that left the allocation (a node failure)
    no longer counts in the GPUs of the parts after it."""
    out = []
    for a in chain:
        segments = seen[a.number].segments if a.number in seen else []
        starts = [min(max(s.start, a.start), a.end) for s in segments[1:]]
        bounds = [a.start, *starts, a.end]
        for k in range(len(bounds) - 1):
            last = k == len(bounds) - 2
            ended = a.ended if last else segments[k + 1].cause or "failure"
            gpus = max(a.gpus - (segments[k].excised * gpus_per_node if segments else 0), 0)
            out.append(Attempt(a.number, bounds[k], bounds[k + 1], gpus, ended, k, restarted=not last))
    return out


def attempts(seen: dict[int, _Seen], gpus: int, final_state: str | None, now: float | None = None) -> list[Attempt]:
    """The attempts from the log alone. An attempt that was killed before it could say it ended (SIGKILL at the end
    of a grace time) ends at its last line; the last attempt of a job still running ends now."""
    out = []
    numbers = sorted(seen)
    for n in numbers:
        s = seen[n]
        last = n == numbers[-1]
        if s.end is None and last and final_state is None:
            end, ended = now if now is not None else time.time(), "running"
        else:
            end = s.end if s.end is not None else s.last_seen
            ended = cause(s, last, final_state)
        out.append(Attempt(n, s.start, end, gpus, ended))
    return out


def requeued_unasked(seen: dict[int, _Seen]) -> list[int]:
    """The attempts that ended with exit code 0, unterminated and without a requeue of the job's own, and yet had a
    next one: Slurm requeued the job by itself after it had ended well (24.11.5 does so once more when the attempt
    after a preemption past its grace time ends; docs/slurm-versions.md)."""
    numbers = sorted(seen)
    return [n for n in numbers[:-1] if seen[n].code == 0 and seen[n].cause is None and not seen[n].terminated]


def cause(seen: _Seen, last: bool, final_state: str | None) -> str:
    """Why an attempt ended, by the log (and Slurm's final state, for the last): a requeued attempt that the
    batch script did not requeue itself but that a termination signal reached was preempted (Slurm requeues a
    preempted job at the end of its grace time; a cancel or a time limit is not requeued)."""
    if last and (final_state == "COMPLETED" or seen.cause not in ("hang", "node check")):
        return FINAL.get(final_state or "", "failure")
    return seen.cause or ("preemption" if seen.terminated else "requeue")


def read_lines(log: Path) -> Iterable[str]:
    """The log's lines, one at a time (none when it is missing)."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            yield from f
    except OSError:
        return
