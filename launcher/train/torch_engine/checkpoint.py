"""Checkpoints of the portable engine: atomic on a shared filesystem, complete enough to resume bit for bit.

Layout under `checkpoints_path`:

    <step>/state.pt    model, optimizer, step, data position, RNG states of every rank, config hash
    <step>/meta.json   the same scalars and every rank's parameter checksum, for people and tools
    latest             the step of the newest complete checkpoint (text)

Rank 0 writes a checkpoint into `.tmp-<step>-<random>` and renames it to `<step>` only when it is complete, then
replaces `latest` (write-temp + fsync + os.replace + fsync of the directory). A `.tmp-*` directory is never loaded
and is removed at the next start. A resume takes the newest complete checkpoint that loads, whatever `latest`
says (a warning names what was skipped). Training removes no checkpoint, and nothing older than the newest whole
checkpoint is ever replaced; the job's supervisor removes old ones where --keep_last/--keep_every say
(docs/checkpoints.md): each save is first noted in the folder's `saves` record, the steps it may remove.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from launcher import atomic, checkpoint_layout
from launcher import protocol as P
from launcher.errors import TrainError
from launcher.train.settings import TrainConfig

STATE_FILE = "state.pt"
POINTER = P.TORCH_POINTER
# Fields that may change between the legs of one run without changing what is trained.
HASH_EXCLUDED = {
    "train_steps",
    "checkpoint_interval",
    "save_initial_state",
    "resume_checkpoint_path",
    "log_interval",
    "checkpoints_path",
    "project",
    "run_name",
    "num_loading_workers",
}


@dataclass(frozen=True)
class Restored:
    """What a loaded checkpoint says about where training stands."""

    step: int
    data_position: int  # micro-batches this rank has consumed
    config_hash: str
    world_size: int


def config_hash(cfg: TrainConfig) -> str:
    """A short hash of everything that determines the training trajectory."""
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in HASH_EXCLUDED}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def capture_rng() -> dict:
    """This process's RNG states (python, numpy, torch, CUDA), as tensors and plain values."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    """Set this process's RNGs from `capture_rng()`'s output."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def parameter_checksum(model: nn.Module) -> float:
    """The float64 sum of every parameter: cheap, and equal on replicas that are in sync."""
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def _io_error(error: BaseException) -> OSError | None:
    """The OSError behind a failed write: the error itself, or the one it was raised from. torch.save's zip writer
    turns a disk that fills mid-file into RuntimeError('... unexpected pos ...'), with the OSError as its context."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _fsynced_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file through `write` and flush it to disk before it is renamed into place."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_pointer(root: Path, step: int) -> None:
    """Point `root/latest` at `step`: complete or not at all, and durable (file, then directory, fsynced)."""
    atomic.replace(root / POINTER, f"{step}\n", durable=True)


def clean_leftovers(root: Path) -> list[str]:
    """Remove the temporary directories and files of saves that a kill interrupted (rank 0, at start; the job's lock
    makes it the run's only writer). Returns what was removed."""
    removed = []
    for leftover in sorted(root.glob(".tmp-*")) if root.is_dir() else []:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover.name)
    return removed


def _write(root: Path, step: int, state: dict, meta: dict) -> Path:
    """Rank 0's part of a save: the step's directory, complete (temporary directory renamed into place), then the
    pointer. A step directory already there is one a crash left unpointed, newer than the newest whole checkpoint
    (resume starts from that one): it is replaced, and removed only once the new one is in place. On any error the
    temporary directory goes and the previous pointer stands."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / str(step)
    tmp = root / f".tmp-{step}-{secrets.token_hex(4)}"
    replaced = None
    checkpoint_layout.note_save(root, step)  # the step is the launcher's: retention may remove it (docs/checkpoints.md)
    try:
        tmp.mkdir()
        _fsynced_write(tmp / STATE_FILE, lambda f: torch.save(state, f))
        _fsynced_write(tmp / "meta.json", lambda f: f.write(json.dumps(meta, indent=1).encode()))
        if final.exists():
            replaced = root / f".tmp-replaced-{step}-{secrets.token_hex(4)}"
            os.rename(final, replaced)
        os.rename(tmp, final)
        atomic.fsync_dir(root)
        write_pointer(root, step)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    return final


def save(cfg: TrainConfig, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, data_position: int) -> Path:
    """Write checkpoint `step` (collective: every rank calls it; rank 0 writes). Returns its directory.

    A save that fails (disk full, quota, an I/O error) leaves the previous checkpoint as the latest and ends the
    run on every rank with one line saying why."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # to rank 0 only: every rank's RNG states (~14 KiB each) gathered to every rank were 444 MiB a rank at 32,000
    gathered: list[tuple[dict, float] | None] | None = [None] * world if rank == 0 else None
    dist.gather_object((capture_rng(), parameter_checksum(model)), gathered, dst=0)
    rng_states = [g[0] for g in gathered or [] if g is not None]
    checksums = [g[1] for g in gathered or [] if g is not None]
    root = Path(cfg.checkpoints_path)
    failure: list[str | None] = [None]
    if rank == 0:
        if len(set(checksums)) > 1:
            print(f"warning: data-parallel replicas differ at step {step}: parameter checksums {checksums}", flush=True)
        meta = {
            "step": step,
            "data_position": data_position,
            "config_hash": config_hash(cfg),
            "world_size": world,
            "parameter_checksums": checksums,  # one per rank: equal while the replicas are in sync
            "time": time.time(),
        }
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_states, **meta}
        try:
            _write(root, step, state, meta)
        except (OSError, RuntimeError) as e:
            if (io := _io_error(e)) is None:
                raise
            failure[0] = f"{io.strerror or io} ({io.filename or root})" if io.strerror else str(io)
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        previous = read_pointer(root)
        raise TrainError(
            f"checkpoint step {step} could not be saved: {failure[0]}; the latest checkpoint is still "
            f"{'step ' + str(previous) if previous is not None else 'none'}: make room or fix the path "
            f"({cfg.checkpoints_path}), then launch again to resume"
        )
    return root / str(step)


