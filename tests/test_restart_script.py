"""The batch script's restart branch, run for real by bash with Slurm's commands stubbed (scontrol, srun) and the
Python helpers stubbed where a test needs them to fail or to race: what the script does around the restart decision
does not need a cluster (tests/test_goodput.py runs the restarts themselves on the local cluster).

The stub `srun` plays the training step: the first fails (exit code 7), a later one honours the stop file as
training does ("stopped 10", exit 0), else finishes ("finished 10")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher_helpers import fixed_paths, spec_for

from launcher import protocol as P
from launcher.bundle import render
from launcher.node.restart import records

SRUN = r"""#!/bin/bash
printf '%s\n' "$*" >> "$STUB_DIR/srun.calls"
if [[ " $* " != *" run "* ]]; then exit 0; fi  # a dump, a stop: nothing to do here
n=$(( $(cat "$STUB_DIR/steps" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STUB_DIR/steps"
if (( n == 1 )); then exit 7; fi
if [[ -e "$LAUNCHER_STOP_FILE" ]]; then
  rm -f "$LAUNCHER_STOP_FILE"; echo "stopped 10" > "$LAUNCHER_OUTCOME_FILE"; exit 0
fi
echo "finished 10" > "$LAUNCHER_OUTCOME_FILE"
"""
SCONTROL = r"""#!/bin/bash
printf '%s\n' "$*" >> "$STUB_DIR/scontrol.calls"
case "$1 ${2:-}" in
  "show hostnames") tr ',' '\n' <<< "$3" ;;
  "show job") echo "JobId=$3 NodeList=$(cat "$STUB_DIR/nodelist") PreemptTime=None ExcNodeList=(null)" ;;
  "show node") echo "NodeName=$3 NodeAddr=$3 State=MIXED" ;;
  "show partition") echo "PartitionName=debug TotalNodes=3" ;;
esac
exit 0
"""
# The job's Python: the real one, but for the watchdog (records its pid, waits) and, as STUB_DECISION says, the
# restart decision: "none" (a traceback, no answer), "warn"/"term" (a USR1/SIGTERM to the batch script while it
# runs), "shrink" (a node leaves the allocation while it runs).
PYTHON = r"""#!/bin/bash
case "$*" in
  *launcher.node.watchdog*)
    echo $$ >> "$STUB_DIR/watchdogs"
    exec sleep 300 ;;
  *launcher.node.restart*)
    while read -r pid; do
      if kill -0 "$pid" 2>/dev/null; then echo "$pid" >> "$STUB_DIR/watchdogs-alive-in-decision"; fi
    done < "$STUB_DIR/watchdogs"
    case "${STUB_DECISION:-}" in
      none) echo "Traceback (most recent call last): ..." >&2; exit 1 ;;
      warn) kill -USR1 "$(cat "$STUB_DIR/batch.pid")"; sleep 1 ;;
      term) kill -TERM "$(cat "$STUB_DIR/batch.pid")"; sleep 1 ;;
      shrink) echo node1 > "$STUB_DIR/nodelist" ;;
    esac ;;
