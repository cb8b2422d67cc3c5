"""The purge: what retention (launcher/retention/rules.py) judges removable, removed safely, by the job's one writer
(the holder of the run's lock), after each new complete checkpoint; and the records of it (docs/checkpoints.md).

Before anything goes, the resume points (the pointer's step, the newest complete one) are flushed to disk: a crash
after a purge finds them whole. A step goes in two moves: renamed out of the steps' names
(`.purging-<step>-<random>`, atomic, made durable), then deleted. A kill between or during them never leaves a step
that looks complete, nor one half deleted under its own name; what it leaves is deleted by the next purge. A reader
that took its lease as the step was judged wins: the step is renamed back.

`Retention` is the supervisor's side: `on_checkpoint` after each new complete checkpoint (the supervisor's
after-checkpoint look, launcher/node/supervisor/followers.py, right after the eval submissions) and as the attempt
ends. The bundle's record (protocol.CHECKPOINTS_RECORD) gets a line per checkpoint seen (its bytes) and a line per
purge (what went, its bytes, why). What it asks of Slurm and the deletions go through a `Slurm` (the supervisor's
Effects). Standard library only.
"""

from __future__ import annotations

import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from launcher import atomic, jsonl
from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.retention.rules import Rules, judge

Owed = Callable[[ckpt.Folder], Mapping[int, str]]  # the folder's steps that must stay (an eval owed, not in the bucket)


class Slurm(Protocol):
    """What retention does beyond the folder's renames (the supervisor's Effects have it)."""

    def say(self, name: str, **fields: object) -> None: ...
    def jobs_alive(self, jobs: Iterable[str]) -> Mapping[str, bool | None]: ...  # None: Slurm cannot say
    def remove_tree(self, path: Path) -> None: ...


