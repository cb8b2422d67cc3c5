"""The GPU-hour ledger's figures (pure: launcher.ledger.breakdown) and the job's own records it reads
(launcher.ledger.attempts). On the real cluster: tests/test_accounting.py (with sacct) and
tests/test_e2e_training.py (without)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher import protocol as P
from launcher.ledger import attempts as records
from launcher.ledger.breakdown import COMPLETED, OVERHEAD, Attempt, Work, compute, hours_at, summary, trained_curve


def steps(start: float, first: int, last: int, every: float = 1.0) -> tuple[tuple[float, int], ...]:
    return tuple((start + every * (s - first), s) for s in range(first, last + 1))


def test_a_completed_attempt():
    ledger = compute([Attempt(1, 0.0, 100.0, 4, "completed")], {1: Work(steps(20.0, 1, 71))}, 10, "test")
    (a,) = ledger.attempts
    assert (a.allocated, a.start_up, a.trained, a.wind_down, a.thrown_away) == (400.0, 80.0, 280.0, 40.0, 0.0)
    assert ledger.useful == 280.0 and ledger.lost == 120.0 and ledger.lost_to == {OVERHEAD: 120.0}
    assert ledger.causes == {} and "lost: " in summary(ledger)


def test_a_preemption_throws_away_the_steps_after_the_checkpoint_resumed_from():
    chain = [Attempt(1, 0.0, 50.0, 2, "preemption"), Attempt(2, 80.0, 140.0, 2, "completed")]
    works = {1: Work(steps(10.0, 1, 31)), 2: Work(steps(100.0, 21, 50), resumed_from=20)}
    ledger = compute(chain, works, 10, "test")
    first, second = ledger.attempts
    assert first.steps_thrown_away == 11 and first.thrown_away == 2 * (40.0 - 29.0)  # steps 21..31
    assert second.steps_thrown_away == 0 and second.start_up == 2 * 20.0
    lost_to_preemption = first.thrown_away + first.wind_down + second.start_up  # the requeue's whole cost
    assert ledger.lost_to == {OVERHEAD: 2 * 10.0 + second.wind_down, "preemption": lost_to_preemption}
    assert ledger.causes == {"preemption": 1} and "to 1 preemption" in summary(ledger)
    assert ledger.allocated == 2 * 50 + 2 * 60  # the 30 s in the queue between attempts are no GPU time


def test_a_failed_last_attempt_loses_the_steps_after_its_last_checkpoint():
    ledger = compute([Attempt(1, 0.0, 40.0, 1, "failure")], {1: Work(steps(5.0, 1, 23))}, 10, "test")
    (a,) = ledger.attempts
    assert a.steps_thrown_away == 3 and a.thrown_away == 3.0  # steps 21, 22, 23 after checkpoint 20
    assert ledger.lost_to["failure"] == a.thrown_away + a.wind_down and ledger.causes == {"failure": 1}


def test_an_attempt_without_a_step_is_all_lost():
    chain = [Attempt(1, 0.0, 30.0, 8, "node check"), Attempt(2, 40.0, 60.0, 8, "completed")]
    ledger = compute(chain, {2: Work(steps(45.0, 1, 10))}, 10, "test")
    assert ledger.attempts[0].start_up == 240.0 and ledger.attempts[0].first_step is None
    assert ledger.lost_to["node check"] == 240.0 + ledger.attempts[1].start_up  # its own and the next start-up


attempt = st.builds(
    lambda n, start, length, gpus, ended, first, count, pace: (
        Attempt(n, start, start + length, gpus, ended),
        Work(steps(start + length * first, 1, count, pace * length / max(count, 1) * (1 - first))),
    ),
    st.just(0), st.floats(0, 1e6), st.floats(0.1, 1e4), st.integers(1, 64),
    st.sampled_from(["preemption", "time limit", "hang", "failure", "completed"]), st.floats(0, 0.9),
    st.integers(0, 50), st.floats(0, 1),
)  # fmt: skip


@given(st.lists(attempt, min_size=1, max_size=5), st.integers(0, 20))
def test_the_parts_add_up(chain: list, save_interval: int):
    attempts, works, start = [], {}, 0.0
    for n, (a, w) in enumerate(chain, start=1):
        shift = start - a.start
        attempts.append(Attempt(n, a.start + shift, a.end + shift, a.gpus, a.ended))
        works[n] = Work(tuple((t + shift, s) for t, s in w.steps))
        start = a.end + shift + 10
    ledger = compute(attempts, works, save_interval, "test")
    assert ledger.allocated == pytest.approx(ledger.useful + ledger.lost, abs=1e-6)
    assert sum(ledger.lost_to.values()) == pytest.approx(ledger.lost, abs=1e-6)
    assert all(a.thrown_away <= a.trained + 1e-9 and min(a.start_up, a.trained, a.wind_down) >= -1e-9
               for a in ledger.attempts)  # fmt: skip


LOG = """\
[launcher 10:00:01.250] job 77 attempt 1 started 2026-11-24T10:00:01+00:00 on node[1-2]
resumed from checkpoint step 0 (x)
[launcher 10:00:09.000] hung at step 4: no progress for 30 s (limit 20 s); stacks in /s
[launcher 10:00:20.500] no healthy nodes left for the layout: requeueing without node1; the next attempt resumes \
from the latest checkpoint; after a hang (suspected: node1)
[launcher 10:00:20.750] job 77 attempt 1 ended 2026-11-24T10:00:20+00:00, exit code 0
[launcher 10:00:40.000] job 77 attempt 2 started 2026-11-24T10:00:40+00:00 on node2
resumed from checkpoint step 3 (/c/3); rng digest 1
[launcher 10:00:50.000] job 77 attempt 2 ended 2026-11-24T10:00:50+00:00, exit code 0
"""


def test_the_jobs_own_records(tmp_path: Path):
    seen = records.read_log(LOG.splitlines(keepends=True), "77")
    chain = records.attempts(seen, 4, "COMPLETED")
    assert [(a.number, a.ended, a.gpus) for a in chain] == [(1, "hang", 4), (2, "completed", 4)]
    assert chain[0].end - chain[0].start == pytest.approx(19.5)  # to the millisecond of the batch script's stamps
    metrics = tmp_path / "metrics.jsonl"
    rows = [(chain[0].start + 2 + s, s) for s in range(1, 5)] + [(chain[1].start + 3 + s, s) for s in range(4, 8)]
    metrics.write_text("".join(json.dumps({"step": s, "time": t}) + "\n" for t, s in rows))
    works = records.works(seen, metrics, records.spans(chain))
    ledger = compute(chain, works, 1000, "job records")
    assert ledger.steps_thrown_away == 1 and ledger.causes == {"hang": 1}  # step 4, after checkpoint 3
    assert ledger.lost_to["hang"] == pytest.approx(4 * (1.0 + (chain[0].end - rows[3][0]) + 7.0))
    running = records.attempts(records.read_log(LOG.splitlines()[:3], "77"), 4, None, now=chain[0].start + 5)
    assert running[0].ended == "running" and running[0].end == chain[0].start + 5


def test_a_requeue_after_a_node_failure_is_charged_to_it():
    log = (
        "[launcher 10:00:01.250] job 79 attempt 1 started 2026-11-24T10:00:01+00:00 on node[1-2]\n"
        f"[launcher 10:00:09.000] {P.LINES['requeue_without'].format(without=' without node1', why=WHY)}\n"
        "[launcher 10:00:10.000] job 79 attempt 1 ended 2026-11-24T10:00:10+00:00, exit code 0\n"
        "[launcher 10:02:20.000] job 79 attempt 2 started 2026-11-24T10:02:20+00:00 on node[2-3]\n"
        "[launcher 10:03:00.000] job 79 attempt 2 ended 2026-11-24T10:03:00+00:00, exit code 0\n"
    )
    first, _ = records.attempts(records.read_log(log.splitlines(), "79"), 4, "COMPLETED")
    assert first.ended == "node failure"


WHY = "a node failure (node1 left the allocation)"


def _attempt(n: int, minute: int, code: int | None, *between: str) -> str:
    start = P.line("attempt_started", f"10:{minute:02d}:00.000", job=80, attempt=n,
                   when=f"2026-11-24T10:{minute:02d}:00+00:00", nodes="node[1-2]")  # fmt: skip
    inside = "".join(f"[launcher 10:{minute:02d}:30.000] {line}\n" for line in between)
    end = P.line("attempt_ended", f"10:{minute:02d}:50.000", job=80, attempt=n,
                 when=f"2026-11-24T10:{minute:02d}:50+00:00", code=code)  # fmt: skip
    return start + "\n" + inside + (end + "\n" if code is not None else "")


def test_a_requeue_slurm_made_after_an_attempt_that_ended_well_is_found():
    """Slurm 24.11.5: preempted past its grace time (killed, no end line), requeued; the next attempt ends well
    (exit 0, no requeue of the job's own) and Slurm requeues it once more; the third finds the run finished."""
    log = _attempt(1, 0, None, P.LINES["terminated"]) + _attempt(2, 3, 0) + _attempt(3, 6, 0)
    assert records.requeued_unasked(records.read_log(log.splitlines(), "80")) == [2]
    ours = P.LINES["requeue_time_limit"].format(step=7, count=1, most=3)  # the job's own requeue: not Slurm's
    for chain in (_attempt(1, 0, 0, ours) + _attempt(2, 3, 0), _attempt(1, 0, 143, P.LINES["terminated"])
                  + _attempt(2, 3, 0), _attempt(1, 0, 0)):  # fmt: skip
        assert records.requeued_unasked(records.read_log(chain.splitlines(), "80")) == []


RESTARTS = """\
[launcher 10:00:01.250] job 78 attempt 1 started 2026-11-24T10:00:01+00:00 on node[1-3]
resumed from checkpoint step 0 (x)
[launcher 10:00:20.000] restart 1 of 10 in the allocation, leaving out node1: training again on node3 from the \
checkpoint of step 10, after a failure (rank 1 on node1: died of SIGKILL (exit code -9), with no traceback)
resumed from checkpoint step 10 (/c/10); rng digest 1
[launcher 10:00:40.000] restart 2 of 10 in the allocation, leaving out node2: training again on node3 from the \
checkpoint of step 20, after a node failure (node2 left the allocation)
resumed from checkpoint step 20 (/c/20); rng digest 1
[launcher 10:01:00.000] job 78 attempt 1 ended 2026-11-24T10:01:00+00:00, exit code 0
"""


def test_restarts_in_the_allocation_are_node_steps_and_each_ones_cost_is_kept(tmp_path: Path):
    """An attempt that restarted training twice is three node steps: each restart charged with its step's wind-down
    and thrown-away steps and the next step's start-up; the node that left the allocation holds no GPU after."""
    seen = records.read_log(RESTARTS.splitlines(keepends=True), "78")
    chain = records.split(records.attempts(seen, 6, "COMPLETED"), seen, 2)
    assert [(a.number, a.segment, a.ended, a.restarted, a.gpus) for a in chain] == [
        (1, 0, "failure", True, 6), (1, 1, "node failure", True, 6), (1, 2, "completed", False, 4)]  # fmt: skip
    start = chain[0].start
    rows = [(start + 2 + s, s) for s in range(1, 13)]  # step 12 at +14 s; killed; back at 10 (its checkpoint)
    rows += [(start + 22 + s, 10 + s) for s in range(1, 13)]  # steps 11..22; node2 fails after 22
    rows += [(start + 43 + s, 20 + s) for s in range(1, 11)]  # steps 21..30
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "time": t}) + "\n" for t, s in rows))
    ledger = compute(chain, records.works(seen, metrics, records.spans(chain)), 10, "job records")
    assert ledger.restarts == {"failure": 1, "node failure": 1} and ledger.causes == {}
    assert ledger.steps_thrown_away == 4  # 11-12 and 21-22, done twice
    first, second = ledger.restart_costs
    assert first["cause"] == "failure" and first["seconds"] == pytest.approx(9.0)  # step 12 at +14, 11 at +23
    assert first["gpu_seconds"] == pytest.approx(6 * (4.75 + 2 + 4.25)) and second["seconds"] == \
        pytest.approx(10.0)  # fmt: skip
    assert "to 1 failure (restarted in the allocation)" in summary(ledger)
    record = ledger.record()
    assert record["restarts"] == {"failure": 1, "node failure": 1}
    assert [r["failure_to_next_step_s"] for r in record["lost_per_restart"]] == [9.0, 10.0]
    assert ledger.allocated == pytest.approx(6 * 38.75 + 4 * 20)


