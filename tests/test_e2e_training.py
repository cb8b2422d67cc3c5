"""The whole mission on the real local cluster: real sbatch, srun, torchrun and the torch engine on CPU.

The demo flow, a relaunch that resumes, preemption -> checkpoint -> requeue -> resume, a time limit crossed over
several allocations, and a cancel that leaves no process behind.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from cluster_runs import (
    assert_continuous,
    bundles,
    finish,
    latest_step,
    launch,
    leftover_processes,
    manifest,
    paced,
    saved_by_the_stop,
    wait_for,
    with_fake_nvidia_smi,
)
from launcher_helpers import ROOT
from nanotron_main import judge, python_with_main

from launcher import jsonl
from launcher.slurm import client as slurm
from launcher.train.settings import load_train_config

pytestmark = pytest.mark.slurm


def assert_ledger_from_the_jobs_records(bundle_dir: Path, out: str) -> None:
    """Without accounting (sacct says so), the ledger comes from the job's own records: its one attempt held the
    job's 4 GPUs from the batch script's start line to its end line."""
    assert slurm.accounting_records(manifest(bundle_dir)["slurm"]["job_id"]) is None
    ledger = manifest(bundle_dir)["ledger"]
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    start, end = (log.split(f" {word} ")[1].split()[0].rstrip(",") for word in ("started", "ended"))
    held = 4 * (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() / 3600
    hours = ledger["gpu_hours"]
    assert ledger["source"] == "job records" and abs(hours["allocated"] - held) <= 4 * 1.0 / 3600  # stamps: to 1 s
    assert hours["trained"] > 0 and hours["start_up"] > 0 and ledger["causes"] == {}
    assert abs(hours["allocated"] - hours["useful"] - hours["lost"]) < 1e-5
    # the end summary's line: three figures of the hours, which the manifest keeps to six decimals (one run's
    # manifest said 0.04105 where the summary, from the hours just under it, said 0.041)
    said = re.findall(r"gpu-hours    (\S+) GPU-hours", out)[-1:]
    assert said and said[0] in {f"{hours['allocated'] + d:.3g}" for d in (-1e-6, 0, 1e-6)}, (said, hours)


@pytest.mark.main_job  # on 22.05 and 26.05 in make test (pyproject.toml's markers)
def test_demo_flow_then_relaunch_resumes(tmp_path: Path, slurm_env: dict, demo_data):
    started = time.monotonic()
    job_env = with_fake_nvidia_smi(tmp_path, slurm_env)
    code, out = finish(launch(tmp_path, job_env, demo_data, "demo", "--train_steps", "30"), timeout=300)
    assert code == 0, out
    assert "Job " in out and "ended COMPLETED, exit code 0" in out
    (first,) = bundles(tmp_path, "demo")
    rows = jsonl.read(first / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert sum(r["loss"] for r in rows[-5:]) / 5 < sum(r["loss"] for r in rows[:5]) / 5 - 0.5
    assert (first / "loss.png").stat().st_size > 10_000 and "loss curve" in out
    assert latest_step(tmp_path / "checkpoints/demo") == 30
    job_id = manifest(first)["slurm"]["job_id"]
    assert "# gpu sample" in next((tmp_path / "logs/slurm_logs/demo").glob(f"gpu-{job_id}-*.log")).read_text()
    wait_for(lambda: leftover_processes(job_id) == [], timeout=15)  # nothing of the job runs on after it ended
    print(f"demo flow: {time.monotonic() - started:.1f} s from launch to the follower's exit")
    assert_ledger_from_the_jobs_records(first, out)

    code, out = finish(launch(tmp_path, slurm_env, demo_data, "demo", "--train_steps", "40"), timeout=300)
    assert code == 0, out
    assert "from the checkpoint at step 30" in out  # said at launch
    assert "resumed from checkpoint step 30" in out  # done by the job
    second = bundles(tmp_path, "demo")[1]
    assert [r["step"] for r in jsonl.read(second / "metrics.jsonl")] == list(range(31, 41))

    # the job's Python now has nanotron main: resuming 0.4's checkpoints is refused before the queue; started
    # afresh, the run is written in main's dialect (which main's parser accepts) and trains on the cluster
    main_python = str(python_with_main(tmp_path))
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "demo", "--python", main_python), timeout=120)
    assert code == 2 and "--nanotron_dialect: run demo's checkpoints were written from a nanotron 0.4" in out, out
    flags = ("--train_steps", "5", "--resume", "false", "--python", main_python)
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "demo", *flags), timeout=300)
    assert code == 0 and "resumed from" not in out and "config in nanotron main's dialect" in out, out
    third = bundles(tmp_path, "demo")[2]
    assert "data_stages" in (third / "config.yaml").read_text()
    (verdict,) = judge(third / "config.yaml")
    assert "error" not in verdict and [r["step"] for r in jsonl.read(third / "metrics.jsonl")] == list(range(1, 6))
    assert manifest(third)["outputs"]["checkpoints"] != str(tmp_path / "checkpoints/demo")
    assert latest_step(tmp_path / "checkpoints/demo") == 40  # the earlier run's checkpoints are untouched


def test_a_mixture_of_two_local_datasets_trains(tmp_path: Path, slurm_env: dict, demo_data, second_dataset):
    mix = f"{demo_data.dataset}:0.7,{second_dataset}:0.3"
    flags = ("--train_steps", "6", "--save_interval", "6")
    code, out = finish(launch(tmp_path, slurm_env, replace(demo_data, dataset=mix), "mix", *flags, nodes="1"), 300)
    assert code == 0 and "ended COMPLETED, exit code 0" in out, out
    assert f"a mixture of {demo_data.dataset} (0.7 of its rows, ~" in out  # the summary
    (bundle,) = bundles(tmp_path, "mix")
    assert manifest(bundle)["derived"]["dataset_mixture"][str(second_dataset)]["weight"] == 0.3
    assert load_train_config(str(bundle / "config.yaml")).mixture == (
        (str(demo_data.dataset), 0.7),
        (str(second_dataset), 0.3),
    )
    assert [r["step"] for r in jsonl.read(bundle / "metrics.jsonl")] == list(range(1, 7))


def test_time_limit_is_crossed_over_allocations(tmp_path: Path, slurm_env: dict, demo_data):
    # 3 minutes per allocation, a warning 50 s before the end. Slurm may send it up to 60 s early (sbatch --signal),
    # so it lands 70-130 s into an allocation, after ~5-15 s of start-up: each allocation trains ~55-125 s.
    # 650 steps paced to 0.2 s are 130 s of training: 2 or 3 allocations on any machine (--max_requeues 4).
    # The warning that often lands as the last allocation finishes must not turn the run into a requeue or failure.
    # (The notice's path on 2 nodes, the stop file, the save and the resume, is the preemption tests' too:
    # tests/test_preemption.py, where the job's own signal is the notice.)
    proc = launch(
        tmp_path,
        slurm_env,
        demo_data,
        "timelimit",
        "--train_steps",
        "650",
        "--time_limit",
        "3",
        "--signal_grace",
        "50",
        "--max_requeues",
        "4",
        "--save_interval",
        "100",
        "--run_train_script",
        paced(tmp_path, 0.2),
        nodes="1",
    )
    code, out = finish(proc, timeout=900)
    assert code == 0, out
    (bundle_dir,) = bundles(tmp_path, "timelimit")
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert log.count("time-limit or preemption notice (USR1)") >= 1 and "attempt 2 started" in log
    saved = saved_by_the_stop(log)  # the step the first allocation's notice saved
    assert "requeueing after the time-limit notice (1 of 4)" in log, log[-3000:]
    assert f"resumed from checkpoint step {saved}" in log
    assert_continuous(bundle_dir, 650)
    assert "ended COMPLETED" in out and re.search(r"requeued [12]x", out), out


def test_cancel_ends_every_process(tmp_path: Path, slurm_env: dict, demo_data):
    slurm_env = with_fake_nvidia_smi(tmp_path, slurm_env)  # a GPU monitor per node, whose stop is checked too
    launcher = launch(tmp_path, slurm_env, demo_data, "cancelme", "--train_steps", "100000", follow=False)
    assert finish(launcher, timeout=60)[0] == 0
    (bundle_dir,) = bundles(tmp_path, "cancelme")
    job_id = manifest(bundle_dir)["slurm"]["job_id"]
    log = Path(manifest(bundle_dir)["outputs"]["log"])
    wait_for(lambda: log.exists() and "step 3/" in log.read_text(), timeout=120)
    follower = subprocess.Popen(
        [sys.executable, "-m", "launcher.jobs", "attach", str(bundle_dir)],
        cwd=ROOT,
        env=slurm_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def every_kind_running() -> bool:  # training, and both nodes' monitors with their sleep between samples (a
        running = leftover_processes(job_id)  # snapshot can fall between one sleep's end and the next one's start)
        seen = any("run_train.py" in p for p in running) and any("sleep" in p for p in running)
        return seen and sum("nvidia-smi dmon" in p for p in running) == 2  # one monitor per node

    wait_for(every_kind_running, timeout=30, every=0.5)
    monitors = sorted(p.name for p in log.parent.glob(f"gpu-{job_id}-*.log"))
    assert monitors == [f"gpu-{job_id}-node1.log", f"gpu-{job_id}-node2.log"]  # one log per node
    slurm.cancel(job_id)
    code, out = finish(follower, timeout=60)
    assert code == 1 and f"Job {job_id} ended CANCELLED" in out
    wait_for(lambda: leftover_processes(job_id) == [], timeout=30)
    # scancel's SIGTERM reaches the batch script and training alike: a cancel, never requeued
    text = log.read_text()
    assert "termination signal" in text and "requeueing" not in text and "attempt 2" not in text, text[-3000:]
