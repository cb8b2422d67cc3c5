"""Runs on the real local cluster, as the end-to-end tests launch and read them: `launch` slurm_launcher.py in a
subprocess (the README's flags for a tiny 2-node run), `finish` it, find its bundles, manifest and job id, wait for
a condition, read the latest checkpoint step, list a job's leftover processes, check a run's steps and LR against an
uninterrupted one; the stand-ins the jobs run with (a fake nvidia-smi, run_train.py paced to a step's time).

Plain functions, not fixtures: the test files that use the cluster import them (tests/test_e2e_training.py holds
the main job's own tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from launcher_helpers import ROOT

from launcher import jsonl
from launcher.train.schedule import lr_at
from launcher.train.settings import load_train_config


def launch(
    tmp_path: Path, env: dict, demo_data, run_name: str, *flags: str, follow: bool = True, nodes: str = "2"
) -> subprocess.Popen:
    argv = [
        sys.executable,
        str(ROOT / "slurm_launcher.py"),
        "--run_name",
        run_name,
        "--nodes",
        nodes,
        "--gpus_per_node",
        "2",
        "--model_size",
        "tiny",
        "--dataset",
        str(demo_data.dataset),
        "--tokenizer",
        str(demo_data.tokenizer),
        "--grad_accum_steps",
        "1",
        "--learning_rate",
        "3e-3",
        "--min_lr",
        "3e-4",
        "--warmup_steps",
        "3",
        "--save_interval",
        "10",
        "--wandb_disabled",
        "true",
        "--time_limit",
        "5:00",
        *flags,
        *(["--show_logs"] if follow else []),
    ]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stdout + stderr


def steps_of_attempts(bundle_dir: Path, log: str, job_id: str) -> tuple[int, int]:
    """(the last step the first attempt logged, the checkpoint step the second resumed from), read from the job's
    metrics and log directly."""
    second = log.split(f"job {job_id} attempt 2 started ")[1].split()[0]
    boundary = datetime.fromisoformat(second).timestamp()
    first_steps = [r["step"] for r in jsonl.read(bundle_dir / "metrics.jsonl") if r["time"] < boundary]
    resumed = int(log.split("resumed from checkpoint step ")[1].split()[0]) if "resumed from" in log else 0
    return max(first_steps), resumed


def bundles(tmp_path: Path, run_name: str) -> list[Path]:
    return sorted((tmp_path / "logs/configs" / run_name).iterdir())


def manifest(bundle_dir: Path) -> dict:
    return json.loads((bundle_dir / "manifest.json").read_text())


def submitted_job_id(bundle_dir: Path) -> str | None:
    """The job id once the launcher has written the manifest and recorded the submission, else None."""
    try:
        return manifest(bundle_dir)["slurm"].get("job_id")
    except FileNotFoundError:  # the bundle directory is claimed before its files are written
        return None


def saved_by_the_stop(log: str) -> int:
    """The step a stop request's checkpoint saved, as the job's log says it."""
    return int(log.split("stop requested: checkpoint saved at step ")[1].split(";")[0])


def wait_for(predicate, timeout: float, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


def latest_step(checkpoints: Path) -> int:
    try:
        return int((checkpoints / "latest").read_text())
    except (OSError, ValueError):
        return 0


def leftover_processes(job_id: str, conf: str | None = None) -> list[str]:
    """Every process on this machine (all the virtual nodes) started for the job: its environment names the job,
    whatever its command line (the heartbeat's sleep, srun, torchrun, the trainers, a GPU monitor). `conf`: the
    job's cluster (its SLURM_CONF; default this process's), as job ids repeat across the clusters tests run."""
    conf = conf or os.environ.get("SLURM_CONF", "")
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={conf}".encode()}
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if wanted <= set(environ.split(b"\0")):
            found.append(f"{proc.name} {cmdline}")
    return found


def assert_continuous(bundle_dir: Path, train_steps: int) -> None:
    """Every step from 1 to train_steps was logged, each with the LR an uninterrupted run would use."""
    rows = {r["step"]: r for r in jsonl.read(bundle_dir / "metrics.jsonl")}
    assert sorted(rows) == list(range(1, train_steps + 1))
    schedule = load_train_config(str(bundle_dir / "config.yaml")).lr
    for step, row in rows.items():
        assert abs(row["lr"] - lr_at(step, schedule)) <= 1e-12 + 1e-9 * abs(row["lr"]), step


FAKE_NVIDIA_SMI = """#!/bin/bash
# stands in for nvidia-smi: `-L` lists the node's two GPUs (the node check asks); `dmon ... -f FILE` starts FILE
# afresh (the harsher of what dmon might do to an existing file) and samples into it until stopped
if [[ "$1" == "-L" ]]; then
  printf 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n'
  exit 0
fi
: > "${@: -1}"
while :; do echo "# gpu sample" >> "${@: -1}"; sleep 2; done
"""


def with_fake_nvidia_smi(tmp_path: Path, env: dict) -> dict:
    """The job's environment with a stand-in nvidia-smi first on PATH, so the GPU monitor runs (and must stop)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


PACED_TRAIN = """
# run_train.py itself, with every optimizer step taking at least {pace} s: the run's length in wall-clock time
# no longer depends on how fast or loaded the machine is (the test's timing needs that, the product does not).
import runpy, sys, time
sys.path.insert(0, {root!r})
from launcher.train.torch_engine import engine as torch_engine

step = torch_engine.TorchTrainer.train_step

def paced(self, ddp):
    start = time.perf_counter()
    done = step(self, ddp)
    time.sleep(max(0.0, {pace} - (time.perf_counter() - start)))
    return done

torch_engine.TorchTrainer.train_step = paced
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def paced(tmp_path: Path, pace: float = 0.5) -> str:
    """PACED_TRAIN written into `tmp_path`: its path. At 0.5 s a step, a run that waits for something else (Slurm's
    end of it, a second job) without its ranks taking the CPUs the other tests need."""
    script = tmp_path / "paced_train.py"
    script.write_text(PACED_TRAIN.format(pace=pace, root=str(ROOT), script=str(ROOT / "run_train.py")))
    return str(script)
