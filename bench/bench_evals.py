"""What --eval_tasks costs: the training job's side (the supervisor's look at the pointers between its polls, and
its submission of a step's eval job: `sbatch` against the local cluster), and the eval job's own time for the tiny
model on CPU (export, lm-eval on two local tasks, the held-out loss), with its peak memory.

    python bench/bench_evals.py [--submits 10] [--jobs 3]     (the local cluster up: `make cluster`)

The submission is launcher/node/evals.py's own `Evals.on_checkpoint`, as the supervisor calls it (in a thread of its
own while the step runs: never in the training processes, which run under srun on the nodes), for a new complete
checkpoint each time, on a checkpoints folder of torch-engine steps; the script it submits is a one-second job. The
eval job is `python -m launcher.evals.evaljob BUNDLE STEP` in a child process, on a tiny run the torch engine trained in
one process (tests/test_evals_job.py's tasks and run); its peak RSS is the kernel's (wait4's ru_maxrss). The
figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def submit_times(where: Path, count: int) -> dict:
    """`Evals.on_checkpoint` for `count` new steps (one sbatch each), and `Evals.poll` when nothing moved."""
    from test_evals_submission import save

    from launcher.evals.settings import EvalSettings
    from launcher.evals.submit import Evals

    script = where / "eval.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --time=1\n#SBATCH --output={where}/eval-%j.out\nsleep 1\n")
    settings = EvalSettings(str(script), str(where), str(where / "ckpt"), "bench", str(where / "eval-{step}.out"),
                            every=1, last_step=count, tasks="bench")  # fmt: skip
    evals = Evals(settings, "0", say=lambda *a, **k: None)
    submits = []
    for step in range(1, count + 1):
        save(where / "ckpt", step)
        started = time.perf_counter()
        (done,) = [d for d in evals.on_checkpoint() if d.step == step]
        submits.append(time.perf_counter() - started)
        assert done.new and done.submitted, done
    quiet = Evals(settings, "0", say=lambda *a, **k: None)
    quiet.poll(wait=True)  # every step settled: the record says so
    looks = []
    for _ in range(2000):
        quiet.next_look = float("-inf")  # a look each time (the supervisor looks every LOOK_EVERY_S)
        started = time.perf_counter()
        quiet.poll()
        looks.append(time.perf_counter() - started)
    return {"submit_ms_median": 1000 * statistics.median(submits), "submit_ms_max": 1000 * max(submits),
            "look_us_median": 1e6 * statistics.median(looks)}  # fmt: skip


def eval_job_times(where: Path, runs: int) -> dict:
    """The eval job of the tiny model's step on CPU, `runs` times: seconds, its phases, peak RSS."""
    from conftest import DemoData
    from test_evals_job import STEP, TASKS, trained_run, write_heldout, write_tasks

    from launcher.evals import record as eval_record
    from launcher.localcluster import demo_data

    dataset, tokenizer = demo_data.make_demo(where / "demo")
    demo = DemoData(dataset, tokenizer, 0)
    tasks = write_tasks(where)
    run = trained_run(where, demo, "--eval_tasks", ",".join(TASKS), "--eval_include", str(tasks), "--eval_heldout",
                      str(write_heldout(where)))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TMPDIR": str(where)}  # fmt: skip
    walls, rss, phases = [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        argv = [sys.executable, "-m", "launcher.evals.evaljob", str(run.bundle_dir), str(STEP)]
        child = subprocess.Popen(argv, env=env,
                                 stdout=subprocess.DEVNULL, stderr=open(where / "job.err", "w"))  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        walls.append(time.perf_counter() - started)
        rss.append(usage.ru_maxrss / 1024)
        assert os.waitstatus_to_exitcode(status) == 0, (where / "job.err").read_text()[-2000:]
        phases.append(eval_record.rows(run.bundle_dir)[STEP]["phases_s"])
    return {"seconds_median": statistics.median(walls), "peak_rss_mib_max": max(rss),
            **{f"{k}_s_median": statistics.median(p[k] for p in phases) for k in phases[0]}}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=3)
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        print("SLURM_CONF is not set: start the local cluster (make cluster) and export its SLURM_CONF")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        print("supervisor:", submit_times(Path(tmp), args.submits))
    with tempfile.TemporaryDirectory() as tmp:
        print("eval job (tiny model, CPU, 2 local tasks + held-out):", eval_job_times(Path(tmp), args.jobs))
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, max RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
