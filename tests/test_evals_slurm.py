"""--eval_tasks on the local cluster, offline, on CPU: the job's supervisor submits one eval job per evaluated step,
beside training; each step's scores are what `lm_eval` gives by hand on `jobs export` of that step; preempted in the
middle, every evaluated step is evaluated once; a failing eval job is recorded with its cause and the run still ends
COMPLETED; a sweep of two points is ranked by an eval score; nanotron main's trainer with 8 ranks is evaluated as
the torch engine is. Two tasks of the test's own over local JSONL: a multiple-choice task and a perplexity task."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import test_nanotron_slurm
from cluster_runs import bundles, finish, launch, paced, submitted_job_id, wait_for
from test_evals_job import TASKS, by_hand, write_tasks
from test_preemption import last_logged_step

from launcher import checkpoint_layout as ckpt
from launcher import jsonl
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.evals import record as eval_record
from launcher.node import job as job_file

pytestmark = pytest.mark.slurm
four_slots = test_nanotron_slurm.four_slots  # its fixture: a cluster of 2 nodes x 4 slots (the 8-rank run's)


def eval_flags(tmp_path: Path, every: int) -> tuple[str, ...]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return ("--eval_tasks", ",".join(TASKS), "--eval_include", str(write_tasks(tmp_path)), "--eval_every", str(every))


def rows(bundle: Path) -> dict[int, dict]:
    """step -> the result the eval job wrote into the bundle (the run's one set of tasks)."""
    return {step: row for (step, _), row in eval_record.results(bundle).items()}


def settled(run: manifest.Manifest, steps: list[int], timeout: float = 600) -> dict[int, dict]:
    """Each step's result once its eval job has ended (done or failed)."""

    def ended() -> dict[int, dict] | None:
        found = rows(run.bundle_dir)
        return found if all(found.get(s, {}).get("state") in ("done", "failed") for s in steps) else None

    return wait_for(ended, timeout=timeout, every=2)


def submitted_steps(run: manifest.Manifest) -> set[int]:
    return {step for step, _ in eval_record.submissions(run.checkpoints)}


def submitted_lines(log: str) -> dict[int, list[str]]:
    """step -> the eval jobs the supervisor's log says it submitted for it."""
    found: dict[int, list[str]] = {}
    for step, job in re.findall(r"\] step (\d+) is evaluated by job (\d+) ", log):
        found.setdefault(int(step), []).append(job)
    return found


def eval_jobs_in_slurm(env: dict, run_name: str, since_job: str) -> dict[int, set[str]]:
    """step -> the jobs of the step's eval-job name Slurm ran from job `since_job` on (its job-completion log: every
    job that ended, a requeued one at each of its ends)."""
    conf = Path(env["SLURM_CONF"])
    text = (conf.parent.parent / "log" / "jobcomp.log").read_text(encoding="utf-8", errors="replace")
    found: dict[int, set[str]] = {}
    for job, step in re.findall(rf"^JobId=(\d+) .*?Name={re.escape(run_name)}-eval-(\d+) ", text, flags=re.M):
        if int(job) >= int(since_job):
            found.setdefault(int(step), set()).add(job)
    return found


def jobs_command(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher.jobs", *args], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_run_evaluated_every_10_steps_gets_each_steps_scores_as_lm_eval_gives_them_by_hand(
    tmp_path: Path, slurm_env: dict, demo_data
):
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "evald", "--train_steps", "20",
                              *eval_flags(tmp_path, 10), nodes="1"), timeout=600)  # fmt: skip
    assert code == 0 and "ended COMPLETED" in out, out
    assert "  evals        lm-eval on evals_mc, evals_ppl: every 10 steps and the last (2 evals)" in out
    assert "Evals of evald (lm-eval: evals_mc, evals_ppl)" in out  # --show_logs' end: the table so far
    (bundle,) = bundles(tmp_path, "evald")
    run = manifest.load(bundle)
    records = settled(run, [10, 20])
    assert sorted(records) == [10, 20] and all(r["state"] == "done" for r in records.values()), records
    log = run.log.read_text()
    assert {s: len(jobs) for s, jobs in submitted_lines(log).items()} == {10: 1, 20: 1}
    assert {s: records[s]["job"] for s in (10, 20)} == {s: j[0] for s, j in submitted_lines(log).items()}
    found = rows(bundle)
    assert sorted(found) == [10, 20] and found[20]["tokens"] == 2 * found[10]["tokens"] > 0
    hand = by_hand(run, tmp_path / "tasks", tmp_path, step=20)
    for task, metrics in found[20]["tasks"].items():
        for metric, value in metrics.items():
            assert math.isclose(value, hand[task][f"{metric},none"], rel_tol=1e-9), (task, metric)
    eval_log = job_file.load(bundle).eval_log(20).read_text()
    assert f"eval: job {records[20]['job']}" in eval_log and "[hf on cpu" in eval_log
    shown = jobs_command(slurm_env, "evals", str(bundle))
    assert [line.split()[:2] for line in shown.splitlines()[2:4]] == [["10", f"{found[10]['tokens']:,}"],
                                                                        ["20", f"{found[20]['tokens']:,}"]]  # fmt: skip
    assert (bundle / "evals.png").is_file()
    status = jobs_command(slurm_env, "status", str(bundle))
    assert "GPU-hours in 2 eval job(s) on CPUs" in status and "apart" in status


