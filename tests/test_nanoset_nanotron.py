"""nanotron main's own trainer on tokenized folders (Nanosets, made by `launcher.data tokenize`: datatrove), fed by
the launcher's nanotron engine (launcher/train/nanotron_engine/folders.py), with the house's 8 ranks (dp 2, tp 2,
pp 2) on CPU through the job's door (`torchrun run_train.py --engine nanotron`, tests/cpu_nanotron): the loss falls,
each dp rank reads its own shard, and a run stopped (by a stop request while it trains, as Slurm's SIGTERM makes
one, or at its last step) and resumed reads, micro-batch by micro-batch on every rank, the token ids the
uninterrupted run reads (logged by the test-side hook, LAUNCHER_TEST_BATCH_LOG)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import yaml
from cpu_nanotron import ROOT, environment, launcher_config, train

from launcher.train.nanotron_engine.folders import start_index
from launcher.train.tokenized import FolderWindows

if TYPE_CHECKING:
    from conftest import DemoData

RANKS = 8  # dp 2 x tp 2 x pp 2: rank = pp x 4 + dp x 2 + tp (nanotron's grid), pipeline rank 0 holds the inputs
ACCUMULATION = 2  # global batch 8 = micro batch 2 x accumulation 2 x dp 2


def _config(where: Path, name: str, demo: DemoData, *flags: str, **yaml_paths: object) -> Path:
    return launcher_config(where, name, demo, "main", 2, 2, 2, "--learning_rate", "3e-3", *flags, **yaml_paths)


def _batches(base: Path) -> dict[int, list]:
    """{rank: every micro-batch's input_ids it drew, in order} for the ranks that hold inputs."""
    out = {}
    for rank in range(RANKS):
        log = Path(f"{base}.rank{rank}.jsonl")
        if log.exists():
            out[rank] = [json.loads(line) for line in log.read_text().splitlines()]
    return out


def _straight_and_resumed(
    tmp_path: Path, demo: DemoData, stop: int | None, steps: int, *flags: str
) -> tuple[dict, dict, dict]:
    """The run to `steps` straight, and the same run stopped and resumed to `steps` (a new torchrun from its own
    checkpoint): their metrics and the micro-batches every rank drew. Stopped after `stop` steps (its train_steps),
    or, where `stop` is None, by a stop request (the stop file, as the batch script writes it on Slurm's SIGTERM)
    made while it trains, after its third step: it saves at the step it is in and exits, and a rerun of the same
    config resumes there."""
    straight = _config(tmp_path, "straight", demo, *flags, **{"tokens.train_steps": steps})
    ckpt = {"checkpoints.checkpoints_path": str(tmp_path / "ckpt" / "b")}
    first = _config(tmp_path, "first", demo, *flags, **{**ckpt, "tokens.train_steps": stop or steps})
    rest = _config(tmp_path, "rest", demo, *flags, **{**ckpt, "tokens.train_steps": steps})
    a = train(straight, RANKS, "main", LAUNCHER_TEST_BATCH_LOG=str(tmp_path / "a"))
    metrics = tmp_path / "b.jsonl"
    if stop is None:
        stop = _stopped(first, metrics, tmp_path / "b", after=3)
    else:
        train(first, RANKS, "main", metrics, LAUNCHER_TEST_BATCH_LOG=str(tmp_path / "b"))
    assert len(_batches(tmp_path / "b")[0]) == stop * ACCUMULATION  # what the first attempt read, and no more
    b = train(rest, RANKS, "main", metrics, LAUNCHER_TEST_BATCH_LOG=str(tmp_path / "b"))
    assert f"resuming from the run's own checkpoints in {tmp_path / 'ckpt' / 'b'} (latest: {stop})" in (
        rest.with_suffix(".log").read_text()
    )
    assert sorted(b) == list(range(1, steps + 1)), sorted(b)
    return a, _batches(tmp_path / "a"), _batches(tmp_path / "b")


def _stopped(config: Path, metrics: Path, batches: Path, after: int) -> int:
    """`config` trained by 8 ranks until a stop request made once step `after` is logged; the step it saved."""
    stop_file = config.with_suffix(".stop")
    env = {**os.environ, **environment(main=True), "LAUNCHER_METRICS_FILE": str(metrics),
           "LAUNCHER_TEST_BATCH_LOG": str(batches), "LAUNCHER_STOP_FILE": str(stop_file),
           "LAUNCHER_STOP_FILE_EVERY_S": "0.2"}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
               str(ROOT / "run_train.py"), "--config-file", str(config), "--engine", "nanotron"]  # fmt: skip
    log = config.with_suffix(".log")
    with open(log, "a") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            end = time.monotonic() + 500
            while not (metrics.exists() and len(metrics.read_text().splitlines()) >= after):
                assert proc.poll() is None and time.monotonic() < end, log.read_text()[-6000:]
                time.sleep(0.1)
            stop_file.touch()
            assert proc.wait(timeout=300) == 0, log.read_text()[-6000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    said = log.read_text()
    assert "stop requested: checkpoint saved at step " in said, said[-6000:]
    saved = int(said.split("stop requested: checkpoint saved at step ")[1].split(";")[0])
    assert after <= saved < 8, saved
    return saved


def _windows(folder: Path) -> set[tuple[int, ...]]:
    windows = FolderWindows([(str(folder), 1.0)], 64)
    return {tuple(row) for row in windows[list(range(len(windows)))].tolist()}


def test_8_ranks_train_on_a_folder_and_resume_at_the_next_sample(
    nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path
):
    folder = nanoset_folders[0]
    config = _config(tmp_path, "check", demo_data, "--dataset", str(folder))
    dataset = yaml.safe_load(config.read_text())["data_stages"][0]["data"]["dataset"]
    assert dataset["dataset_folder"] == [str(folder)]  # main's NanosetDatasetsArgs, read by main's own parser

    metrics, straight, resumed = _straight_and_resumed(tmp_path, demo_data, None, 8, "--dataset", str(folder))
    losses = [metrics[s]["loss"] for s in range(1, 9)]
    assert np.mean(losses[:2]) - np.mean(losses[-2:]) > 0.3, losses

    assert sorted(straight) == [0, 1, 2, 3]  # pipeline rank 0, every dp x tp
    assert resumed == straight  # every rank, every micro-batch, every token id
    assert all(len(drawn) == 8 * ACCUMULATION for drawn in straight.values())
    by_dp = {dp: [straight[dp * 2 + tp] for tp in (0, 1)] for dp in (0, 1)}
    assert all(a == b for a, b in by_dp.values())  # the tp ranks of a replica read the same batch
    rows = {dp: [tuple(row) for batch in by_dp[dp][0] for row in batch] for dp in (0, 1)}
    assert not set(rows[0]) & set(rows[1])  # the dp ranks read their own shards (no window twice in an epoch)
    assert len(set(rows[0])) == len(rows[0])
    inputs = {w[:64] for w in _windows(folder)}  # a window less its last token (the last input's label)
    assert set(rows[0]) | set(rows[1]) <= inputs  # each micro-batch's rows: windows of the files' own tokens


def test_8_ranks_resume_inside_a_later_stage_over_a_mixture(
    nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path
):
    """A mixture (main's normalised weights) in the first stage, another folder from step 4: stopped at step 5,
    inside the later stage, the resumed run reads what the straight run reads, the stage's own offset restored."""
    a, b = nanoset_folders
    flags = ("--dataset", f"{a}:1,{b}:3", "--data_stages", f"two@4={b}")
    _, straight, resumed = _straight_and_resumed(tmp_path, demo_data, 5, 7, *flags)
    assert resumed == straight and all(len(drawn) == 7 * ACCUMULATION for drawn in straight.values())
    second = {tuple(row) for batch in straight[0][3 * ACCUMULATION :] for row in batch}
    assert second <= {w[:64] for w in _windows(b)}  # from step 4 on: the second stage's folder only


def test_the_next_micro_batch_after_a_checkpoint():
    assert start_index(0, 2, 2) == 0 and start_index(32, 2, 2) == 8
    with pytest.raises(Exception, match="resume in the layout it was saved in"):
        start_index(30, 4, 2)