def remove_tree(path: Path) -> None:
    """Delete what was renamed out of the steps' names (a kill here leaves it for the next purge)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class Unasked:
    """Retention's effects where Slurm is not asked (a purge by hand, the tests, the benchmarks): every job's state
    unknown (a reader's lease of a Slurm job holds), the deletions done here, the lines printed."""

    def say(self, name: str, **fields: object) -> None:
        print(P.line(name, None, **fields), flush=True)

    def jobs_alive(self, jobs: Iterable[str]) -> dict[str, bool | None]:
        return dict.fromkeys(jobs)

    def remove_tree(self, path: Path) -> None:
        remove_tree(path)


def readers(folder: ckpt.Folder, jobs_alive: Callable[[Iterable[str]], Mapping[str, bool | None]],
            drop_stale: bool = True) -> dict[int, str]:  # fmt: skip
    """step -> who reads it, by the leases that hold; a lease whose holder is gone is dropped (`drop_stale`)."""
    states = jobs_alive(lease.job for lease in folder.leases if lease.job) if folder.leases else {}
    held: dict[int, str] = {}
    for lease in folder.leases:
        if ckpt.lease_holds(lease, lambda job: states.get(job)):
            held[lease.step] = f"{lease.reader} ({lease.holder})"
        elif drop_stale:
            ckpt.drop_lease(lease)
    return held


def _read_now(root: Path, step: int, slurm: Slurm) -> bool:
    """Whether a lease that holds names `step` now."""
    found = [lease for lease in ckpt.leases(root) if lease.step == step]
    states = slurm.jobs_alive(lease.job for lease in found if lease.job) if found else {}
    return any(ckpt.lease_holds(lease, lambda job: states.get(job)) for lease in found)


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


def purge(root: Path, rules: Rules, job: str, slurm: Slurm | None = None, owed: Owed | None = None) -> Purge:
    """Remove what `rules` judge removable in `root`; only by `job`, the holder of the run's lock ("": no check);
    `owed`: the steps that must stay whatever the rules (owed an eval, not yet in the bucket: `rules.owed_merged`)."""
    started, slurm = time.monotonic(), slurm or Unasked()
    done = Purge()
    holder = ckpt.lock_holder(root)
    if job and holder != job:
        done.refused = f"the run's lock ({ckpt.lock_dir(root)}) names job {holder or 'none'}, not this job ({job})"
        return done
    folder = ckpt.look(root)
    plan = judge(folder, rules, readers(folder, slurm.jobs_alive), owed(folder) if owed else {})
    if plan.removed:  # the resume points on disk before anything older goes (nanotron fsyncs none of its files)
        newest = max(folder.complete, default=None)
        for step in {s for s in (folder.pointer, newest) if s is not None and s in folder.complete}:
            make_durable(ckpt.step_dir(root, step))
    for judged in plan.removed:
        source = Path(judged.path) if judged.path else root / str(judged.step)
        size = ckpt.size_of(source)
        aside = ckpt.purging_path(root, judged.step)
        try:
            os.rename(source, aside)
        except OSError:
            continue  # gone meanwhile
        atomic.fsync_dir(root)
        if judged.complete and _read_now(root, judged.step, slurm):  # a lease taken as it was judged
            os.rename(aside, source)
            done.restored.append(judged.step)
            continue
        slurm.remove_tree(aside)
        done.removed.append({"step": judged.step, "bytes": size, "why": judged.remove,
                             **({} if judged.complete else {"partial": source.name})})  # fmt: skip
    for left in map(Path, plan.leftovers):
        size = ckpt.size_of(left)
        slurm.remove_tree(left)
        done.leftovers.append({"path": left.name, "bytes": size, "why": "left by an interrupted purge"})
    done.kept = [j.step for j in plan.steps if j.kept and j.complete]
    done.seconds = time.monotonic() - started
    return done


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class Retention:
    """The supervisor's retention: `on_checkpoint` after each new complete checkpoint and as the attempt ends (nothing
    where no rule is set)."""

    def __init__(self, rules: Rules, root: Path, job: str, record: Path | None, slurm: Slurm,
                 owed: Owed | None = None) -> None:  # fmt: skip
        self.rules, self.root, self.job, self.record, self.slurm, self.owed = rules, root, job, record, slurm, owed
        self.known: set[int] | None = None  # the steps the record has (seen, or found before the run's first save)
        self.refused = False

    def on_checkpoint(self) -> Purge | None:
        """What is new recorded, then a purge (its line in the log and the record). A failure is said, never raised:
        retention never ends an attempt."""
        if not self.rules.active:
            return None
        try:
            return self._on_checkpoint()
        except Exception as e:  # noqa: BLE001  a bug here must not end training: its traceback, and the line
            traceback.print_exc()
            self.slurm.say("retention_failed", error=f"{type(e).__name__}: {e}".splitlines()[0])
            return None

    def _on_checkpoint(self) -> Purge | None:
        self._note_new()
        done = purge(self.root, self.rules, self.job, self.slurm, self.owed)
        if done.refused:
            if not self.refused:
                self.slurm.say("retention_refused", why=done.refused)
                self.refused = True
            return done
        if done.removed or done.leftovers or done.restored:
            self._write({"event": "purge", "rules": self.rules.describe(), **asdict(done), "freed": done.freed})
            steps = ", ".join(str(r["step"]) for r in done.removed) or "none"
            if done.leftovers:
                steps += f" and what an interrupted purge left ({', '.join(r['path'] for r in done.leftovers)})"
            self.slurm.say("purged", steps=steps, freed=gigabytes(done.freed), seconds=f"{done.seconds:.2f}",
                           kept=", ".join(map(str, done.kept)) or "none", rules=self.rules.describe())  # fmt: skip
        return done

    def _note_new(self) -> None:
        """Each complete step not yet in the record, as saved (its bytes); at the run's first look, those already
        there as found (saved before this run: not its bytes)."""
        if self.known is None:
            rows = jsonl.read(self.record) if self.record else []
            self.known = {int(s) for r in rows for s in ([r["step"]] if "step" in r else r.get("steps", []))
                          if r.get("event") in ("saved", "found")}  # fmt: skip
            if not rows:
                found = sorted(ckpt.complete_steps(self.root))
                self._write({"event": "found", "steps": found})
                self.known.update(found)
        for step, engine in sorted(ckpt.complete_steps(self.root).items()):
            if step not in self.known:
                self.known.add(step)
                size = ckpt.size_of(ckpt.step_dir(self.root, step))
                self._write({"event": "saved", "step": step, "bytes": size, "engine": engine})

    def _write(self, row: dict) -> None:
        if self.record is not None:
            jsonl.append(self.record, {**row, "time": round(time.time(), 3), "job": self.job})
