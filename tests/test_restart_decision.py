"""The supervisor's restart decision (launcher/node/restart.py): which node failed, and whether training goes on in
the allocation, the job requeues, or it stops with the cause and its fix. Pure rules here, on the real torchrun logs
of tests/fixtures/triage; tests/test_goodput.py holds the job to them on the local cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher_helpers import TRIAGE_FIXTURES

from launcher import protocol as P
from launcher.node import failures, restart
from launcher.node.restart import Found, Step, answer, choose, find, ranks_map, records

ROOT = Path(__file__).resolve().parent.parent
CRASH = failures.Failure("crash", "died of SIGKILL (exit code -9), with no traceback", 1, "node1")
VALUE = failures.Failure("exception", "ValueError: bad shard", 1, "node1")


def step(**changes) -> Step:
    values = dict(verdict="failed", attempt=1, layout=2, step_nodes=["node1", "node2"],
                  allocation=["node1", "node2", "node3"], partition_spare=0)  # fmt: skip
    values.update(changes)
    return Step(**values)  # type: ignore[arg-type]


def failed(nodes=("node1",), failure=CRASH, at=12) -> Found:
    return Found("failure", "a failure", list(nodes), failure, at)


def past(*ends: tuple[int, int], failure: str = "crash: died", at: str = "12") -> list[dict[str, str]]:
    return [{"start": str(a), "end": str(b), "failure": failure, "at": at} for a, b in ends]


def test_a_failed_node_is_left_out_while_a_spare_is_there():
    d = choose(step(), failed(), [], 10)
    assert (d.action, d.nodes, d.checkpoint) == ("restart", ["node1"], 10)


def test_without_a_spare_the_job_requeues_without_the_node_where_the_partition_can_spare_one():
    no_spare = step(allocation=["node1", "node2"], partition_spare=1)
    assert (choose(no_spare, failed(), [], 10).action, choose(no_spare, failed(), [], 10).nodes) == (
        "requeue",
        ["node1"],
    )
    # the partition has no other node: the step again on the same nodes (the requeue would get them back)
    same = choose(step(allocation=["node1", "node2"], partition_spare=0), failed(), [], 10)
    assert (same.action, same.nodes) == ("restart", []) and "none spare" in same.said
    # a failure no node can be blamed for: the same nodes
    assert choose(step(allocation=["node1", "node2"]), failed(nodes=()), [], 10).action == "restart"


def test_a_node_that_left_the_allocation_without_a_spare_requeues():
    gone = step(allocation=["node1"], partition_spare=1)
    found = find(gone, "", {}, 2, 30)
    assert (found.why, found.nodes) == ("node-failure", ["node2"]) and "node2 left the allocation" in found.said
    d = choose(gone, found, [], 30)
    assert (d.action, d.nodes) == ("requeue", ["node2"])
    # with a spare: on node1 and node3
    assert choose(step(allocation=["node1", "node3"]), find(step(allocation=["node1", "node3"]), "", {}, 2, 30), [],
                  30).action == "restart"  # fmt: skip
    # the job may not requeue itself (--max_requeues 0): a stop that says so
    refused = choose(step(allocation=["node1"], requeues_allowed=False), found, [], 30)
    assert refused.action == "stop" and "--max_requeues" in refused.fix


def test_what_a_retry_cannot_fix_stops_at_once():
    bad = choose(step(), failed(failure=failures.Failure("bad_input", "dataset has no column 'x'", 0, None)), [], 4)
    assert (bad.action, bad.code) == ("stop", 2) and "refused its data or config" in bad.reason
    missing = failures.Failure("exception", "FileNotFoundError: [Errno 2] No such file or directory: '/d/x'", 0, None)
    gone = choose(step(), failed(failure=missing), [], 4)
    assert gone.action == "stop" and "a file is missing" in gone.reason and "step 4" in gone.fix


def test_the_same_exception_at_the_same_step_stops_and_another_step_does_not():
    before = past((0, 10), failure=f"exception: {VALUE.summary}", at="12")
    same = choose(step(), failed(failure=VALUE, at=12), before, 10)
    assert same.action == "stop" and "the same exception as the failure before, at the same point of the run (after " \
        "step 12)" in same.reason  # fmt: skip
    assert "traceback" in same.fix
    assert choose(step(), failed(failure=VALUE, at=15), before, 10).action == "restart"
    oom = failures.Failure("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory", 1, None)
    again = choose(step(), failed(failure=oom, at=12), past((0, 10), failure=f"cuda_oom: {oom.summary}"), 10)
    assert again.action == "stop" and "the same out-of-memory as" in again.reason and "--micro_batch_size" in again.fix
    # before the run's first step (no step logged), twice: the same point too
    first = choose(step(), failed(failure=oom, at=None), past((0, 0), failure=f"cuda_oom: {oom.summary}", at="-"), 0)
    assert first.action == "stop" and "at the same point of the run (before its first step)" in first.reason
    # a crash (SIGKILL, SIGSEGV) may be the node's: retried however often it comes, within the bounds below
    assert choose(step(), failed(at=12), past((0, 10), failure=f"crash: {CRASH.summary}"), 10).action == "restart"


def test_three_steps_in_a_row_without_a_newer_checkpoint_stop():
    assert choose(step(), failed(), past((10, 10)), 10).action == "restart"
    assert choose(step(started_from=10), failed(), past((0, 10), (10, 10)), 10).action == "restart"
    stuck = choose(step(started_from=10), failed(), past((10, 10), (10, 10)), 10)
    assert stuck.action == "stop" and "3 node steps in a row ended without a checkpoint newer than step 10" in \
        stuck.reason  # fmt: skip
    assert choose(step(started_from=10), failed(), past((10, 10), (10, 10)), 20).action == "restart"  # progress


def test_the_restarts_are_bounded():
    spent = choose(step(max_restarts=2), failed(), past((0, 10), (10, 20)), 30)
    assert spent.action == "stop" and "--max_restarts 2" in spent.reason and "step 30" in spent.fix


def test_every_node_failing_its_check_is_the_runs_problem():
    found = Found("node-check", "a failed node check", ["node1", "node2"])
    d = choose(step(verdict="unhealthy", suspects=["node1", "node2"]), found, [], 0)
    assert (d.action, d.code) == ("stop", 5)
    one = choose(step(verdict="unhealthy"), Found("node-check", "a failed node check", ["node2"]), [], 0)
    assert (one.action, one.nodes) == ("restart", ["node2"])


def test_the_failed_rank_is_found_on_its_node_by_the_rank_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    log = (TRIAGE_FIXTURES / "exception-2nodes.log").read_text()  # rank 3 raises first, on node2
    ranks = tmp_path / "ranks"
    ranks.write_text(P.RANKS_FORMAT.format(node="node7", first=0, last=1) + P.RANKS_FORMAT.format(node="node9",
                     first=2, last=3))  # fmt: skip
    nodes = step(step_nodes=["node7", "node9"], allocation=["node7", "node9", "node8"])
    found = find(nodes, log, ranks_map(ranks), 2, 5)
    assert found.failure is not None and found.failure.rank == 3 and "rank 3 on node9: ValueError" in found.said
    # an exception is the run's own, not node9's: the step again on the same nodes, none left out or excluded
    assert found.nodes == [] and (choose(nodes, found, [], 4).action, choose(nodes, found, [], 4).nodes) == (
        "restart", [])  # fmt: skip
    crash = failures.Failure("crash", "died of SIGKILL", 3, None)  # the same ranks, a node's failure this time
    monkeypatch.setattr(failures, "first_failure", lambda text: crash)
    assert find(nodes, log, ranks_map(ranks), 2, 5).nodes == ["node9"]
    # no rank map (a script of the user's): the step's nodes in order, two ranks each
    assert find(nodes, log, {}, 2, 5).nodes == ["node9"]


def test_the_supervisors_call_reads_the_steps_part_of_the_log_and_the_record_is_kept(tmp_path: Path):
    log = tmp_path / "job.out"
    before = "[launcher 10:00:00.000] an earlier step's lines\n" + (TRIAGE_FIXTURES / "cuda-oom.log").read_text()
    log.write_text(before + (TRIAGE_FIXTURES / "exception-2nodes.log").read_text())
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / P.TORCH_POINTER).write_text("20\n")
    (tmp_path / "metrics.jsonl").write_text('{"step": 24, "loss": 1.0}\n')
    decision = answer(step(started_from=10), "48", tmp_path / "ckpt", tmp_path / "restarts", 2, log,
                      len(before.encode()), None, tmp_path / "metrics.jsonl")  # fmt: skip
    # the step's own failure (rank 3's ValueError), not the OOM an earlier step left in the log
    d = decision
    assert (d.action, d.why, d.nodes, d.checkpoint, d.count) == ("restart", "failure", [], 20, 1), d
    assert "ValueError" in d.said
    (record,) = records(tmp_path / "restarts")
    assert record == {"why": "failure", "action": "restart", "job": "48", "attempt": "1", "start": "10", "end": "20",
                      "at": "24", "nodes": "-", "failure": record["failure"]}  # fmt: skip
    assert record["failure"].startswith("exception: ValueError")


def test_the_budget_is_the_jobs_own_not_an_earlier_job_of_the_same_script(tmp_path: Path):
    """`sbatch <script>` again (what the script's header says to do) is a new job appending to the same restarts
    file: the earlier job's restarts and steps without progress do not count against it."""
    path = tmp_path / "restarts"
    earlier = dict(why="failure", action="restart", attempt=1, at=2, nodes="-", failure="crash: x")
    lines = [P.RESTART_FORMAT.format(**earlier, start=10 * i, end=10 * i + 10, job="47") for i in range(10)]
    lines.append(P.RESTART_FORMAT_NO_JOB.format(**earlier, start=0, end=0))  # a record from before job ids
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "ckpt").mkdir()

    def decided(job: str) -> restart.Decision:
        return answer(step(layout=1, step_nodes=["node1"], allocation=["node1", "node2"]), job, tmp_path / "ckpt", path)

    first = decided("48")
    assert (first.action, first.count) == ("restart", 1)  # its first restart, not an 11th
    assert decided("48").action == "restart"  # 2 of its own steps without progress: not yet 3
    assert [r["job"] for r in records(path)] == ["47"] * 10 + ["", "48", "48"]  # the one before job ids: no job's
    assert len(records(path, "48")) == 2
    stopped = decided("47")  # the earlier job itself stays bounded
    assert stopped.action == "stop" and "--max_restarts 10" in stopped.reason


@pytest.mark.parametrize("verdict,expected", [("hung", "hang"), ("unhealthy", "node-check")])
def test_a_hang_and_a_failed_check_blame_the_nodes_the_supervisor_names(verdict: str, expected: str):
    found = find(step(verdict=verdict, suspects=["node2"]), "", {}, 2, 7)
    assert (found.why, found.nodes, found.at) == (expected, ["node2"], 7)


LOST = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/engine.py", line 290, in train_step
[rank0]:     (loss / accum).backward()
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5
srun: error: node1: task 0: Exited with exit code 1
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
"""


def test_a_node_gone_before_slurm_noticed_is_the_one_srun_never_heard_from():
    """A node dies (power, kernel): the others' ranks only lose their peers and fail first, before Slurm marks the
    node DOWN; the node whose task srun never heard end is blamed, not the survivors."""
    found = find(step(), LOST, {}, 2, 40)
    assert found.nodes == ["node2"] and "no word from node2" in found.said
    assert choose(step(), found, [], 30).nodes == ["node2"]
    # every node's task was heard: no one node to blame, the same nodes again
    heard = LOST + "srun: error: node2: task 1: Killed\n"
    assert find(step(), heard, {}, 2, 40).nodes == []  # a rank that only lost its peers blames no node
