"""nanotron main's own trainer on tokenized folders (Nanosets, made by `launcher.data tokenize`: datatrove), fed by
the launcher's nanotron engine (launcher/train/nanotron_engine/folders.py), with the house's 8 ranks (dp 2, tp 2,
pp 2) on CPU through the job's door (`torchrun run_train.py --engine nanotron`, tests/cpu_nanotron): a run over a
mixture and a later stage, stopped at a step inside that stage and resumed, reads, micro-batch by micro-batch on
every rank, the token ids the uninterrupted run reads (logged by the test-side hook, LAUNCHER_TEST_BATCH_LOG). One
folder, a stop while training (Slurm's preemption), the loss and each dp rank's shard: tests/test_nanoset_slurm.py,
with the checks kept here (`assert_trains_each_dp_rank_on_its_shard`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from cpu_nanotron import launcher_config, train

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
    tmp_path: Path, demo: DemoData, stop: int, steps: int, *flags: str
) -> tuple[dict, dict, dict]:
    """The run to `steps` straight, saving at `stop` as well, and a run resumed to `steps` from that checkpoint (a
    new torchrun, the checkpoint copied to its own folder, as a run stopped there leaves it): their metrics and the
    micro-batches every rank drew (the resumed run's: those after `stop`). (A stop while it trains, Slurm's SIGTERM:
    tests/test_nanoset_slurm.py.)"""
    straight = _config(tmp_path, "straight", demo, *flags, **{"tokens.train_steps": steps,
                                                              "checkpoints.checkpoint_interval": stop})  # fmt: skip
    ckpt = tmp_path / "ckpt" / "b"
    rest = _config(tmp_path, "rest", demo, *flags, **{"checkpoints.checkpoints_path": str(ckpt),
                                                      "tokens.train_steps": steps})  # fmt: skip
    a = train(straight, RANKS, "main", LAUNCHER_TEST_BATCH_LOG=str(tmp_path / "a"))
    shutil.copytree(tmp_path / "ckpt" / "straight" / str(stop), ckpt / str(stop))
    (ckpt / "latest.txt").write_text(str(stop))
    b = train(rest, RANKS, "main", LAUNCHER_TEST_BATCH_LOG=str(tmp_path / "b"))
    assert f"resuming from the run's own checkpoints in {ckpt} (latest: {stop})" in rest.with_suffix(".log").read_text()
    assert sorted(b) == list(range(stop + 1, steps + 1)), sorted(b)
    return a, _batches(tmp_path / "a"), _batches(tmp_path / "b")


def _windows(folder: Path) -> set[tuple[int, ...]]:
    windows = FolderWindows([(str(folder), 1.0)], 64)
    return {tuple(row) for row in windows[list(range(len(windows)))].tolist()}


def assert_trains_each_dp_rank_on_its_shard(folder: Path, metrics: dict, straight: dict, steps: int) -> None:
    """A run on one folder (8 ranks): the loss falls; the tp ranks of a replica read the same batch, the dp ranks
    their own shards (no window twice in the first `steps` steps, which must fit in an epoch), every row a window
    of the files' own tokens. tests/test_nanoset_slurm.py's uninterrupted run is held to it."""
    losses = [metrics[s]["loss"] for s in sorted(metrics)]
    assert np.mean(losses[:2]) - np.mean(losses[-2:]) > 0.3, losses
    assert sorted(straight) == [0, 1, 2, 3]  # pipeline rank 0, every dp x tp
    by_dp = {dp: [straight[dp * 2 + tp] for tp in (0, 1)] for dp in (0, 1)}
    assert all(a == b for a, b in by_dp.values())  # the tp ranks of a replica read the same batch
    rows = {dp: [tuple(row) for batch in by_dp[dp][0][: steps * ACCUMULATION] for row in batch] for dp in (0, 1)}
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
    assert all(len(drawn) == 7 * ACCUMULATION for drawn in straight.values())
    assert resumed == {rank: drawn[5 * ACCUMULATION :] for rank, drawn in straight.items()}
    second = {tuple(row) for batch in straight[0][3 * ACCUMULATION :] for row in batch}
    assert second <= {w[:64] for w in _windows(b)}  # from step 4 on: the second stage's folder only


def test_the_next_micro_batch_after_a_checkpoint():
    assert start_index(0, 2, 2) == 0 and start_index(32, 2, 2) == 8
    with pytest.raises(Exception, match="resume in the layout it was saved in"):
        start_index(30, 4, 2)
