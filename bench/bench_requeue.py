"""Time from a node failure to the next training step when the job requeues: a plain `--requeue` against Slurm
25.11's `--requeue=expedite`, each on a local cluster of the bench's own with Slurm's default credential lifetime
(cred_expire 120 s: a plainly requeued job cannot start for 121 s) and SlurmdTimeout 20 s. Not a test; it needs
Slurm 25.11 or newer, so it runs inside a newer release's root:

    bash scripts/slurm_root.sh 26.05 python3 bench/bench_requeue.py [--repeats 1] [--out bench/results/X.md]

Each run trains the tiny model on 1 node x 2 processes of a 2-node cluster (checkpoints every 10 steps, no spare:
nothing to restart on inside the allocation) and, once it has logged step 25 and saved step 20, fails the job's
node as a power cut would: its slurmd and every process of the job on it (the batch script, the job's slurmstepd,
torchrun, the ranks) are SIGKILLed at once. slurmctld notices the silent node (SlurmdTimeout), ends the job
NODE_FAIL and requeues it; the requeued attempt trains on the other node. Measured from the kill to the first step
the new attempt logs (metrics.jsonl's own clock), and to the log's "attempt 2 started". The launcher asks for
`--requeue=expedite` where the cluster's config enables it (`SlurmctldParameters=enable_expedited_requeue`, read
once at submission), a plain `--requeue` elsewhere: the two clusters differ in that parameter alone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_goodput import launch_argv, report, rows, wait_for

from launcher.localcluster import ClusterSpec, down, up
from launcher.localcluster.demo_data import make_demo
from launcher.slurm.parse import parse_scontrol

MODES = {"plain": False, "expedite": True}  # the cluster's enable_expedited_requeue


@dataclass(frozen=True)
class Run:
    mode: str
    to_next_step: float  # s, the kill to the first step the requeued attempt logged
    to_attempt: float | None  # s, the kill to the log's "attempt 2 started" (polled, ~0.2 s)
    asked: str  # the #SBATCH --requeue line of the script Slurm ran
    load: float  # the 1-minute load average at the kill


def job_processes(job_id: str, conf: str) -> list[int]:
    """Every process of the job on this machine: those with its id and cluster in their environment, and its
    slurmstepds (`slurmstepd: [JOB.batch]`, `[JOB.0]`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = dict(x.split("=", 1) for x in (proc / "environ").read_text().split("\0") if "=" in x)
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        own = env.get("SLURM_CONF") == conf and env.get("SLURM_JOB_ID") == job_id
        if own or cmdline.startswith(f"slurmstepd: [{job_id}."):
            found.append(int(proc.name))
    return found


def fail_node(spec: ClusterSpec, node: str, job_id: str, conf: str) -> None:
    pids = [int((spec.dir / f"run/slurmd.{node}.pid").read_text()), *job_processes(job_id, conf)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def one_run(mode: str, n: int, work: Path, spec: ClusterSpec, env: dict, data: tuple[Path, Path]) -> Run:
    name = f"{mode}-{n}"
    proc = subprocess.Popen(
        launch_argv(name, data), cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        (bundle,) = wait_for(lambda: list((work / "logs/configs" / name).glob("*/manifest.json")), 60)
        job_id = wait_for(lambda: json.loads(bundle.read_text())["slurm"].get("job_id"), 60)
        manifest = json.loads(bundle.read_text())
        script = Path(manifest["files"]["script"]["path"]).read_text()
        asked = next(line for line in script.splitlines() if line.startswith("#SBATCH --requeue"))
        metrics, latest = bundle.parent / "metrics.jsonl", work / "checkpoints" / name / "latest"
        wait_for(lambda: max((r["step"] for r in rows(metrics)), default=0) >= 25 and latest.is_file()
                 and int(latest.read_text() or 0) >= 20, 300)  # fmt: skip
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
        node = parse_scontrol(shown.stdout)["BatchHost"]
        load, killed = os.getloadavg()[0], time.time()
        fail_node(spec, node, job_id, env["SLURM_CONF"])
        log = Path(manifest["outputs"]["log"])
        attempt = None
        while not (after := [r for r in rows(metrics) if r["time"] > killed + 1]):
            if attempt is None and "attempt 2 started" in log.read_text(errors="replace"):
                attempt = time.time() - killed
            if time.time() - killed > 600:
                raise TimeoutError(f"{name}: no step within 600 s of the node failure")
            time.sleep(0.2)
        first = min(after, key=lambda r: r["time"])
        return Run(mode, first["time"] - killed, attempt, asked, load)
    finally:
        if "job_id" in locals():
            subprocess.run(["scancel", job_id], env=env, capture_output=True)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        up(spec)  # the failed node's slurmd back (ReturnToService=2)


def table(runs: list[Run]) -> str:
    lines = ["| requeue | node failure → next step (s), each run | median | → attempt 2 started (s) |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for mode in MODES:
        mine = [r for r in runs if r.mode == mode]
        each = ", ".join(f"{r.to_next_step:.1f}" for r in mine)
        said = ", ".join("?" if r.to_attempt is None else f"{r.to_attempt:.1f}" for r in mine)
        lines.append(f"| {mine[0].asked} | {each} | {statistics.median(r.to_next_step for r in mine):.1f} | {said} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs of each mode")
    ap.add_argument("--out", type=Path, help="write the results here too (markdown)")
    args = ap.parse_args()
    runs: list[Run] = []
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-requeue-") as tmp:
        work = Path(tmp)
        data = make_demo(work / "demo", num_docs=400, seed=0)
        for mode, enabled in MODES.items():
            spec = ClusterSpec(work / f"cluster-{mode}", nodes=2, gpus_per_node=2, cred_expire_s=120,
                               slurmd_timeout_s=20, expedited_requeue=enabled)  # fmt: skip
            env = {**os.environ, **up(spec)}
            version = subprocess.run(["sinfo", "-V"], env=env, capture_output=True, text=True).stdout.strip()
            try:
                for n in range(args.repeats):
                    runs.append(run := one_run(mode, n, work, spec, env, data))
                    said = "?" if run.to_attempt is None else f"{run.to_attempt:.1f}"
                    print(f"{run.asked:28} node failure -> next step {run.to_next_step:6.1f} s (attempt 2 started "
                          f"at {said} s); load {run.load:.1f}", flush=True)  # fmt: skip
            finally:
                down(spec)
    report("bench_requeue.py", f"{version}, cred_expire=120, SlurmdTimeout=20", before, [table(runs)], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
