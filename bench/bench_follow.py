"""The follower's latency, cost, and controller load against the local cluster (targets: a line within ~1 s, exit
within ~2 s of the job's end, well under 5% of a core while waiting; while nothing changes, at most one controller
query per 30 s: ~240 RPCs an hour for a running job, where the follower before this one made ~7,000). Not a test.

    python -m launcher.localcluster up && SLURM_CONF=$PWD/.slurm/etc/slurm.conf python bench/bench_follow.py

1. Submits a job that prints a timestamp every 0.5 s for 15 s (between the batch script's own "attempt 1 started"
   and "attempt 1 ended" lines, as the launcher's jobs print them), follows it in this process, and reports the
   delay between each line's timestamp and its arrival, the delay between the job's end and the follower's
   return, and the follower's CPU time (its own plus its scontrol calls) over the wall time.
2. The controller's RPCs (sdiag) while following running jobs where nothing changes, as RPCs an hour: one job and
   a sweep of 4, by the follower before (`scontrol show job` every second; for a sweep, each point's every 2 s
   backing off to 10 s) and by this one. `--window S` sets the seconds measured (default 60; twice that for
   this follower, whose queries are 30 s apart).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher import protocol as P  # noqa: E402
from launcher.localcluster.sdiag import rpc_counts, served  # noqa: E402
from launcher.slurm import client as slurm  # noqa: E402
from launcher.slurm import follow  # noqa: E402

STARTED = P.LINES["attempt_started"].format(job="$SLURM_JOB_ID", attempt="1", when="$(date)", nodes="node")
ENDED = P.LINES["attempt_ended"].format(job="$SLURM_JOB_ID", attempt="1", when="$(date)", code="$?")
MARKS = "\n".join(  # the job's own lines at an attempt's start and end, from the contract, its fields bash's
    [
        'log() { printf \'[launcher %s] %s\\n\' "$(date +%H:%M:%S.%3N)" "$*"; }',
        f'log "{STARTED}"',
        f"trap 'log \"{ENDED}\"' EXIT",
    ]
)
JOB = """#!/bin/bash
#SBATCH --job-name=bench-follow
#SBATCH --output={log}
{marks}
for i in $(seq 30); do echo "stamp $(date +%s.%N)"; sleep 0.5; done
echo "stamp $(date +%s.%N) end"
"""
SLEEPER = "#!/bin/bash\n#SBATCH --job-name=bench-quiet\n#SBATCH --output={log}\n{marks}\nsleep {seconds}\n"


class Arrivals:
    """A binary sink that notes when each stamped line arrives."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.last_stamp = 0.0
        self.buffer = b""

    def write(self, data: bytes) -> int:
        now = time.time()
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"stamp "):
                stamp = float(line.split()[1])
                self.delays.append(now - stamp)
                self.last_stamp = stamp
        return len(data)

    def flush(self) -> None:
        pass


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def latency(tmp: Path) -> None:
    script, log = tmp / "job.sh", tmp / "job.out"
    script.write_text(JOB.format(log=log, marks=MARKS))
    job_id = slurm.submit(script)
    sink = Arrivals()
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    final = follow.follow(job_id, log, out=sink, say=lambda _: None)  # type: ignore[arg-type]
    returned = time.time()
    cpu, wall = cpu_seconds() - cpu0, time.monotonic() - wall0
    print(f"job {job_id} {final.state}: {len(sink.delays)} lines")
    print(f"line latency: median {statistics.median(sink.delays):.3f} s, max {max(sink.delays):.3f} s (target ~1 s)")
    print(f"exit after the job's last line: {returned - sink.last_stamp:.2f} s, including the 1 s settle (target ~2 s)")
    print(f"follower CPU: {cpu:.2f} s over {wall:.1f} s wall = {100 * cpu / wall:.1f}% of a core (target < 5%)")


def before(job_ids: list[str], stop: threading.Event) -> None:
    """The follower before this one, as it asked: one job every second; a sweep's points each, every 2 s backing
    off x1.5 to 10 s while nothing changed."""
    interval = 1.0 if len(job_ids) == 1 else 2.0
    while not stop.is_set():
        for job_id in job_ids:
            slurm.job_state(job_id)
        stop.wait(interval)
        interval = 1.0 if len(job_ids) == 1 else min(interval * 1.5, 10.0)


def after(tmp: Path, job_ids: list[str], stop: threading.Event) -> None:
    """This follower: `follow.follow` for one job, `follow.watch` (one query for all) for a sweep."""
    logs = [tmp / f"quiet-{job_id}.out" for job_id in job_ids]
    if len(job_ids) == 1:
        follow.follow(job_ids[0], logs[0], out=open("/dev/null", "wb"), say=lambda _: None)  # noqa: SIM115
    else:
        jobs = [follow.Watched(j, follow.LogTail(log, None)) for j, log in zip(job_ids, logs, strict=True)]
        follow.watch(jobs, lambda *_: None)


def rpcs_an_hour(tmp: Path, jobs: int, window: float, run: Callable[..., None]) -> tuple[float, dict[str, int]]:
    """Start `jobs` sleeping jobs, follow them with `run` once all run, count the controller's RPCs over `window`
    seconds, cancel them (the follower notices from their logs) and wait for the follower to return."""
    script = tmp / "quiet.sh"
    script.write_text(SLEEPER.format(log=tmp / "quiet-%j.out", marks=MARKS, seconds=int(window) + 600))
    job_ids = [slurm.submit(script) for _ in range(jobs)]
    while not all((s := slurm.job_state(j)) is not None and s.state == "RUNNING" for j in job_ids):
        time.sleep(0.5)
    stop = threading.Event()
    args = (job_ids, stop) if run is before else (tmp, job_ids, stop)
    follower = threading.Thread(target=run, args=args, daemon=True)
    follower.start()
    time.sleep(2)  # the follower's first look, which any follower makes
    start = rpc_counts()
    time.sleep(window)
    counts = served(start, rpc_counts())
    stop.set()
    subprocess.run(["scancel", *job_ids], check=True)
    follower.join(timeout=60)
    return sum(counts.values()) * 3600 / window, dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured (this follower: twice that)")
    parser.add_argument("--skip_latency", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_latency:
            latency(Path(tmp))
        for jobs in (1, 4):
            what = "one running job" if jobs == 1 else f"a sweep of {jobs} running jobs"
            old, old_kinds = rpcs_an_hour(Path(tmp), jobs, args.window, before)
            new, new_kinds = rpcs_an_hour(Path(tmp), jobs, 2 * args.window, after)
            print(f"{what}: {old:,.0f} RPCs/hour before ({old_kinds}), {new:,.0f} now ({new_kinds})")


if __name__ == "__main__":
    main()
