"""The supervisor's orchestrator (launcher/node/supervisor/attempt.py) as a real process for
tests/test_supervisor_loop.py: `python supervisor_loop_harness.py DIR MODE LAYOUT`. Job 77 on node1-node3, node1 the
batch host, DIR the bundle. Slurm is absent: its commands are answered from DIR (the allocation from DIR/nodelist),
and the node step is a real child process in place of srun that plays training: the first step fails (exit 7), a
later one honours the stop file ("stopped 10") or finishes ("finished 10"). MODE races the restart decision: "none"
(it raises: no answer), "warn"/"term" (a USR1/SIGTERM to this process while it runs), "shrink" (a node leaves the
allocation while it runs)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from launcher.node import restart
from launcher.node.job import Job
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.effects import Node, run
from launcher.node.supervisor.state import Allocation

FOLDER, MODE, LAYOUT = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
TRAINING = r"""
import os, pathlib, sys
folder = pathlib.Path(sys.argv[1])
n = int((folder / "steps").read_text()) + 1 if (folder / "steps").exists() else 1
(folder / "steps").write_text(str(n))
if n == 1:
    sys.exit(7)
if (folder / "stop-requested").exists():
    (folder / "outcome").write_text("stopped 10\n")
else:
    (folder / "outcome").write_text("finished 10\n")
"""


class NoSlurm(Node):
    def job_field(self, job: str, name: str) -> str:
        return {"NodeList": (FOLDER / "nodelist").read_text().strip(), "ExcNodeList": "(null)"}.get(name, "")

    def hostnames(self, hostlist: str) -> list[str]:
        return [n for n in hostlist.split(",") if n]

    def kill_wait(self) -> float | None:
        return 5.0

    def node_addr(self, node: str) -> str:
        return "127.0.0.1"

    def partition_field(self, partition: str, name: str) -> str:
        return "3" if name == "TotalNodes" else ""

    def requeue(self, job: str) -> bool:
        (FOLDER / "requeued").write_text(job)
        return run(["kill", "-TERM", str(os.getpid())], 10).returncode == 0  # the requeue's own SIGTERM

    def run_step(self, argv: Sequence[str], wake: Callable[[], bool]) -> int:
        with open(FOLDER / "srun.calls", "a") as f:
            f.write(" ".join(argv) + "\n")
        return super().run_step([sys.executable, "-c", TRAINING, str(FOLDER)], wake)

    def restart_decision(self, step: restart.Step, job: Job, job_id: str, offset: int) -> restart.Decision:
        (FOLDER / "watchdog-in-decision").write_text(str(self.watchdog is not None))
        if MODE == "none":
            raise RuntimeError("no answer")
        if MODE in ("warn", "term"):
            os.kill(os.getpid(), signal.SIGUSR1 if MODE == "warn" else signal.SIGTERM)
            time.sleep(1)
        if MODE == "shrink":
            (FOLDER / "nodelist").write_text("node1\n")
        return super().restart_decision(step, job, job_id, offset)


def main() -> int:
    (FOLDER / "nodelist").write_text("node1,node2,node3\n")
    job = Job("t", FOLDER, FOLDER / "job.log", FOLDER / "ck", Path(sys.executable), Path.cwd(), FOLDER / "train.py",
              FOLDER / "config.yaml", "auto", LAYOUT, 1, FOLDER, spare_nodes=1, max_requeues=1, max_restarts=10,
              hang_timeout=600, heartbeat_s=300)  # fmt: skip
    attempt = Attempt(job, Allocation("77", 1, "node1,node2,node3", "node1", "debug"), NoSlurm())
    attempt.install()
    try:
        code = attempt.run()
    finally:
        attempt.close()
    (FOLDER / "result.json").write_text(json.dumps({"code": code, "notice": attempt.state.notice.value}))
    return code


if __name__ == "__main__":
    sys.exit(main())
