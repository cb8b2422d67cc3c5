"""A run's checkpoints folder, read: the one place that knows its layout (standard library only: the launcher, the
job's supervisor, training and the export all read it through here).

Both engines write under the run's `checkpoints_path`:

    torch:     <step>/state.pt, <step>/meta.json; the pointer `latest`; a save in progress is `.tmp-<step>-<random>`
               (renamed to <step> once whole)
    nanotron:  <step>/model/..., <step>/config.yaml, <step>/checkpoint_metadata.json (written last: a <step> without
               it is a save in progress, or one cut short); the pointer `latest.txt`

and beside them the launcher's own records: the engine and nanotron dialect the checkpoints were written by, the
one-writer lock, the experiment tracker's run id, the steps the launcher's engines began to save (`saves`), the
readers' leases (`.leases/`), a purge's step being deleted (`.purging-<step>-<random>`) and the eval jobs submitted
(`.evals/<step>-<key>.json`, launcher/evals/record.py): this module names every one of them. A step is *complete*
when its engine's last file is there; the *pointer* names the step a resume starts from (written after the step is
complete). A *lease* holds a step a reader (an export, an eval) reads, until the reader drops it or is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher import atomic
from launcher import protocol as P

TORCH_STATE = "state.pt"  # the torch engine's checkpoint, and its record written after it
TORCH_META = "meta.json"
TORCH_PARTIAL = ".tmp-"  # .tmp-<step>-<random>: the torch engine's save in progress
ENGINE_RECORD = "engine"  # the engine that wrote the run's checkpoints ("torch" | "nanotron")
ENGINES = ("torch", "nanotron")


def pointer_step(root: Path) -> int | None:
    """The step the run's pointer names (either engine's), None where there is none (or it is unreadable)."""
    for pointer in P.POINTERS:
        try:
            text = (root / pointer).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def pointer_engines(root: Path) -> list[str]:
    """The engines whose pointer the folder holds (runs saved before the engine's record say it so)."""
    return [engine for pointer, engine in P.POINTERS.items() if (root / pointer).exists()]


def recorded_engine(root: Path) -> str | None:
    """The engine whose checkpoints the folder holds: its record, else the pointer found; None before any save."""
    saved = pointer_engines(root)
    if not saved:
        return None
    try:
        recorded = (root / ENGINE_RECORD).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    return recorded if recorded in ENGINES else saved[0]


def engine_of(step_dir: Path) -> str | None:
    """The engine of a complete checkpoint in `step_dir`; None where it is not one (partial, or something else)."""
    if (step_dir / TORCH_STATE).is_file() and (step_dir / TORCH_META).is_file():
        return "torch"
    if (step_dir / "model").is_dir() and (step_dir / P.NANOTRON_METADATA).is_file():
        return "nanotron"
    return None


def complete_steps(root: Path) -> dict[int, str]:
    """Every complete checkpoint in the folder: step -> engine."""
    found = {}
    for child in _children(root):
        if child.name.isdigit() and (engine := engine_of(child)) is not None:
            found[int(child.name)] = engine
    return found


@dataclass(frozen=True)
class Partial:
    """A checkpoint not (yet) complete: a save in progress, or one a kill cut short."""

    step: int
    path: Path
    why: str


def partial_steps(root: Path) -> list[Partial]:
    """Every save in the folder that is not a complete checkpoint, oldest step first."""
    found = []
    for child in _children(root):
        name = child.name
        if name.startswith(TORCH_PARTIAL) and child.is_dir():
            step = name[len(TORCH_PARTIAL) :].split("-", 1)[0]
            if step.isdigit():
                found.append(
                    Partial(int(step), child, f"the torch engine's save of step {step} is in progress ({child})")
                )
        elif name.isdigit() and child.is_dir() and engine_of(child) is None:
            found.append(Partial(int(name), child, _why_partial(child)))
    return sorted(found, key=lambda p: (p.step, p.path.name))


def _why_partial(step_dir: Path) -> str:
    if (step_dir / "model").is_dir():
        return f"{step_dir} has weights but no {P.NANOTRON_METADATA}, which nanotron writes last"
    if (step_dir / TORCH_STATE).is_file():
        return f"{step_dir} has {TORCH_STATE} but no {TORCH_META}"
    return f"{step_dir} holds no checkpoint of either engine"


def in_progress(root: Path, step: int) -> str | None:
    """What says `step` is being written (or was cut short), or None."""
    return next((p.why for p in partial_steps(root) if p.step == step), None)


def resume_point(root: Path) -> tuple[int | None, str]:
    """The step a resume of the run starts from (None: none), and what to say beside it where the pointer names
    another ("" where not): the torch engine takes the newest complete step whatever its pointer names; nanotron
    loads the step its pointer (`latest.txt`) names, and only that one."""
    complete, pointer = complete_steps(root), pointer_step(root)
    newest = max(complete, default=None)
    why = None if pointer is None or pointer in complete else in_progress(root, pointer) or "not on disk"
    if "nanotron" in pointer_engines(root) or (pointer is None and newest is not None and complete[newest] != "torch"):
        if pointer is None:
            return None, ""  # (nanotron resumes from its pointer alone: without one, the run starts afresh)
        if why is None:
            return pointer, ""
        rest = f"step {newest} is the newest complete one" if newest is not None else "no step is complete"
        return None, f"the pointer names step {pointer}, which is not complete ({why}): nanotron cannot load it: {rest}"
    if pointer is None or pointer == newest:
        return newest, ""
    said = f"the pointer names step {pointer}" + (f": {why}" if why else "")
    if newest is None:
        return None, f"no complete step to resume from ({said}): training starts at its first step"
    return newest, f"the newest complete one; {said}"


def step_dir(root: Path, step: int) -> Path:
    return root / str(step)


def lock_dir(root: Path) -> Path:
    """The one-writer lock (a directory: mkdir is atomic), whose holder file names the job that trains the run."""
    return root / P.LOCK


def hold_lock(root: Path, job: str) -> None:
    """Name `job` the holder of the run's lock (the directory made by the job that takes it)."""
    (lock_dir(root) / P.LOCK_HOLDER).write_text(job + "\n", encoding="utf-8")


def lock_holder(root: Path) -> str:
    """The job that holds the run's lock ("" for none, or while it is being written)."""
    try:
        return (lock_dir(root) / P.LOCK_HOLDER).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def purging_path(root: Path, step: int) -> Path:
    """Where a purge renames `step` out of the steps' names before it deletes it (a new name each time)."""
    return root / f"{P.PURGING}{step}-{secrets.token_hex(4)}"


def evals_dir(root: Path) -> Path:
    """The eval submissions' records: `<step>-<key>.json` each (launcher/evals/record.py)."""
    return root / P.EVALS_SUBMITTED


def eval_submission(root: Path, step: int, key: str) -> Path:
    return evals_dir(root) / f"{step}-{key}.json"


def eval_submissions(root: Path) -> list[tuple[int, str, Path]]:
    """Every eval submission's record in the folder: (step, key, path), by step."""
    found = []
    for path in _children(evals_dir(root)):
        step, _, key = path.name.removesuffix(".json").partition("-")
        if path.name.endswith(".json") and step.isdigit() and key and not path.name.startswith("."):
            found.append((int(step), key, path))
    return sorted(found)


def size_of(path: Path) -> int:
    """Bytes under `path` (files only; what cannot be read counts 0)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _children(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError:
        return []


def pointer_stamp(root: Path) -> tuple:
    """What changes when either pointer is written again (its inode, size and time; None where absent): a look
    that costs one stat a pointer."""
    stamps: list[tuple[int, int, int] | None] = []
    for pointer in P.POINTERS:
        try:
            st = os.stat(root / pointer)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def note_save(root: Path, step: int) -> None:
    """Record that the launcher's engine begins to save `step` (its rank 0, before the save's first file): retention
    removes only the steps so recorded. Appended, and on disk before the save starts."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / P.SAVES_RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{step}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def saves(root: Path) -> frozenset[int]:
    """The steps the launcher's engines began to save in this folder (`note_save`)."""
    try:
        text = (root / P.SAVES_RECORD).read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    return frozenset(int(word) for word in text.split() if word.isdigit())


