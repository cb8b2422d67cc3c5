"""Time from a failure to the next training step: a restart inside the allocation against a requeue, on a local
cluster of the bench's own with Slurm's default credential lifetime (cred_expire 120 s: a requeued job cannot start
for 121 s; the test cluster's 10 s hides that). Not a test.

    python bench/bench_goodput.py [--repeats 2] [--out bench/results/goodput-DATE.md]

Each run trains the tiny model on 1 node x 2 processes (checkpoints every 10 steps), and once it has logged step
25 and saved step 20, SIGKILLs rank 1's process: a training process that dies, with no word. The time measured is
from the kill to the first step training logs after it (metrics.jsonl's own clock):

    restart   --spare_nodes 1: the batch script starts the node step again on the spare, in the same job
    requeue   no spare: no healthy node left for the layout, so the job requeues without the failed node (what
              every failure did before restarts in the allocation)

and, beside it, when the job's log said it would train again (the restart line, or the requeued attempt's start).
The job is cancelled once the step is seen. The two paths alternate; the load average is printed with each run
(the figures move with it on a shared machine). The GPU-hours a path loses at 512 GPUs are 512 x that time: the
GPUs the run holds (a restart) or needs (a requeue) do no training meanwhile; the steps after the last checkpoint
are done again on both paths alike and are not counted here (docs/ledger.md counts them per run).
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
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher import protocol as P  # noqa: E402
from launcher.localcluster import ClusterSpec, down, up  # noqa: E402
from launcher.localcluster.demo_data import make_demo  # noqa: E402

GPUS = 512
PATHS = {"restart": ["--spare_nodes", "1"], "requeue": []}
AGAIN = {"restart": "restart 1 of ", "requeue": "attempt 2 started"}  # the log's word that training starts again


@dataclass(frozen=True)
class Run:
    path: str
    to_next_step: float  # s, the kill to the first step logged after it
    to_again: float | None  # s, the kill to the log's line that training starts again (seen by polling, ~0.2 s)
    resumed_at: int  # the first step after the kill (the checkpoint's step + 1)
    load: float  # the 1-minute load average at the kill


def wait_for(what, timeout: float, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := what():
            return value
        time.sleep(every)
    raise TimeoutError(f"not in {timeout:.0f} s: {what}")


def rows(metrics: Path) -> list[dict]:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(x) for x in lines if x.strip().endswith("}")]


def rank_pid(job_id: str, conf: str, rank: int) -> int | None:
    """The pid of the job's training process of `rank` (from its environment: the node step's tag)."""
    for proc in Path("/proc").iterdir():
        try:
            env = dict(x.split("=", 1) for x in (proc / "environ").read_text().split("\0") if "=" in x)
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if env.get("SLURM_CONF") == conf and env.get(P.ENV_NODE_TAG, "").startswith(f"{job_id}:") and \
                env.get("RANK") == str(rank) and "LOCAL_RANK" in env:  # fmt: skip
            return int(proc.name)
    return None


def launch_argv(name: str, data: tuple[Path, Path], *flags: str) -> list[str]:
    """The benches' run: the tiny model on 1 node x 2 processes, checkpoints every 10 steps, followed to its end."""
    return [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", name, "--nodes", "1",
            "--gpus_per_node", "2", "--model_size", "tiny", "--dataset", str(data[0]), "--tokenizer", str(data[1]),
            "--grad_accum_steps", "1", "--train_steps", "100000", "--save_interval", "10", "--wandb_disabled", "true",
            "--time_limit", "30:00", *flags, "--show_logs"]  # fmt: skip


def report(bench: str, settings: str, before: tuple[float, ...], lines: list[str], out: Path | None) -> None:
    """Print the bench's report (its settings, the load before and after, `lines`), and write it to `out`."""
    after = os.getloadavg()
    text = "\n".join([
        f"# bench/{bench}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"{settings}; {os.cpu_count()} cores; load average (1, 5, 15 min) before "
        f"{before[0]:.1f} {before[1]:.1f} {before[2]:.1f}, after {after[0]:.1f} {after[1]:.1f} {after[2]:.1f}",
        "",
        *lines,
    ])  # fmt: skip
    print(text)
    if out:
        out.write_text(text + "\n")


