"""`python -m launcher.jobs evaluate` before the queue, on a run's dry-run bundle (no cluster): every problem at once,
each naming its flag (a task the job's lm-eval does not know, a step not on disk with the steps that are), a bundle
of an earlier launcher refused with the reason, nothing submitted nor recorded. Its submissions on the local
cluster: tests/test_verdict_slurm.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher import protocol as P
from launcher.bundle import manifest
from launcher.jobs.command import main
from launcher.runs import launch


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, demo_data) -> Path:
    where = tmp_path_factory.mktemp("evaluate")
    cwd = os.getcwd()
    os.chdir(where)
    try:
        argv = ["--run_name", "kept", "--nodes", "1", "--gpus_per_node", "1", "--engine", "torch", "--dataset",
                str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--train_steps", "5",
                "--wandb_disabled", "--dry_run"]  # fmt: skip
        return launch.prepare(argv).paths.bundle_dir
    finally:
        os.chdir(cwd)


def evaluate(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["evaluate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_problem_is_said_at_once_and_nothing_is_submitted(bundle: Path, capsys):
    run = manifest.load(bundle)
    code, out, err = evaluate(capsys, str(bundle), "--eval_tasks", "no_such_task_x", "--steps", "3,5",
                              "--eval_limit", "0")  # fmt: skip
    assert code == 2 and "Traceback" not in err and out == "", err
    assert f"--steps: step(s) 3, 5 not on disk in {run.checkpoints} (complete checkpoints there: none)" in err
    assert "--eval_limit: must be positive, got 0" in err
    assert not (run.checkpoints / ".evals").exists()
    code, _, err = evaluate(capsys, str(bundle), "--eval_tasks", "no_such_task_x", "--steps", "x")
    assert code == 2 and "--steps: 'x' is not all or step numbers" in err


def test_a_task_the_jobs_lm_eval_does_not_know_is_named(bundle: Path, capsys):
    code, _, err = evaluate(capsys, str(bundle), "--eval_tasks", "no_such_task_x")
    assert code == 2 and "'no_such_task_x' is not a task, group, tag or preset" in err
    assert "holds no complete checkpoint" in err


def test_a_bundle_of_an_earlier_launcher_is_refused_with_the_reason(bundle: Path, tmp_path: Path, capsys):
    job = bundle / P.JOB_FILE
    kept = job.read_text()
    try:
        job.write_text(json.dumps({**json.loads(kept), "version": 1}))
        code, _, err = evaluate(capsys, str(bundle), "--eval_tasks", "hellaswag")
    finally:
        job.write_text(kept)
    assert code == 2 and "was written by an earlier launcher" in err and "format 1" in err
    assert "it has no eval job to submit" in err