LEASE_MAX_AGE_S = 24 * 3600  # a lease of a process on another host, which no one here can look at, holds this long


@dataclass(frozen=True)
class Lease:
    """A reader's hold on a step: its Slurm job, or else its process (pid, and the process's start, so that a pid
    used again is not taken for it) on its host."""

    step: int
    reader: str  # what reads: "export", "eval"
    job: str  # the reader's Slurm job ("" for none)
    host: str
    pid: int
    started: str  # the process's start time, as /proc says it ("" where unknown)
    since: float  # when the lease was taken (unix time)
    path: Path

    @property
    def holder(self) -> str:
        return f"job {self.job}" if self.job else f"pid {self.pid} on {self.host}"


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat's 22nd field), None where it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # (the command's name, in parentheses, may hold spaces)
    return fields[19] if len(fields) > 19 else ""


def take_lease(root: Path, step: int, reader: str, env: Mapping[str, str] = os.environ) -> Lease:
    """A lease on `step` for this process (its Slurm job, where it runs in one): written whole, then named."""
    pid = os.getpid()
    lease = Lease(step, reader, env.get("SLURM_JOB_ID", ""), socket.gethostname(), pid, _process_start(pid) or "",
                  time.time(), root / P.LEASES / f"{step}-{secrets.token_hex(4)}.json")  # fmt: skip
    lease.path.parent.mkdir(parents=True, exist_ok=True)
    record = {"step": step, "reader": reader, "job": lease.job, "host": lease.host, "pid": pid,
              "started": lease.started, "since": lease.since}  # fmt: skip
    atomic.replace(lease.path, json.dumps(record) + "\n")  # (named once whole: a reader never sees half of it)
    return lease


