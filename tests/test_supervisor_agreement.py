"""The Python supervisor's decisions agree with the bash supervisor's, case by case: the batch script is rendered by
the project's renderer, the pieces of it that decide (the verdict `case`, the notice as the step ends, what follows
the restart decision, the attempt's final `case`) are cut out of it and run by bash, with only the commands they
call (log, requeue, amend_record, ...) defined to print what they were asked; every case runs in one bash, each in a
subshell. The Python side is launcher/node/supervisor (its table and its pure functions), never a copy of the script.
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
from pathlib import Path

import pytest
from launcher_helpers import fixed_paths, spec_for

from launcher import protocol as P
from launcher.node.supervisor import decide, table
from launcher.node.supervisor.decide import Answer, Line
from launcher.node.supervisor.state import Action, Notice, Verdict

NOTICES = [n.value for n in Notice]
BEFORE_STEP_END = ["none", "warned", "terminated", "hung"]  # the notices a step can end with (the others come after)
STUBS = r"""
log() { echo "LOG $*"; }
amend_record() { echo "AMEND $1"; }
latest_checkpoint() { echo 5; }
requeue() { echo "REQUEUE $1|$2|${3:-}"; exit 0; }
fresh_step() { echo FRESH; }
next_port() { echo 20001; }
choose_nodes() { step_count=$STEP_COUNT; nodes_csv=$NODES_CSV; }
requeued() { echo "$TIME_LIMITS"; }
slurm_requeues_preempted() { slurm_version=24.05; return "$SRP"; }
job_field() { echo "$PREEMPT_TIME"; }
"""


@pytest.fixture(scope="module")
def script() -> list[str]:
    spec, problems = spec_for("--dataset", "none", "--max_requeues", "3", "--hang_timeout", "600",
                              "--spare_nodes", "1", "--nodes", "2")  # fmt: skip
    assert not problems
    return render_script(spec).splitlines()


def render_script(spec) -> str:  # type: ignore[no-untyped-def]
    from launcher.bundle import render

    return render.sbatch_script(spec, fixed_paths("t"))


def cut(lines: list[str], first: str, last: str, after: int = 0) -> str:
    """The script's lines from the one that starts with `first` to the first one after it equal to `last`."""
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i in range(start + after + 1, len(lines)) if lines[i] == last)
    return "\n".join(lines[start : end + 1])


