"""The batch script (templates/sbatch.sh.j2: a header and one exec of the Python supervisor) run on the real local
Slurm cluster, with real srun and torchrun, its bundle written here by the launcher's renderer: a run that
completes, a failing one that the supervisor restarts in its allocation until the decision stops it, a warning, a
preemption, a cancel, two writers (docs/supervisor.md)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from launcher_helpers import spec_for
from test_slurm_e2e import ALLREDUCE, FAIL, script

from launcher import protocol as P
from launcher.bundle import render
from launcher.bundle.files import paths_for

pytestmark = pytest.mark.slurm

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def submit_draft(tmp_path: Path, env: dict, train: str, *flags: str, ck: Path | None = None) -> tuple[str, Path]:
    """The bundle written with the draft as its batch script (its checkpoints in `ck`, else tmp_path/ck), and
    submitted: the job's id and its log."""
    spec, problems = spec_for("--run_name", "sup", "--nodes", "2", "--gpus_per_node", "2", "--run_train_script",
                              train, "--dataset", "none", "--time_limit", "5:00", *flags, cwd=tmp_path)  # fmt: skip
    assert not problems, problems
    logs = tmp_path / "logs"
    paths = paths_for("sup", "20260101-000000", logs / "configs", logs / "scripts", logs / "out", ck or tmp_path / "ck")
    for folder in (paths.bundle_dir, paths.script.parent, paths.log.parent):
        folder.mkdir(parents=True)
    paths.config.write_text(render.config_yaml(spec, paths))
    paths.job.write_text(render.job_settings(spec, paths).to_json())
    paths.script.write_text(render.sbatch_script(spec, paths))
    job = subprocess.run(["sbatch", "--parsable", str(paths.script)], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.strip().split(";")[0]  # fmt: skip
    return job, paths.log


def run_draft(tmp_path: Path, env: dict, train: str, *flags: str) -> tuple[str, str, str]:
    """The draft submitted and followed to its end: (state, exit code, log)."""
    job, log = submit_draft(tmp_path, env, train, *flags)
    state, code = wait_end(job, env)
    return state, code, log.read_text() if log.exists() else ""


def wait_end(job: str, env: dict, timeout: float = 240) -> tuple[str, str]:
    deadline, state, code = time.monotonic() + timeout, "", ""
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job, "-o"], env=env, capture_output=True, text=True).stdout
        fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
        state, code = fields.get("JobState", ""), fields.get("ExitCode", "")
        if state in TERMINAL:
            break
        time.sleep(1)
    time.sleep(1)  # the log's last lines
    return state, code


def wait_for_line(log: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and text in log.read_text()):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.5)


def lines(log: str, name: str) -> list[str]:
    return [line for line in log.splitlines() if P.pattern(name, whole=False).match(line)]


def test_the_supervisor_runs_a_training_step_to_its_end(tmp_path: Path, slurm_env: dict):
    state, code, log = run_draft(tmp_path, slurm_env, script(tmp_path, "allreduce.py", ALLREDUCE))
    assert (state, code) == ("COMPLETED", "0:0"), log
    for rank in range(4):
        assert f"rank {rank}/4 sum=10 expected=10" in log, log
    assert len(lines(log, "attempt_started")) == 1 and len(lines(log, "rendezvous")) == 1, log
    assert lines(log, "outcome") and lines(log, "attempt_ended")[0].endswith("exit code 0"), log


def test_the_supervisor_restarts_a_failing_step_until_the_decision_stops(tmp_path: Path, slurm_env: dict):
    state, code, log = run_draft(tmp_path, slurm_env, script(tmp_path, "fail.py", FAIL), "--max_restarts", "2")
    restarts = lines(log, "restart")
    assert len(restarts) == 2 and "restart 2 of 2 in the allocation" in restarts[1], log
    assert len(lines(log, "rendezvous")) == 3 and lines(log, "no_restart"), log
    assert state == "FAILED" and lines(log, "attempt_ended")[0].endswith(f"exit code {code.split(':')[0]}"), log


# Training as far as the supervisor sees it: rank 0 reports "stopped 5" once the stop file appears (or SIGTERM comes),
# or "finished 5" in a requeued attempt.
STOPPABLE = """
import os, pathlib, signal, sys, time
rank = int(os.environ.get("RANK", "0"))
bundle = pathlib.Path(os.environ["LAUNCHER_BUNDLE"])
stop, outcome = bundle / "stop-requested", bundle / "outcome"
if int(os.environ.get("SLURM_RESTART_COUNT") or 0) >= 1:
    if rank == 0:
        outcome.write_text("finished 5\\n")
    sys.exit(0)
signalled = []
signal.signal(signal.SIGTERM, lambda *_: signalled.append(1))  # a preemption's notice to training: save, exit
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # (the node step starts torchrun with it blocked)
print(f"rank {rank} training", flush=True)
while not stop.exists() and not signalled:
    time.sleep(0.2)
time.sleep(1)
if rank == 0:
    outcome.write_text("stopped 5\\n")
"""


