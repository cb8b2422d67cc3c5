"""The contract between launcher and job (launcher/protocol.py), end to end: every line of the contract is printed
by someone (the job's supervisor, its batch script, the node check), the supervisor's lines are made here by its own
functions (the decisions, its hang handler, its `say`), the node check prints its line for real, and triage reads
what they printed. A line whose words drift between the job and triage fails here (the time-limit warning once did:
triage looked for "preemption or time-limit signal" while the script said "time-limit or preemption notice")."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import fixed_paths, spec_for

from launcher import protocol as P
from launcher.bundle import render
from launcher.node.supervisor import decide, effects
from launcher.node.supervisor.decide import Answer
from launcher.node.supervisor.state import WARN, Action, Notice, Phase, State, Verdict
from launcher.node.supervisor.supervise import Files, Supervisor
from launcher.slurm import triage

ROOT = Path(__file__).resolve().parent.parent
SUPERVISOR = ROOT / "launcher/node/supervisor"
SAID = (("why", "a failure (rank 1 on node1: died of SIGKILL (exit code -9), with no traceback)"),)
REASON = "the same exception as the failure before, at the same point of the run (after step 21): ValueError: bad"


def _script() -> str:
    spec, problems = spec_for("--run_name", "p", "--dataset", "none", "--debug", "true", "--max_requeues", "3")
    assert not problems
    return render.sbatch_script(spec, fixed_paths("p"))


def _consts(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _consts(node.body) | _consts(node.orelse)
    return set()


def said_by_the_job() -> set[str]:
    """The lines the supervisor's code says (a `say` call's name, a decision's `(name, fields)`; its eval jobs'
    submissions too) and the batch script's `say` calls (the pre-launch commands' lines)."""
    names = set(re.findall(r'say\("(\w+)"', (ROOT / "launcher/bundle/templates/sbatch.sh.j2").read_text()))
    for source in [*SUPERVISOR.glob("*.py"), ROOT / "launcher/node/evals.py"]:
        for node in ast.walk(ast.parse(source.read_text())):
            if (
                isinstance(node, ast.Call)
                and node.args
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "say"
            ):
                names |= _consts(node.args[0])
            if isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[1], ast.Dict):
                names |= _consts(node.elts[0])
    return names


class Heard(effects.Node):
    """The supervisor's effects, its lines kept (Slurm's commands are not reached by what runs here)."""

    def __init__(self) -> None:
        super().__init__(out=io.StringIO())

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
    stop = Answer(Action.STOP, dict(SAID)["why"], reason=REASON, fix="correct what its traceback points at")
    lines += decide.after_decision(Notice.NONE, stop, Verdict.FAILED, 1).lines
    again = Answer(Action.RESTART, dict(SAID)["why"], nodes=("node1",), checkpoint=20, count=1)
    lines += decide.restart_on_nodes(Notice.NONE, again, Verdict.FAILED, ["node2"], 1, 3, 10).lines
    for name, fields in lines:
        heard.say(name, **fields)
    files = Files.in_dir(tmp_path, tmp_path / "logs")
    files.hung.write_text("812 615 600\n")
    hang = Supervisor(State("48", 2, "node1", 20048, phase=Phase.STEP, step_nodes=["node1", "node2"]), heard, files)
    hang.on_hang()
    return heard.lines()


def names_of(line: str) -> list[str]:
    return [name for name in P.LINES if P.pattern(name).match(line)]


def test_every_line_of_the_contract_is_printed_by_the_job():
    # every line of the contract is the supervisor's or its batch script's, except the node check's (below)
    assert set(P.LINES) - said_by_the_job() == {"preflight_failed", "node_warning"}
    assert said_by_the_job() <= set(P.LINES)


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
    run = subprocess.run(  # as the node script runs it: a module, the project on PYTHONPATH
        [sys.executable, "-m", "launcher.node.nodecheck", "--head", "127.0.0.1", "--port", "0", "--nodes", "node7",
         "--node", "node7", "--readable", str(missing), "--timeout", "5"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 5, run.stdout + run.stderr
    (line,) = [line for line in run.stdout.splitlines() if line.startswith(P.LINE_START)]
    assert names_of(line) == ["preflight_failed"]
    verdict = triage.verdict("FAILED", line + "\n")
    assert verdict is not None and (verdict.cause, verdict.node) == ("preflight", "node7")
    assert str(missing) in verdict.message


@pytest.mark.parametrize("name", sorted(P.LINES))
def test_every_lines_static_text_is_safe_in_bash_double_quotes(name: str):
    expressions = {field: "X" for field in P.fields(name)}
    assert P.bash_line(name, **expressions).count('"') == 2


def test_the_templates_speak_the_contracts_words():
    script, node = _script(), render.node_script(*_spec_and_paths())
    for name in (P.ENV_STOP_FILE, P.ENV_OUTCOME_FILE):
        assert f"export {name}=" in script and f"export {name}=" in node
    for name in (P.ENV_METRICS_FILE, P.ENV_PROGRESS_FILE, P.ENV_NODE_TAG):
        assert f"export {name}=" in node
    for name in P.SUPERVISOR_ENV.values():  # every value the supervisor reads
        assert f"\nexport {name}=" in script, name


def _spec_and_paths():
    spec, _ = spec_for("--run_name", "p", "--dataset", "none")
    return spec, fixed_paths("p")


def test_the_requeue_record_the_supervisor_writes_reads_back_by_its_format(tmp_path: Path):
    record = tmp_path / "requeues"
    effects.append_requeue_record(record, "preemption", 2, "520", ["node2"])
    fields = re.fullmatch(P._regex(P.REQUEUE_FORMAT), record.read_text().rstrip("\n"))
    assert fields is not None and fields.groupdict() == {"why": "preemption", "attempt": "2", "step": "520",
                                                         "nodes": "node2"}  # fmt: skip