def saved_step(checkpoints: Path) -> int:
    """The run's latest checkpoint step: the torch engine's `latest`, nanotron's `latest.txt` (0: none yet)."""
    for name in ("latest", "latest.txt"):
        try:
            return int((checkpoints / name).read_text() or 0)
        except (OSError, ValueError):
            continue
    return 0


def one_run(path: str, n: int, work: Path, env: dict, data: tuple[Path, Path], *flags: str, name: str = "") -> Run:
    """`path`'s run (with `flags` after the bench's own), killed and timed to its next step (bench_nanoset.py
    times a restart of each engine on each kind of data with it)."""
    name = name or f"{path}-{n}"
    argv = launch_argv(name, data, *PATHS[path], *flags)
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        (bundle,) = wait_for(lambda: list((work / "logs/configs" / name).glob("*/manifest.json")), 60)
        job_id = wait_for(lambda: json.loads(bundle.read_text())["slurm"].get("job_id"), 60)
        metrics, checkpoints = bundle.parent / "metrics.jsonl", work / "checkpoints" / name
        wait_for(lambda: max((r["step"] for r in rows(metrics)), default=0) >= 25 and saved_step(checkpoints) >= 20,
                 600)  # fmt: skip
        pid = wait_for(lambda: rank_pid(job_id, env["SLURM_CONF"], 1), 30)
        load, killed = os.getloadavg()[0], time.time()
        os.kill(pid, signal.SIGKILL)
        log = Path(json.loads(bundle.read_text())["outputs"]["log"])
        again = None
        # a step rank 0 logs within a second of the kill is one rank 1 finished before it died, not a resumed one
        # (a resumed step needs torch imported again: seconds)
        while not (after := [r for r in rows(metrics) if r["time"] > killed + 1]):
            if again is None and AGAIN[path] in log.read_text(errors="replace"):
                again = time.time() - killed
            if time.time() - killed > 600:
                raise TimeoutError(f"{name}: no step within 600 s of the failure")
            time.sleep(0.2)
        first = min(after, key=lambda r: r["time"])
        return Run(path, first["time"] - killed, again, first["step"], load)
    finally:
        if "job_id" in locals():
            subprocess.run(["scancel", job_id], env=env, capture_output=True)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def table(runs: list[Run]) -> str:
    lines = ["| path | failure → next step (s), each run | median | GPU-hours lost at 512 GPUs (median) |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for path in PATHS:
        times = [r.to_next_step for r in runs if r.path == path]
        median = statistics.median(times)
        each = ", ".join(f"{t:.1f}" for t in times)
        lines.append(f"| {path} | {each} | {median:.1f} | {GPUS * median / 3600:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="runs of each path")
    ap.add_argument("--out", type=Path, help="write the results here too (markdown)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        work = Path(tmp)
        spec = ClusterSpec(work / "cluster", nodes=2, gpus_per_node=2, cred_expire_s=120)
        data = make_demo(work / "demo", num_docs=400, seed=0)
        env = {**os.environ, **up(spec)}
        version = subprocess.run(["sinfo", "-V"], env=env, capture_output=True, text=True).stdout.strip()
        before = os.getloadavg()
        runs = []
        try:
            for n in range(args.repeats):
                for path in PATHS:
                    runs.append(run := one_run(path, n, work, env, data))
                    again = "?" if run.to_again is None else f"{run.to_again:.1f}"
                    print(f"{path:8} failure -> next step {run.to_next_step:6.1f} s (training again said at "
                          f"{again} s; resumed at step {run.resumed_at}); load {run.load:.1f}", flush=True)  # fmt: skip
        finally:
            down(spec)
    lines = [f"- {r.path}: failure -> next step {r.to_next_step:.1f} s, training again said at "
             f"{'?' if r.to_again is None else f'{r.to_again:.1f}'} s, resumed at step {r.resumed_at}, "
             f"load {r.load:.1f}" for r in runs]  # fmt: skip
    report("bench_goodput.py", f"{version}, cred_expire=120", before, [*lines, "", table(runs)], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
