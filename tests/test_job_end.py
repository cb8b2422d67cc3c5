"""The end of a followed job, without Slurm: "Job N ended STATE", then the verdict's lines, and both recorded in
the manifest (launcher/runs/submission.py `report_end`, used by --show_logs, `jobs attach` and `jobs status`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from launcher_helpers import job_log

from launcher import jobs
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.config.cli import parse
from launcher.runs import submission as submit
from launcher.slurm import client, follow
from launcher.slurm.awaited_jobs import NEVER_SATISFIED
from launcher.slurm.parse import JobState


def written_bundle(tmp_path: Path, *flags: str) -> tuple[Path, Path]:
    """A bundle's manifest as a launch writes it (the resolved flags of `flags`), and its job's log path."""
    args, _ = parse(["--run_name", "demo", *flags])
    bundle_dir, log = tmp_path / "logs/configs/demo/20261123-144147", tmp_path / "logs/slurm_logs/demo/x.out"
    bundle_dir.mkdir(parents=True)
    log.parent.mkdir(parents=True)
    data = {
        "resolved": dataclasses.asdict(args),
        "outputs": {"log": str(log), "metrics": str(bundle_dir / "metrics.jsonl")},
        "slurm": {"submitted": True, "job_id": "48"},
    }
    manifest.write_manifest(bundle_dir / "manifest.json", data, new=True)
    return bundle_dir / "manifest.json", log


def failed(code: int = 143, state: str = "FAILED", **more: object) -> JobState:
    return JobState("48", state, "NonZeroExitCode", code, None, 0, "node[1-2]", **more)  # type: ignore[arg-type]


def test_a_failed_job_ends_with_its_verdict_printed_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path, log = written_bundle(tmp_path)
    log.write_text(job_log("exception-2nodes.log"))
    verdict = submit.report_end(failed(), log, manifest.load(path))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Job 48 ended FAILED, exit code 143"
    assert out[1].startswith("  why: rank 3 on node2 raised ValueError: shard 7 of /data/tokenized has 0 samples")
    assert out[2].startswith("       at fail.py:72 in main; exit code 143 is srun stopping the other ranks")
    assert out[3].startswith("  fix: correct what its traceback") and len(out) == 4
    data = json.loads(path.read_text())
    assert data["ended"] == {"state": "FAILED", "exit_code": 143, "restarts": 0, "restarts_in_allocation": 0}
    assert verdict is not None and data["verdict"] == verdict.record()
    assert data["verdict"]["cause"] == "exception" and data["verdict"]["where"] == {"rank": 3, "node": "node2"}
    assert data["slurm"] == {"submitted": True, "job_id": "48"}  # Slurm's side stays as it was


def test_the_oom_fix_names_the_runs_own_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path, log = written_bundle(tmp_path, "--micro_batch_size", "4", "--grad_accum_steps", "8", "--tp", "2")
    log.write_text(job_log("cuda-oom.log"))
    submit.report_end(failed(1), log, manifest.load(path))
    out = capsys.readouterr().out
    assert "  fix: use --micro_batch_size 2 --grad_accum_steps 16 (the same batch)" in out and "--tp 4" in out


def test_a_completed_job_has_no_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path, log = written_bundle(tmp_path)
    log.write_text("step 30/30 | loss 1.0\n")
    assert (
        submit.report_end(dataclasses.replace(failed(0), state="COMPLETED", restarts=1), log, manifest.load(path))
        is None
    )
    assert capsys.readouterr().out == "Job 48 ended COMPLETED, exit code 0 (requeued 1x)\n"
    data = json.loads(path.read_text())
    assert data["verdict"] is None and data["ended"]["state"] == "COMPLETED"


def test_a_requeue_slurm_made_after_an_attempt_that_ended_well_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, log = written_bundle(tmp_path)
    attempt = [P.line("attempt_started", f"10:0{n}:00.000", job=48, attempt=n, when=f"2026-11-24T10:0{n}:00+00:00",
                      nodes="node1") + "\n" + P.line("attempt_ended", f"10:0{n}:30.000", job=48, attempt=n,
                      when=f"2026-11-24T10:0{n}:30+00:00", code=0) + "\n" for n in (1, 2)]  # fmt: skip
    log.write_text("".join(attempt))
    submit.report_end(dataclasses.replace(failed(0), state="COMPLETED", restarts=1), log, manifest.load(path))
    out = capsys.readouterr().out
    assert submit.UNASKED_REQUEUE.format(attempt=1, next=2) in out, out


def test_the_restarts_said_are_the_jobs_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The script submitted again by hand (job 49 after job 48) appends to the bundle's restarts file: each job's
    end says its own restarts; a record from before records named their job is taken as the job's."""
    path, log = written_bundle(tmp_path)
    log.write_text("step 30/30 | loss 1.0\n")
    record = dict(why="failure", action="restart", attempt=1, start=0, end=5, at=7, nodes="node1", failure="-")
    (path.parent / P.RESTARTS_FILE).write_text(P.RESTART_FORMAT_NO_JOB.format(**record) + "\n" + "".join(
        P.RESTART_FORMAT.format(**record, job=job) + "\n" for job in ("48", "48", "49")))  # fmt: skip
    done = dataclasses.replace(failed(0), state="COMPLETED")
    submit.report_end(dataclasses.replace(done, job_id="49"), log, manifest.load(path))
    assert capsys.readouterr().out == "Job 49 ended COMPLETED, exit code 0 (restarted 1x in its allocation)\n"
    assert json.loads(path.read_text())["ended"]["restarts_in_allocation"] == 1
    submit.report_end(done, log, manifest.load(path))
    assert "(restarted 3x in its allocation)" in capsys.readouterr().out
    assert len(submit.restarts_of(manifest.load(path), None)) == 3  # the run's job (the manifest's: 48)


def test_without_a_bundle_or_a_log_the_verdict_is_still_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    state = JobState("49", "CANCELLED", NEVER_SATISFIED, 0, None, 0, "", "afterok:48(failed)")
    submit.report_end(state, tmp_path / "never-written.out", None)
    out = capsys.readouterr().out
    assert "Job 49 ended CANCELLED" in out
    assert "it never started: its dependency can no longer be met (afterok:48(failed))" in out


def test_follow_to_end_reports_the_end(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch):
    path, log = written_bundle(tmp_path)
    log.write_text(job_log("nccl-timeout.log"))
    monkeypatch.setattr(follow, "follow", lambda job_id, log: failed(134))  # the job has ended
    assert submit.follow_to_end("48", log, "target", manifest.load(path)) == 1
    assert "why: rank 1 on node1: NCCL collective ALLREDUCE (SeqNum 1207) timed out" in capsys.readouterr().out
    assert json.loads(path.read_text())["verdict"]["cause"] == "nccl"


def test_jobs_status_of_an_ended_job_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch):
    path, log = written_bundle(tmp_path)
    log.write_text(job_log("user-error.log"))
    monkeypatch.setattr(client, "job_state", lambda job_id: failed(2))
    assert jobs.main(["status", str(path.parent)]) == 0
    out = capsys.readouterr().out
    assert "Job 48 ended FAILED, exit code 2" in out and "why: the job refused its data or config" in out
    assert f"  log: {log}" in out and json.loads(path.read_text())["verdict"]["cause"] == "bad_input"
    monkeypatch.setattr(client, "job_state", lambda job_id: dataclasses.replace(failed(0), state="RUNNING"))
    assert jobs.main(["status", str(path.parent)]) == 0
    assert capsys.readouterr().out.startswith("job 48 RUNNING on node[1-2]\n")
