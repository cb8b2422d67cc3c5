"""Goodput on the real local cluster: a training process killed mid-run and a node whose slurmd stops mid-run each
end with training finished in the same job, without a requeue, on the spare, the failed node left out; a run that
cannot progress stops after its bound with the cause; one wandb run across a preemption and a restart; a rank
slowed on purpose named as a straggler. (The time from a failure to the next step, restart against requeue:
bench/bench_goodput.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_runs import (
    assert_continuous,
    bundles,
    finish,
    latest_step,
    launch,
    leftover_processes,
    manifest,
    submitted_job_id,
    wait_for,
)
from launcher_helpers import wrapped_script
from test_preemption import drawn, last_logged_step, logged_run_train, straight_run
from wandb_records import offline_runs

from launcher import protocol as P
from launcher.localcluster import ClusterSpec, down, up
from launcher.slurm.parse import parse_scontrol

pytestmark = pytest.mark.slurm


def job_fields(job_id: str, env: dict) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
    return parse_scontrol(out.stdout)


def trainers(job_id: str, conf: str) -> dict[int, tuple[int, str]]:
    """The job's training processes on this machine: rank -> (pid, node), from their environment."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            env = dict(x.split("=", 1) for x in (proc / "environ").read_text().split("\0") if "=" in x)
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        tag = env.get(P.ENV_NODE_TAG, "")
        if env.get("SLURM_CONF") == conf and tag.startswith(f"{job_id}:") and "RANK" in env and "LOCAL_RANK" in env:
            found[int(env["RANK"])] = (int(proc.name), tag.split(":", 1)[1])
    return found


def started(tmp_path: Path, run_name: str, at_step: int, checkpoint: int = 0) -> tuple[Path, str]:
    """The launched run's bundle and job id, once it has logged `at_step` and saved `checkpoint`."""
    (bundle_dir,) = wait_for(lambda: list((tmp_path / "logs/configs" / run_name).glob("*")), timeout=60)
    job_id = wait_for(lambda: submitted_job_id(bundle_dir), timeout=60)
    wait_for(lambda: last_logged_step(bundle_dir) >= at_step and latest_step(tmp_path / "checkpoints" / run_name)
             >= checkpoint, timeout=240)  # fmt: skip
    return bundle_dir, job_id


def log_of(bundle_dir: Path) -> str:
    return Path(manifest(bundle_dir)["outputs"]["log"]).read_text()


def assert_restarted_in_the_same_job(bundle_dir: Path, job_id: str, env: dict, out: str, cause: str) -> dict:
    """Finished in one attempt of one job, restarted once in its allocation: the ledger's and the manifest's
    record of it, returned."""
    log = log_of(bundle_dir)
    assert "ended COMPLETED" in out and "restarted 1x in its allocation" in out, out[-3000:] + log[-3000:]
    assert f"job {job_id} attempt 2" not in log and job_fields(job_id, env)["Restarts"] == "0"  # no requeue
    record = manifest(bundle_dir)
    assert record["ended"]["restarts_in_allocation"] == 1 and record["verdict"] is None
    ledger = record["ledger"]
    assert ledger["restarts"] == {cause: 1} and ledger["causes"] == {}
    (cost,) = ledger["lost_per_restart"]
    assert cost["cause"] == cause and cost["gpu_hours"] > 0 and cost["failure_to_next_step_s"] > 0
    assert f"to 1 {cause} (restarted in the allocation)" in out
    return record