def test_a_step_logged_just_before_a_restart_is_the_failed_steps(tmp_path: Path):
    """Training that fails fast is restarted within a second of its last step: that step is the failed node
    step's (the restart's line comes after its training ended), not the next one's."""
    seen = records.read_log(RESTARTS.splitlines(keepends=True), "78")
    chain = records.split(records.attempts(seen, 6, "COMPLETED"), seen, 2)
    restart = chain[1].start
    rows = [(restart - 0.9 + s / 10, s) for s in range(1, 9)]  # steps 1-8, the last 0.1 s before the restart
    rows += [(restart + 5 + s, 10 + s) for s in range(1, 5)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "time": t}) + "\n" for t, s in rows))
    works = records.works(seen, metrics, records.spans(chain))
    assert [s for _, s in works[(1, 0)].steps] == list(range(1, 9)) and [s for _, s in works[(1, 1)].steps] == [
        11, 12, 13, 14]  # fmt: skip
    (first, _) = compute(chain, works, 10, "job records").restart_costs
    assert first["seconds"] == pytest.approx(6.1)  # step 8 at restart - 0.1 s, step 11 at restart + 6 s


def test_sacct_lagging_behind_the_controller_is_waited_for_then_left(monkeypatch: pytest.MonkeyPatch):
    """slurmdbd records a job's end after the controller knows it: the ledger waits (bounded) for sacct to agree,
    and where it does not, it is not used (the job's records are). sacct's answers are recorded ones, replayed."""
    from launcher.ledger import usage
    from launcher.slurm import client
    from launcher.slurm.parse import JobState, parse_sacct_records

    running = parse_sacct_records(
        "7|RUNNING|0:0|None|node1|2026-11-24T07:10:16|2026-11-24T07:10:16|Unknown|3|gres/gpu=2"
    )
    ended = parse_sacct_records("7|COMPLETED|0:0|None|node1|2026-11-24T07:10:16|2026-11-24T07:10:16|"
                                "2026-11-24T07:10:30|14|gres/gpu=2")  # fmt: skip
    final = JobState("7", "COMPLETED", "None", 0, 0, 0, "node1")
    answers = [running, running, ended]
    monkeypatch.setattr(client, "accounting_records", lambda job_id: answers.pop(0) if len(answers) > 1 else answers[0])
    monkeypatch.setattr(usage, "LAG_POLL_S", 0.01)
    assert usage._settled("7", final, 0.0) == ended  # waited two answers for the end
    monkeypatch.setattr(client, "accounting_records", lambda job_id: running)
    monkeypatch.setattr(usage, "LAG_S", 0.05)
    assert usage._settled("7", final, 0.0) is None  # still running in sacct: not used, never read as running
    monkeypatch.setattr(client, "accounting_records", lambda job_id: [])
    assert usage._settled("7", final, 0.0) is None  # sacct does not know it yet
    monkeypatch.setattr(client, "accounting_records", lambda job_id: None)
    assert usage._settled("7", final, 0.0) is None  # no accounting
    monkeypatch.setattr(client, "accounting_records", lambda job_id: ended)
    assert usage._settled("7", final, ended[0].submit.timestamp() + 3600) is None  # an older job of the same id


