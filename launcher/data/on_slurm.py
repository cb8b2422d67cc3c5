"""`tokenize --slurm`: the same pipeline as a Slurm array job, through datatrove's own SlurmPipelineExecutor (one
array task per datatrove task; a rerun submits only the tasks without a completion record), optionally followed to
its end (--show_logs), then the folder checked and the record finished as on the login node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.config.slurm_values import TIME_LIMIT
from launcher.data.tokenize import RECORD, RECORD_DIR, Plan, finish, pipeline, write_record
from launcher.errors import LauncherError, SlurmUnavailable
from launcher.problems import Problem
from launcher.slurm import client

SLURM_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # a partition, QOS, account or job name on an #SBATCH line
SAFE_PATH = re.compile(r"[A-Za-z0-9._/+=,@-]+")  # a path datatrove may write unquoted into a shell script
POLL_S = (2.0, 30.0)  # the first look at the array, and the longest wait between two


@dataclass(frozen=True)
class SlurmArgs:
    partition: str | None  # datatrove's executor names one on every script
    qos: str | None = None  # None: no --qos line (datatrove's own default, "normal", fails where it is not defined)
    account: str | None = None
    time_limit: str = "4:00:00"  # of each array task
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    job_name: str = "tokenize"


def problems(s: SlurmArgs, output: str) -> list[Problem]:
    """What would reach an #SBATCH line or datatrove's script, checked to Slurm's alphabets and a shell-safe path
    (datatrove writes the values as they are, unquoted: `srun ... launch_pickled_pipeline <output>/...`)."""
    found = []
    where = os.path.abspath(os.path.expanduser(output))
    if not SAFE_PATH.fullmatch(where):
        found.append(
            Problem(
                "output",
                f"{where!r} would reach datatrove's batch script unquoted (it holds a space, quote or shell character)",
                "with --slurm, give an --output of letters, digits and . _ - / + = , @",
            )
        )
    if not s.partition:
        found.append(Problem("partition", "--slurm needs a partition", "give --partition (sinfo -s lists them)"))
    for flag in ("partition", "qos", "account", "job_name"):
        value = getattr(s, flag)
        if value and not SLURM_NAME.fullmatch(value):
            found.append(Problem(flag, f"{value!r} is not a Slurm name", "use letters, digits, '.', '_' and '-'"))
    if not TIME_LIMIT.fullmatch(s.time_limit):
        found.append(Problem("time_limit", f"{s.time_limit!r} is not a Slurm time", "use HH:MM:SS or D-HH:MM:SS"))
    for flag in ("cpus_per_task", "mem_per_cpu_gb"):
        if getattr(s, flag) < 1:
            found.append(Problem(flag, f"--{flag} {getattr(s, flag)} is below 1", f"use --{flag} 1 or more"))
    return found


def live_job_problems(plan: Plan, slurm_needed: bool) -> list[Problem]:
    """One writer per output: the record's last Slurm job must have ended before anything else writes there (a
    second array would run the same tasks into the same files). Without Slurm here, a local run is not held back
    (`slurm_needed` False); a --slurm run then fails at submission as it would anyway."""
    try:
        jobs = json.loads((plan.output / RECORD_DIR / RECORD).read_text(encoding="utf-8")).get("slurm_jobs", [])
    except (OSError, ValueError, AttributeError):
        return []
    if not plan.resume or not jobs:
        return []
    try:
        states = client.job_states(str(jobs[-1]))
    except SlurmUnavailable:
        if not slurm_needed:
            return []
        raise
    live = sorted({st.state for st in states if not st.terminal})
    if not live:
        return []
    return [
        Problem(
            "output",
            f"job {jobs[-1]} ({', '.join(live)}) is still tokenizing into {plan.output}",
            f"wait for it to end (python -m launcher.data inspect {plan.output}), or scancel {jobs[-1]} and run this "
            "command again",
        )
    ]


def hub_environment(plan: Plan) -> str:
    """For a hub name: the tasks read it, offline, from the datasets cache this machine checked it in (on a shared
    filesystem; a node's own default cache may lack it, or hold another version)."""
    if plan.reader != "hub":
        return ""
    import datasets

    return f"; export HF_HUB_OFFLINE=1 HF_DATASETS_CACHE={shlex.quote(str(datasets.config.HF_DATASETS_CACHE))}"


def submit(plan: Plan, s: SlurmArgs, command: list[str]) -> str | None:
    """The array job submitted by datatrove's executor; its id, or None where every task had already finished."""
    from datatrove.executor import SlurmPipelineExecutor

    write_record(plan, command, "submitting")
    logs = plan.output / RECORD_DIR / "logs"
    executor = SlurmPipelineExecutor(
        pipeline=pipeline(plan),
        tasks=plan.args.tasks,
        workers=plan.args.workers or -1,
        time=s.time_limit,
        partition=s.partition or "",
        cpus_per_task=s.cpus_per_task,
        mem_per_cpu_gb=s.mem_per_cpu_gb,
        job_name=s.job_name,
        qos=s.qos or "",  # falsy: datatrove writes no --qos line
        sbatch_args={"account": s.account} if s.account else None,
        # the array tasks run this same Python (its bin holds datatrove's launch_pickled_pipeline)
        env_command=f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH" + hub_environment(plan),
        logging_dir=str(logs),
        slurm_logs_folder=str(logs / "slurm"),
        skip_completed=True,
    )
    try:
        executor.run()
    except (subprocess.CalledProcessError, OSError) as e:  # sbatch's own words are on the console above
        script = logs / "launch_script.slurm"
        raise LauncherError(f"sbatch refused the tokenization ({e}); the script was {script}") from None
    job_id = str(executor.job_id) if executor.job_id not in (None, -1) else None
    if job_id is not None:
        earlier = json.loads((plan.output / RECORD_DIR / RECORD).read_text(encoding="utf-8"))["slurm_jobs"]
        write_record(plan, command, "submitted", {"slurm_jobs": [*earlier, job_id]})
    return job_id


def follow(job_id: str, show: bool = True) -> list[str]:
    """Wait for every task of the array to end (one controller query per look, backing off); their end states."""
    wait, seen = POLL_S[0], ""
    while True:
        states = client.job_states(job_id)
        line = ", ".join(sorted({f"{st.state}" for st in states})) or "gone"
        if show and line != seen:
            print(f"[data] job {job_id}: {line}", flush=True)
            seen = line
        if all(st.terminal for st in states):
            return [st.state for st in states]
        time.sleep(wait)
        wait = min(wait * 1.5, POLL_S[1])


def run_slurm(plan: Plan, s: SlurmArgs, command: list[str], wait: bool) -> str:
    """Submit; with `wait`, follow to the end and check the folder. What to tell the user."""
    job_id = submit(plan, s, command)
    if job_id is None:
        folder = finish(plan, command)
        return f"every task had finished: {folder.tokens} tokens in {folder.path}"
    if not wait:
        again = shlex.join(["python", "-m", "launcher.data", "inspect", str(plan.output)])
        return f"submitted job {job_id} ({plan.args.tasks} tasks); when it ends: {again}"
    ends = follow(job_id)
    if any(state != "COMPLETED" for state in ends):
        logs = plan.output / RECORD_DIR / "logs"
        raise LauncherError(
            f"job {job_id} ended {', '.join(sorted(set(ends)))}; its tasks' logs are in {logs / 'slurm'} and "
            f"{logs / 'logs'}; the same command resubmits only the unfinished tasks"
        )
    folder = finish(plan, command)
    return f"job {job_id}: {folder.tokens} tokens in {folder.documents} documents, {len(folder.files)} files"
