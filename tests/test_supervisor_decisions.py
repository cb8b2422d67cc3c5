"""The supervisor's pure decisions (launcher/node/supervisor/decide.py, table.py), case by case: every row of the
verdict table, every notice during every phase, every end of an attempt, held to what docs/supervisor.md says."""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import pytest

from launcher import protocol as P
from launcher.node import restart
from launcher.node.restart import Decision
from launcher.node.supervisor import decide, table
from launcher.node.supervisor.state import HANG, TERM, WARN, Notice, Phase, Then, Verdict

N, V = Notice, Verdict


@pytest.mark.parametrize(
    "notice, outcome, status, verdict",
    [
        (N.TERMINATED, "finished 10", 0, V.ENDED),  # row 1: a SIGTERM: Slurm's verdict stands, whatever training said
        (N.TERMINATED, "", 143, V.ENDED),
        (N.WARNED, "finished 10", 0, V.COMPLETE),  # row 2: the notice came as the run ended
        (N.PREEMPTED, "finished 10", 143, V.COMPLETE),
        (N.WARNED, "stopped 10", 0, V.REQUEUE),  # row 3: anything else, no word included
        (N.PREEMPTED, "", 143, V.REQUEUE),
        (N.WARNED, "other 3", 1, V.REQUEUE),
        (N.HUNG, "finished 10", 0, V.HUNG),  # row 4
        (N.HUNG, "", 143, V.HUNG),
        (N.NODE_CHECK, "", 1, V.UNHEALTHY),  # row 5
        (N.NONE, "stopped 10", 0, V.STOPPED),  # row 6
        (N.NONE, "stopped 10", 1, V.FAILED),  # (a stopped report with a failed step is a failure)
        (N.NONE, "finished 10", 0, V.COMPLETE),  # row 7: finished, or no word at all, or any other
        (N.NONE, "", 0, V.COMPLETE),
        (N.NONE, "finished 10", 7, V.FAILED),  # row 8
        (N.NONE, "", 143, V.FAILED),
    ],
)
def test_each_row_of_the_verdict_table(notice: Notice, outcome: str, status: int, verdict: Verdict):
    assert table.verdict(notice, outcome, status) == verdict


def test_every_row_is_reached_and_the_last_matches_everything():
    assert all(table.matches(table.VERDICTS[-1], n, o, s) for n in Notice for o in ("", "x 1") for s in (0, 1))
    cases = itertools.product(Notice, ("", "finished 1", "stopped 1", "x"), (0, 1))
    first = {next(r for r in table.VERDICTS if table.matches(r, n, o, s)) for n, o, s in cases}
    assert first == set(table.VERDICTS)


def test_what_training_said_and_what_was_saved():
    assert table.word("finished 120") == P.FINISHED and table.word("") == ""
    assert table.saved("stopped 120") == "120" and table.saved("finished 120") == "finished 120"
    assert table.saved("") == table.NO_WORD
    assert table.read_outcome("stopped 5\n\n") == "stopped 5" and table.read_outcome(None) == ""
    assert table.node_check_suspects("node2: no GPU\nnode1: x\nnode2: y\n") == ["node1", "node2"]


# -- a notice during each phase: what docs/supervisor.md's second table says
STEPS = (Phase.NODE_CHECK, Phase.STEP)


def expected(phase: Phase, notice: Notice, signum: int) -> tuple[Notice, tuple[str, ...], bool, bool]:
    """(notice after, lines, stop file, hang handled)."""
    if signum == WARN:  # everywhere: the stop file and the line; a SIGTERM before it stands
        return (notice if notice == N.TERMINATED else N.WARNED), ("warned",), True, False
    if signum == TERM:  # everywhere but during the job's own requeue
        return (notice, (), False, False) if phase == Phase.REQUEUING else (N.TERMINATED, ("terminated",), False, False)
    if phase in STEPS and notice != N.TERMINATED:  # the hang: only while a step runs; an earlier notice stands
        return (N.HUNG if notice == N.NONE else notice), (), False, True
    return notice, (), False, False


@pytest.mark.parametrize("phase, notice, signum", list(itertools.product(Phase, Notice, (WARN, TERM, HANG))))
def test_every_notice_during_every_phase(phase: Phase, notice: Notice, signum: int):
    r = decide.on_signal(phase, notice, signum)
    assert (r.notice, tuple(name for name, _ in r.lines), r.stop_file, r.hang) == expected(phase, notice, signum)


