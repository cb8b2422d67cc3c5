"""The supervisor's loop (a draft: launcher/node/supervisor/main.py) as a real process with a real child for its
node step (tests/supervisor_loop_harness.py): the cases tests/test_restart_script.py holds the bash script to, where
the restart decision has no answer or races a notice, here with real signals and no bash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from launcher import protocol as P
from launcher.node.restart import records

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
    code, out, steps = run_loop(tmp_path)
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