def test_a_killed_training_process_restarts_on_the_spare_in_the_same_job(
    tmp_path: Path, slurm_env: dict, demo_data, slurm_nanoset: Path
):
    """On a folder tokenized as a Slurm array job on this cluster (`slurm_nanoset`): after the restart from the
    checkpoint, each rank draws the micro-batches the uninterrupted run draws (the steps after the checkpoint drawn
    again, the same)."""
    script = logged_run_train(tmp_path, tmp_path / "killed")
    proc = launch(tmp_path, slurm_env, demo_data, "killed", "--train_steps", "200", "--save_interval", "5",
                  "--spare_nodes", "1", "--time_limit", "20:00", "--dataset", str(slurm_nanoset),
                  "--nanotron_dialect", "main", "--run_train_script", str(script), nodes="1")  # fmt: skip
    bundle_dir, job_id = started(tmp_path, "killed", at_step=8, checkpoint=5)
    ranks = wait_for(lambda: len(t := trainers(job_id, slurm_env["SLURM_CONF"])) == 2 and t, timeout=30)
    pid, failed = ranks[1]
    spare = ({"node1", "node2"} - {failed}).pop()
    os.kill(pid, signal.SIGKILL)  # a training process dies, with no word
    code, out = finish(proc, timeout=600)
    log = log_of(bundle_dir)
    assert code == 0, out[-3000:] + log[-3000:]
    restart = next(line for line in log.splitlines() if P.pattern("restart").match(line))
    assert f"restart 1 of 10 in the allocation, leaving out {failed}: training again on {spare} from the " in restart
    assert f"after a failure (rank 1 on {failed}: died of SIGKILL" in restart
    assert (bundle_dir / P.RANKS_FILE).read_text() == f"{spare} 0 1\n"  # the last step ran on the spare
    assert_continuous(bundle_dir, 200)
    assert_restarted_in_the_same_job(bundle_dir, job_id, slurm_env, out, "failure")
    assert "restarts     after failure at step " in out and f"without {failed}" in out
    straight = straight_run(tmp_path, bundle_dir, 2)
    for rank, rows in drawn(tmp_path / "killed").items():
        last = {index: tokens for index, tokens in rows}  # each index as drawn last: after the restart
        assert all(last[index] == tokens for index, tokens in rows), rank  # drawn again: the same tokens
        assert [i for i, _ in rows].count(0) == 1 and last == dict(straight[rank]), rank


def test_a_hung_rank_restarts_on_the_spare_in_the_same_job(tmp_path: Path, slurm_env: dict, demo_data):
    """The watchdog catches the hang, its stacks name the node, and training goes on on the spare: the restart
    after a hang starts the next step's watchdog with the first one's gone."""
    proc = launch(tmp_path, slurm_env, demo_data, "hung", "--train_steps", "30", "--save_interval", "3",
                  "--hang_timeout", "20", "--startup_timeout", "300", "--spare_nodes", "1", "--run_train_script",
                  wrapped_script(tmp_path), "--extra_env", f"HANG_AT=5 HANG_ONCE={tmp_path / 'hung-once'}",
                  "--time_limit", "20:00", nodes="1")  # fmt: skip  # no time-limit requeue at load ~15
    code, out = finish(proc, timeout=600)
    (bundle_dir,) = bundles(tmp_path, "hung")
    log, job_id = log_of(bundle_dir), submitted_job_id(bundle_dir)
    assert code == 0, out[-3000:] + log[-3000:]
    suspected = next(line for line in log.splitlines() if P.pattern("suspected").match(line))
    node = suspected.split("suspected: ")[1].split(" (")[0]
    spare = ({"node1", "node2"} - {node}).pop()
    restart = next(line for line in log.splitlines() if P.pattern("restart").match(line))
    assert f"restart 1 of 10 in the allocation, leaving out {node}: training again on {spare} from the checkpoint " \
        "of step 3, after a hang" in restart, restart  # fmt: skip
    assert (bundle_dir / P.RANKS_FILE).read_text() == f"{spare} 0 1\n"  # the last step ran on the spare
    assert_continuous(bundle_dir, 30)
    assert_restarted_in_the_same_job(bundle_dir, job_id, slurm_env, out, "hang")


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], ClusterSpec]]:
    """A 3-node cluster that notices a silent slurmd after 20 s (at 10 s and load ~9, Slurm 24.11 once marked the
    healthy first node DOWN with the killed one, ending the job with its batch script)."""
    spec = ClusterSpec(tmp_path_factory.mktemp("spare"), nodes=3, gpus_per_node=2, slurmd_timeout_s=20)
    yield up(spec), spec
    down(spec)


