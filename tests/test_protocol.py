"""The contract between launcher and job (launcher/protocol.py), end to end: every line of the contract is printed
by someone (the job's supervisor, its node step, the node check), the supervisor's lines are made here by its own
functions (the decisions, its hang handler, its `say`), the node check prints its line for real, and triage reads
what they printed. A line whose words drift between the job and triage fails here (the time-limit warning once did:
triage looked for "preemption or time-limit signal" while the job said "time-limit or preemption notice")."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
from pathlib import Path

from launcher import protocol as P
from launcher.node import restart, step
from launcher.node.job import Job
from launcher.node.restart import Decision
from launcher.node.supervisor import decide, effects, records
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.state import WARN, Allocation, Notice, Phase, Verdict
from launcher.slurm import triage

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "launcher/node"
SAID = (("why", "a failure (rank 1 on node1: died of SIGKILL (exit code -9), with no traceback)"),)
REASON = "the same exception as the failure before, at the same point of the run (after step 21): ValueError: bad"


def _consts(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _consts(node.body) | _consts(node.orelse)
    return set()


def said_by_the_job() -> set[str]:
    """The lines the job's code says: a `say` or `line` call's name, a decision's `(name, fields)`; the job's code is
    the node package and what the supervisor runs after each checkpoint (the eval submissions, retention's purge)."""
    names = set()
    followers = [NODE.parent / "evals" / "submit.py", NODE.parent / "retention" / "purge.py"]
    for source in [*NODE.rglob("*.py"), *followers]:
        for node in ast.walk(ast.parse(source.read_text())):
            if (
                isinstance(node, ast.Call)
                and node.args
                and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("say", "line")
            ):
                names |= _consts(node.args[0])
            if isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[1], ast.Dict):
                names |= _consts(node.elts[0])
    return names


class Heard(effects.Node):
    """The supervisor's effects, its lines kept (Slurm's commands are not reached by what runs here)."""

    def __init__(self) -> None:
        super().__init__(out=io.StringIO())

    def overlap(self, nodes: object, argv: object, timeout: float) -> int:
        return 0  # (the step's stack dumps and stop, on the nodes)

    def lines(self) -> list[str]:
        assert self.out is not None
        return self.out.getvalue().splitlines()  # type: ignore[attr-defined]


def printed_lines(tmp_path: Path) -> list[str]:
    """Lines the supervisor prints, each made by what prints it: job 48, attempt 2."""
    heard = Heard()
    heard.say("attempt_started", job=48, attempt=2, when="2026-11-24T08:00:00+00:00", nodes="node[1-2]")
    lines = list(decide.on_signal(Phase.STEP, Notice.NONE, WARN).lines)
    lines += decide.notice_at_step_end(Notice.NONE, "2026-11-24T08:00:00", "")[1]
    lines += decide.end_of_attempt(Verdict.REQUEUE, Notice.WARNED, 0, "520", 3, 3, False).lines
    lines += decide.end_of_attempt(Verdict.STOPPED, Notice.NONE, 0, "520", 0, 3, False).lines
    why = dict(SAID)["why"]
    stop = Decision(restart.STOP, "failure", why, [], 20, REASON, "correct what its traceback points at")
    lines += decide.after_decision(Notice.NONE, stop, Verdict.FAILED, 1).lines
    again = Decision(restart.RESTART, "failure", why, ["node1"], 20, count=1)
    lines += decide.restart_on_nodes(Notice.NONE, again, Verdict.FAILED, ["node2"], 1, 3, 10).lines
    for name, fields in lines:
        heard.say(name, **fields)
    job = Job("p", tmp_path, tmp_path / "logs/p.out", tmp_path / "ck", Path(sys.executable), ROOT,
              tmp_path / "train.py", tmp_path / "config.yaml", "auto", 2, 8, tmp_path)  # fmt: skip
    (tmp_path / P.HUNG_FILE).write_text("812 615 600\n")
    hang = Attempt(job, Allocation("48", 2, "node[1-2]", "node1"), heard)
    hang.state.phase, hang.state.step_nodes = Phase.STEP, ["node1", "node2"]
    hang.on_hang()
    return heard.lines()


def names_of(line: str) -> list[str]:
    return [name for name in P.LINES if P.pattern(name).match(line)]


def test_every_line_of_the_contract_is_printed_by_the_job():
    assert said_by_the_job() == set(P.LINES)


def test_the_supervisors_lines_are_lines_of_the_contract(tmp_path: Path):
    lines = printed_lines(tmp_path)
    assert all(len(names_of(line)) == 1 for line in lines), [(line, names_of(line)) for line in lines]
    said = [names_of(line)[0] for line in lines]
    assert said == ["attempt_started", "warned", "preemption", "no_requeue_left", "stop_file", "no_restart",
                    "restart", "hung"]  # fmt: skip


def test_triage_reads_the_time_limit_warning_the_supervisor_prints(tmp_path: Path):
    lines = printed_lines(tmp_path)
    started = next(line for line in lines if names_of(line) == ["attempt_started"])
    warned = next(line for line in lines if names_of(line) == ["warned"])
    log = "\n".join([started, "step 77/500 | loss 2.0", warned, "slurmstepd: error: *** JOB 48 ... TIME LIMIT ***"])
    verdict = triage.verdict("TIMEOUT", log)
    assert verdict is not None and verdict.cause == "time_limit"
    assert "raise --signal_grace" in verdict.fix and "at step 77 of 500" in verdict.message


