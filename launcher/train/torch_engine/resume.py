"""Where a torch-engine run resumes: the newest checkpoint every rank can read, restored into model and optimizer.

Rank 0 decides which checkpoints there are (after removing what killed saves left), every rank reads the chosen
one, and a checkpoint counts only if every rank could read it; one that cannot be read is named and skipped.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from launcher import protocol as P
from launcher.errors import TrainError
from launcher.train.metrics import Reporter
from launcher.train.settings import TrainConfig
from launcher.train.torch_engine import checkpoint


def resume(
    cfg: TrainConfig, world_size: int, device: torch.device, model: nn.Module, optimizer: torch.optim.Optimizer,
    reporter: Reporter,
) -> tuple[int, int]:  # fmt: skip
    """Restore the newest checkpoint that loads into `model` and `optimizer`; (optimizer steps done, micro-batches
    this rank consumed), (0, 0) where none does. Every rank calls it."""
    found, notes = _resume_points(cfg)
    for note in notes:
        reporter.print(f"warning: {note}")
    for path in found:
        state, why = _read_agreed(path, device)
        if state is None:
            reporter.print(f"warning: checkpoint {path} cannot be read ({why or 'on another rank'}): skipped")
            continue
        restored = checkpoint.load(state, path, model, optimizer)
        reporter.print(P.RESUMED_LINE.format(step=restored.step, path=path, digest=checkpoint.rng_digest()))
        if restored.config_hash != checkpoint.config_hash(cfg):
            reporter.print("warning: the checkpoint was written with a different config; continuing from it")
        if restored.world_size != world_size:
            reporter.print(
                f"warning: the checkpoint was written by {restored.world_size} ranks, not "
                f"{world_size}: data order and RNG states do not continue exactly"
            )
        return restored.step, restored.data_position
    if found:
        reporter.print("warning: no checkpoint of this run could be read: starting from step 0")
    return 0, 0


def _resume_points(cfg: TrainConfig) -> tuple[list[Path], list[str]]:
    """Rank 0's view of the checkpoints to resume from, newest first, and its notes (or its TrainError), the same
    on every rank. Rank 0 first removes what killed saves left behind."""
    payload: list = [None]
    if dist.get_rank() == 0:
        try:
            removed = checkpoint.clean_leftovers(Path(cfg.checkpoints_path))
            found, notes = checkpoint.find_resume(cfg)
            if removed:
                notes.append(f"removed what interrupted saves left in {cfg.checkpoints_path}: {', '.join(removed)}")
            payload[0] = (found, notes)
        except TrainError as e:
            payload[0] = e
    dist.broadcast_object_list(payload, src=0)
    if isinstance(payload[0], TrainError):
        raise payload[0]
    return payload[0]


def _read_agreed(path: Path, device: torch.device) -> tuple[dict | None, str]:
    """Rank 0 reads the checkpoint and shares it (`checkpoint.share`: one read of the file, not one a rank); None
    and why when it cannot be read."""
    state, why = None, ""
    if dist.get_rank() == 0:
        try:
            state = checkpoint.read_state(path)
        except Exception as e:  # noqa: BLE001  a damaged file fails torch.load in many ways; all mean "skip it"
            why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    failed = [why]
    dist.broadcast_object_list(failed, src=0)
    if failed[0]:
        return None, failed[0]
    return checkpoint.share(state, device), ""
