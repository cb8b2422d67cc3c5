"""The supervisor's loop (launcher/node/supervisor/main.py) as a real process with a real child for its node step
(tests/supervisor_loop_harness.py): the cases the bash script's tests (test_restart_script.py, retired with it) held
it to, where the restart decision has no answer or races a notice, here with real signals and no bash."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from launcher import protocol as P
from launcher.node.restart import records
from launcher.node.supervisor import effects
from launcher.node.supervisor.state import Phase, State
from launcher.node.supervisor.supervise import Files, Supervisor

HARNESS = Path(__file__).resolve().parent / "supervisor_loop_harness.py"
NUMBERS = ("layout", "allocated", "gpus", "max_requeues", "max_restarts", "max_excluded", "heartbeat_s", "debug")


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


def test_a_requeue_without_a_node_asks_slurm_one_thing_after_the_requeue(tmp_path: Path):
    slurm = Requeued()
    state = State("48", 1, "node1", 20048, phase=Phase.DECIDING, step_nodes=["node1"])
    supervisor = Supervisor(state, slurm, Files.in_dir(tmp_path))
    assert supervisor.requeue("a hang", "3", ("node1",)) == 0
    assert slurm.calls == ["read ExcNodeList", "requeue", "exclude ('node1',) beside node7"]
    assert (tmp_path / P.REQUEUES_FILE).read_text().endswith(" node1\n")  # recorded before the requeue


def test_an_exception_in_the_loop_ends_the_attempt_with_a_line_that_names_it(tmp_path: Path):
    """A bug of the supervisor's (here: the checkpoints path under a file, which the launcher's checks refuse before
    any job) is said in the launcher's words, the traceback above it, and the attempt's end follows (exit code 1)."""
    (tmp_path / "file").write_text("")
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", "SLURMD_NODENAME": "node1"}
    env |= {name: str(tmp_path / key) for key, name in P.SUPERVISOR_ENV.items()}
    env |= {name: "" for key, name in P.SUPERVISOR_ENV.items() if key in NUMBERS}
    env |= {P.SUPERVISOR_ENV["checkpoints"]: str(tmp_path / "file" / "ck"), P.SUPERVISOR_ENV["layout"]: "1"}
    out = subprocess.run([sys.executable, "-m", "launcher.node.supervisor"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    names = [name for line in out.stdout.splitlines() for name in P.LINES if P.pattern(name).match(line)]
    assert (out.returncode, names) == (1, ["attempt_started", "supervisor_failed", "attempt_ended"]), out
    (line,) = said(out.stdout.splitlines(), "supervisor_failed")
    assert "failed: NotADirectoryError: [Errno 20] Not a directory" in line and "Traceback" in out.stderr, out
    env[P.SUPERVISOR_ENV["layout"]] = "two"  # a value the supervisor cannot read: the same, before any lock
    out = subprocess.run([sys.executable, "-m", "launcher.node.supervisor"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    names = [name for line in out.stdout.splitlines() for name in P.LINES if P.pattern(name).match(line)]
    assert (out.returncode, names) == (1, ["attempt_started", "supervisor_failed", "attempt_ended"]), out
    assert "failed: ValueError: invalid literal for int()" in out.stdout, out


def test_the_batch_script_hands_the_supervisor_every_value(tmp_path: Path):
    """The batch script run by bash up to its exec, the job's Python a script that reads the settings as the
    supervisor would: what the template exports is what settings.py reads."""
    from launcher_helpers import fixed_paths, spec_for

    from launcher.bundle import render

    python = tmp_path / "python"
    python.write_text(f"""#!/bin/bash
exec {sys.executable} -c 'import dataclasses, json, os, sys
from launcher.node.supervisor.settings import Settings
print(json.dumps({{"argv": sys.argv[1:], **dataclasses.asdict(Settings.from_env(os.environ))}}, default=str))' "$@"
""")
    python.chmod(0o755)
    spec, problems = spec_for("--python", str(python), "--nodes", "2", "--spare_nodes", "1", "--hang_timeout", "600",
                              "--startup_timeout", "900", "--max_requeues", "2", "--max_restarts", "4",
                              "--pre_launch_commands", "echo before", "--dataset", "none")  # fmt: skip
    assert not problems
    paths = fixed_paths("t", root=tmp_path)
    script = tmp_path / "draft.sbatch"
    script.write_text(render.sbatch_script(spec, paths))
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-3]", "SLURMD_NODENAME": "node1"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, lock_line, before, settings_line = out.stdout.splitlines()
    assert P.pattern("attempt_started").match(first) and before == "before"
    assert json.loads(lock_line)["argv"] == ["-m", "launcher.node.supervisor", "--lock"]  # before the commands
    got = json.loads(settings_line)
    assert got["argv"] == ["-m", "launcher.node.supervisor", "--started-said"]
    assert (got["layout"], got["allocated"], got["max_requeues"], got["max_restarts"]) == (2, 3, 2, 4)
    assert got["watchdog"] == ["--factor", str(spec.args.job.hang_factor), "--floor", "600", "--startup", "900"]
    assert got["node_script"] == str(paths.node_script) and got["checkpoints"] == str(paths.checkpoints)
    assert got["files"]["restarts"] == str(paths.restarts_file) and got["files"]["stop"] == str(paths.stop_file)
    assert (got["job"], got["batch_node"], got["gpus"], got["container"]) == ("77", "node1", 8, [])