def test_a_node_whose_slurmd_stops_is_left_out_and_training_goes_on_on_the_spare(
    tmp_path: Path, slurm_env: dict, three_nodes, demo_data
):
    env, spec = {**slurm_env, **three_nodes[0]}, three_nodes[1]
    # 2 nodes train, 1 is spare; each step takes at least 200 ms until the restart, so that the run outlasts Slurm's
    # notice (20-30 s, more at load: the 400 steps take 80 s at least); the steps after it at full speed; 20 minutes,
    # so that no time-limit notice comes first
    fast = tmp_path / "restarted"
    proc = launch(tmp_path, env, demo_data, "nodefails", "--train_steps", "400", "--save_interval", "20",
                  "--spare_nodes", "1", "--run_train_script", wrapped_script(tmp_path),
                  "--extra_env", f"STEP_S=0.2 STEP_S_UNTIL={fast}", "--time_limit", "20:00")  # fmt: skip
    bundle_dir, job_id = started(tmp_path, "nodefails", at_step=25, checkpoint=20)
    ranks = wait_for(lambda: len(t := trainers(job_id, env["SLURM_CONF"])) == 4 and t, timeout=30)
    first = ranks[0][1]  # the rendezvous host, where the batch script runs
    failed = next(node for _, node in ranks.values() if node != first)
    os.kill(int((spec.dir / f"run/slurmd.{failed}.pid").read_text()), signal.SIGKILL)  # the node stops answering
    try:
        wait_for(lambda: "training again on" in log_of(bundle_dir), timeout=300)
        fast.touch()
        code, out = finish(proc, timeout=600)
        log = log_of(bundle_dir)
        assert code == 0, out[-3000:] + log[-3000:]
        restart = next(line for line in log.splitlines() if P.pattern("restart").match(line))
        spare = ({"node1", "node2", "node3"} - {first, failed}).pop()
        assert f"leaving out {failed}: training again on {first},{spare} from the checkpoint of step " in restart
        assert restart.endswith(f"after a node failure ({failed} left the allocation)"), restart
        assert f"srun: error: Node failure on {failed}" in log
        assert sorted((bundle_dir / P.RANKS_FILE).read_text().split()[::3]) == sorted([first, spare])
        assert_continuous(bundle_dir, 400)
        record = assert_restarted_in_the_same_job(bundle_dir, job_id, env, out, "node failure")
        steps = [a for a in record["ledger"]["attempts"] if a["number"] == 1]
        assert [a["gpus"] for a in steps] == [6, 4]  # the failed node's GPUs left the allocation with it
    finally:
        for pid in leftover_processes(job_id, env["SLURM_CONF"]):  # training ran on there without its slurmd
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid.split()[0]), signal.SIGKILL)
        up(spec)  # its slurmd back


@pytest.mark.parametrize(
    "crash,reason",
    [
        ("CRASH_AT=3", "3 node steps in a row ended without a checkpoint newer than step 0"),
        ("RAISE_AT=3", "the same exception as the failure before, at the same point of the run (after step 2)"),
    ],
    ids=["no-progress", "same-exception"],
)
def test_a_run_that_cannot_progress_stops_after_its_bound(
    tmp_path: Path, slurm_env: dict, demo_data, crash: str, reason: str
):
    proc = launch(tmp_path, slurm_env, demo_data, "stuck", "--train_steps", "50", "--save_interval", "1000",
                  "--spare_nodes", "1", "--run_train_script", wrapped_script(tmp_path), "--extra_env", crash,
                  nodes="1")  # fmt: skip
    code, out = finish(proc, timeout=600)
    (bundle_dir,) = bundles(tmp_path, "stuck")
    log = log_of(bundle_dir)
    job_id = submitted_job_id(bundle_dir)
    assert code == 1 and "ended FAILED" in out, out[-3000:] + log[-3000:]
    stop = [line for line in log.splitlines() if P.pattern("no_restart").match(line)]
    assert len(stop) == 1 and f"not restarting or requeueing: {reason}" in stop[0], log[-3000:]
    restarts = [line for line in log.splitlines() if P.pattern("restart").match(line)]
    assert len(restarts) == (2 if crash.startswith("CRASH") else 1) and f"job {job_id} attempt 2" not in log
    verdict = manifest(bundle_dir)["verdict"]
    assert f"not restarted: {reason}" in verdict["message"] and verdict["fix"] in out
    if crash.startswith("RAISE"):
        assert verdict["cause"] == "exception" and "ValueError: bad shard 7 in the data" in verdict["message"]
        assert "correct what its traceback points at" in verdict["fix"]