def read_pointer(root: Path) -> int | None:
    """The step `root/latest` names, or None when it is missing, empty or not a step number."""
    try:
        text = (root / POINTER).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def candidates(root: Path) -> tuple[list[Path], list[str]]:
    """The run's checkpoints to try, newest first, and notes on a pointer that cannot be trusted.

    Every complete step directory counts (a crash between a checkpoint's rename and the pointer's update leaves
    the newest one unpointed), so a damaged, empty or dangling `latest` costs nothing but a warning."""
    steps = sorted(
        (int(d.name) for d in root.iterdir() if d.name.isdigit() and (d / STATE_FILE).is_file())
        if root.is_dir()
        else (),
        reverse=True,
    )
    notes = []
    pointer = root / POINTER
    if pointer.exists():
        named = read_pointer(root)
        if named is None:
            notes.append(f"{pointer} does not name a step ({pointer.read_text(errors='replace')[:40]!r}): ignored")
        elif named not in steps:
            notes.append(f"{pointer} names step {named}, which is not a complete checkpoint: ignored")
        elif steps and named < steps[0]:
            notes.append(
                f"{pointer} names step {named}, but step {steps[0]} is complete (saved as the job was stopped)"
            )
    elif steps:
        notes.append(f"{pointer} is missing: using the newest complete checkpoint")
    return [root / str(step) for step in steps], notes


def find_resume(cfg: TrainConfig) -> tuple[list[Path], list[str]]:
    """The checkpoints to resume from, newest first (the run's own, else resume_checkpoint_path), and notes."""
    found, notes = candidates(Path(cfg.checkpoints_path))
    if found or cfg.resume_checkpoint_path is None:
        return found, notes
    given = Path(cfg.resume_checkpoint_path)
    if (given / STATE_FILE).is_file():
        return [given], notes
    found, more = candidates(given)
    if not found:
        raise TrainError(
            f"resume_checkpoint_path {given} is not a checkpoint of this engine (no {STATE_FILE}, no complete step "
            f"directory); point it at a <checkpoints_path>/<step> directory"
        )
    return found, notes + more


def read_state(path: Path) -> dict:
    """A checkpoint's saved state; OSError or RuntimeError (a truncated or damaged file) when it cannot be read."""
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)


def load(state: dict, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored:
    """Load a read checkpoint into `model` and `optimizer` and restore this rank's RNG states."""
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        first_line = str(e).strip().splitlines()[0]
        raise TrainError(f"checkpoint {path} does not fit this model/optimizer: {first_line}") from None
    if state.get("rng") is not None:  # this rank's own (see `share`)
        restore_rng(state["rng"])
    return Restored(state["step"], state["data_position"], state["config_hash"], state["world_size"])


def _skeleton(value: object, tensors: list[torch.Tensor]) -> object:
    """`value` with each tensor replaced by its shape and dtype (appended to `tensors`, in order)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("__tensor__", tuple(value.shape), str(value.dtype).removeprefix("torch."))
    if isinstance(value, dict):
        return {k: _skeleton(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v, tensors) for v in value)
    return value


def _flesh(value: object, tensors: list[torch.Tensor]) -> object:
    """The inverse of `_skeleton`: empty tensors of the shapes it noted (appended to `tensors`, in order)."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "__tensor__":
        tensors.append(torch.empty(value[1], dtype=getattr(torch, value[2])))
        return tensors[-1]
    if isinstance(value, dict):
        return {k: _flesh(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_flesh(v, tensors) for v in value)
    return value


def share(state: dict | None, device: torch.device) -> dict:
    """Rank 0's read checkpoint on every rank, without the others reading the file (collective): its shape as one
    small object, then tensor by tensor from rank 0 (memory: one tensor at a time beyond the state), and to each
    rank its own RNG states only."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rngs = (state or {}).get("rng") or []
    tensors: list[torch.Tensor] = []
    shape: list = [_skeleton({k: v for k, v in state.items() if k != "rng"}, tensors) if rank == 0 and state else None]
    dist.broadcast_object_list(shape, src=0)
    if rank != 0:
        state = _flesh(shape[0], tensors)  # type: ignore[assignment]
    assert state is not None
    for tensor in tensors:
        moved = tensor.to(device) if device.type != "cpu" else tensor
        dist.broadcast(moved, src=0)
        if moved is not tensor:
            tensor.copy_(moved)
    mine: list = [None]
    dist.scatter_object_list(mine, [rngs[r] if r < len(rngs) else None for r in range(world)] if rank == 0 else None)
    return {**state, "rng": mine[0]}


def rng_digest() -> str:
    """A short digest of this process's RNG states (printed after a resume, so that a restore can be checked)."""
    state = capture_rng()
    parts = [repr(state["python"]).encode(), state["numpy"]["key"].numpy().tobytes(), state["torch"].numpy().tobytes()]
    return hashlib.sha256(b"".join(parts)).hexdigest()[:12]
