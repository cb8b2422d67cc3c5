"""The torch engine's data, as every rank reads it: the run's packed windows built once by rank 0 and shared
(`packcache`), while the other ranks wait, told every HEARTBEAT_S that rank 0 still works; then each rank's own
micro-batches, per data stage."""

from __future__ import annotations

import threading

import numpy as np
import torch.distributed as dist

from launcher.errors import TrainError
from launcher.train import packcache
from launcher.train.data import MicroBatches, StagedBatches, build_micro_batches, build_windows
from launcher.train.settings import TrainConfig

HEARTBEAT_S = 30.0  # while rank 0 packs the data, it tells the waiting ranks this often (far inside any timeout)


def shared_windows(cfg: TrainConfig) -> np.ndarray | None:
    """The dataset's packed windows, tokenized once for all ranks (`packcache`): rank 0 builds and caches them
    unless the cache has them, the others wait for it and map the file. None where there is no dataset, the data
    is not cached (a hub name), or this rank cannot read the cache (a checkpoint directory not shared with rank
    0's node): the rank then builds its own. A data error on rank 0 is raised on every rank.

    Rank 0 builds in a thread and broadcasts "still working" every HEARTBEAT_S seconds, so that the waiting ranks
    are never in one collective longer than that: a corpus that takes longer to tokenize than the process group's
    timeout (10 minutes for NCCL) must not end the run."""
    if cfg.dataset is None or cfg.nanoset:  # random tokens, or tokenized folders each rank maps (nothing to build)
        return None
    cached = packcache.path_for(cfg)
    built: list = [None, None]  # rank 0: the windows it built, the error it met
    done = threading.Event()
    if dist.get_rank() == 0 and cached is not None and packcache.load(cached) is None:

        def build() -> None:
            try:
                built[0] = build_windows(cfg)
                packcache.save(cached, built[0])
            except OSError as e:  # not fatal: rank 0 keeps what it built, the others build their own
                print(f"warning: the packed data could not be cached in {cached.parent}: {e.strerror or e}", flush=True)
            except Exception as e:  # noqa: BLE001  raised below, on every rank
                built[1] = e
            finally:
                done.set()

        threading.Thread(target=build, name="pack-data", daemon=True).start()
    else:
        done.set()
    while True:
        working: list[bool | None] = [None]
        if dist.get_rank() == 0:
            working[0] = not done.wait(HEARTBEAT_S)
        dist.broadcast_object_list(working, src=0)
        if not working[0]:
            break
    failure = built[1]
    told = [failure if failure is None or isinstance(failure, TrainError) else
            TrainError(f"rank 0 could not prepare the data: {type(failure).__name__}: {failure}")]  # fmt: skip
    dist.broadcast_object_list(told, src=0)
    if failure is not None:
        raise failure  # rank 0: the original, with its traceback
    if told[0] is not None:
        raise told[0]
    loaded = packcache.load(cached) if cached is not None else None
    return loaded if loaded is not None else built[0]


def batches(cfg: TrainConfig, rank: int, world_size: int) -> MicroBatches:
    """This rank's micro-batches: the run's data, and each later data stage's from its first step on."""

    def stream(data: TrainConfig) -> MicroBatches:
        return build_micro_batches(data, rank, world_size, shared_windows(data))

    if not cfg.stages:
        return stream(cfg)
    later = [(s.name, (s.start - 1) * cfg.grad_accum_steps, stream(s.data)) for s in cfg.stages]
    return StagedBatches(stream(cfg), later)
