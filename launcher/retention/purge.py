"""The purge: what retention (launcher/node/retention.py) judges removable, removed safely, by the job's one writer
(the holder of the run's lock), after each new complete checkpoint; and the records of it (docs/checkpoints.md).

Before anything goes, the resume points (the pointer's step, the newest complete one) are flushed to disk: a crash
after a purge finds them whole. A step goes in two moves: renamed out of the steps' names
(`.purging-<step>-<random>`, atomic, made durable), then deleted. A kill between or during them never leaves a step
that looks complete, nor one half deleted under its own name; what it leaves is deleted by the next purge. A reader
that took its lease as the step was judged wins: the step is renamed back.

`Retention` is the supervisor's side: `poll` between the step's polls (one stat a pointer every LOOK_EVERY_S while
nothing changes; a look and a purge in a thread once a pointer moves or the folder changes, at once where the step
has ended), `on_checkpoint` for a new complete checkpoint. The bundle's record (protocol.CHECKPOINTS_RECORD) gets a
line per checkpoint seen (its bytes) and a line per purge (what went, its bytes, why). Standard library only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher import atomic
from launcher import checkpoint_layout as layout
from launcher import protocol as P
from launcher.retention.rules import Rules, judge

LOOK_EVERY_S = 2.0  # while the step runs: how often the pointers are looked at (one stat each)
LIVE_STATES = frozenset("PENDING RUNNING SUSPENDED REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING SIGNALING CONFIGURING "
                        "COMPLETING STAGE_OUT SPECIAL_EXIT".split())  # fmt: skip
JobStates = Callable[[Iterable[str]], Mapping[str, bool | None]]  # job ids -> alive (None: Slurm cannot say)


def squeue_alive(jobs: Iterable[str]) -> dict[str, bool | None]:
    """Whether each job is alive, by one `squeue` for them all; None for each where squeue does not answer."""
    wanted = sorted(set(jobs))
    if not wanted:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-j", ",".join(wanted), "-o", "%i %T"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return dict.fromkeys(wanted)
    if out.returncode != 0:
        gone = "Invalid job id" in out.stderr
        return {job: (False if gone else None) for job in wanted}
    rows = [line.split() for line in out.stdout.splitlines()]
    live = {words[0] for words in rows if len(words) == 2 and words[1] in LIVE_STATES}
    return {job: job in live for job in wanted}


def lock_holder(root: Path) -> str:
    try:
        return (root / P.LOCK / P.LOCK_HOLDER).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def readers(folder: layout.Folder, job_states: JobStates, drop_stale: bool = True) -> dict[int, str]:
    """step -> who reads it, by the leases that hold; a lease whose holder is gone is dropped (`drop_stale`)."""
    states = job_states(lease.job for lease in folder.leases if lease.job) if folder.leases else {}
    held: dict[int, str] = {}
    for lease in folder.leases:
        if layout.lease_holds(lease, lambda job: states.get(job)):
            held[lease.step] = f"{lease.reader} ({lease.holder})"
        elif drop_stale:
            layout.drop_lease(lease)
    return held


def _read_now(root: Path, step: int, job_states: JobStates) -> bool:
    """Whether a lease that holds names `step` now."""
    found = [lease for lease in layout.leases(root) if lease.step == step]
    states = job_states(lease.job for lease in found if lease.job) if found else {}
    return any(layout.lease_holds(lease, lambda job: states.get(job)) for lease in found)


def make_durable(path: Path) -> None:
    """Every file and folder under `path` flushed to disk (cheap where the engine fsynced them already)."""
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        atomic.fsync_dir(Path(folder))


def remove_aside(path: Path) -> None:
    """Delete what was renamed out of the steps' names (a kill here leaves it for the next purge)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass
class Purge:
    """One purge: what went (step, bytes, why), what was renamed back for a reader, what stayed, and how long."""

    removed: list[dict] = field(default_factory=list)
    leftovers: list[dict] = field(default_factory=list)  # what interrupted purges left
    restored: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    refused: str = ""  # why nothing was looked at (another job holds the lock)
    seconds: float = 0.0

    @property
    def freed(self) -> int:
        return sum(r["bytes"] for r in self.removed + self.leftovers)


def purge(root: Path, rules: Rules, job: str, job_states: JobStates = squeue_alive) -> Purge:
    """Remove what `rules` judge removable in `root`; only by `job`, the holder of the run's lock ("": no check)."""
    started = time.monotonic()
    done = Purge()
    holder = lock_holder(root)
    if job and holder != job:
        done.refused = f"the run's lock ({root / P.LOCK}) names job {holder or 'none'}, not this job ({job})"
        return done
    folder = layout.look(root)
    plan = judge(folder, rules, readers(folder, job_states))
    if plan.removed:  # the resume points on disk before anything older goes (nanotron fsyncs none of its files)
        newest = max(folder.complete, default=None)
        for step in {s for s in (folder.pointer, newest) if s is not None and s in folder.complete}:
            make_durable(layout.step_dir(root, step))
    for judged in plan.removed:
        source = Path(judged.path) if judged.path else root / str(judged.step)
        size = layout.size_of(source)
        aside = root / f"{P.PURGING}{judged.step}-{secrets.token_hex(4)}"
        try:
            os.rename(source, aside)
        except OSError:
            continue  # gone meanwhile
        atomic.fsync_dir(root)
        if judged.complete and _read_now(root, judged.step, job_states):  # a lease taken as it was judged
            os.rename(aside, source)
            done.restored.append(judged.step)
            continue
        remove_aside(aside)
        done.removed.append({"step": judged.step, "bytes": size, "why": judged.remove,
                             **({} if judged.complete else {"partial": source.name})})  # fmt: skip
    for left in map(Path, plan.leftovers):
        size = layout.size_of(left)
        remove_aside(left)
        done.leftovers.append({"path": left.name, "bytes": size, "why": "left by an interrupted purge"})
    done.kept = [j.step for j in plan.steps if j.kept and j.complete]
    done.seconds = time.monotonic() - started
    return done


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def say_line(name: str, **fields: object) -> None:
    """A contract line in the job's log, whole."""
    sys.stdout.write(P.line(name, None, **fields) + "\n")
    sys.stdout.flush()