def test_a_sigterm_is_final_and_a_stale_watchdog_does_nothing():
    # a watchdog's USR2 after its step ended (the decision ran beside it once) does nothing
    assert decide.on_signal(Phase.DECIDING, N.HUNG, HANG) == decide.Reaction(N.HUNG)
    # a hang during a time-limit warning's checkpoint: the step is stopped, the warning stands (a requeue)
    assert decide.on_signal(Phase.STEP, N.WARNED, HANG).notice == N.WARNED
    # a SIGTERM is final: no warning nor hang turns a cancelled attempt into a requeue or a restart
    assert decide.on_signal(Phase.STEP, N.TERMINATED, WARN).notice == N.TERMINATED
    assert not decide.starts_step(N.TERMINATED) and decide.starts_step(N.WARNED)


def test_the_port_is_tried_again_only_where_it_was_taken_and_no_notice_came():
    assert decide.retry_port(True, N.NONE)
    assert not any(decide.retry_port(True, n) for n in Notice if n != N.NONE)
    assert not decide.retry_port(False, N.NONE)


def test_the_notice_as_the_step_ends():
    assert decide.notice_at_step_end(N.WARNED, "2026-11-24T08:00:00", "")[0] == N.PREEMPTED
    assert decide.notice_at_step_end(N.TERMINATED, "2026-11-24T08:00:00", "")[0] == N.TERMINATED
    assert decide.notice_at_step_end(N.NONE, "None", "node2: x\n") == (N.NODE_CHECK, [])
    assert decide.notice_at_step_end(N.HUNG, "", "node2: x\n") == (N.HUNG, [])


def test_the_decision_is_asked_after_failures_hangs_and_failed_checks_only():
    asked = {v for v in Verdict if decide.needs_decision(v, 10)}
    assert asked == {V.FAILED, V.HUNG, V.UNHEALTHY}
    assert not any(decide.needs_decision(v, 0) for v in Verdict)


RESTART = Decision(restart.RESTART, "hang", "a hang", ["node2"], 20, count=3)
NONE = None  # the decision had no answer


@pytest.mark.parametrize(
    "notice, action, then, verdict, amend",
    [
        (N.TERMINATED, restart.RESTART, Then.END, V.ENDED, "none"),  # a SIGTERM while it decided: the attempt ends
        (N.TERMINATED, restart.REQUEUE, Then.END, V.ENDED, "none"),
        (N.TERMINATED, restart.STOP, Then.END, V.ENDED, None),
        (N.WARNED, restart.RESTART, Then.END, V.REQUEUE, "requeue"),  # a warning: a requeue, recorded as one
        (N.WARNED, NONE, Then.END, V.REQUEUE, None),
        (N.WARNED, restart.REQUEUE, Then.REQUEUE, V.HUNG, None),  # its own requeue or stop stands
        (N.WARNED, restart.STOP, Then.EXIT, V.HUNG, None),
        (N.HUNG, restart.RESTART, Then.RESTART, V.HUNG, None),
        (N.HUNG, restart.REQUEUE, Then.REQUEUE, V.HUNG, None),
        (N.HUNG, restart.STOP, Then.EXIT, V.HUNG, None),
        (N.HUNG, NONE, Then.END, V.HUNG, None),  # no answer: as without restarts, and said
    ],
)
def test_after_the_restart_decision(notice: Notice, action: str | None, then: Then, verdict: Verdict,
                                    amend: str | None):  # fmt: skip
    decision = None if action is None else Decision(action, "hang", "a hang", ["node2"], 20, code=2)
    nxt = decide.after_decision(notice, decision, V.HUNG, 7)
    assert (nxt.then, nxt.verdict, nxt.amend) == (then, verdict, amend)
    if then == Then.EXIT:
        assert nxt.code == 2
    if action is None and notice == N.HUNG:
        assert nxt.lines == (("no_decision", {"answer": "nothing"}),)
    if then == Then.REQUEUE:
        assert nxt.exclude == ("node2",) and nxt.why == "hang"


def test_a_stop_after_a_failure_exits_with_sruns_status():
    nxt = decide.after_decision(N.NONE, Decision(restart.STOP, "failure", "a failure", [], 0, code=2), V.FAILED, 7)
    assert (nxt.then, nxt.code) == (Then.EXIT, 7)