esac
exec {python} "$@"
"""


def run_script(tmp_path: Path, decision: str = "", nodes: str = "1") -> tuple[int, str, Path]:
    """The rendered batch script run by bash with the stubs (job 77 on node1-node3, the batch host node1): its exit
    code, its output (the job's log) and the stubs' directory."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in {
        "srun": SRUN,
        "scontrol": SCONTROL,
        "python": PYTHON.replace("{python}", sys.executable),
    }.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    (stubs / "watchdogs").touch()
    (stubs / "nodelist").write_text("node1,node2,node3\n")
    spec, problems = spec_for("--python", str(stubs / "python"), "--nodes", nodes, "--spare_nodes", "1",
                              "--hang_timeout", "600", "--dataset", "none", "--wandb_disabled", "true",
                              "--run_train_script", "/x/run_train.py")  # fmt: skip
    paths = fixed_paths("t", root=tmp_path)
    for folder in (paths.bundle_dir, paths.script.parent, paths.log.parent):
        folder.mkdir(parents=True)
    paths.script.write_text(render.sbatch_script(spec, paths))
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_DIR": str(stubs), "STUB_DECISION": decision,
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1,node2,node3", "SLURMD_NODENAME": "node1",
           "SLURM_JOB_PARTITION": "debug", "SLURM_RESTART_COUNT": "0"}  # fmt: skip
    start = f'echo $$ > {stubs / "batch.pid"}; exec bash "$0"'  # the script keeps the pid: the stubs signal it
    run = subprocess.run(["bash", "-c", start, str(paths.script)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    return run.returncode, run.stdout + run.stderr, stubs


def steps(stubs: Path) -> int:
    return int((stubs / "steps").read_text())


def lines(out: str, name: str) -> list[str]:
    return [line for line in out.splitlines() if P.pattern(name).match(line)]


def test_a_restart_starts_the_step_again_and_records_it_as_the_jobs(tmp_path: Path):
    code, out, stubs = run_script(tmp_path)
    assert code == 0 and steps(stubs) == 2, out
    (restart,) = lines(out, "restart")
    assert "restart 1 of 10 in the allocation, leaving out none: training again on node1 " in restart, out
    (record,) = records(tmp_path / "logs/configs/t/20260101-000000" / P.RESTARTS_FILE)
    assert (record["action"], record["job"]) == ("restart", "77")


def test_a_decision_with_no_answer_ends_the_attempt_as_without_restarts_and_says_so(tmp_path: Path):
    code, out, stubs = run_script(tmp_path, "none")
    assert code == 7 and steps(stubs) == 1, out  # a failure ends with srun's status, as with --max_restarts 0
    (said,) = lines(out, "no_decision")
    assert "no restart decision could be had (its answer: nothing;" in said and "Traceback" in out


def test_a_time_limit_warning_during_the_decision_requeues_the_job(tmp_path: Path):
    code, out, stubs = run_script(tmp_path, "warn")
    assert code == 0 and steps(stubs) == 1, out  # not a second step that stops at once on the stop file
    assert lines(out, "notice_over_restart") and lines(out, "requeue_time_limit"), out
    assert "requeue 77" in (stubs / "scontrol.calls").read_text()
    (record,) = records(tmp_path / "logs/configs/t/20260101-000000" / P.RESTARTS_FILE)
    assert record["action"] == "requeue"  # what the job did: no restart is counted


def test_a_sigterm_during_the_decision_ends_the_attempt(tmp_path: Path):
    code, out, stubs = run_script(tmp_path, "term")
    assert code == 7 and steps(stubs) == 1, out  # no new step in a dying job
    assert lines(out, "notice_over_restart") and "requeue" not in (stubs / "scontrol.calls").read_text()
    assert records(tmp_path / "logs/configs/t/20260101-000000" / P.RESTARTS_FILE) == []


def test_the_watchdog_is_stopped_before_the_decision(tmp_path: Path):
    code, out, stubs = run_script(tmp_path)
    assert code == 0 and len((stubs / "watchdogs").read_text().split()) == 2, out  # one per step
    assert not (stubs / "watchdogs-alive-in-decision").exists()


def test_a_step_never_starts_on_fewer_nodes_than_the_layout(tmp_path: Path):
    """A node leaves the allocation while the decision runs: 1 node left of the layout's 2, the job requeues; never
    `srun --nodes=2 --nodelist=node1`, which lets Slurm add any node (a left-out suspect too)."""
    code, out, stubs = run_script(tmp_path, "shrink", nodes="2")
    assert code == 0 and steps(stubs) == 1, out
    (requeue,) = lines(out, "requeue_without")
    assert requeue.endswith("; 1 of the layout's 2 nodes left in the allocation"), requeue
    assert "requeue 77" in (stubs / "scontrol.calls").read_text()
    assert not lines(out, "restart")