def test_a_time_limit_warning_stops_training_and_the_job_requeues_itself(tmp_path: Path, slurm_env: dict):
    job, log = submit_draft(tmp_path, slurm_env, script(tmp_path, "stoppable.py", STOPPABLE), "--max_requeues", "1")
    wait_for_line(log, "rank 3 training")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm_env, check=True)
    state, code = wait_end(job, slurm_env, timeout=400)
    text = log.read_text()
    assert (state, code) == ("COMPLETED", "0:0"), text
    assert lines(text, "warned") and "saved at step 5; requeueing after the time-limit notice (1 of 1)" in text, text
    assert f"job {job} attempt 2 started" in text and "training's last word: finished 5" in text, text
    requeues = tmp_path / "logs/configs/sup/20260101-000000" / P.REQUEUES_FILE
    assert requeues.read_text() == "time-limit attempt 1 step 5 nodes -\n"


@pytest.mark.slurm_versions  # relied on unchanged: scancel signals the batch script and its steps, no requeue
def test_a_cancel_ends_the_attempt_and_is_not_requeued(tmp_path: Path, slurm_env: dict):
    job, log = submit_draft(tmp_path, slurm_env, script(tmp_path, "stoppable.py", STOPPABLE), "--max_requeues", "1")
    wait_for_line(log, "rank 3 training")
    subprocess.run(["scancel", job], env=slurm_env, check=True)
    state, _ = wait_end(job, slurm_env)
    text = log.read_text()
    assert state == "CANCELLED" and lines(text, "terminated"), text
    assert lines(text, "outcome") and lines(text, "attempt_ended"), text  # the attempt's end said, as bash said it
    assert "requeueing" not in text and "attempt 2" not in text, text


def test_a_preemption_requeues_the_job_and_it_resumes(tmp_path: Path, slurm_env: dict):
    """A job of the `urgent` partition takes the run's GPUs (tests/test_preemption.py's setting): the supervisor
    reads PreemptTime as the step ends and the job is requeued, by itself (22.05 to 23.11) or by Slurm (24.05+)."""
    job, log = submit_draft(tmp_path, slurm_env, script(tmp_path, "stoppable.py", STOPPABLE), "--max_requeues", "1")
    wait_for_line(log, "rank 3 training")
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "2",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 3"]  # fmt: skip
    subprocess.run(urgent, env=slurm_env, capture_output=True, text=True, check=True)
    wait_for_line(log, "attempt 2 started", timeout=300)
    state, code = wait_end(job, slurm_env, timeout=300)
    text = log.read_text()
    assert (state, code) == ("COMPLETED", "0:0"), text
    assert lines(text, "preemption") and "training's last word: stopped 5" in text, text
    assert lines(text, "requeue_preemption") or lines(text, "requeue_by_slurm"), text
    assert text.count("attempt 2 started") == 1 and "attempt 3" not in text, text


def test_two_jobs_of_one_run_never_train_together(tmp_path: Path, slurm_env: dict):
    """The second job of the run finds the first holding the lock under the checkpoints and ends (exit code 4),
    before its pre-launch commands run (the supervisor takes the lock before them)."""
    train = script(tmp_path, "stoppable.py", STOPPABLE)
    first, first_log = submit_draft(tmp_path, slurm_env, train, "--nodes", "1", "--gpus_per_node", "1")
    wait_for_line(first_log, "rank 0 training")
    (tmp_path / "again").mkdir()
    second, second_log = submit_draft(tmp_path / "again", slurm_env, train, "--nodes", "1", "--gpus_per_node", "1",
                                      "--pre_launch_commands", f"touch {tmp_path / 'pre-launch-ran'}",
                                      ck=tmp_path / "ck")  # fmt: skip
    state, code = wait_end(second, slurm_env)
    text = second_log.read_text()
    subprocess.run(["scancel", first], env=slurm_env, check=True)
    assert (state, code) == ("FAILED", "4:0"), text
    (line,) = lines(text, "two_writers")
    assert f"two jobs of one run: job {first} (RUNNING) holds {tmp_path / 'ck' / P.LOCK}" in line, text
    assert not lines(text, "rendezvous") and not (tmp_path / "pre-launch-ran").exists(), text
    assert lines(text, "attempt_ended")[0].endswith("exit code 4"), text
