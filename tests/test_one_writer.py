"""One writer per run: a second launch of a live run is refused before the queue, and a second job of one run (a
script submitted twice by hand) refuses to train beside the first (the lock under the checkpoints path)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from cluster_runs import bundles, finish, launch, manifest, paced, submitted_job_id, wait_for
from launcher_helpers import spec_for

from launcher import protocol as P
from launcher.problems import Problem
from launcher.slurm import client, one_writer

pytestmark = pytest.mark.slurm


def test_a_live_job_of_the_run_is_named_unless_awaited(tmp_path: Path, monkeypatch):
    spec, _ = spec_for("--run_name", "r", "--dataset", "none", cwd=tmp_path)
    ckpt = Path(spec.args.paths.checkpoints_path) / "r"
    ckpt.mkdir(parents=True)
    (ckpt / P.LOCK).mkdir()  # as the batch script takes it: a directory, the holder's job id in a file inside
    (ckpt / P.LOCK / P.LOCK_HOLDER).write_text("41\n")
    monkeypatch.setattr(client, "live_jobs", lambda name: [("41", "RUNNING", "/x/logs/slurm_scripts/r/s.sbatch")])
    (problem,) = one_writer.problems(spec)
    assert isinstance(problem, Problem) and problem.flag == "run_name"
    assert f"job 41 is RUNNING and trains into {ckpt}" in problem.message
    assert "--dependency afterany:41" in problem.fix
    waiting, _ = spec_for("--run_name", "r", "--dataset", "none", "--dependency", "afterok:41", cwd=tmp_path)
    assert one_writer.problems(waiting) == []
    fresh, _ = spec_for("--run_name", "r", "--dataset", "none", "--resume", "false", cwd=tmp_path)
    assert one_writer.problems(fresh) == []
    # a rerun named otherwise that resumes r's directory (jobs rerun --resume): r's job is asked for and named
    asked: list[str] = []
    monkeypatch.setattr(client, "live_jobs", lambda name: asked.append(name) or [("41", "RUNNING", "/x/s.sbatch")])
    rerun, _ = spec_for("--run_name", "b", "--dataset", "none", cwd=tmp_path)
    (problem,) = one_writer.problems(dataclasses.replace(rerun, checkpoints=ckpt))
    assert asked == ["b,r"] and f"job 41 is RUNNING and trains into {ckpt}" in problem.message
    monkeypatch.setattr(client, "live_jobs", lambda name: [("52", "PENDING", "/elsewhere/job.sbatch")])
    assert one_writer.problems(spec) == []  # a job of that name that is not this run's


def test_a_second_launch_of_a_live_run_is_refused(tmp_path: Path, slurm_env: dict, demo_data):
    first = launch(tmp_path, slurm_env, demo_data, "twice", "--train_steps", "100000", "--run_train_script",
                   paced(tmp_path), follow=False, nodes="1")  # fmt: skip
    assert finish(first, timeout=60)[0] == 0
    job_id = submitted_job_id(bundles(tmp_path, "twice")[0])
    try:
        code, out = finish(launch(tmp_path, slurm_env, demo_data, "twice", follow=False, nodes="1"), timeout=60)
        assert code == 2 and f"--run_name: job {job_id} is" in out, out
        assert len(bundles(tmp_path, "twice")) == 1  # nothing written
        chained = launch(tmp_path, slurm_env, demo_data, "twice", "--dependency", f"afterany:{job_id}",
                         "--dry_run", "true", nodes="1", follow=False)  # fmt: skip
        assert finish(chained, timeout=60)[0] == 0
    finally:
        client.cancel(job_id)


def test_a_script_submitted_twice_trains_once(tmp_path: Path, slurm_env: dict, demo_data):
    first = launch(tmp_path, slurm_env, demo_data, "dup", "--train_steps", "100000", "--run_train_script",
                   paced(tmp_path), follow=False, nodes="1")  # fmt: skip
    assert finish(first, timeout=60)[0] == 0
    (bundle_dir,) = bundles(tmp_path, "dup")
    job_id = submitted_job_id(bundle_dir)
    script = manifest(bundle_dir)["files"]["script"]["path"]
    log = Path(manifest(bundle_dir)["outputs"]["log"])
    try:
        wait_for(lambda: log.exists() and "step 2/" in log.read_text(), timeout=120)
        again = subprocess.run(["sbatch", "--parsable", script], env=slurm_env, capture_output=True, text=True)
        second = again.stdout.strip()
        wait_for(lambda: (s := client.job_state(second)) is not None and s.terminal, timeout=90)
        state = client.job_state(second)
        assert state is not None and state.state == "FAILED" and state.exit_code == 4, state
        text = log.read_text()
        assert (
            f"two jobs of one run: job {job_id} (RUNNING) holds" in text and f"--dependency afterany:{job_id}" in text
        )
        assert (client.job_state(job_id) or state).state == "RUNNING"  # the first trains on
    finally:
        client.cancel(job_id)
