"""The supervisor's side of --eval_tasks (launcher/evals/submit.py): which steps are evaluated, the record by step that
makes each step's eval job one across restarts, requeues and launches (a kill between the claim and sbatch's answer
included), sbatch's refusal recorded and said, never raised. Slurm here is a recorder of the commands asked; the
real submissions are tests/test_evals_slurm.py's, on the local cluster."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from launcher import checkpoint_layout as layout
from launcher import protocol as P
from launcher.evals import record as records_of_evals
from launcher.evals.settings import EvalSettings
from launcher.evals.submit import Evals


def settings(tmp_path: Path, every: int = 10, last: int = 25) -> EvalSettings:
    return EvalSettings(script=str(tmp_path / "eval.sbatch"), bundle=str(tmp_path / "bundle"),
                        checkpoints=str(tmp_path / "ckpt"), run_name="r", log=str(tmp_path / "r.eval-{step}.out"),
                        every=every, last_step=last, tasks="mc, ppl")  # fmt: skip


class Slurm:
    """Answers sbatch with the next job id (or a refusal) and squeue with the jobs of a name; records the asks."""

    def __init__(self, refuse: str = "", named: list[str] | None = None) -> None:
        self.asked: list[list[str]] = []
        self.refuse, self.named, self.next_id = refuse, named, 100

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.asked.append(argv)
        assert "SLURM_JOB_ID" not in (kwargs.get("env") or {})  # the training job's own variables stay out
        if argv[0] == "squeue":
            if self.named is None:
                return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Unable to contact")
            return subprocess.CompletedProcess(argv, 0, "".join(f"{j}\n" for j in self.named), "")
        if self.refuse:
            return subprocess.CompletedProcess(argv, 1, "", self.refuse)
        self.next_id += 1
        return subprocess.CompletedProcess(argv, 0, f"{self.next_id}\n", "")

    @property
    def sbatches(self) -> list[list[str]]:
        return [a for a in self.asked if a[0] == "sbatch"]


def save(root: Path, step: int) -> None:
    """A complete torch-engine checkpoint of `step`, and the pointer to it."""
    (root / str(step)).mkdir(parents=True)
    (root / str(step) / layout.TORCH_STATE).write_bytes(b"x")
    (root / str(step) / layout.TORCH_META).write_text("{}")
    (root / P.TORCH_POINTER).write_text(f"{step}\n")


def test_the_evaluated_steps_are_the_multiples_and_the_last(tmp_path: Path):
    s = settings(tmp_path, every=10, last=25)
    assert [step for step in range(0, 40) if s.evaluated(step)] == [10, 20, 25, 30]
    only_last = settings(tmp_path, every=0, last=25)
    assert [step for step in range(0, 40) if only_last.evaluated(step)] == [25]


def test_the_settings_go_through_json_whole(tmp_path: Path):
    s = settings(tmp_path)
    assert EvalSettings.from_json(s.to_json()) == s
    with pytest.raises(ValueError, match="lack every"):
        EvalSettings.from_dict({k: v for k, v in s.to_dict().items() if k != "every"})


def test_each_evaluated_step_is_submitted_once_across_supervisors(tmp_path: Path):
    s, slurm, said = settings(tmp_path), Slurm(), []
    root = Path(s.checkpoints)
    for step in (5, 10):
        save(root, step)
    first = Evals(s, "7", say=lambda name, **f: said.append((name, f)), run=slurm)
    first.on_checkpoint()
    assert [a[-1] for a in slurm.sbatches] == ["10"]  # 5 is not a multiple of 10
    argv = slurm.sbatches[0]
    assert argv[:4] == ["sbatch", "--parsable", "--job-name=r-eval-10", f"--output={tmp_path}/r.eval-10.out"]
    assert argv[4:] == [s.script, "10"]
    assert said == [("eval_submitted", {"step": 10, "eval_job": "101", "tasks": "mc, ppl",
                                        "log": f"{tmp_path}/r.eval-10.out"})]  # fmt: skip
    record = records_of_evals.read_record(root, 10)
    assert record is not None and record["state"] == "submitted" and record["job"] == "101" and record["by"] == "7"
    (lease,) = layout.leases(root)  # the step held for its eval job (retention leaves it), no longer for job 7
    assert (lease.step, lease.reader, lease.job) == (10, "eval", "101")
    first.on_checkpoint()  # the attempt's end: nothing new
    Evals(s, "8", run=slurm).on_checkpoint()  # a requeue, a restart, a second launch: the record says it is done
    assert len(slurm.sbatches) == 1
    save(root, 20)
    save(root, 25)
    Evals(s, "8", run=slurm).on_checkpoint(25)
    assert [a[-1] for a in slurm.sbatches] == ["10", "20", "25"]


def test_a_kill_between_the_claim_and_the_record_asks_slurm_for_the_job_first(tmp_path: Path):
    s = settings(tmp_path)
    root = Path(s.checkpoints)
    save(root, 10)
    assert records_of_evals.claim(
        root, 10, by="7"
    )  # sbatch then ran (or not), and the supervisor was killed before the record
    slurm = Slurm(named=["55"])  # Slurm knows a job of the step's name: it is the step's
    Evals(s, "8", run=slurm).on_checkpoint()
    assert slurm.sbatches == [] and records_of_evals.read_record(root, 10)["job"] == "55"
    assert records_of_evals.claim(root, 20, by="7")
    save(root, 20)
    slurm = Slurm(named=[])  # none: sbatch never ran; submitted now
    Evals(s, "8", run=slurm).on_checkpoint()
    assert [a[-1] for a in slurm.sbatches] == ["20"] and records_of_evals.read_record(root, 20)["state"] == "submitted"
    assert records_of_evals.claim(root, 30, by="7")
    save(root, 30)
    slurm = Slurm(named=None)  # squeue does not answer: nothing now, asked again at the next look
    unsure = Evals(s, "8", run=slurm)
    done = next(d for d in unsure.on_checkpoint() if d.step == 30)
    assert done.retry and slurm.sbatches == [] and records_of_evals.read_record(root, 30)["state"] == "submitting"
    slurm.named = []
    unsure.on_checkpoint()
    assert [a[-1] for a in slurm.sbatches] == ["30"]


def test_a_refusal_is_recorded_and_said_never_raised(tmp_path: Path):
    s, said = settings(tmp_path), []
    root = Path(s.checkpoints)
    save(root, 10)
    slurm = Slurm(refuse="sbatch: error: invalid partition specified: cpu")
    Evals(s, "7", say=lambda name, **f: said.append((name, f)), run=slurm).on_checkpoint()
    record = records_of_evals.read_record(root, 10)
    assert record["state"] == "refused" and "invalid partition specified: cpu" in record["cause"]
    assert layout.leases(root) == []  # nothing held for a job that will not run
    assert said[0][0] == "eval_not_submitted" and "invalid partition" in said[0][1]["why"]
    Evals(s, "8", run=slurm).on_checkpoint()  # recorded with its cause: not asked again
    assert len(slurm.sbatches) == 1


def test_sbatch_that_does_not_answer_leaves_a_claim_that_the_next_look_settles(tmp_path: Path):
    s = settings(tmp_path)
    root = Path(s.checkpoints)
    save(root, 10)

    def hangs(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        raise subprocess.TimeoutExpired(argv, 1)

    (done,) = Evals(s, "7", run=hangs).on_checkpoint()
    assert done.retry and records_of_evals.read_record(root, 10)["state"] == "submitting"


def test_the_job_settings_carry_the_eval_settings(tmp_path: Path):
    """job.json holds --eval_tasks' settings (the supervisor's Evals is made from them), or none."""
    from launcher.node import job as job_file

    s = settings(tmp_path)
    base = job_file.Job("t", tmp_path, tmp_path / "log", tmp_path / "ck", Path("/usr/bin/python3"), tmp_path,
                        tmp_path / "train.py", tmp_path / "config.yaml", "auto", 1, 1, tmp_path)  # fmt: skip
    assert job_file.from_json(base.to_json()).evals is None
    with_evals = job_file.from_json(dataclasses.replace(base, evals=s).to_json())
    assert with_evals.evals == s and with_evals.evals.evaluated(s.last_step)


def test_the_record_is_a_file_per_step_under_the_checkpoints(tmp_path: Path):
    root = tmp_path / "ckpt"
    records_of_evals.write_record(root, 40, state="done", job="9")
    (root / P.EVALS_SUBMITTED / "41.json").write_text("{cut sh")  # a record cut short reads as a claim
    found = records_of_evals.records(root)
    assert found[40]["state"] == "done" and found[41]["state"] == "submitting"
    assert json.loads((root / P.EVALS_SUBMITTED / "40.json").read_text())["job"] == "9"
    assert layout.complete_steps(root) == {}  # not a step's folder