def read_record(path: Path) -> list[dict]:
    """The record's lines (a line cut by a kill is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class Retention:
    """The supervisor's retention: `poll` between the step's polls, `on_checkpoint` once a checkpoint is complete."""

    def __init__(self, rules: Rules, root: Path, job: str, say: Callable[..., None] | None = None,
                 job_states: JobStates = squeue_alive, clock: Callable[[], float] | None = None) -> None:  # fmt: skip
        self.rules, self.root, self.job = rules, root, job
        self.say, self.job_states, self.clock = say or say_line, job_states, clock or time.monotonic
        self.record = Path(rules.record) if rules.record else None
        self.stamp: tuple | None = None
        self.next_look = float("-inf")
        self.thread: threading.Thread | None = None
        self.known: set[int] | None = None  # the steps the record has (seen, or found before the run's first save)
        self.refused = False
        self.stepping = False  # the last poll came while the step ran

    def _stamp(self) -> tuple:
        try:
            folder = os.stat(self.root).st_mtime_ns
        except OSError:
            folder = None
        return (*layout.pointer_stamp(self.root), folder)

    def poll(self, wait: bool = False) -> None:
        """Between the step's polls: where a pointer moved or the folder changed since the last look (looked at every
        LOOK_EVERY_S), the new checkpoints recorded and a purge: in a thread while the step runs, at once (after
        one in flight) where `wait` (the step has ended). Nothing where no rule is set."""
        if not self.rules.active:
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
            self.on_checkpoint()
        else:
            self.thread = threading.Thread(target=self.on_checkpoint, daemon=True, name="retention")
            self.thread.start()

    def on_checkpoint(self, step: int | None = None) -> Purge | None:
        """A new complete checkpoint (`step`, where the caller knows it), or the attempt's end: what is new recorded,
        then a purge (its line in the log and the record). A failure is said, never raised: retention never ends
        an attempt."""
        try:
            return self._on_checkpoint()
        except Exception as e:  # noqa: BLE001  a bug here must not end training: its traceback, and the line
            traceback.print_exc()
            self.say("retention_failed", error=f"{type(e).__name__}: {e}".splitlines()[0])
            return None

    def _on_checkpoint(self) -> Purge | None:
        self._note_new()
        before = self._stamp()
        done = purge(self.root, self.rules, self.job, self.job_states)
        after = self._stamp()
        if after[:-1] == before[:-1] and self.stamp == before:  # only the folder changed (by this purge's renames)
            self.stamp = after
        if done.refused:
            if not self.refused:
                self.say("retention_refused", why=done.refused)
                self.refused = True
            return done
        if done.removed or done.leftovers or done.restored:
            self._write({"event": "purge", "rules": self.rules.describe(), **asdict(done), "freed": done.freed})
            steps = ", ".join(str(r["step"]) for r in done.removed) or "none"
            if done.leftovers:
                steps += f" and what an interrupted purge left ({', '.join(r['path'] for r in done.leftovers)})"
            self.say("purged", steps=steps, freed=gigabytes(done.freed), seconds=f"{done.seconds:.2f}",
                     kept=", ".join(map(str, done.kept)) or "none", rules=self.rules.describe())  # fmt: skip
        return done

    def _note_new(self) -> None:
        """Each complete step not yet in the record, as saved (its bytes); at the run's first look, those already
        there as found (saved before this run: not its bytes)."""
        if self.known is None:
            rows = read_record(self.record) if self.record else []
            self.known = {int(s) for r in rows for s in ([r["step"]] if "step" in r else r.get("steps", []))
                          if r.get("event") in ("saved", "found")}  # fmt: skip
            if not rows:
                found = sorted(layout.complete_steps(self.root))
                self._write({"event": "found", "steps": found})
                self.known.update(found)
        for step, engine in sorted(layout.complete_steps(self.root).items()):
            if step not in self.known:
                self.known.add(step)
                size = layout.size_of(layout.step_dir(self.root, step))
                self._write({"event": "saved", "step": step, "bytes": size, "engine": engine})

    def _write(self, row: dict) -> None:
        if self.record is None:
            return
        line = json.dumps({**row, "time": round(time.time(), 3), "job": self.job}) + "\n"
        with open(self.record, "a", encoding="utf-8") as f:
            f.write(line)