def _bundle_without_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str, ended: dict | None):
    """A submitted bundle whose job's log is `log`, with Slurm's controller unreachable (its client says so, as
    it does when scontrol cannot connect: tests/test_rerun_e2e.py makes it so on the local cluster)."""
    from launcher.bundle import manifest
    from launcher.errors import SlurmUnavailable
    from launcher.ledger import usage

    def unreachable(job_id: str):
        raise SlurmUnavailable("scontrol cannot reach the Slurm controller: Connection refused")

    monkeypatch.setattr(usage.client, "job_state", unreachable)
    monkeypatch.setattr(usage.client, "accounting_records", lambda job_id: pytest.fail("sacct asked"))
    (tmp_path / "job.out").write_text(log)
    data = {"slurm": {"job_id": "77"}, "outputs": {"log": str(tmp_path / "job.out")},
            "created": "2026-11-24T09:00:00+0000",
            "resolved": {"slurm": {"nodes": 2, "gpus_per_node": 2}, "paths": {"save_interval": 1000}}}  # fmt: skip
    if ended is not None:
        data["ended"] = ended
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    return usage, manifest.load(tmp_path)


def test_without_a_controller_the_ledger_is_the_records_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    usage, run = _bundle_without_controller(tmp_path, monkeypatch, LOG, {"state": "COMPLETED", "exit_code": 0})
    final, notes = usage.final_state(run)
    assert final is not None and final.state == "COMPLETED" and "the manifest's record" in notes[1]
    assert "cannot be reached" in notes[0] and "sacct was not asked" in notes[0]
    found = usage.ledger(run)
    assert found is not None and [a.ended for a in found.attempts] == ["hang", "completed"]
    assert "ledger" not in json.loads((tmp_path / "manifest.json").read_text())  # said, not recorded
    said = usage.line(run)
    assert said.endswith(f"(not confirmed: {notes[0]})") and usage.several([("r", tmp_path)], None, "t")[0] == (
        f"  r: {said}"
    )


