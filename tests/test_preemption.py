"""A real preemption on the local cluster: a job in the `urgent` partition (priority tier 2) takes the GPUs of a
training run in `debug` (tier 1, PreemptMode=REQUEUE, GraceTime=60), as sites set it up.

Slurm's notice is SIGTERM to the run's training processes (or, with SlurmctldParameters=preempt_send_user_signal,
the job's own --signal to its batch script); the run must save a checkpoint at its next step, be requeued once (by
itself on Slurm 22.05; by Slurm on 24.05 and later, where a second requeue by the job would make a third attempt),
and resume from that checkpoint. CI runs these on every release (scripts/slurm_root.sh). --save_interval is larger
than the run, so only the notice can have saved it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cluster_runs import (
    assert_continuous,
    bundles,
    finish,
    launch,
    manifest,
    submitted_job_id,
    wait_for,
    with_fake_nvidia_smi,
)
from launcher_helpers import ROOT
from slurm_cluster import slurm_release

from launcher import jsonl
from launcher import protocol as P
from launcher.localcluster import ClusterSpec, down, up
from launcher.slurm.parse import parse_scontrol

pytestmark = pytest.mark.slurm


def last_logged_step(bundle_dir: Path) -> int:
    path = bundle_dir / "metrics.jsonl"
    return max((r["step"] for r in jsonl.read(path)), default=0) if path.exists() else 0


LOGGED_RUN_TRAIN = """# run_train.py, each micro-batch the torch engine draws logged per rank: [index, token ids]
import json, os, runpy, sys
sys.path.insert(0, {root!r})
from launcher.train.data import PackedWindows

real = PackedWindows.micro_batch

def micro_batch(self, index):
    batch = real(self, index)
    with open({base!r} + ".rank" + os.environ.get("RANK", "0") + ".jsonl", "a") as out:
        out.write(json.dumps([index, batch.tolist()]) + "\\n")
    return batch

PackedWindows.micro_batch = micro_batch
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def logged_run_train(where: Path, base: Path) -> Path:
    """A --run_train_script: run_train.py with every micro-batch logged to `<base>.rank<RANK>.jsonl`."""
    script = where / f"run_train_logged_{base.name}.py"
    script.write_text(LOGGED_RUN_TRAIN.format(root=str(ROOT), base=str(base), script=str(ROOT / "run_train.py")))
    return script


def drawn(base: Path) -> dict[int, list]:
    """{rank: every [index, token ids] it drew, in order}."""
    return {int(p.name.split(".rank")[1].split(".")[0]): [json.loads(line) for line in p.read_text().splitlines()]
            for p in base.parent.glob(f"{base.name}.rank*.jsonl")}  # fmt: skip


def straight_run(tmp_path: Path, bundle_dir: Path, ranks: int) -> dict[int, list]:
    """The bundle's own config trained uninterrupted (torchrun, `ranks` processes on this machine, its own
    checkpoints): what each rank draws."""
    config = yaml.safe_load((bundle_dir / "config.yaml").read_text())
    config["checkpoints"]["checkpoints_path"] = str(tmp_path / "straight-ckpt")
    path = tmp_path / "straight.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    script = logged_run_train(tmp_path, tmp_path / "straight")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
               str(script), "--config-file", str(path), "--engine", "torch"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_CONF", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return drawn(tmp_path / "straight")


def preempt_and_follow(tmp_path: Path, env: dict, demo_data, run_name: str, *flags: str) -> tuple[str, int, str, str]:
    """Launch a run on all GPUs, let it train past step 10, preempt it with an urgent job; return the job id, the
    step seen before the preemption, the launcher's output and the job's log. `flags`: more launcher flags."""
    # training runs ~150 steps in 5 s here: rank 0 looks for the stop file every 0.2 s, not every 5 s, so that the
    # notice is heard before the run ends
    proc = launch(tmp_path, env, demo_data, run_name, "--train_steps", "150", "--save_interval", "100000",
                  "--extra_env", f"{P.ENV_STOP_FILE_EVERY}=0.2", *flags)  # fmt: skip
    (bundle_dir,) = wait_for(lambda: list((tmp_path / "logs/configs" / run_name).glob("*")), timeout=30)
    job_id = wait_for(lambda: submitted_job_id(bundle_dir), timeout=60)
    wait_for(lambda: last_logged_step(bundle_dir) >= 10, timeout=180)
    seen = last_logged_step(bundle_dir)
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "2",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 3"]  # fmt: skip
    urgent_id = subprocess.run(urgent, env=env, capture_output=True, text=True, check=True).stdout.strip()
    code, out = finish(proc, timeout=400)
    assert code == 0, out
    shown = subprocess.run(["scontrol", "show", "job", "-o", urgent_id], env=env, capture_output=True, text=True)
    assert parse_scontrol(shown.stdout).get("JobState") == "COMPLETED", shown  # the urgent job got the GPUs, ran
    return job_id, seen, out, Path(manifest(bundle_dir)["outputs"]["log"]).read_text()


