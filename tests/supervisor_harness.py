"""A real supervisor process for tests/test_supervisor_process.py: `python supervisor_harness.py DIR`, one node step
(TRAINING below, a real child process that honours the stop file as training does), then the attempt's end, exit
code and all. Only Slurm is absent: the job's fields are empty, and a requeue is a real child process that sends
the supervisor SIGTERM, as `scontrol requeue` makes Slurm do."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from launcher.node.supervisor import decide
from launcher.node.supervisor.effects import Node, run
from launcher.node.supervisor.state import State
from launcher.node.supervisor.supervise import Files, Supervisor

TRAINING = r"""
import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
(folder / "progress").write_text("1 0.0 train\n")
(folder / "training.pid").write_text(str(os.getpid()))
while not (folder / "stop-requested").exists():
    time.sleep(0.05)
(folder / "stop-requested").unlink()
(folder / "outcome").write_text("stopped 10\n")
"""


class NoSlurm(Node):
    def job_field(self, job: str, name: str) -> str:
        return ""

    def requeue(self, job: str) -> bool:
        (FOLDER / "requeued").write_text(job)
        return run(["kill", "-TERM", str(os.getpid())], 10).returncode == 0  # the requeue's own SIGTERM

    def exclude(self, job: str, nodes: object, excluded: str) -> bool:
        return True


FOLDER = Path(sys.argv[1])


def main() -> int:
    files = Files.in_dir(FOLDER)
    supervisor = Supervisor(State("77", 1, "node1", decide.first_port(77), step_nodes=["node1"]), NoSlurm(), files)
    supervisor.install()
    if (FOLDER / "killwait").exists():  # Slurm's KillWait, where a test sets it (else unknown: the default's)
        supervisor.kill_wait_s = float((FOLDER / "killwait").read_text())
    (FOLDER / "supervisor.pid").write_text(str(os.getpid()))
    end = supervisor.judge(supervisor.run_step([sys.executable, "-c", TRAINING, str(FOLDER)]))
    code = supervisor.finish(end, max_requeues=2)
    (FOLDER / "result.json").write_text(
        json.dumps(
            {"verdict": end.verdict.value, "status": end.status, "notice": supervisor.state.notice.value, "code": code}
        )
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
