"""What the job asks of a shared filesystem at thousands of ranks, counted on real ranks (gloo on CPU): the stop
file looked for by rank 0 alone, every few seconds; the progress file rewritten every few seconds, not every step."""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from launcher.train import stop


def rank_looks(rank: int, world: int, store_path: str, stop_file: str, counts: dict) -> None:
    os.environ["LAUNCHER_STOP_FILE"] = stop_file
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    looks = []
    real_exists = os.path.exists
    os.path.exists = lambda p: (looks.append(p) if p == stop_file else None) or real_exists(p)  # counted, not faked
    try:
        request = stop.StopRequest(torch_device())
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
    monkeypatch.setenv("LAUNCHER_PROGRESS_FILE", str(progress))
    monkeypatch.setattr(stop, "_last_progress", [None, float("-inf")])
    writes = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: writes.append(b) or real_replace(a, b))
    for step in range(1, 1001):
        stop.report_progress(True, step)
        stop.report_progress(False, step)  # other ranks write nothing
    assert len(writes) == 1 and progress.read_text().startswith("1 ")
    stop.report_progress(True, 1000, "saving")
    stop.report_progress(True, 1000)
    assert len(writes) == 3 and progress.read_text().startswith("1000 ") and progress.read_text().endswith(" step\n")
