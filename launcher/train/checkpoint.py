"""Checkpoints of the portable engine: atomic on a shared filesystem, complete enough to resume bit for bit.

Layout under `checkpoints_path`:

    <step>/state.pt    model, optimizer, step, data position, RNG states of every rank, config hash
    <step>/meta.json   the same scalars and every rank's parameter checksum, for people and tools
    latest             the step of the newest complete checkpoint (text)

Rank 0 writes a checkpoint into `.tmp-<step>-<random>` and renames it to `<step>` only when it is complete, then
replaces `latest` (write-temp + os.replace). A step directory that `latest` does not name, and any `.tmp-*`
directory, is never loaded. Old checkpoints are kept: nothing is pruned.
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

from launcher.errors import TrainError
from launcher.train.config import TrainConfig

STATE_FILE = "state.pt"
POINTER = "latest"
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


def _fsynced_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file through `write` and flush it to disk before it is renamed into place."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def save(cfg: TrainConfig, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, data_position: int) -> Path:
    """Write checkpoint `step` (collective: every rank calls it; rank 0 writes). Returns its directory."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list[tuple[dict, float] | None] = [None] * world
    dist.all_gather_object(gathered, (capture_rng(), parameter_checksum(model)))
    rng_states = [g[0] for g in gathered if g is not None]
    checksums = [g[1] for g in gathered if g is not None]
    root = Path(cfg.checkpoints_path)
    final = root / str(step)
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
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{step}-{secrets.token_hex(4)}"
        tmp.mkdir()
        _fsynced_write(tmp / STATE_FILE, lambda f: torch.save(state, f))
        _fsynced_write(tmp / "meta.json", lambda f: f.write(json.dumps(meta, indent=1).encode()))
        if final.exists():  # left by an earlier attempt that crashed before moving `latest` to it
            stale = root / f".tmp-stale-{step}-{secrets.token_hex(4)}"
            os.rename(final, stale)
            shutil.rmtree(stale)
        os.rename(tmp, final)
        pointer_tmp = root / f".tmp-{POINTER}-{secrets.token_hex(4)}"
        _fsynced_write(pointer_tmp, lambda f: f.write(f"{step}\n".encode()))
        os.replace(pointer_tmp, root / POINTER)
    dist.barrier()
    return final


def _from_pointer(root: Path) -> tuple[Path | None, str | None]:
    """The checkpoint `root/latest` names, if complete; else a note saying why not (None: no pointer)."""
    pointer = root / POINTER
    if not pointer.is_file():
        return None, None
    text = pointer.read_text().strip()
    if not text.isdigit():
        return None, f"ignoring {pointer}: {text[:40]!r} is not a step number"
    if not (root / text / STATE_FILE).is_file():
        return (
            None,
            f"ignoring {pointer}: it names step {text}, but {root / text / STATE_FILE} does not exist",
        )
    return root / text, None


def find_resume(cfg: TrainConfig) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from (the run's own `latest` first, then resume_checkpoint_path) and notes."""
    found, note = _from_pointer(Path(cfg.checkpoints_path))
    notes = [note] if note else []
    if found is not None or cfg.resume_checkpoint_path is None:
        return found, notes
    given = Path(cfg.resume_checkpoint_path)
    if (given / STATE_FILE).is_file():
        return given, notes
    found, note = _from_pointer(given)
    if found is None:
        raise TrainError(
            f"resume_checkpoint_path {given} is not a checkpoint of this engine (no {STATE_FILE}, no complete "
            f"'{POINTER}'){': ' + note if note else ''}; point it at a <checkpoints_path>/<step> directory"
        )
    return found, notes


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored:
    """Load a checkpoint into `model` and `optimizer` and restore this rank's RNG states (every rank calls it)."""
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        first_line = str(e).strip().splitlines()[0]
        raise TrainError(f"checkpoint {path} does not fit this model/optimizer: {first_line}") from None
    rank = dist.get_rank()
    if rank < len(state["rng"]):
        restore_rng(state["rng"][rank])
    return Restored(state["step"], state["data_position"], state["config_hash"], state["world_size"])
