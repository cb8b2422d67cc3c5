"""A real supervisor process for tests/test_supervisor_process.py: `python supervisor_harness.py DIR`, one node step
(TRAINING below, a real child process that honours the stop file as training does), then the attempt's end, exit
code and all. DIR is the bundle. Only Slurm is absent: the job's fields are empty, a requeue is a real child process
that sends the supervisor SIGTERM (as `scontrol requeue` makes Slurm do), and the node step's `stop` beside the step
ends the training process, as the step's own `stop` does on a node."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from launcher.node.job import Job
from launcher.node.supervisor import followers
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.effects import Node, run
from launcher.node.supervisor.records import take_lock
from launcher.node.supervisor.state import Allocation
from launcher.retention.rules import Rules

TRAINING = r"""
import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
(folder / "progress").write_text("1 0.0 train\n")
(folder / "training.pid").write_text(str(os.getpid()))
def save(step):  # as the torch engine saves: noted first, then the step's files, then the pointer
    with open(folder / "ck" / "saves", "a") as f:
        f.write(f"{step}\n")
    (folder / "ck" / str(step)).mkdir()
    for name in ("state.pt", "meta.json"):
        (folder / "ck" / str(step) / name).write_text("x" * 1000)
    (folder / "ck" / "latest").write_text(f"{step}\n")
if (folder / "keep").exists():  # checkpoints 2 and 4 while it runs, and 6 as it ends
    for step in (2, 4):
        save(step)
        time.sleep(0.6)
    save(6)
    (folder / "outcome").write_text("finished 6\n")
    sys.exit(0)
while not (folder / "stop-requested").exists():
    time.sleep(0.05)
(folder / "stop-requested").unlink()
(folder / "outcome").write_text("stopped 10\n")
"""
FOLDER = Path(sys.argv[1])


class NoSlurm(Node):
    def job_field(self, job: str, name: str) -> str:
        return ""

    def requeue(self, job: str) -> bool:
        (FOLDER / "requeued").write_text(job)
        return run(["kill", "-TERM", str(os.getpid())], 10).returncode == 0  # the requeue's own SIGTERM

    def exclude(self, job: str, nodes: object, excluded: str) -> bool:
        return True

    def overlap(self, nodes: Sequence[str], argv: Sequence[str], timeout: float) -> int:
        if argv[-1] == "stop":  # (a training process stopped by the test, SIGSTOP, ends too)
            training = int((FOLDER / "training.pid").read_text())
            os.kill(training, signal.SIGTERM)
            os.kill(training, signal.SIGCONT)
        return 0


def main() -> int:
    (FOLDER / "ck").mkdir(exist_ok=True)
    keep = Rules(keep_last=1)  # where a test asks for it
    job = Job("t", FOLDER, FOLDER / "job.log", FOLDER / "ck", Path(sys.executable), Path.cwd(), FOLDER / "train.py",
              FOLDER / "config.yaml", "auto", 1, 1, FOLDER, train_steps=6, max_requeues=2,
              retention=keep if (FOLDER / "keep").exists() else Rules())  # fmt: skip
    take_lock(job.checkpoints, "77", lambda job: "")  # the attempt's (its retention purges only under it)
    attempt = Attempt(job, Allocation("77", 1, "node1", "node1"), NoSlurm())
    attempt.state.step_nodes = ["node1"]
    followers.LOOK_EVERY_S = 0.1
    attempt.install()
    if (FOLDER / "killwait").exists():  # Slurm's KillWait, where a test sets it (else unknown: the default's)
        attempt.kill_wait_s = float((FOLDER / "killwait").read_text())
    (FOLDER / "supervisor.pid").write_text(str(os.getpid()))
    end = attempt.judge(attempt.run_step([sys.executable, "-c", TRAINING, str(FOLDER)]))
    code = attempt.finish(end)
    result = {"verdict": end.verdict.value, "status": end.status, "notice": attempt.state.notice.value, "code": code}
    (FOLDER / "result.json").write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