def test_preempted_in_the_middle_every_evaluated_step_is_evaluated_once(tmp_path: Path, slurm_env: dict, demo_data):
    """Paced to 0.3 s a step, 40 steps on both nodes' GPUs, evaluated every 10: a job in `urgent` preempts the run
    after step 10's eval job was submitted; the run requeues, resumes and ends; steps 10, 20, 30, 40 each get one
    eval job (the supervisor's log, the records, Slurm's own record of the jobs it ran) and one result."""
    flags = ("--train_steps", "40", "--run_train_script", paced(tmp_path, 0.3), *eval_flags(tmp_path, 10))
    proc = launch(tmp_path, slurm_env, demo_data, "evpre", *flags)
    (bundle,) = wait_for(lambda: bundles(tmp_path, "evpre") if (tmp_path / "logs/configs/evpre").exists() else [],
                         timeout=60)  # fmt: skip
    job = wait_for(lambda: submitted_job_id(bundle), timeout=60)
    run = manifest.load(bundle)
    wait_for(lambda: 10 in submitted_steps(run) and last_logged_step(bundle) >= 14, timeout=300)
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "2",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 3"]  # fmt: skip
    subprocess.run(urgent, env=slurm_env, capture_output=True, text=True, check=True)
    code, out = finish(proc, timeout=900)
    log = run.log.read_text()
    assert code == 0 and "requeued 1x" in out and "attempt 2 started" in log, out + log[-4000:]
    records = settled(run, [10, 20, 30, 40])
    assert {s: r["state"] for s, r in records.items()} == {10: "done", 20: "done", 30: "done", 40: "done"}
    said = submitted_lines(log)
    assert {s: len(jobs) for s, jobs in said.items()} == {10: 1, 20: 1, 30: 1, 40: 1}, said
    ran = wait_for(lambda: (r := eval_jobs_in_slurm(slurm_env, "evpre", job)) and len(r) == 4 and r, timeout=60)
    assert {s: len(jobs) for s, jobs in ran.items()} == {10: 1, 20: 1, 30: 1, 40: 1}, ran
    assert {s: {r["job"]} for s, r in records.items()} == ran
    assert sorted(s for s, r in rows(bundle).items() if r["state"] == "done") == [10, 20, 30, 40]
    assert len(eval_record.submissions(run.checkpoints)) == 4  # one submission a step