def run_cases(body: str, cases: list[dict[str, str]], more: list[str] | None = None) -> list[list[str]]:
    """`body` run by bash once per case (its variables set first, then `more`'s bash for it), each in a subshell:
    what each printed, and "EXIT n" where it exited."""
    parts = [STUBS]
    for k, case in enumerate(cases):
        sets = "\n".join(f"{name}={shlex.quote(value)}" for name, value in case.items()) + (more[k] if more else "")
        parts.append(f"echo '@@{k}'\n( set -u\n{sets}\n{body}\n); echo \"EXIT $?\"")
    out = subprocess.run(["bash", "-s"], input="\n".join(parts), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and not out.stderr, out.stderr[-2000:]
    chunks = out.stdout.split("@@")[1:]
    return [chunk.splitlines()[1:] for chunk in chunks]


def said(lines: tuple[Line, ...]) -> list[str]:
    """Python's lines as the script's `log` printed them."""
    return [f"LOG {P.LINES[name].format(**fields)}" for name, fields in lines]


def test_the_verdict_table_is_the_scripts_case_row_by_row(script: list[str]):
    body = cut(script, '  case "${notice}/${outcome%% *}/${status}" in', "  esac") + '\necho "VERDICT $verdict"'
    outcomes = ["", "finished 10", "stopped 10", "finished", "stopped", "other 3", " finished 10", "finished\t1"]
    cases = [{"notice": n, "outcome": o, "status": str(s)}
             for n, o, s in itertools.product(NOTICES, outcomes, (0, 1, 7, 143))]  # fmt: skip
    for case, got in zip(cases, run_cases(body, cases), strict=True):
        want = table.verdict(Notice(case["notice"]), case["outcome"], int(case["status"]))
        assert got == [f"VERDICT {want.value}", "EXIT 0"], case
    # and every row of the table is some case's first match (no row the script never reaches)
    reached = {next(row for row in table.VERDICTS if table.matches(row, Notice(c["notice"]), c["outcome"],
                                                                    int(c["status"]))) for c in cases}  # fmt: skip
    assert reached == set(table.VERDICTS)


def test_the_notice_as_the_step_ends_is_the_scripts(script: list[str], tmp_path: Path):
    body = cut(script, "  preempt_time=$(job_field", "  fi", after=4) + '\necho "NOTICE $notice SUSPECTS $suspects"'
    report = tmp_path / "preflight"
    report.write_text("node2: no GPU\nnode1: python\nnode2: path\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    cases = [
        {"notice": n, "PREEMPT_TIME": t, "LAUNCHER_PREFLIGHT_REPORT": str(r), "SLURM_JOB_ID": "7", "suspects": ""}
        for n, t, r in itertools.product(BEFORE_STEP_END, ("", "None", "2026-11-24T08:00:00"), (report, empty))
    ]
    for case, got in zip(cases, run_cases(body, cases), strict=True):
        text = Path(case["LAUNCHER_PREFLIGHT_REPORT"]).read_text()
        notice, lines = decide.notice_at_step_end(Notice(case["notice"]), case["PREEMPT_TIME"], text)
        suspects = " ".join(table.preflight_suspects(text)) if notice == Notice.PREFLIGHT else ""
        assert got == [*said(tuple(lines)), f"NOTICE {notice.value} SUSPECTS {suspects}", "EXIT 0"], case


def test_what_follows_the_restart_decision_is_the_scripts(script: list[str]):
    block = cut(script, '  if [[ "$notice" == terminated || (', "  esac", after=10)
    body = f'for _once in 1; do\n{block}\ndone\necho "AFTER $verdict $notice ${{saved:-}}"'
    answers = [Answer(Action.RESTART, "hang", "a hang (suspected: node2)", ("node2",), 20, count=1),
               Answer(Action.RESTART, "failure", "a failure", (), 20, count=2),
               Answer(Action.REQUEUE, "node-failure", "a node failure", ("node2", "node3"), 20),
               Answer(Action.STOP, "failure", "a failure", ("node2",), 20, "the same exception", "correct it", 2),
               Answer(Action.NOTHING)]  # fmt: skip
    cases, keys = [], []
    for notice, answer, verdict, status, nodes, requeues in itertools.product(
        NOTICES, answers, ("failed", "hung", "unhealthy"), (7, 0), (["node1", "node3"], ["node1"]), (0, 3)
    ):
        keys.append((notice, answer, verdict, status, nodes, requeues))
        cases.append(
            {
                "notice": notice,
                "action": answer.action.value,
                "why": answer.why,
                "said": answer.said,
                "blamed": ",".join(answer.nodes),
                "checkpoint": str(answer.checkpoint),
                "reason": answer.reason,
                "fix": answer.fix,
                "code": str(answer.code),
                "count": str(answer.count),
                "verdict": verdict,
                "status": str(status),
                "STEP_COUNT": str(len(nodes)),
                "NODES_CSV": ",".join(nodes),
                "LAUNCHER_MAX_REQUEUES": str(requeues),
                "LAUNCHER_MAX_RESTARTS": "10",
                "LAUNCHER_LAYOUT_NODES": "2",
                "rdzv_port": "20000",
                "suspects": "node2",
                "saved": "s",
            }
        )
    for key, case, got in zip(keys, cases, run_cases(body, cases), strict=True):
        notice, answer, verdict, status, nodes, requeues = key
        assert got == python_after_decision(Notice(notice), answer, Verdict(verdict), status, nodes, requeues), case


def python_after_decision(notice: Notice, answer: Answer, verdict: Verdict, status: int, nodes: list[str],
                          requeues: int) -> list[str]:  # fmt: skip
    """What the supervisor does after the decision, in the stubs' words."""
    nxt = decide.after_decision(notice, answer, verdict, status)
    if nxt.kind == "restart":
        nxt = decide.restart_on_nodes(notice, answer, verdict, nodes, 2, requeues, 10)
    trace = [f"AMEND {nxt.amend}"] if nxt.amend else []
    trace += said(nxt.lines)
    if nxt.kind == "requeue":
        return [*trace, f"REQUEUE {nxt.why}|{' '.join(nxt.exclude)}|", "EXIT 0"]
    if nxt.kind == "exit":
        return [*trace, f"EXIT {nxt.code}"]
    if nxt.kind == "restart":
        return [*trace, "FRESH", f"AFTER {nxt.verdict.value} {(nxt.notice or notice).value} s", "EXIT 0"]
    saved = "5" if nxt.resaved else "s"
    return [*trace, f"AFTER {nxt.verdict.value} {notice.value} {saved}", "EXIT 0"]


def test_the_attempts_end_is_the_scripts(script: list[str]):
    body = cut(script, 'case "$verdict" in', "esac")
    cases, keys = [], []
    for verdict, notice, status, limits, most, srp in itertools.product(
        [v.value for v in Verdict], NOTICES, (0, 7), (0, 2, 3), (0, 3), (True, False)
    ):
        keys.append((verdict, notice, status, limits, most, srp))
        cases.append(
            {
                "verdict": verdict,
                "notice": notice,
                "status": str(status),
                "saved": "120",
                "TIME_LIMITS": str(limits),
                "LAUNCHER_MAX_REQUEUES": str(most),
                "SRP": "0" if srp else "1",
            }
        )
    for key, case, got in zip(keys, cases, run_cases(body, cases), strict=True):
        verdict, notice, status, limits, most, srp = key
        end = decide.end_of_attempt(Verdict(verdict), Notice(notice), status, "120", limits, most, srp, "24.05")
        want = said(end.lines)
        if end.requeue:
            want.append(f"REQUEUE {end.requeue}||{'slurm' if end.by_slurm else ''}")
        assert got == [*want, f"EXIT {end.code}"], case


def test_amending_the_restart_record_is_the_scripts(script: list[str], tmp_path: Path):
    from launcher.node.supervisor import effects

    body = cut(script, "amend_record() {", "}")
    first = P.RESTART_FORMAT.format(why="hang", action="restart", job="7", attempt=1, start=0, end=10, at=12,
                                    nodes="node2", failure="-")  # fmt: skip
    last = first.replace("hang restart", "failure restart").replace("node2", "-")
    for how in ("none", "requeue"):
        for lines in ([first, last], [first], []):
            bash_file, py_file = tmp_path / f"bash-{how}", tmp_path / f"py-{how}"
            for f in (bash_file, py_file):
                f.write_text("".join(line + "\n" for line in lines))
            run_cases(f"{body}\namend_record {how}", [{"LAUNCHER_RESTARTS": str(bash_file)}])
            effects.amend_restart_record(py_file, how)
            assert py_file.read_text() == bash_file.read_text(), (how, lines)


def test_the_steps_nodes_are_the_scripts(script: list[str]):
    body = cut(script, "choose_nodes() {", "}") + '\nchoose_nodes\necho "NODES $nodes_csv $step_count $head_node"'
    stubs = 'allocation_now() { echo "$ALLOC"; }\nscontrol() { echo "NodeAddr=x"; }\n'
    allocations = ["node1,node2,node3", "node2,node3", "node1", "node3,node1,node2", ""]
    lefts = [[], ["node2"], ["node1", "node3"], ["node1", "node2", "node3"]]
    cases, keys = [], []
    for batch, alloc, left, layout in itertools.product(("node1", "node2"), allocations, lefts, (1, 2, 3)):
        keys.append((batch, alloc, left, layout))
        cases.append({"batch_node": batch, "ALLOC": alloc, "LAUNCHER_LAYOUT_NODES": str(layout)})
    left_sets = [f"left_out=({' '.join(left)})" for _, _, left, _ in keys]
    got = run_cases(stubs + body, cases, [f"\n{s}" for s in left_sets])
    for key, out in zip(keys, got, strict=True):
        batch, alloc, left, layout = key
        nodes = decide.choose_nodes(batch, [n for n in alloc.split(",") if n], left, layout)
        assert out == [f"NODES {','.join(nodes)} {len(nodes)} {nodes[0] if nodes else ''}", "EXIT 0"], key