def test_without_a_controller_or_a_recorded_end_the_log_says_how_it_ended(tmp_path, monkeypatch):
    usage, run = _bundle_without_controller(tmp_path, monkeypatch, LOG, None)
    final, notes = usage.final_state(run)
    assert final is not None and (final.state, final.restarts) == ("COMPLETED", 1) and "read from its log" in notes[1]
    failed = LOG.replace(
        "attempt 2 ended 2026-11-24T10:00:50+00:00, exit code 0",
        "attempt 2 ended 2026-11-24T10:00:50+00:00, exit code 3",
    )
    usage, run = _bundle_without_controller(tmp_path, monkeypatch, failed, None)
    assert usage.final_state(run)[0].state == "FAILED"  # type: ignore[union-attr]
    usage, run = _bundle_without_controller(tmp_path, monkeypatch, "".join(LOG.splitlines(True)[:6]), None)
    final, notes = usage.final_state(run)
    assert final is None and "counted as running until now" in notes[1]


def test_trained_gpu_hours_at_a_step_count_requeues_and_steps_done_twice():
    """`jobs verdict --at gpu_hours`: the GPU-hours trained when the run last reached a step; a preempted attempt's
    thrown-away steps (3, 4: done again after the requeue) are paid for, and the step is the redone one's."""
    attempts = [Attempt(1, 0, 100, 2, "preemption"), Attempt(2, 200, 300, 2, COMPLETED)]
    works = {1: Work(((10, 1), (20, 2), (30, 3), (40, 4)), None, 2), 2: Work(((210, 3), (220, 4), (230, 5)), 2, None)}
    curves = trained_curve(attempts, works)
    assert curves == [[(1, 0.0), (2, 20 / 3600), (3, 40 / 3600), (4, 60 / 3600)],
                      [(3, 60 / 3600), (4, 80 / 3600), (5, 100 / 3600)]]  # fmt: skip
    assert hours_at(curves, 2) == 20 / 3600  # reached once, by the first attempt
    assert hours_at(curves, 4) == 80 / 3600  # reached twice: the second time (its first one was thrown away)
    assert hours_at(curves, 6) is None
    ledger = compute(attempts, works, 2, "job records")
    assert ledger.total("trained") / 3600 == curves[-1][-1][1]  # the last step's hours: the ledger's trained total
