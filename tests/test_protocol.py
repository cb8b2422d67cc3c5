"""The contract between launcher and job (launcher/protocol.py), end to end: the real templates are rendered, every
line their `log` calls print is produced by bash, the node check prints its line for real, and triage reads what
they printed. A line whose words drift between the script and triage fails here (the time-limit warning once did:
triage looked for "preemption or time-limit signal" while the script said "time-limit or preemption notice")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import fixed_paths, spec_for

from launcher import protocol as P
from launcher.bundle import render
from launcher.slurm import triage

ROOT = Path(__file__).resolve().parent.parent
LOG_CALL = re.compile(r'(?<![\w-])log ("[^"]*")')  # a call of the script's `log`, anywhere on a line
# What the batch script's variables hold when its lines are printed here.
BASH_STATE = (
    "SLURM_JOB_ID=48 SLURM_JOB_NODELIST='node[1-2]' attempt=2 rc=143 hung_step=812 idle=615 allowed=600 "
    "stacks=/logs/stacks-48-2 suspects=node2 holder=41 holder_state=RUNNING lock=/ck/.launcher-lock "
    "LAUNCHER_CHECKPOINTS=/ck head_node=node1 port=20048 rdzv=127.0.0.1:20048 rdzv_port=20048 "
    "LAUNCHER_PYTHON=/usr/bin/python3 preempt_time=2026-11-24T08:00:00 saved=520 time_limits=0 "
    "LAUNCHER_MAX_REQUEUES=3 notice=warned pre_launch_command='source /no/venv/bin/activate' outcome='stopped 520' "
    "count=1 LAUNCHER_MAX_RESTARTS=10 said='a failure (rank 1 on node1: died of SIGKILL (exit code -9), with no "
    "traceback)' blamed=node1 nodes_csv=node2 checkpoint=20 reason='the same exception as the failure before, at "
    "the same point of the run (after step 21): ValueError: bad' fix='correct what its traceback points at' "
    "; set -- preemption node2"
)


def _script() -> str:
    spec, problems = spec_for("--run_name", "p", "--dataset", "none", "--debug", "true", "--max_requeues", "3")
    assert not problems
    return render.sbatch_script(spec, fixed_paths("p"))


def printed_lines(script: str) -> list[str]:
    """Every line the script's `log` calls print, printed by bash with the script's own `log`."""
    (log_def,) = [line for line in script.splitlines() if line.startswith("log() {")]
    calls = LOG_CALL.findall(script)
    body = "\n".join([log_def, BASH_STATE, *(f"log {call}" for call in calls)])
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def names_of(line: str) -> list[str]:
    return [name for name in P.LINES if P.pattern(name).match(line)]


def test_every_line_the_batch_script_prints_is_a_line_of_the_contract():
    lines = printed_lines(_script())
    said = {name for line in lines for name in names_of(line)}
    assert all(len(names_of(line)) == 1 for line in lines), [(line, names_of(line)) for line in lines]
    # every line of the contract is printed by the batch script, except the node check's (below) and the Python
    # supervisor's own (tests/test_supervisor_loop.py)
    assert set(P.LINES) - said == {"preflight_failed", "node_warning", "supervisor_failed"}


def test_triage_reads_the_time_limit_warning_the_script_prints():
    lines = printed_lines(_script())
    started = next(line for line in lines if names_of(line) == ["attempt_started"])
    warned = next(line for line in lines if names_of(line) == ["warned"])
    log = "\n".join([started, "step 77/500 | loss 2.0", warned, "slurmstepd: error: *** JOB 48 ... TIME LIMIT ***"])
    verdict = triage.verdict("TIMEOUT", log)
    assert verdict is not None and verdict.cause == "time_limit"
    assert "raise --signal_grace" in verdict.fix and "at step 77 of 500" in verdict.message


def test_triage_reads_the_hang_the_preemption_and_the_spent_requeues_the_script_prints():
    lines = printed_lines(_script())
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


def test_triage_judges_the_last_node_step_of_a_restarted_attempt():
    """A restart line starts a new node step: the verdict is on the step that ended the job, with why the script
    did not restart it, not on an earlier step's failure it went on from."""
    lines = printed_lines(_script())
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
    assert f"/{P.FINISHED}/" in script and f"/{P.STOPPED}/" in script and P.LOCK in script


def _spec_and_paths():
    spec, _ = spec_for("--run_name", "p", "--dataset", "none")
    return spec, fixed_paths("p")


def test_the_requeue_record_the_script_writes_reads_back_by_its_format(tmp_path: Path):
    (printf,) = [line.strip() for line in _script().splitlines() if '>> "$LAUNCHER_REQUEUES"' in line]
    record = tmp_path / "requeues"
    body = f"{BASH_STATE}; LAUNCHER_REQUEUES={record}; {printf}"
    subprocess.run(["bash", "-c", body], check=True)
    fields = re.fullmatch(P._regex(P.REQUEUE_FORMAT), record.read_text().rstrip("\n"))
    assert fields is not None and fields.groupdict() == {"why": "preemption", "attempt": "2", "step": "520",
                                                         "nodes": "node2"}  # fmt: skip
