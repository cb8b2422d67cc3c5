"""The node check at 1,000-4,000 nodes, simulated on loopback: the head (the job's nodecheck.py, run by path, its
open-file limit set like a common Slurm soft limit) against N peers (threads in this process). Not a test.

    python bench/bench_scale_nodecheck.py [--nodes 1100 4000] [--files 1024] [--before REF]

For each N: the head's exit status and verdict, the wall time until every peer had its answer, and the most
files the head held open at once (sampled from /proc). `--before main~N` (a git ref) runs the same against that
version of nodecheck.py, for the before/after table in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"nodecheck_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


PROCESSES = 8  # the simulated peers: threads in 8 processes (one process's lock would be the bottleneck)


def peers(script: str, port: int, names: list[str], group: list[str]) -> dict[str, int]:
    """One process's share of the peers, a thread each: node -> how many problems its answer names as unreached."""
    module, answers = load(Path(script)), {}

    def peer(name: str) -> None:
        verdict = module.gather("127.0.0.1", port, names, name, [], 120)
        answers[name] = sum("reach" in p for p in verdict.get(name, []))

    threads = [threading.Thread(target=peer, args=(n,)) for n in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def one(script: Path, nodes: int, files: int) -> dict:
    port = free_port()
    names = ["head"] + [f"n{i}" for i in range(nodes - 1)]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report"
        argv = [sys.executable, str(script), "--head", "127.0.0.1", "--port", str(port), "--nodes", ",".join(names),
                "--node", "head", "--gpus", "8", "--timeout", "120", "--report", str(report)]  # fmt: skip
        started = time.monotonic()
        limit = (files, files)
        head = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))  # fmt: skip
        peak, done = [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                try:
                    peak[0] = max(peak[0], len(os.listdir(f"/proc/{head.pid}/fd")))
                except OSError:
                    pass
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        groups = [names[1:][i::PROCESSES] for i in range(PROCESSES)]
        with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
            results = pool.starmap(peers, [(str(script), port, names, group) for group in groups])
        answers = {k: v for part in results for k, v in part.items()}
        wall = time.monotonic() - started
        out, _ = head.communicate(timeout=300)
        done.set()
        sampler.join()
        unreached = sum(1 for v in answers.values() if v)
        return {"nodes": nodes, "rc": head.returncode, "wall_s": round(wall, 1), "head_peak_fds": peak[0],
                "peers_answered": len(answers) - unreached, "peers_unreached": unreached,
                "head_says": (out.strip().splitlines() or [""])[-1][:160]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1100, 4000])
    parser.add_argument("--files", type=int, default=1024, help="the head's open-file limit (soft and hard)")
    parser.add_argument("--before", help="a git ref: also run that version of nodecheck.py")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the peers' side: one process holds them all
    threading.stack_size(256 * 1024)
    scripts = {"after": ROOT / "launcher/node/nodecheck.py"}
    if args.before:
        old = Path(tempfile.mkdtemp()) / "nodecheck.py"
        show = ["git", "-C", str(ROOT), "show", f"{args.before}:launcher/node/nodecheck.py"]
        old.write_text(subprocess.check_output(show, text=True))
        scripts = {"before": old, **scripts}
    for label, script in scripts.items():
        for nodes in args.nodes:
            print(label, one(script, nodes, args.files), flush=True)


if __name__ == "__main__":
    main()