def assert_saved_by_the_notice(bundle_dir: Path, job_id: str, seen: int, out: str, log: str, env: dict) -> None:
    saved = int(log.split("stop requested: checkpoint saved at step ")[1].split(";")[0])
    assert saved >= seen  # the step the notice found, not a periodic checkpoint (there is none before 100000)
    assert "requeueing after the preemption" in log and f"job {job_id} attempt 2 started" in log
    # Slurm 24.05+ requeues a preempted job itself, and the job must not requeue it again (a third attempt would
    # follow); 22.05 leaves the requeue to the job
    by_slurm = "requeueing after the preemption (by Slurm {}.{:02d}".format(*slurm_release(env))
    assert (by_slurm in log) == (slurm_release(env) >= (24, 5)), log
    assert f"job {job_id} attempt 3" not in log
    assert f"resumed from checkpoint step {saved} " in log
    assert "ended COMPLETED" in out and "requeued 1x" in out
    assert (bundle_dir / "requeues").read_text().startswith(f"preemption attempt 1 step {saved}")
    assert_continuous(bundle_dir, 150)


@pytest.mark.slurm_versions
def test_preemption_sigterm_checkpoints_requeues_and_resumes(tmp_path: Path, slurm_env: dict, demo_data):
    env = with_fake_nvidia_smi(tmp_path, slurm_env)  # so that each attempt starts the GPU monitor on each node
    job_id, seen, out, log = preempt_and_follow(tmp_path, env, demo_data, "preempted")
    assert "preemption notice: Slurm preempted this job at" in log
    assert "time-limit or preemption notice (USR1)" not in log  # Slurm's notice here is SIGTERM to training
    (bundle_dir,) = bundles(tmp_path, "preempted")
    assert_saved_by_the_notice(bundle_dir, job_id, seen, out, log, env)
    logs = Path(manifest(bundle_dir)["outputs"]["log"]).parent
    monitors = {p.name: p.read_text() for p in logs.glob(f"gpu-{job_id}-*")}
    names = [f"gpu-{job_id}-{node}.log{attempt}" for node in ("node1", "node2") for attempt in ("", ".2")]
    assert sorted(monitors) == names  # one GPU monitor log per attempt and node: the requeue overwrote none
    assert all("# gpu sample" in text for text in monitors.values()), monitors
    ledger = manifest(bundle_dir)["ledger"]  # without accounting: from the job's records
    assert ledger["source"] == "job records" and ledger["causes"] == {"preemption": 1}
    assert ledger["steps_thrown_away"] == 0  # the notice's checkpoint was the step the preemption found
    assert ledger["lost_to_gpu_hours"]["preemption"] > 0 and "to 1 preemption" in out


def test_a_preempted_run_on_a_slurm_tokenized_folder_reads_what_the_straight_run_reads(
    tmp_path: Path, slurm_env: dict, demo_data, slurm_nanoset: Path
):
    """The torch engine on a folder tokenized as a Slurm array job on this same cluster (`slurm_nanoset`): the loss
    falls, and after a real preemption every rank's micro-batches of both attempts are those of an uninterrupted
    torchrun of the bundle's own config (4 ranks, 150 each, across epochs). Not a release difference: `make test`
    runs it on 22.05 alone (the preemption itself is the test above, on every release)."""
    script = logged_run_train(tmp_path, tmp_path / "onfolder")
    flags = ("--dataset", str(slurm_nanoset), "--nanotron_dialect", "main", "--run_train_script", str(script))
    job_id, seen, out, log = preempt_and_follow(tmp_path, slurm_env, demo_data, "onfolder", *flags)
    (bundle_dir,) = bundles(tmp_path, "onfolder")
    assert_saved_by_the_notice(bundle_dir, job_id, seen, out, log, slurm_env)
    losses = [r["loss"] for r in jsonl.read(bundle_dir / "metrics.jsonl")]
    assert sum(losses[:10]) / 10 - sum(losses[-10:]) / 10 > 0.3, losses
    preempted, straight = drawn(tmp_path / "onfolder"), straight_run(tmp_path, bundle_dir, 4)
    assert sorted(straight) == [0, 1, 2, 3] and all(len(rows) == 150 for rows in straight.values())
    assert all([i for i, _ in rows] == list(range(150)) for rows in straight.values())  # one micro-batch a step
    assert preempted == straight  # both attempts: every rank, every micro-batch, the straight run's token ids


@pytest.fixture(scope="module")
def user_signal_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A second local cluster whose preemption sends the job's own --signal (preempt_send_user_signal)."""
    spec = ClusterSpec(tmp_path_factory.mktemp("usersignal"), nodes=2, gpus_per_node=2, send_user_signal=True)
    yield up(spec)
    down(spec)


@pytest.mark.slurm_versions
def test_preemption_with_the_jobs_own_signal(tmp_path: Path, slurm_env: dict, user_signal_cluster, demo_data):
    env = {**slurm_env, **user_signal_cluster}
    job_id, seen, out, log = preempt_and_follow(tmp_path, env, demo_data, "signalled")
    assert "time-limit or preemption notice (USR1)" in log  # the batch script heard the job's own signal
    assert "preemption notice: Slurm preempted this job at" in log  # and knew it for a preemption
    (bundle_dir,) = bundles(tmp_path, "signalled")
    assert_saved_by_the_notice(bundle_dir, job_id, seen, out, log, env)