def test_a_failing_eval_job_is_recorded_with_its_cause_and_the_run_ends_completed(
    tmp_path: Path, slurm_env: dict, demo_data
):
    flags = ("--train_steps", "10", "--run_train_script", paced(tmp_path, 0.3), *eval_flags(tmp_path, 10))
    proc = launch(tmp_path, slurm_env, demo_data, "evfail", *flags, nodes="1")
    (bundle,) = wait_for(lambda: bundles(tmp_path, "evfail") if (tmp_path / "logs/configs/evfail").exists() else [],
                         timeout=60)  # fmt: skip
    wait_for(lambda: submitted_job_id(bundle), timeout=60)
    (tmp_path / "tasks" / "ppl.jsonl").unlink()  # the perplexity task's data, gone once the run is queued
    code, out = finish(proc, timeout=600)
    assert code == 0 and "ended COMPLETED" in out, out
    run = manifest.load(bundle)
    record = settled(run, [10])[10]
    assert record["state"] == "failed" and "ppl.jsonl" in record["cause"], record
    shown = jobs_command(slurm_env, "evals", str(bundle))
    assert f"step 10: failed (job {record['job']}): " in shown and "ppl.jsonl" in shown
    assert (run.checkpoints / "10").is_dir() and not list((run.checkpoints / ".leases").iterdir())


def test_a_sweep_of_two_points_is_ranked_by_an_eval_score(tmp_path: Path, slurm_env: dict, demo_data):
    flags = ("--train_steps", "10", "--sweep", "learning_rate=3e-3,3e-4", "--rank_by", "evals_mc:acc",
             *eval_flags(tmp_path, 10))  # fmt: skip
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "evsw", *flags, nodes="1"), timeout=900)
    assert code == 0, out
    assert "waiting for the points' eval jobs, to rank them by evals_mc:acc" in out
    ranking = out[out.index("Ranked by evals_mc acc, highest first") :].splitlines()[1:3]
    scores = {line.split()[1]: float(line.split()[2]) for line in ranking}
    assert set(scores) == {"evsw-1", "evsw-2"} and all("at step 10" in line for line in ranking), ranking
    assert list(scores.values()) == sorted(scores.values(), reverse=True)
    for name, score in scores.items():
        (bundle,) = bundles(tmp_path, name)
        assert rows(bundle)[10]["tasks"]["evals_mc"]["acc"] == pytest.approx(score, abs=5e-5)
    (record_dir,) = [p.parent for p in tmp_path.glob("logs/configs/evsw/*/sweep.json")]
    again = jobs_command(slurm_env, "status", str(record_dir))
    assert "Ranked by evals_mc acc, highest first" in again  # the sweep's record keeps --rank_by


@pytest.mark.nanotron_cpu
def test_nanotron_mains_8_rank_run_is_evaluated(tmp_path: Path, slurm_env: dict, four_slots: dict, demo_data: Any):
    """nanotron main's trainer, dp 2 x tp 2 x pp 2 on 2 nodes x 4 (as tests/test_nanotron_slurm.py runs it), saving
    every 2 steps and evaluated every 2: each step's eval job exports the 8 ranks' shards and scores them."""
    proc = test_nanotron_slurm.launch(tmp_path, four_slots, demo_data, "main", "evn", None, 4, "--save_interval", "2",
                        *eval_flags(tmp_path, 2))  # fmt: skip
    code, out = finish(proc, timeout=900)
    assert code == 0 and "ended COMPLETED" in out, out
    (bundle,) = bundles(tmp_path, "evn")
    run = manifest.load(bundle)
    records = settled(run, [2, 4])
    assert {s: r["state"] for s, r in records.items()} == {2: "done", 4: "done"}, records
    found = rows(bundle)
    assert set(found[4]["tasks"]) == set(TASKS) and 0 <= found[4]["tasks"]["evals_mc"]["acc"] <= 1
    assert all(math.isfinite(v) for v in found[4]["tasks"]["evals_ppl"].values())
    assert {s: len(j) for s, j in submitted_lines(run.log.read_text()).items()} == {2: 1, 4: 1}


