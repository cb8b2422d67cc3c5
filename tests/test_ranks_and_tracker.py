"""Which node holds which ranks, the stragglers rank 0 names (launcher/train/ranks.py), and the one wandb run a
training run keeps (launcher/train/tracker.py). The torch engine's two ranks under torchrun, one slowed on purpose
by the tests' wrapper (launcher_helpers.wrapped_script); tests/test_goodput.py shows the names in a Slurm job's
summary and picture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DemoData, tiny_config, write_config
from launcher_helpers import wrapped_script
from test_train_engine import TORCHRUN_WITH_SIGTERM_BLOCKED

from launcher import protocol as P
from launcher.node.restart import ranks_map
from launcher.train import ranks, tracker
from launcher.train.environment import JobEnvironment


def test_the_rank_map_names_each_nodes_ranks_and_reads_back(tmp_path: Path):
    job = JobEnvironment(ranks_file=str(tmp_path / "ranks"))
    ranks.write_rank_map(job, ["node2", "node2", "node5", "node5", "node7"])
    assert (tmp_path / "ranks").read_text() == "node2 0 1\nnode5 2 3\nnode7 4 4\n"
    assert ranks_map(tmp_path / "ranks") == {0: "node2", 1: "node2", 2: "node5", 3: "node5", 4: "node7"}


def test_a_rank_is_slow_above_its_share_of_the_median_by_a_share_of_a_step():
    assert ranks.slow_ranks([0.10, 0.11, 0.10, 0.30], 0.32) == (pytest.approx(0.105), [3])
    assert ranks.slow_ranks([0.10, 0.11, 0.10, 0.12], 0.14)[1] == []  # within 20% of the median: no one
    # rank 1 at 1.23x the median, but 3 ms more in a 165 ms step (a busy CPU's noise on a small model): not named
    assert ranks.slow_ranks([0.010, 0.016, 0.010, 0.160], 0.165)[1] == [3]
    assert ranks.slow_ranks([0.010, 0.016, 0.010, 0.160], 0.025)[1] == [1, 3]  # 3 ms of a 25 ms step: it counts


def test_a_whole_slow_node_is_named_as_the_node(tmp_path: Path):
    job = JobEnvironment(stragglers_file=str(tmp_path / "s.jsonl"))
    watch = ranks.StragglerWatch(job, ["a", "a", "b", "b", "c", "c"], torch.device("cpu"))
    watch.streak = [0, 0, 3, 3, 3, 0]  # node b's two ranks slow at three looks, and rank 4 of node c
    found = watch._named(30, 0.0, [0.1, 0.1, 0.3, 0.3, 0.25, 0.1], 0.1)
    assert [(s.rank, s.node, s.ranks) for s in found] == [(None, "b", "2-3"), (4, "c", "4")]
    assert found[0].words().startswith("straggler: b (ranks 2-3) is 3.0x slower than the median rank")
    watch.streak = [0, 0, 2, 2, 0, 0]  # two looks are no straggler yet
    assert watch._named(30, 0.0, [0.1, 0.1, 0.3, 0.3, 0.1, 0.1], 0.1) == []


def test_the_wandb_run_id_is_made_once_and_kept_beside_the_checkpoints(tmp_path: Path):
    first = tracker.wandb_run_id(str(tmp_path / "ckpt"))
    assert first == tracker.wandb_run_id(str(tmp_path / "ckpt")) and len(first) == 8
    assert (tmp_path / "ckpt" / P.WANDB_RUN_ID_FILE).read_text().strip() == first
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [P.WANDB_RUN_ID_FILE]  # no temporary left behind
    assert tracker.wandb_run_id(str(tmp_path / "other")) != first


def test_whoever_calls_wandb_init_opens_the_runs_one_run(tmp_path: Path):
    calls = []

    class FakeWandb:
        @staticmethod
        def init(**kwargs):
            calls.append(kwargs)

    with tracker.one_wandb_run(FakeWandb, str(tmp_path)):
        FakeWandb.init(project="p", name="20261126_run")  # as nanotron's trainer calls it
    FakeWandb.init(project="p")
    run_id = (tmp_path / P.WANDB_RUN_ID_FILE).read_text().strip()
    assert calls == [{"project": "p", "name": "20261126_run", "id": run_id, "resume": "allow"}, {"project": "p"}]


def test_the_steps_wandb_may_have_lost_are_given_again_and_those_it_holds_recorded(tmp_path: Path):
    """wandb's service dies with a preemption's SIGTERM (it writes its offline file at the end): the next start
    gives it again, from the job's metrics file, every step after the last one a finished run held, up to the
    checkpoint it resumes from; the last line of a step wins, as the launcher reads the file."""
    metrics_file = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 1.0 / s, "time": 0.0} for s in (1, 2, 3, 4, 3, 4, 5, 6)]  # 3 and 4 done twice
    metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lost = tracker.lost_steps(str(metrics_file), after=2, up_to=5)
    assert [r["step"] for r in lost] == [3, 4, 5] and lost[0] is not rows[2]  # the later lines of 3 and 4
    assert tracker.lost_steps(str(metrics_file), after=6, up_to=6) == [] == tracker.lost_steps(None, 0, 9)

    class Run:
        def __init__(self, fails: bool):
            self.fails = fails

        def finish(self):
            if self.fails:
                raise ConnectionResetError("Connection lost")

    assert tracker.logged_to(str(tmp_path)) == 0
    tracker.finish(Run(fails=False), str(tmp_path), 40)
    assert tracker.logged_to(str(tmp_path)) == 40
    tracker.finish(Run(fails=True), str(tmp_path), 55)  # a warning, and nothing recorded: 41..55 come again
    assert tracker.logged_to(str(tmp_path)) == 40


def test_a_slowed_rank_is_named_in_the_log_and_the_stragglers_file(demo_data: DemoData, tmp_path: Path):
    config = tiny_config(demo_data, tmp_path / "ckpt", **{"parallelism.dp": 2, "tokens.train_steps": 24,
                         "tokens.batch_accumulation_per_replica": 1})  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "SLOW_RANK": "1", "SLOW_S": "0.15",
           P.ENV_STRAGGLER_EVERY: "4", P.ENV_BUNDLE: str(tmp_path), P.ENV_NODE_TAG: "48:node7"}  # fmt: skip
    argv = [sys.executable, "-c", TORCHRUN_WITH_SIGTERM_BLOCKED, "--nproc_per_node", "2", "--standalone",
            wrapped_script(tmp_path), "--config-file", str(write_config(tmp_path / "c.yaml", config))]  # fmt: skip
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("straggler:")]  # named once
    assert line.startswith("straggler: rank 1 on node7 is ") and "3 looks in a row, to step 12" in line, line
    rows = [json.loads(x) for x in (tmp_path / "stragglers.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [12, 16, 20, 24] and {r["rank"] for r in rows} == {1}  # every look since
    assert all(r["ratio"] > ranks.SLOWER and r["seconds"] >= 0.15 for r in rows), rows
    assert (tmp_path / "ranks").read_text() == "node7 0 1\n"