def test_one_wandb_run_across_a_restart_and_a_preemption(tmp_path: Path, slurm_env: dict, demo_data):
    """wandb offline: a training process killed (a restart in the allocation), then a preemption (a requeue),
    and every attempt appends to the one run whose id is kept beside the checkpoints."""
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    proc = launch(tmp_path, slurm_env, demo_data, "tracked", "--train_steps", "150", "--save_interval", "5",
                  "--spare_nodes", "1", "--wandb_disabled", "false", "--run_train_script", wrapped_script(tmp_path),
                  "--extra_env", f"WANDB_MODE=offline WANDB_DIR={wandb_dir} STEP_S=0.05 "
                  f"{P.ENV_STOP_FILE_EVERY}=0.2", nodes="1")  # fmt: skip
    bundle_dir, job_id = started(tmp_path, "tracked", at_step=8, checkpoint=5)
    ranks = wait_for(lambda: len(t := trainers(job_id, slurm_env["SLURM_CONF"])) == 2 and t, timeout=30)
    os.kill(ranks[1][0], signal.SIGKILL)
    wait_for(lambda: "training again on" in log_of(bundle_dir), timeout=120)
    restarted_at = last_logged_step(bundle_dir)
    wait_for(lambda: last_logged_step(bundle_dir) >= restarted_at + 10, timeout=240)
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "2",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 3"]  # fmt: skip
    subprocess.run(urgent, env=slurm_env, capture_output=True, text=True, check=True)
    code, out = finish(proc, timeout=600)
    log = log_of(bundle_dir)
    assert code == 0, out[-3000:] + log[-3000:]
    assert "restart 1 of 10 in the allocation" in log and "requeueing after the preemption" in log
    assert f"job {job_id} attempt 2 started" in log
    assert_continuous(bundle_dir, 150)
    run_id = (tmp_path / "checkpoints/tracked" / P.WANDB_RUN_ID_FILE).read_text().strip()
    runs = offline_runs(wandb_dir / "wandb")
    assert len(runs) >= 3 and all(r.directory.endswith(f"-{run_id}") for r in runs), runs  # 3 starts, one run
    assert {r.run_id for r in runs} - {None} == {run_id}, runs
    # continuous: every step is in the run, the ones a start's wandb lost (the preemption's SIGTERM killed its
    # service) given again by the next start from the job's metrics file
    steps = sorted({s for r in runs for s in r.steps})
    assert steps == list(range(1, 151)), runs


def test_a_slowed_rank_is_named_in_the_log_the_summary_and_the_picture(tmp_path: Path, slurm_env: dict, demo_data):
    proc = launch(tmp_path, slurm_env, demo_data, "slowed", "--train_steps", "40", "--run_train_script",
                  wrapped_script(tmp_path), "--extra_env",
                  f"SLOW_RANK=3 SLOW_S=0.15 {P.ENV_STRAGGLER_EVERY}=5")  # fmt: skip
    code, out = finish(proc, timeout=600)
    (bundle_dir,) = bundles(tmp_path, "slowed")
    log = log_of(bundle_dir)
    assert code == 0, out[-3000:] + log[-3000:]
    node = (bundle_dir / P.RANKS_FILE).read_text().splitlines()[1].split()[0]  # ranks 2-3's node
    (line,) = [x for x in log.splitlines() if x.startswith("straggler: ")]
    assert line.startswith(f"straggler: rank 3 on {node} is ") and "3 looks in a row, to step 15" in line
    summary = next(x for x in out.splitlines() if x.startswith("  stragglers"))
    assert f"rank 3 on {node}: " in summary and "the median rank's own work per step (steps 1-40" in summary
    rows = [json.loads(x) for x in (bundle_dir / P.STRAGGLERS_FILE).read_text().splitlines()]
    assert {r["rank"] for r in rows} == {3} and [r["step"] for r in rows] == [15, 20, 25, 30, 35, 40]
    assert (bundle_dir / "training.png").stat().st_size > 10_000
