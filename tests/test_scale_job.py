"""What the job asks of a shared filesystem at thousands of ranks, counted on real ranks (gloo on CPU): the stop
file looked for by rank 0 alone, every few seconds; the progress file rewritten every few seconds, not every step."""

from __future__ import annotations

import builtins
import dataclasses
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from launcher.train import stop
from launcher.train.environment import JobEnvironment
from launcher.train.torch_engine import checkpoint


def rank_looks(rank: int, world: int, store_path: str, stop_file: str, counts: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    looks = []
    real_exists = os.path.exists
    os.path.exists = lambda p: (looks.append(p) if p == stop_file else None) or real_exists(p)  # counted, not faked
    try:
        request = stop.StopRequest(torch_device(), JobEnvironment(rank=rank, world_size=world, stop_file=stop_file))
        agreed = [request.agreed() for _ in range(200)]  # 200 steps within a second or two
        request.close()
    finally:
        os.path.exists = real_exists
        dist.destroy_process_group()
    counts[rank] = (len(looks), agreed[0], any(agreed[1:]))


def torch_device():
    import torch

    return torch.device("cpu")


def test_only_rank_0_looks_for_the_stop_file_and_every_rank_learns_of_it(tmp_path: Path):
    stop_file = tmp_path / "stop"
    stop_file.touch()
    with mp.Manager() as manager:
        counts = manager.dict()
        mp.spawn(rank_looks, args=(2, str(tmp_path / "store"), str(stop_file), counts), nprocs=2, join=True)
        counts = dict(counts)
    # rank 0: one look for 200 steps (every 5 s at most), rank 1 none; both learn of it at the first step
    assert counts == {0: (1, True, False), 1: (0, True, False)}


def test_progress_is_rewritten_every_few_seconds_and_at_once_on_a_change_of_phase(tmp_path: Path, monkeypatch):
    progress = tmp_path / "progress"
    rank0, rank1 = (JobEnvironment(rank=rank, world_size=2, progress_file=str(progress)) for rank in (0, 1))
    monkeypatch.setattr(stop, "_last_progress", [None, float("-inf")])
    writes = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: writes.append(b) or real_replace(a, b))
    for step in range(1, 1001):
        stop.report_progress(rank0, step)
        stop.report_progress(rank1, step)  # other ranks write nothing
    assert len(writes) == 1 and progress.read_text().startswith("1 ")
    stop.report_progress(rank0, 1000, "saving")
    stop.report_progress(rank0, 1000)
    assert len(writes) == 3 and progress.read_text().startswith("1000 ") and progress.read_text().endswith(" step\n")


@dataclasses.dataclass(frozen=True)
class Where:
    """What checkpoint.save reads of a TrainConfig: its hash and the checkpoints path."""

    checkpoints_path: str


def rank_saves_and_resumes(rank: int, world: int, store_path: str, root: str, counts: dict) -> None:
    from launcher.train.torch_engine import checkpoint, resume

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    torch.manual_seed(100 + rank)  # each rank's own RNG state
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    dist.broadcast(model.weight.data, 0)
    dist.broadcast(model.bias.data, 0)
    mine = checkpoint.rng_digest()
    created, opened = [], []
    real_open = builtins.open

    def counting_open(file, mode="r", *args, **kwargs):
        (created if any(m in mode for m in "wax") else opened).append(os.path.basename(str(file)))
        return real_open(file, mode, *args, **kwargs)

    builtins.open = counting_open
    try:
        checkpoint.save(Where(root), 3, model, optimizer, data_position=6)
        torch.manual_seed(0)  # a fresh run's state, until the resume restores this rank's own
        fresh = torch.nn.Linear(8, 8)
        state, why = resume._read_agreed(Path(root) / "3", torch.device("cpu"))
        restored = checkpoint.load(state, Path(root) / "3", fresh, torch.optim.AdamW(fresh.parameters()))
    finally:
        builtins.open = real_open
    same = bool(torch.equal(fresh.weight, model.weight)) and restored.step == 3 and restored.data_position == 6
    counts[rank] = (sorted(created), opened.count(checkpoint.STATE_FILE), same, checkpoint.rng_digest() == mine)
    dist.destroy_process_group()


def test_one_writer_per_save_and_one_reader_per_resume(tmp_path: Path):
    with mp.Manager() as manager:
        counts = manager.dict()
        mp.spawn(rank_saves_and_resumes, args=(2, str(tmp_path / "store"), str(tmp_path / "ckpt"), counts), nprocs=2)
        counts = dict(counts)
    # rank 0 writes the state, its meta and the pointer (through a temporary file); rank 1 writes nothing; rank 0
    # alone reads the state file; both get the weights and the step back, and each its own RNG states
    assert len(counts[0][0]) == 3 and counts[0][0][1:] == ["meta.json", "state.pt"], counts
    assert counts[0][0][0].startswith(".tmp-") and checkpoint.POINTER in counts[0][0][0], counts  # the pointer
    assert counts[1][0] == [] and counts[0][1] == 1 and counts[1][1] == 0
    assert counts[0][2:] == (True, True) and counts[1][2:] == (True, True)


def test_a_save_that_would_not_fit_the_grace_time_is_named():
    assert stop.grace_warning(JobEnvironment.read({}), 500, 10) is None  # no requeue on time limits: nothing to fit
    job = JobEnvironment.read({"LAUNCHER_SIGNAL_GRACE": "120"})
    assert stop.grace_warning(job, 60, 5) is None
    warning = stop.grace_warning(job, 95, 12)
    assert warning is not None and "needs ~107 s of the 120 s warning" in warning and "--signal_grace 190" in warning