def test_a_restart_needs_the_layouts_nodes():
    ok = decide.restart_on_nodes(N.HUNG, RESTART, V.HUNG, ["node1", "node3"], 2, 3, 10)
    assert (ok.then, ok.notice) == (Then.RESTART, N.NONE)
    assert ok.lines[0][1] == {"count": 3, "most": 10, "left": "node2", "nodes": "node1,node3", "step": 20,
                              "why": "a hang"}  # fmt: skip
    short = decide.restart_on_nodes(N.HUNG, RESTART, V.HUNG, ["node1"], 2, 3, 10)
    assert (short.then, short.amend, short.exclude) == (Then.REQUEUE, "requeue", ("node2",))
    assert short.lines[0][1]["why"] == "a hang; 1 of the layout's 2 nodes left in the allocation"
    stuck = decide.restart_on_nodes(N.HUNG, RESTART, V.HUNG, ["node1"], 2, 0, 10)
    assert (stuck.then, stuck.amend, stuck.lines[0][0]) == (Then.END, "none", "no_restart")


@pytest.mark.parametrize(
    "verdict, notice, limits, slurm, code, requeue, lines",
    [
        (V.REQUEUE, N.PREEMPTED, 0, True, 0, "preemption", ["requeue_by_slurm"]),
        (V.REQUEUE, N.PREEMPTED, 5, False, 0, "preemption", ["requeue_preemption"]),  # preemptions: always
        (V.REQUEUE, N.WARNED, 2, False, 0, "time-limit", ["requeue_time_limit"]),
        (V.REQUEUE, N.WARNED, 3, False, 3, None, ["no_requeue_left"]),  # --max_requeues 3 spent
        (V.HUNG, N.HUNG, 0, False, 1, None, []),
        (V.UNHEALTHY, N.NODE_CHECK, 0, False, 5, None, []),
        (V.STOPPED, N.NONE, 0, False, 3, None, ["stop_file"]),
        (V.COMPLETE, N.NONE, 0, False, 0, None, []),
        (V.COMPLETE, N.WARNED, 0, False, 0, None, ["late_notice"]),
        (V.COMPLETE, N.PREEMPTED, 0, True, 0, None, ["late_notice", "slurm_requeues_finished"]),
        (V.ENDED, N.TERMINATED, 0, False, 143, None, []),  # srun's status
        (V.FAILED, N.NONE, 0, False, 143, None, []),
    ],
)
def test_the_attempts_end(verdict, notice, limits, slurm, code, requeue, lines):  # type: ignore[no-untyped-def]
    end = decide.end_of_attempt(verdict, notice, 143, "120", limits, 3, slurm, "24.05")
    assert (end.code, end.requeue, [name for name, _ in end.lines]) == (code, requeue, lines)
    assert end.by_slurm == (requeue == "preemption" and slurm)


def test_the_nodes_and_the_ports():
    assert decide.choose_nodes("node2", ["node1", "node2", "node3"], [], 2) == ["node2", "node1"]
    assert decide.choose_nodes("node2", ["node1", "node2", "node3"], ["node2"], 2) == ["node1", "node3"]
    assert decide.choose_nodes("node2", ["node1", "node3"], ["node1"], 2) == ["node2", "node3"]
    assert decide.choose_nodes("node9", ["node1"], [], 2) == ["node9", "node1"]  # the batch host first, unless left out
    assert decide.first_port(12077) == P.RDZV_PORT_LOW + 77
    assert decide.next_port(P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN - 1) == P.RDZV_PORT_LOW
    ports = decide.candidate_ports(P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN - 2)
    assert ports[:3] == [P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN - 2, P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN - 1,
                         P.RDZV_PORT_LOW] and len(ports) == P.RDZV_PORT_TRIES  # fmt: skip


def test_a_container_without_the_jobs_python_is_known_by_sruns_status():
    image = "/images/base.sqsh"
    assert decide.python_missing(2, image, "") and decide.python_missing(13, image, "")
    assert not decide.python_missing(2, "", "")  # no container: --python was checked before the queue
    assert not decide.python_missing(2, image, "node1: cannot write /ck\n")  # the step ran: its node check spoke
    assert not any(decide.python_missing(status, image, "") for status in (0, 1, 5, 6, 143))


def test_after_a_sigterm_the_step_is_waited_for_until_shortly_before_slurms_sigkill():
    assert decide.wait_after_term(30) == 28 and decide.wait_after_term(5) == 3
    assert decide.wait_after_term(None) == decide.wait_after_term(30)  # KillWait unknown: Slurm's default
    assert decide.wait_after_term(0) == decide.wait_after_term(1) == 0.5  # never less than a poll or two


def test_the_supervisor_stands_on_the_standard_library():
    """It runs with the job's Python before anything is installed beside it (a container's, a bare venv's)."""
    outside = set()
    for source in (Path(__file__).resolve().parent.parent / "launcher/node/supervisor").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            outside |= {n for n in names if n.split(".")[0] not in (*sys.stdlib_module_names, "launcher")}
    assert outside == set()