def test_an_eval_job_slurm_would_not_run_is_refused_before_anything_is_written(
    tmp_path: Path, slurm_env: dict, demo_data
):
    cases = (
        (("--eval_partition", "nosuch"), "on nosuch on CPUs"),
        (("--eval_gpus", "8"), "on the default partition with 8 GPU(s)"),
    )  # (its nodes have 2)
    for number, (flags, said) in enumerate(cases):
        proc = launch(tmp_path, slurm_env, demo_data, "evpart", *eval_flags(tmp_path / str(number), 10), *flags,
                      follow=False, nodes="1")  # fmt: skip
        code, out = finish(proc, timeout=300)
        assert code == 2 and f"--eval_partition: Slurm would not run an eval job {said}: " in out, out
        assert "Traceback" not in out and not (tmp_path / "logs" / "configs" / "evpart").exists()


def slow_sbatch(where: Path, env: dict, job_name: str, seconds: int) -> dict:
    """`env` with an sbatch first on its PATH that waits `seconds` before submitting a job named `job_name` (a busy
    controller), then runs Slurm's own: the job's supervisor submits its eval jobs through it."""
    real = shutil.which("sbatch", path=env.get("PATH"))
    assert real is not None
    folder = where / "slow-bin"
    folder.mkdir()
    script = folder / "sbatch"
    script.write_text(f'#!/bin/bash\nfor a in "$@"; do [ "$a" = --job-name={job_name} ] && sleep {seconds}; done\n'
                      f'exec {real} "$@"\n')  # fmt: skip
    script.chmod(0o755)
    return {**env, "PATH": f"{folder}:{env['PATH']}"}


def test_a_step_owed_an_eval_is_never_purged_while_its_submission_is_held_up(
    tmp_path: Path, slurm_env: dict, demo_data
):
    """--keep_last 1 saving every 5 steps, evaluated every 10, step 10's sbatch held up 25 s (a busy controller):
    steps 15, 20, 25 and 30 complete meanwhile; step 10 is kept until its eval job has ended, and every evaluated
    step is scored once. An eval job killed outright left a scratch folder on the node: the next one removes it."""
    nodetmp = tmp_path / "nodetmp"
    (nodetmp / "launcher-eval-999999-10-x" / "model").mkdir(parents=True)  # job 999999: long gone
    env = slow_sbatch(tmp_path, slurm_env, "owed-eval-10", 25)
    flags = ("--train_steps", "30", "--save_interval", "5", "--keep_last", "1", "--tmp_dir", str(nodetmp),
             "--run_train_script", paced(tmp_path, 0.3), *eval_flags(tmp_path, 10))  # fmt: skip
    code, out = finish(launch(tmp_path, env, demo_data, "owed", *flags, nodes="1"), timeout=600)
    assert code == 0 and "ended COMPLETED" in out, out
    (bundle,) = bundles(tmp_path, "owed")
    run = manifest.load(bundle)
    found = settled(run, [10, 20, 30])
    assert {s: r["state"] for s, r in found.items()} == {10: "done", 20: "done", 30: "done"}, found
    assert {s: len(jobs) for s, jobs in submitted_lines(run.log.read_text()).items()} == {10: 1, 20: 1, 30: 1}
    purges = [r for r in jsonl.read(bundle / P.CHECKPOINTS_RECORD) if r["event"] == "purge"]
    removed = {r["step"]: purge["time"] for purge in purges for r in purge["removed"]}
    assert {5, 15, 25} <= set(removed), purges  # retention ran all along
    for step in (10, 20):  # removed, if at all, only once its eval had ended
        assert step not in removed or removed[step] >= found[step]["ended"], (step, removed, found[step])
    assert removed.get(10, math.inf) > found[10]["ended"] - 1 or 10 in ckpt.complete_steps(run.checkpoints)
    assert not (nodetmp / "launcher-eval-999999-10-x").exists()
    assert list(nodetmp.glob("launcher-eval-*")) == []
