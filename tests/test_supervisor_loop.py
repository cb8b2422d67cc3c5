"""The supervisor's orchestrator (launcher/node/supervisor/attempt.py) as a real process with a real child for its
node step (tests/supervisor_loop_harness.py): a restart, a restart decision with no answer or raced by a notice, a
node lost meanwhile, with real signals; a requeue without a node; a bug of the supervisor's; and the batch script
run by bash up to the supervisor, the pre-launch commands around it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from launcher import protocol as P
from launcher.node import job
from launcher.node.job import Job
from launcher.node.restart import records
from launcher.node.supervisor import effects
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.state import Allocation, Phase

ROOT = Path(__file__).resolve().parent.parent
HARNESS = Path(__file__).resolve().parent / "supervisor_loop_harness.py"


def run_loop(tmp_path: Path, mode: str = "", layout: int = 1) -> tuple[int, list[str], int]:
    """The loop's exit code, its lines, and how many steps it ran."""
    out = subprocess.run([sys.executable, str(HARNESS), str(tmp_path), mode, str(layout)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert json.loads((tmp_path / "result.json").read_text())["code"] == out.returncode, out.stderr
    return out.returncode, out.stdout.splitlines(), int((tmp_path / "steps").read_text())


def said(out: list[str], name: str) -> list[str]:
    return [line for line in out if P.pattern(name).match(line)]


def test_a_restart_starts_the_step_again_and_records_it_as_the_jobs(tmp_path: Path):
    (tmp_path / "ranks").write_text("0 node9\n")  # an earlier attempt's ranks map: gone before a step starts
    code, out, steps = run_loop(tmp_path)
    assert not (tmp_path / "ranks").exists()
    assert (code, steps) == (0, 2), out
    (restart,) = said(out, "restart")
    assert "restart 1 of 10 in the allocation, leaving out none: training again on node1 " in restart, out
    (record,) = records(tmp_path / P.RESTARTS_FILE)
    assert (record["action"], record["job"]) == ("restart", "77")
    assert (tmp_path / "watchdog-in-decision").read_text() == "False"  # stopped before the decision


def test_a_decision_with_no_answer_ends_the_attempt_as_without_restarts_and_says_so(tmp_path: Path):
    code, out, steps = run_loop(tmp_path, "none")
    assert (code, steps) == (7, 1), out  # a failure ends with the step's status, as with --max_restarts 0
    (line,) = said(out, "no_decision")
    assert "no restart decision could be had (its answer: nothing;" in line


def test_a_time_limit_warning_during_the_decision_requeues_the_job(tmp_path: Path):
    code, out, steps = run_loop(tmp_path, "warn")
    assert (code, steps) == (0, 1), out  # not a second step that stops at once on the stop file
    assert said(out, "notice_over_restart") and said(out, "requeue_time_limit"), out
    assert (tmp_path / "requeued").read_text() == "77"
    (record,) = records(tmp_path / P.RESTARTS_FILE)
    assert record["action"] == "requeue"  # what the job did: no restart is counted


def test_a_sigterm_during_the_decision_ends_the_attempt(tmp_path: Path):
    code, out, steps = run_loop(tmp_path, "term")
    assert (code, steps) == (7, 1), out  # no new step in a dying job
    assert said(out, "notice_over_restart") and not (tmp_path / "requeued").exists()
    assert records(tmp_path / P.RESTARTS_FILE) == []


def test_a_step_never_starts_on_fewer_nodes_than_the_layout(tmp_path: Path):
    code, out, steps = run_loop(tmp_path, "shrink", layout=2)
    assert (code, steps) == (0, 1), out
    (requeue,) = said(out, "requeue_without")
    assert requeue.endswith("; 1 of the layout's 2 nodes left in the allocation"), requeue
    assert (tmp_path / "requeued").read_text() == "77" and not said(out, "restart")


class Requeued(effects.Node):
    """Slurm's side of a requeue without a node: the job leaves node7 out already; once requeued, its processes
    (the supervisor too) live KillWait s more (5 on the local cluster: a loaded CI machine once spent them on a read
    of the job before the exclusion, and the next attempt ran where the hang was)."""

    def __init__(self) -> None:
        super().__init__(out=io.StringIO())
        self.calls: list[str] = []

    def job_field(self, job: str, name: str) -> str:
        self.calls.append(f"read {name}")
        return "node7"

    def requeue(self, job: str) -> bool:
        self.calls.append("requeue")
        return True

    def exclude(self, job: str, nodes: object, excluded: str) -> bool:
        self.calls.append(f"exclude {nodes} beside {excluded}")
        return True


def a_job(tmp_path: Path, **changes: object) -> Job:
    job = Job("t", tmp_path, tmp_path / "job.log", tmp_path / "ck", Path(sys.executable), ROOT, tmp_path / "train.py",
              tmp_path / "config.yaml", "auto", 1, 1, tmp_path)  # fmt: skip
    return replace(job, **changes)  # type: ignore[arg-type]


def test_a_requeue_without_a_node_asks_slurm_one_thing_after_the_requeue(tmp_path: Path):
    slurm = Requeued()
    attempt = Attempt(a_job(tmp_path), Allocation("48", 1, "node1", "node1"), slurm)
    attempt.state.phase, attempt.state.step_nodes = Phase.DECIDING, ["node1"]
    assert attempt.requeue("a hang", "3", ("node1",)) == 0
    assert slurm.calls == ["read ExcNodeList", "requeue", "exclude ('node1',) beside node7"]
    assert (tmp_path / P.REQUEUES_FILE).read_text().endswith(" node1\n")  # recorded before the requeue


def test_an_exception_in_the_loop_ends_the_attempt_with_a_line_that_names_it(tmp_path: Path):
    """A bug of the supervisor's (here: the checkpoints path under a file, which the launcher's checks refuse before
    any job) is said in the launcher's words, the traceback above it, and the attempt's end follows (exit code 1)."""
    (tmp_path / "file").write_text("")
    job_file = tmp_path / P.JOB_FILE
    job_file.write_text(a_job(tmp_path, checkpoints=tmp_path / "file" / "ck").to_json())
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", "SLURMD_NODENAME": "node1",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    argv = [sys.executable, "-m", "launcher.node.supervisor", str(job_file)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    names = [name for line in out.stdout.splitlines() for name in P.LINES if P.pattern(name).match(line)]
    assert (out.returncode, names) == (1, ["attempt_started", "supervisor_failed", "attempt_ended"]), out
    (line,) = said(out.stdout.splitlines(), "supervisor_failed")
    assert "failed: NotADirectoryError: [Errno 20] Not a directory" in line and "Traceback" in out.stderr, out
    job_file.write_text(job_file.read_text().replace('"nodes": 1', '"nodes": "two"'))  # unreadable: before any lock
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    names = [name for line in out.stdout.splitlines() for name in P.LINES if P.pattern(name).match(line)]
    assert (out.returncode, names) == (1, ["attempt_started", "supervisor_failed", "attempt_ended"]), out
    assert "failed: JobFileError: " in out.stdout and "settings of the wrong kind: nodes 'two'" in out.stdout, out


FAKE_PYTHON = """#!/bin/bash
exec {python} -c 'import json, os, sys
from launcher.node import job
read = job.load(sys.argv[3]).to_json()
print(json.dumps({{"argv": sys.argv[1:], "pythonpath": os.environ["PYTHONPATH"], "job": read}}))' "$@"
"""


def test_the_batch_script_hands_the_supervisor_the_bundles_job_and_nothing_else(tmp_path: Path):
    """The batch script run by bash up to its exec, the job's Python a script that reads the job's settings as the
    supervisor does: the bundle's job.json, named by the one exec line, after the supervisor's own call that takes
    the lock before the pre-launch commands."""
    from launcher_helpers import fixed_paths, spec_for

    from launcher.bundle import render

    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    spec, problems = spec_for("--python", str(python), "--nodes", "2", "--spare_nodes", "1", "--hang_timeout", "600",
                              "--startup_timeout", "900", "--max_requeues", "2", "--max_restarts", "4",
                              "--pre_launch_commands", "echo before", "--dataset", "none")  # fmt: skip
    assert not problems
    paths = fixed_paths("t", root=tmp_path)
    paths.bundle_dir.mkdir(parents=True)
    settings = render.job_settings(spec, paths)
    paths.job.write_text(settings.to_json())
    script = tmp_path / "draft.sbatch"
    script.write_text(render.sbatch_script(spec, paths))
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-3]", "SLURMD_NODENAME": "node1"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lock_line, before, exec_line = out.stdout.splitlines()
    assert before == "before"
    lock, started = json.loads(lock_line), json.loads(exec_line)
    assert lock["argv"] == ["-m", "launcher.node.supervisor", str(paths.job), "--before-pre-launch"]
    assert started["argv"] == ["-m", "launcher.node.supervisor", str(paths.job), "--started-said"]
    assert started["pythonpath"] == str(render.PROJECT) and started["job"] == settings.to_json()
    got = job.from_json(started["job"])
    assert (got.nodes, got.allocated, got.max_requeues, got.max_restarts) == (2, 3, 2, 4)
    assert got.watchdog_options() == ["--factor", f"{spec.args.job.hang_factor:g}", "--floor", "600", "--startup",
                                      "900"]  # fmt: skip


def test_a_failing_pre_launch_command_ends_the_attempt_with_its_lines(tmp_path: Path):
    """The real supervisor around the pre-launch commands: the attempt's start and the lock before them, then the
    command that failed named and the attempt's end, with its exit code."""
    from launcher_helpers import fixed_paths, spec_for

    from launcher.bundle import render

    spec, problems = spec_for("--python", sys.executable, "--pre_launch_commands", "echo before\nfalse\necho after",
                              "--dataset", "none")  # fmt: skip
    assert not problems
    paths = fixed_paths("t", root=tmp_path)
    paths.bundle_dir.mkdir(parents=True)
    paths.job.write_text(render.job_settings(spec, paths).to_json())
    script = tmp_path / "draft.sbatch"
    script.write_text(render.sbatch_script(spec, paths))
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", "SLURMD_NODENAME": "node1"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 1 and "after" not in lines, out
    assert [name for line in lines for name in P.LINES if P.pattern(name).match(line)] == [
        "attempt_started", "pre_launch_ended", "attempt_ended"], out  # fmt: skip
    assert lines[1] == "before" and "ended this attempt at: false (exit code 1)" in lines[2], lines
    assert " job 77 attempt 1 ended " in lines[3] and lines[3].endswith(", exit code 1"), lines
    assert (paths.checkpoints / P.LOCK / P.LOCK_HOLDER).read_text() == "77\n"  # taken before the commands ran