def drop_lease(lease: Lease) -> None:
    lease.path.unlink(missing_ok=True)


@contextlib.contextmanager
def leased(root: Path, step: int, reader: str) -> Iterator[Lease | None]:
    """A lease on `step` while the block reads it (an export, an eval), dropped after; None where the folder takes
    no lease (not writable: the reader goes on, unprotected). The caller checks the step is still complete once it
    holds the lease: a purge that judged it before is then either done, or gives it back (launcher/node/purge.py)."""
    try:
        lease: Lease | None = take_lease(root, step, reader)
    except OSError:
        lease = None
    try:
        yield lease
    finally:
        if lease is not None:
            drop_lease(lease)


def leases(root: Path) -> list[Lease]:
    """Every lease in the folder (one that cannot be read is no lease)."""
    found = []
    for path in sorted(_children(root / P.LEASES)):
        if path.name.startswith(".") or not path.name.endswith(".json"):
            continue
        try:
            r = json.loads(path.read_text(encoding="utf-8"))
            found.append(Lease(int(r["step"]), str(r["reader"]), str(r["job"]), str(r["host"]), int(r["pid"]),
                               str(r["started"]), float(r["since"]), path))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def lease_holds(lease: Lease, job_alive: Callable[[str], bool | None], now: float | None = None) -> bool:
    """Whether the lease still holds its step: its job alive (`job_alive`: None where Slurm cannot say: it holds),
    its process alive on this host, or, for a process on another host, until LEASE_MAX_AGE_S."""
    if lease.job:
        alive = job_alive(lease.job)
        return True if alive is None else alive
    if lease.host == socket.gethostname():
        started = _process_start(lease.pid)
        return started is not None and (not lease.started or started == lease.started)
    return (time.time() if now is None else now) - lease.since < LEASE_MAX_AGE_S


@dataclass(frozen=True)
class Folder:
    """A checkpoints folder at one look: what retention decides from."""

    root: Path
    complete: dict[int, str]  # step -> engine
    partials: tuple[Partial, ...]
    pointer: int | None
    saves: frozenset[int]
    purging: tuple[Path, ...]  # what an interrupted purge left
    leases: tuple[Lease, ...]


def look(root: Path) -> Folder:
    purging = tuple(sorted(c for c in _children(root) if c.name.startswith(P.PURGING)))  # (`purging_path`'s)
    return Folder(root, complete_steps(root), tuple(partial_steps(root)), pointer_step(root), saves(root), purging,
                  tuple(leases(root)))  # fmt: skip