def test_triage_reads_the_hang_the_preemption_and_the_spent_requeues_the_supervisor_prints(tmp_path: Path):
    lines = printed_lines(tmp_path)
    started = next(line for line in lines if names_of(line) == ["attempt_started"])

    def judged(name: str, state: str = "FAILED") -> triage.Verdict:
        *_, line = (line for line in lines if names_of(line) == [name])  # no_restart: the decision's, the last
        verdict = triage.verdict(state, f"{started}\n{line}\n")
        assert verdict is not None
        return verdict

    hung = judged("hung")
    assert hung.cause == "hung" and "step 812: no progress for 615 s (limit 600 s)" in hung.message
    assert "/logs/stacks-48-2" in hung.fix
    preempted = judged("preemption")
    assert preempted.cause == "preempted" and "2026-11-24T08:00:00" in preempted.message
    spent = judged("no_requeue_left")
    assert spent.cause == "time_limit" and "resume from step 520" in spent.fix
    stopped = judged("stop_file")
    assert stopped.cause == "stopped" and "step 520" in stopped.message
    not_restarted = judged("no_restart")
    assert not_restarted.cause == "not_restarted" and not_restarted.fix == "correct what its traceback points at"
    assert "not restarted: the same exception as the failure before, at the same point" in not_restarted.message


def test_triage_judges_the_last_node_step_of_a_restarted_attempt(tmp_path: Path):
    """A restart line starts a new node step: the verdict is on the step that ended the job, with why the script
    did not restart it, not on an earlier step's failure it went on from."""
    lines = printed_lines(tmp_path)
    started, restart, stop = ([line for line in lines if names_of(line) == [name]][-1]
                              for name in ("attempt_started", "restart", "no_restart"))  # fmt: skip
    first = (ROOT / "tests/fixtures/triage/cuda-oom.log").read_text()
    last = (ROOT / "tests/fixtures/triage/exception-2nodes.log").read_text()
    verdict = triage.verdict("FAILED", triage.excerpt(f"{started}\n{first}{restart}\n{last}{stop}\n".splitlines()))
    assert verdict is not None and verdict.cause == "exception" and "ValueError" in verdict.message
    assert "out of memory" not in verdict.message and "not restarted: the same exception" in verdict.message


def test_the_node_check_prints_its_line_and_triage_names_the_node(tmp_path: Path):
    missing = tmp_path / "no-such-dataset"
    run = subprocess.run(  # on its own: a module, the project on PYTHONPATH
        [sys.executable, "-m", "launcher.node.nodecheck", "--head", "127.0.0.1", "--port", "0", "--nodes", "node7",
         "--node", "node7", "--readable", str(missing), "--timeout", "5"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 5, run.stdout + run.stderr
    (line,) = [line for line in run.stdout.splitlines() if line.startswith(P.LINE_START)]
    assert names_of(line) == ["node_check_failed"]
    verdict = triage.verdict("FAILED", line + "\n")
    assert verdict is not None and (verdict.cause, verdict.node) == ("preflight", "node7")
    assert str(missing) in verdict.message


def test_the_node_step_sets_every_variable_training_reads_of_the_launcher(tmp_path: Path):
    """What launcher/train/environment.py reads of the contract's variables, the node step sets (but the two knobs
    a user sets with --extra_env, which training reads with a default)."""
    read = set(re.findall(r"P\.(ENV_\w+)", (ROOT / "launcher/train/environment.py").read_text()))
    knobs = {"ENV_STOP_FILE_EVERY", "ENV_STRAGGLER_EVERY"}
    job = Job("p", tmp_path, tmp_path / "p.out", tmp_path / "ck", Path(sys.executable), ROOT, tmp_path / "train.py",
              tmp_path / "config.yaml", "auto", 2, 8, tmp_path, signal_grace=120)  # fmt: skip
    env = step.environment(job, {}, "48", "node1")
    assert read - knobs and {getattr(P, name) for name in read - knobs} <= set(env)
    assert not {getattr(P, name) for name in knobs} & set(env)


def test_old_words_of_a_line_are_still_read():
    """A log written before the node check had its name says "preflight failed": triage and the ledger read both."""
    old = "[launcher 07:41:02] preflight failed on node1: sees 1 GPUs (nvidia-smi -L), the job runs 2 processes on it"
    assert names_of(old) == ["node_check_failed"] == names_of(P.line("node_check_failed", node="node1", what="x"))
    verdict = triage.verdict("FAILED", old + "\n")
    assert verdict is not None and (verdict.cause, verdict.node) == ("preflight", "node1")


def test_the_requeue_record_the_supervisor_writes_reads_back_by_its_format(tmp_path: Path):
    record = tmp_path / "requeues"
    records.append_requeue_record(record, "preemption", 2, "520", ["node2"])
    fields = re.fullmatch(P._regex(P.REQUEUE_FORMAT), record.read_text().rstrip("\n"))
    assert fields is not None and fields.groupdict() == {"why": "preemption", "attempt": "2", "step": "520",
                                                         "nodes": "node2"}  # fmt: skip
