"""The supervisor as a real process (tests/supervisor_harness.py): real signals to it, a real child process as its
node step, its real lines, records and exit code, and its notice of each new checkpoint. Only Slurm is absent (no
cluster here: the harness says how)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher import protocol as P
from launcher.node.restart import records

HARNESS = Path(__file__).resolve().parent / "supervisor_harness.py"


def start(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(HARNESS), str(folder)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (folder / "training.pid").exists():  # the step runs
        assert proc.poll() is None and time.monotonic() < deadline, "the supervisor ended before its step started"
        time.sleep(0.05)
    return proc


def signal_and_wait(folder: Path, proc: subprocess.Popen[str], *signums: int) -> tuple[int, dict, list[str]]:
    for signum in signums:
        proc.send_signal(signum)
        time.sleep(0.5)  # each handled before the next (the supervisor looks every 0.2 s)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, json.loads((folder / "result.json").read_text()), out.splitlines()


def names(lines: list[str]) -> list[str]:
    return [name for line in lines for name in P.LINES if P.pattern(name).match(line)]


def test_a_warning_stops_training_at_a_checkpoint_and_the_job_requeues_itself(tmp_path: Path):
    proc = start(tmp_path)
    code, result, lines = signal_and_wait(tmp_path, proc, signal.SIGUSR1)
    assert (code, result["verdict"], result["status"]) == (0, "requeue", 0), lines
    assert names(lines) == ["warned", "outcome", "requeue_time_limit"], lines
    assert "training's last word: stopped 10" in lines[1]
    assert (tmp_path / "requeued").read_text() == "77"  # and its SIGTERM, which the supervisor outlived
    assert (tmp_path / P.REQUEUES_FILE).read_text() == "time-limit attempt 1 step 10 nodes -\n"


def test_a_hang_dumps_stops_the_step_and_ends_as_without_restarts(tmp_path: Path):
    proc = start(tmp_path)
    (tmp_path / P.HUNG_FILE).write_text("812 615 600\n")
    code, result, lines = signal_and_wait(tmp_path, proc, signal.SIGUSR2)
    assert (code, result["verdict"], result["status"]) == (1, "hung", 128 + signal.SIGTERM), lines
    assert names(lines) == ["hung", "outcome"], lines
    assert "hung at step 812: no progress for 615 s (limit 600 s); stacks in " in lines[0]
    assert (tmp_path / "stacks-77-1").is_dir()
    assert records(tmp_path / P.RESTARTS_FILE) == []


def test_a_hang_after_the_warning_stops_the_step_and_the_warning_stands(tmp_path: Path):
    """(a hang then would restart training in a job whose time is up)"""
    proc = start(tmp_path)
    os.kill(int((tmp_path / "training.pid").read_text()), signal.SIGSTOP)  # training hangs: no checkpoint comes
    code, result, lines = signal_and_wait(tmp_path, proc, signal.SIGUSR1, signal.SIGUSR2)
    assert (result["verdict"], result["notice"], code) == ("requeue", "warned", 0), lines
    assert names(lines[:3]) == ["warned", "hung", "outcome"] and len(lines) == 4, lines
    assert "training's last word: none" in lines[2]
    # (a step no pattern of the contract reads, FIELD_PATTERNS' `step` being \S+: docs/supervisor.md)
    assert "saved at step unknown (no word from training); requeueing after the time-limit notice (1 of 2)" in lines[3]
    assert (tmp_path / P.REQUEUES_FILE).read_text().startswith("time-limit attempt 1 step unknown")


def test_a_sigterm_ends_the_attempt_with_the_steps_status(tmp_path: Path):
    proc = start(tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    os.kill(int((tmp_path / "training.pid").read_text()), signal.SIGTERM)  # as Slurm ends the step's tasks
    code, result, lines = signal_and_wait(tmp_path, proc)
    assert (code, result["verdict"]) == (128 + signal.SIGTERM, "ended"), lines
    assert names(lines) == ["terminated", "outcome"], lines
    assert not (tmp_path / "requeued").exists()


def test_a_sigterm_with_a_step_that_outlives_it_ends_the_attempt_before_slurms_sigkill(tmp_path: Path):
    """scancel: Slurm SIGTERMs every process of the job and SIGKILLs them KillWait s later; training may save
    meanwhile and srun waits for it. The supervisor leaves the step to Slurm 2 s before the SIGKILL, its last lines
    said (on the cluster: tests/test_supervisor_slurm.py's cancel)."""
    (tmp_path / "killwait").write_text("3")
    proc = start(tmp_path)
    training = int((tmp_path / "training.pid").read_text())
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
        os.kill(training, 0)  # the step still runs: Slurm ends it
    finally:
        os.kill(training, signal.SIGKILL)  # (it holds the supervisor's stdout open)
    lines = proc.communicate(timeout=60)[0].splitlines()
    result = json.loads((tmp_path / "result.json").read_text())
    assert (code, result["verdict"], result["status"]) == (128 + signal.SIGTERM, "ended", 128 + 15), lines
    # 2 s before KillWait's 3: the supervisor ends after ~1 s, and before Slurm's SIGKILL however busy the machine
    assert names(lines) == ["terminated", "outcome"] and 1 <= took < 3, (took, lines)


def test_the_lock_one_writer_per_run(tmp_path: Path):
    from launcher.node.supervisor.records import take_lock

    states = {"41": "RUNNING", "40": "COMPLETED"}
    assert take_lock(tmp_path, "40", states.__getitem__) is None  # free: taken
    assert (tmp_path / P.LOCK / P.LOCK_HOLDER).read_text() == "40\n"
    assert take_lock(tmp_path, "40", states.__getitem__) is None  # its own, from an earlier attempt
    assert take_lock(tmp_path, "41", states.__getitem__) is None  # 40 ended: taken over
    assert take_lock(tmp_path, "42", states.__getitem__) == ("41", "RUNNING")  # 41 alive: refused
    assert (tmp_path / P.LOCK / P.LOCK_HOLDER).read_text() == "41\n" and len(list(tmp_path.iterdir())) == 1


def test_what_follows_each_checkpoint_runs_while_the_step_runs_and_as_it_ends(tmp_path: Path):
    """Training saves steps 2 and 4 while it runs and 6 as it ends, with --keep_last 1: the attempt's retention
    purges behind it (2 once 4 is there, while the step runs) and after the step (4, once 6 is), and says so."""
    (tmp_path / "keep").write_text("")
    code, result, lines = signal_and_wait(tmp_path, start(tmp_path))
    assert (code, result["verdict"]) == (0, "complete"), lines
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["6"]
    purged = [row for row in map(json.loads, (tmp_path / "checkpoints.jsonl").read_text().splitlines())
              if row["event"] == "purge"]  # fmt: skip
    assert [r["step"] for row in purged for r in row["removed"]] == [2, 4], purged
    assert names(lines).count("purged") == 2, lines
