"""The login node's side at 4,000 nodes: gpus.png from 4,000 nodes' monitor logs of a 1-hour run, triage of a
2 GiB job log, attaching to it (the follower's copy). Files generated under /tmp and deleted. Not a test.

    python bench/bench_scale_logs.py [--nodes 4000] [--samples 240] [--log-gib 2]

Each measurement runs in a child process of its own: wall time and peak memory (max RSS) are its alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHILD = {
    "pictures": "from launcher.report import pictures; from pathlib import Path; import sys\n"
    "d = Path(sys.argv[1]); print(pictures.gpus_picture(d, '99', d / 'gpus.png', 'bench'))",
    "triage": "from launcher.runs import submission; from launcher.slurm import triage; from pathlib import Path\n"
    "import sys; print(triage.verdict('FAILED', submission.read_log(Path(sys.argv[1])), exit_code=1))",
    "attach": "from launcher.slurm.follow import LogTail; from pathlib import Path; import sys\n"
    "out = open('/dev/null', 'wb'); print(LogTail(Path(sys.argv[1]), out).pump())",
}


def measure(what: str, arg: Path) -> dict:
    code = (
        f"import resource, sys, time\nsys.path[:0] = [{str(ROOT)!r}]\nstarted = time.monotonic()\n{CHILD[what]}\n"
        "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print('WALL', time.monotonic() - started, 'RSS_MIB', rss)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(arg)], capture_output=True, text=True, timeout=3600)
    last = out.stdout.strip().splitlines()[-1].split() if out.stdout.strip() else []
    result = out.stdout.strip().splitlines()[0][:150] if out.stdout.strip() else out.stderr[-300:]
    return {"what": what, "wall_s": round(float(last[1]), 1) if last else None,
            "peak_rss_mib": round(float(last[3])) if last else None, "result": result}  # fmt: skip


def big_log(path: Path, gib: float) -> int:
    """A job log of `gib` GiB: an attempt's start, steps of 32,000 ranks' worth of lines, a traceback at the end."""
    line = "step 1234/100000 | loss 2.1234 | lr 3.0e-04 | grad_norm 0.912 | tokens/s 12345678 | mfu 41.2%\n"
    block = line * 10_000
    with open(path, "w") as f:
        f.write("[launcher 10:00:00.000] job 99 attempt 1 started 2026-11-24T10:00:00+00:00 on node[0000-3999]\n")
        while f.tell() < gib * 2**30:
            f.write(block)
        f.write("[rank12345]: Traceback (most recent call last):\n")
        f.write("[rank12345]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
        f.write("[launcher 11:00:00.000] job 99 attempt 1 ended, exit code 1\n")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--samples", type=int, default=240, help="dmon samples a node (every 15 s): 240 = 1 hour")
    parser.add_argument("--log-gib", type=float, default=2.0)
    args = parser.parse_args()
    from synthetic_dmon import write_logs

    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-logs-"))
    try:
        size = write_logs(tmp / "dmon", "99", args.nodes, 8, args.samples, slow={17})
        print(json.dumps({"dmon_logs": args.nodes, "mib": round(size / 2**20)}), flush=True)
        print(json.dumps(measure("pictures", tmp / "dmon")), flush=True)
        shutil.rmtree(tmp / "dmon")
        size = big_log(tmp / "job.out", args.log_gib)
        print(json.dumps({"job_log_gib": round(size / 2**30, 2)}), flush=True)
        print(json.dumps(measure("triage", tmp / "job.out")), flush=True)
        print(json.dumps(measure("attach", tmp / "job.out")), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
