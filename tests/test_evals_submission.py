"""The submitter's side of --eval_tasks (launcher/evals/submit.py, record.py): which steps are evaluated, the
submission record that makes each step's eval job one across restarts, requeues, launches and `jobs evaluate` (a
kill between the claim and sbatch's answer included), sbatch's refusal recorded and said, never raised, an eval job
Slurm says ended without a result recorded lost, and the steps still owed an eval. Slurm here is a recorder of the
commands asked; the real submissions are tests/test_evals_slurm.py's, on the local cluster."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.evals import record
from launcher.evals.settings import EvalSettings
from launcher.evals.submit import Evals, submit
from launcher.node import job as job_file
from launcher.node.job import Job


def job_of(tmp_path: Path, every: int = 10, last: int = 25) -> Job:
    evals = EvalSettings(("mc", "ppl"), said="mc, ppl", every=every)
    return Job("r", tmp_path / "bundle", tmp_path / "r.out", tmp_path / "ckpt", Path("/usr/bin/python3"), tmp_path,
               tmp_path / "train.py", tmp_path / "config.yaml", "auto", 1, 1, tmp_path, train_steps=last,
               evals=evals)  # fmt: skip


class Slurm:
    """Answers sbatch with the next job id (or a refusal, or no answer), squeue with the jobs of a name and the
    jobs alive; records the asks and the lines said."""

    def __init__(self, refuse: str = "", named: list[str] | None = None, hang: bool = False) -> None:
        self.asked: list[list[str]] = []
        self.said: list[tuple[str, dict]] = []
        self.refuse, self.named, self.hang, self.next_id = refuse, named, hang, 100
        self.alive: dict[str, bool | None] = {}

    def say(self, name: str, **fields: object) -> None:
        self.said.append((name, fields))

    def sbatch(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.asked.append(list(argv))
        if self.hang:
            return subprocess.CompletedProcess(list(argv), 124, "", "sbatch did not answer in 120 s")
        if self.refuse:
            return subprocess.CompletedProcess(list(argv), 1, "", self.refuse)
        self.next_id += 1
        self.alive[str(self.next_id)] = True
        return subprocess.CompletedProcess(list(argv), 0, f"{self.next_id}\n", "")

    def jobs_named(self, name: str) -> list[str] | None:
        self.asked.append(["squeue", f"--name={name}"])
        return None if self.named is None else list(self.named)

    def jobs_alive(self, jobs: Iterable[str]) -> dict[str, bool | None]:
        wanted = list(jobs)
        self.asked.append(["squeue", "-j", ",".join(sorted(wanted))])
        return {j: self.alive.get(j, False) for j in wanted}

    @property
    def sbatches(self) -> list[list[str]]:
        return [a for a in self.asked if a[0] == "sbatch"]


def save(root: Path, step: int) -> None:
    """A complete torch-engine checkpoint of `step`, and the pointer to it."""
    (root / str(step)).mkdir(parents=True)
    (root / str(step) / ckpt.TORCH_STATE).write_bytes(b"x")
    (root / str(step) / ckpt.TORCH_META).write_text("{}")
    (root / P.TORCH_POINTER).write_text(f"{step}\n")


def test_the_evaluated_steps_are_the_multiples_and_the_last(tmp_path: Path):
    job = job_of(tmp_path, every=10, last=25)
    assert [step for step in range(0, 40) if job.evaluated(step)] == [10, 20, 25, 30]
    only_last = job_of(tmp_path, every=0, last=25)
    assert [step for step in range(0, 40) if only_last.evaluated(step)] == [25]
    assert not dataclasses.replace(job, evals=None).evaluated(10)


def test_the_settings_go_through_job_json_whole_and_say_once_what_the_job_says(tmp_path: Path):
    job = job_of(tmp_path)
    again = job_file.from_json(job.to_json())
    assert again == job and again.evals is not None and again.evals.key == job.evals.key  # type: ignore[union-attr]
    written = json.loads(job.to_json())["evals"]
    assert not {"bundle", "checkpoints", "run_name", "train_steps", "last_step", "script", "log"} & set(written)
    with pytest.raises(ValueError, match="unknown eval settings bundle"):
        EvalSettings.from_dict({**written, "bundle": "/b"})
    other = EvalSettings(("mc",), every=10)
    assert other.key != job.evals.key and EvalSettings(("mc",), every=20).key == other.key  # type: ignore[union-attr]
    assert job.eval_name(10) == "r-eval-10" and job.eval_log(10) == tmp_path / "r.eval-10.out"


def test_each_evaluated_step_is_submitted_once_across_supervisors(tmp_path: Path):
    job, slurm = job_of(tmp_path), Slurm()
    key = job.evals.key  # type: ignore[union-attr]
    for step in (5, 10):
        save(job.checkpoints, step)
    first = Evals(job, "7", slurm)
    first.on_checkpoint()
    assert [a[-2] for a in slurm.sbatches] == ["10"]  # 5 is not a multiple of 10
    argv = slurm.sbatches[0]
    assert argv[:4] == ["sbatch", "--parsable", "--job-name=r-eval-10", f"--output={tmp_path}/r.eval-10.out"]
    assert argv[4:] == [str(job.file(P.EVAL_SCRIPT)), "10", key]
    assert slurm.said == [("eval_submitted", {"step": 10, "eval_job": "101", "tasks": "mc, ppl",
                                              "log": tmp_path / "r.eval-10.out"})]  # fmt: skip
    sub = record.submission(job.checkpoints, 10, key)
    assert sub is not None and sub["state"] == "submitted" and sub["job"] == "101" and sub["by"] == "7"
    assert EvalSettings.from_dict(sub["settings"]) == job.evals  # what the eval job scores by
    first.on_checkpoint()  # the attempt's end: nothing new
    Evals(job, "8", slurm).on_checkpoint()  # a requeue, a restart, a second launch: the record says it is done
    assert len(slurm.sbatches) == 1
    save(job.checkpoints, 20)
    save(job.checkpoints, 25)
    Evals(job, "8", slurm).on_checkpoint()
    assert [a[-2] for a in slurm.sbatches] == ["10", "20", "25"]
    other = EvalSettings(("hellaswag",))  # `jobs evaluate` of step 10 on other tasks: a submission of its own
    assert submit(job, other, 10, "jobs evaluate", slurm).new and len(slurm.sbatches) == 4
    assert not submit(job, other, 10, "jobs evaluate", slurm).new and len(slurm.sbatches) == 4


def test_a_kill_between_the_claim_and_the_record_asks_slurm_for_the_job_first(tmp_path: Path):
    job = job_of(tmp_path)
    key, root = job.evals.key, job.checkpoints  # type: ignore[union-attr]
    save(root, 10)
    assert record.claim(root, 10, key, by="7", bundle=str(job.bundle))  # then killed, sbatch answered or not
    slurm = Slurm(named=["55"])  # Slurm knows a job of the step's name: it is the step's
    Evals(job, "8", slurm).on_checkpoint()
    assert slurm.sbatches == [] and record.submission(root, 10, key)["job"] == "55"  # type: ignore[index]
    assert record.claim(root, 20, key, by="7", bundle=str(job.bundle))
    save(root, 20)
    record.write_result(job.bundle, 20, key, {"state": "done", "job": "56", "tasks": {}})  # it ran: Slurm forgot it
    slurm = Slurm(named=[])
    Evals(job, "8", slurm).on_checkpoint()
    assert slurm.sbatches == [] and record.submission(root, 20, key)["job"] == "56"  # type: ignore[index]
    assert record.claim(root, 30, key, by="7", bundle=str(job.bundle))
    save(root, 30)
    Evals(job, "8", slurm).on_checkpoint()  # none of the name, no result: sbatch never ran; submitted now
    assert [a[-2] for a in slurm.sbatches] == ["30"] and record.submission(root, 30, key)["state"] == "submitted"  # type: ignore[index]
    assert record.claim(root, 40, key, by="7", bundle=str(job.bundle))
    save(root, 40)
    slurm = Slurm(named=None)  # squeue does not answer: nothing now, asked again at the next look
    unsure = Evals(job, "8", slurm)
    done = next(d for d in unsure.on_checkpoint() if d.step == 40)
    assert done.retry and slurm.sbatches == [] and record.submission(root, 40, key)["state"] == "submitting"  # type: ignore[index]
    slurm.named = []
    unsure.on_checkpoint()
    assert [a[-2] for a in slurm.sbatches] == ["40"]


def test_a_refusal_is_recorded_and_said_never_raised(tmp_path: Path):
    job = job_of(tmp_path)
    save(job.checkpoints, 10)
    slurm = Slurm(refuse="sbatch: error: invalid partition specified: cpu")
    Evals(job, "7", slurm).on_checkpoint()
    sub = record.submission(job.checkpoints, 10, job.evals.key)  # type: ignore[union-attr]
    assert sub is not None and sub["state"] == "refused" and "invalid partition specified: cpu" in sub["cause"]
    assert slurm.said[0][0] == "eval_not_submitted" and "invalid partition" in slurm.said[0][1]["why"]
    Evals(job, "8", slurm).on_checkpoint()  # recorded with its cause: not asked again
    assert len(slurm.sbatches) == 1
    assert record.owed(job.checkpoints, [10], job.evaluated) == {}  # settled: the step is no longer owed


def test_sbatch_that_does_not_answer_leaves_a_claim_that_the_next_look_settles(tmp_path: Path):
    job = job_of(tmp_path)
    save(job.checkpoints, 10)
    slurm = Slurm(hang=True, named=[])
    evals = Evals(job, "7", slurm)
    (done,) = evals.on_checkpoint()
    assert done.retry and record.submission(job.checkpoints, 10, job.evals.key)["state"] == "submitting"  # type: ignore[union-attr,index]
    slurm.hang = False
    evals.on_checkpoint()
    assert record.submission(job.checkpoints, 10, job.evals.key)["state"] == "submitted"  # type: ignore[union-attr,index]


def test_a_step_is_owed_its_eval_from_its_save_until_its_eval_settles(tmp_path: Path):
    """The rule retention judges by (launcher/retention/rules.py): owed where --eval_every names the step and it is
    not submitted yet, where its eval job is queued or runs, where it was interrupted; not once done, failed,
    refused or lost."""
    job, slurm = job_of(tmp_path), Slurm()
    key, root = job.evals.key, job.checkpoints  # type: ignore[union-attr]
    for step in (5, 10, 20):
        save(root, step)
    owed = record.owed(root, [5, 10, 20], job.evaluated)
    assert set(owed) == {10, 20} and "not submitted yet" in owed[10]
    Evals(job, "7", slurm).on_checkpoint()
    assert set(record.owed(root, [5, 10, 20], job.evaluated)) == {10, 20}  # queued
    record.write_result(job.bundle, 10, key, {"state": "running", "job": "101"})
    record.write_result(job.bundle, 20, key, {"state": "interrupted", "job": "102"})
    owed = record.owed(root, [5, 10, 20], job.evaluated)
    assert owed == {10: "eval job 101 running", 20: "eval job 102 interrupted"}
    record.write_result(job.bundle, 10, key, {"state": "done", "job": "101", "tasks": {"mc": {"acc": 0.5}}})
    assert set(record.owed(root, [5, 10, 20], job.evaluated)) == {20}
    slurm.alive["102"] = False  # Slurm says 102 ended, and its result says interrupted: lost
    Evals(job, "7", slurm).on_checkpoint()
    assert record.owed(root, [5, 10, 20], job.evaluated) == {}
    assert slurm.said[-1][0] == "eval_lost" and slurm.said[-1][1]["step"] == 20
    found = record.of_run(job.bundle, root)
    assert (
        set(found.done) == {10} and set(found.failed) == {20} and "ended while interrupted" in found.failed[20]["cause"]
    )


def test_the_submissions_are_files_per_step_and_key_under_the_checkpoints(tmp_path: Path):
    root = tmp_path / "ckpt"
    record.note_submission(root, 40, "abc", state="submitted", job="9")
    (ckpt.evals_dir(root) / "41-abc.json").write_text("{cut sh")  # a record cut short reads as a claim
    found = record.submissions(root)
    assert found[(40, "abc")]["state"] == "submitted" and found[(41, "abc")]["state"] == "submitting"
    assert json.loads(ckpt.eval_submission(root, 40, "abc").read_text())["job"] == "9"
    assert ckpt.complete_steps(root) == {}  # not a step's folder


def test_again_submits_anew_a_step_whose_eval_failed_and_once_only(tmp_path: Path):
    """`jobs evaluate --again`: a failed (or refused, or lost) eval is submitted anew, once: the new claim is newer
    than the failed result, so a second --again before the new job writes submits nothing; a done eval never."""
    job, slurm = job_of(tmp_path), Slurm()
    settings = EvalSettings(("mc",), said="mc")
    first = submit(job, settings, 10, "jobs evaluate", slurm)
    assert first.new and first.job == "101"
    assert not submit(job, settings, 10, "jobs evaluate", slurm, again=True).new  # not failed: nothing
    record.write_result(job.bundle, 10, settings.key, {"state": "failed", "cause": "boom", "ended": 2e9})
    again = submit(job, settings, 10, "jobs evaluate", slurm, again=True)
    assert again.new and again.job == "102" and len(slurm.sbatches) == 2
    sub = record.submission(job.checkpoints, 10, settings.key)
    assert sub is not None and sub["state"] == "submitted" and sub["job"] == "102" and sub["again"] is True
    record.write_result(job.bundle, 10, settings.key, {"state": "failed", "cause": "old", "ended": 1.0})
    assert not submit(job, settings, 10, "jobs evaluate", slurm, again=True).new  # a result older than the claim
    record.write_result(job.bundle, 10, settings.key, {"state": "done", "ended": 3e9})
    assert not submit(job, settings, 10, "jobs evaluate", slurm, again=True).new
    assert len(slurm.sbatches) == 2
