"""Follower latency and cost against the local cluster (targets: a line within ~1 s, exit within ~2 s of the
job's end, well under 5% of a core while waiting). Not a test.

    python -m launcher.localcluster up && SLURM_CONF=$PWD/.slurm/etc/slurm.conf python bench/bench_follow.py

Submits a job that prints a timestamp every 0.5 s for 15 s, follows it in this process, and reports the delay
between each line's timestamp and its arrival, the delay between the job's last line and the follower's return,
and the follower's CPU time (its own plus its scontrol calls) over the wall time.
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.slurm import client as slurm  # noqa: E402
from launcher.slurm import follow  # noqa: E402

JOB = """#!/bin/bash
#SBATCH --job-name=bench-follow
#SBATCH --output={log}
for i in $(seq 30); do echo "stamp $(date +%s.%N)"; sleep 0.5; done
echo "stamp $(date +%s.%N) end"
"""


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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script, log = Path(tmp) / "job.sh", Path(tmp) / "job.out"
        script.write_text(JOB.format(log=log))
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


if __name__ == "__main__":
    main()
