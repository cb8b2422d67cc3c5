"""Time from the launch command to the first training step on the local cluster (aim <= 8 s), and the
batch script's prologue before torchrun starts (target <= 2 s), and the job's end after its last step. Not a test.

    make cluster && SLURM_CONF=$PWD/.slurm/etc/slurm.conf python bench/bench_launch.py [MORE LAUNCHER FLAGS]

(e.g. `--container_image IMAGE` on a cluster started with `up --containers`: the same run with its node step in the
image; docs/performance.md has both.)

Launches the demo model (2 nodes x 2 processes, 5 steps) and watches its log: the prologue is the time between
the job's "started" line and its "rendezvous" line (everything the script does before srun), the start-up is the
time from the launch command to the log's "step 1/" line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stamp(log: str, needle: str) -> datetime:
    line = next(x for x in log.splitlines() if needle in x)
    return datetime.strptime(re.search(r"\[launcher (\S+)\]", line).group(1), "%H:%M:%S.%f")


MARKERS = {  # the job's log lines, in the order they come, and what each marks
    "attempt 1 started": "the batch script starts (Slurm scheduled the job)",
    "rendezvous": "srun starts the node step (lock, port: the prologue done)",
    "engine:": "rank 0 has imported torch and chosen its engine (node checks and torchrun done)",
    "engine torch |": "rank 0 has built the model and loaded the data",
    "step 1/": "the first step is logged",
}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        demo = [sys.executable, "-m", "launcher.localcluster.demo_data", f"{tmp}/demo"]
        subprocess.run(demo, cwd=ROOT, check=True, capture_output=True)
        start = time.monotonic()
        launched = subprocess.run(
            [
                sys.executable,
                str(ROOT / "slurm_launcher.py"),
                "--run_name",
                "bench",
                "--nodes",
                "2",
                "--gpus_per_node",
                "2",
                "--dataset",
                f"{tmp}/demo/dataset",
                "--tokenizer",
                f"{tmp}/demo/tokenizer",
                "--train_steps",
                "5",
                "--warmup_steps",
                "1",
                "--wandb_disabled",
                "true",
                *sys.argv[1:],
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if launched.returncode != 0:
            sys.exit(f"the launch failed (is the local cluster up? make cluster):\n{launched.stderr}")
        submitted = time.monotonic() - start
        (bundle,) = (Path(tmp) / "logs/configs/bench").iterdir()
        log = Path(json.loads((bundle / "manifest.json").read_text())["outputs"]["log"])
        seen: dict[str, float] = {}
        while "step 1/" not in seen:
            text = log.read_text() if log.exists() else ""
            for marker in MARKERS:
                if marker in text and marker not in seen:
                    seen[marker] = time.monotonic() - start
            time.sleep(0.02)
        first_step = seen["step 1/"]
        while "training finished" not in log.read_text():
            time.sleep(0.05)
        finished = time.monotonic()
        while "ended" not in log.read_text():
            time.sleep(0.05)
        teardown = time.monotonic() - finished
        text = log.read_text()
    prologue = (stamp(text, "rendezvous") - stamp(text, "attempt 1 started")).total_seconds()
    print(f"launch command until submitted: {submitted:.2f} s")
    print(f"launch command until the first training step is logged: {first_step:.1f} s (aim <= 8 s)")
    print(f"batch prologue before srun/torchrun: {prologue:.3f} s (target <= 2 s)")
    print(f"from the last step until the job has ended: {teardown:.2f} s")
    print("when each line appeared in the log, from the launch command:")
    for marker, at in seen.items():
        print(f"  {at:6.2f} s  {MARKERS[marker]}")


if __name__ == "__main__":
    main()
