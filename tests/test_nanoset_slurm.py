"""The chain on one local cluster: a corpus tokenized as a Slurm array job (`launcher.data tokenize --slurm`:
datatrove's SlurmPipelineExecutor, 2 tasks, 2 token files), then nanotron main's trainer on that folder through
`slurm_launcher.py` on the same cluster, 8 ranks (dp 2 x tp 2 x pp 2, 2 nodes x 4 slots, the CPU patches of
tests/cpu_nanotron), preempted by a job in `urgent`: Slurm's SIGTERM, the checkpoint at the next step, the requeue,
and every rank's micro-batches, both attempts together, the token ids the uninterrupted run reads (logged by the
test-side hook, LAUNCHER_TEST_BATCH_LOG), every step's LR, loss and grad norm its own. (0.4's trainer through the
time-limit notice: tests/test_nanotron_slurm.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_nanotron_slurm
import yaml
from conftest import DemoData
from cpu_nanotron import train
from slurm_cluster import tokenize_on_slurm
from test_nanoset_nanotron import ACCUMULATION, RANKS, _batches, _config, assert_trains_each_dp_rank_on_its_shard
from test_nanotron_slurm import assert_as_the_reference, assert_launched_as_eight, launch, preempt_to_the_end, training

pytestmark = [pytest.mark.slurm, pytest.mark.nanotron_cpu]
four_slots = test_nanotron_slurm.four_slots  # its fixture: a cluster of 2 nodes x 4 slots


@pytest.fixture(scope="module")
def tokenized_on_slurm(four_slots: dict, demo_data: DemoData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo dataset tokenized as an array job of 2 tasks on the 8-slot cluster the runs train on."""
    return tokenize_on_slurm(four_slots, demo_data, tmp_path_factory.mktemp("on-slurm") / "out")


def test_a_preempted_8_rank_main_run_on_a_folder_resumes_at_the_next_sample(
    tmp_path: Path, slurm_env: dict, four_slots: dict, demo_data: Any, tokenized_on_slurm: Path
):
    steps, folder = 16, str(tokenized_on_slurm)  # ~15 steps make an epoch of the folder: the run crosses its end
    assert len(list(tokenized_on_slurm.glob("*.ds"))) == 2  # one token file per array task
    straight = _config(tmp_path, "straight", demo_data, "--dataset", folder,
                       **{"tokens.train_steps": steps, "checkpoints.save_initial_state": True})  # fmt: skip
    dataset = yaml.safe_load(straight.read_text())["data_stages"][0]["data"]["dataset"]
    assert dataset["dataset_folder"] == [folder]  # main's NanosetDatasetsArgs, read by main's own parser
    metrics = train(straight, RANKS, "main", LAUNCHER_TEST_BATCH_LOG=str(tmp_path / "a"))
    assert_trains_each_dp_rank_on_its_shard(Path(folder), metrics, _batches(tmp_path / "a"), 8)
    init = tmp_path / "ckpt" / "straight" / "0"
    env = f"LAUNCHER_STOP_FILE_EVERY_S=0.2 LAUNCHER_TEST_BATCH_LOG={tmp_path / 'b'}"
    flags = ("--save_interval", "100000", "--max_requeues", "2", "--extra_env", env, "--dataset", folder,
             "--learning_rate", "3e-3")  # the straight run's (_config's)  # fmt: skip
    proc = launch(tmp_path, four_slots, demo_data, "main", "preempted", init, steps, *flags)
    bundle_dir, job_id = training(tmp_path, "preempted")
    log, out, saved = preempt_to_the_end(tmp_path, four_slots, proc, bundle_dir, job_id, steps)
    assert f"(latest: {saved})" in log
    assert_launched_as_eight(out, log, bundle_dir)
    assert_as_the_reference(bundle_dir, metrics)
    straight_batches, preempted = _batches(tmp_path / "a"), _batches(tmp_path / "b")
    assert all(len(drawn) == steps * ACCUMULATION for drawn in straight_batches.values())
    assert preempted == straight_batches  # every rank, every micro-batch, both attempts: the straight run's ids
