"""The supervisor's effects: everything it does to the world and all it reads of it besides its own state. `Effects`
is the interface the attempt acts through: the contract lines it prints, Slurm's commands (argument lists,
time-limited), the node step and the commands beside it, the lock and the records, the restart decision, the free
port, the watchdog, and what follows each checkpoint (the eval jobs' sbatch and squeue, retention's squeue and
deletions, the S3 client's commands: `evals.submit.Queue`, `retention.purge.Slurm` and `remote.upload.World` are its
parts). `Node` is the real one (tests use it
too, with real child processes, and replace only the Slurm side where no cluster runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from launcher import commands
from launcher import protocol as P
from launcher.node import restart
from launcher.node.job import Job
from launcher.node.step import end
from launcher.node.supervisor import decide, records
from launcher.remote import client
from launcher.retention import purge

POLL_S = 0.2  # how often the supervisor looks at its pending notices while the step runs
SBATCH_TIMEOUT_S = 120  # sbatch's answer (it retries by itself for a while when the queue is full)
SQUEUE_TIMEOUT_S = 60
EXCLUDE_TRIES, EXCLUDE_EVERY_S = 6, 0.5  # the exclusion's tries after a requeue: within KillWait (5 s here)
_PRINTING = threading.Lock()  # the heartbeat's thread prints too: one whole line at a time


def say(name: str, out: IO[str] | None = None, **fields: object) -> None:
    """A contract line (protocol.LINES), printed whole and at once: `[launcher HH:MM:SS.mmm] ...`."""
    stream = out or sys.stdout
    with _PRINTING:
        stream.write(P.line(name, None, **fields) + "\n")
        stream.flush()


run = commands.run  # (the job side's one runner: launcher/commands.py)


def sbatch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a job submitted from the job runs sbatch in: the job's, without Slurm's own variables of this
    job (sbatch would read some as the new job's options); SLURM_CONF stays."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def field_of(text: str, name: str) -> str:
    """A `Name=value` field of scontrol's one-line output (`-o`), "" where absent."""
    for word in text.split():
        if word.startswith(name + "="):
            return word[len(name) + 1 :]
    return ""


def free_port_here(start: int) -> int | None:
    """The first free port of the rendezvous window's candidates from `start`, on this node."""
    for port in decide.candidate_ports(start):
        try:
            socket.create_server(("", port)).close()
        except OSError:
            continue
        return port
    return None


class Effects(Protocol):
    """What the supervisor does to the world, and all it reads of it besides its own state."""

    def say(self, name: str, **fields: object) -> None: ...
    # Slurm's side
    def job_field(self, job: str, name: str) -> str: ...
    def hostnames(self, hostlist: str) -> list[str]: ...
    def node_addr(self, node: str) -> str: ...
    def partition_field(self, partition: str, name: str) -> str: ...
    def version(self) -> str: ...
    def kill_wait(self) -> float | None: ...
    def requeue(self, job: str) -> bool: ...
    def exclude(self, job: str, nodes: Sequence[str], excluded: str) -> bool: ...
    # the node step, and what runs beside it
    def run_step(self, argv: Sequence[str], wake: Callable[[], bool]) -> int: ...
    def stop_step(self) -> None: ...
    def overlap(self, nodes: Sequence[str], argv: Sequence[str], timeout: float) -> int: ...
    def free_port(self, node: str, start: int, here: bool, python: str) -> int | None: ...
    def start_watchdog(self, argv: Sequence[str]) -> None: ...
    def stop_watchdog(self) -> None: ...
    # the run's files
    def touch(self, path: Path) -> None: ...
    def remove(self, paths: Sequence[Path]) -> None: ...
    def make_dir(self, path: Path) -> None: ...
    def take_lock(self, checkpoints: Path, job: str) -> tuple[str, str] | None: ...
    def record_requeue(self, path: Path, why: str, attempt: int, saved: str, nodes: Sequence[str]) -> None: ...
    def amend_restart(self, path: Path, how: str) -> None: ...
    def restart_decision(self, step: restart.Step, job: Job, job_id: str, offset: int) -> restart.Decision: ...
    # what follows each checkpoint (the eval jobs, retention)
    def sbatch(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]: ...
    def jobs_named(self, name: str) -> list[str] | None: ...
    def jobs_alive(self, jobs: Iterable[str]) -> Mapping[str, bool | None]: ...
    def remove_tree(self, path: Path) -> None: ...
    # the bucket (--checkpoints_remote): the S3 client's commands
    def s3(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]: ...


class Node:
    """The real effects: the batch host's view of Slurm (scontrol, srun), its child processes and the run's files."""

    def __init__(self, out: IO[str] | None = None, scontrol: str = "scontrol", srun: str = "srun",
                 sbatch: str = "sbatch", squeue: str = "squeue") -> None:  # fmt: skip
        self.out = out
        self.scontrol, self.srun, self.sbatch_command, self.squeue = scontrol, srun, sbatch, squeue
        self.step: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None

    def say(self, name: str, **fields: object) -> None:
        say(name, self.out, **fields)

    def job_field(self, job: str, name: str) -> str:
        return field_of(run([self.scontrol, "show", "job", job, "-o"], 60).stdout, name)

    def hostnames(self, hostlist: str) -> list[str]:
        return run([self.scontrol, "show", "hostnames", hostlist], 60).stdout.split()

    def node_addr(self, node: str) -> str:
        """The address Slurm knows `node` by (the rendezvous host's), "" where it says none."""
        return field_of(run([self.scontrol, "show", "node", node, "-o"], 60).stdout, "NodeAddr")

    def partition_field(self, partition: str, name: str) -> str:
        return field_of(run([self.scontrol, "show", "partition", partition, "-o"], 60).stdout, name)

    def version(self) -> str:
        """Slurm's release ("24.11.1"), "" where scontrol does not say."""
        words = run([self.scontrol, "--version"], 60).stdout.split()
        return words[-1] if words else ""

    def kill_wait(self) -> float | None:
        """Slurm's KillWait (s): how long after its SIGTERM Slurm SIGKILLs a job's processes; None where unknown."""
        for line in run([self.scontrol, "show", "config"], 60).stdout.splitlines():
            words = line.replace("=", " ").split()
            if len(words) >= 2 and words[0] == "KillWait" and words[1].isdigit():
                return float(words[1])
        return None

    def requeue(self, job: str) -> bool:
        return run([self.scontrol, "requeue", job], 120).returncode == 0

    def exclude(self, job: str, nodes: Sequence[str], excluded: str) -> bool:
        """Leave `nodes` out of the (requeued, pending) job, beside `excluded` (its ExcNodeList, read before the
        requeue): one RPC, inside KillWait's window between the requeue's SIGTERM and its SIGKILL."""
        names = [n for n in excluded.split(",") if n and excluded != "(null)"] + list(nodes)
        for _ in range(EXCLUDE_TRIES):  # 26.05 at CI's load refused the first update right after the requeue once
            if run([self.scontrol, "update", f"JobId={job}", f"ExcNodeList={','.join(names)}"], 60).returncode == 0:
                return True
            time.sleep(EXCLUDE_EVERY_S)
        return False

    def run_step(self, argv: Sequence[str], wake: Callable[[], bool]) -> int:
        """The node step (srun) as a child process, to its end: its exit status (a signal's: 128 + its number, as a
        shell says). `wake` runs every POLL_S s meanwhile: the supervisor handles the notices that came; where it
        answers False (Slurm's SIGKILL is near), the step is left to Slurm and the status is `LEFT_STATUS`."""
        self.step = subprocess.Popen(list(argv))
        try:
            while True:
                try:
                    code = self.step.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    if not wake():
                        return decide.LEFT_STATUS
            wake()  # a notice that came as the step ended
        finally:
            self.step = None
        return 128 - code if code < 0 else code

    def stop_step(self) -> None:
        """End the step that runs (a hang's end, once its stacks are dumped): SIGTERM, then SIGKILL after 10 s."""
        if self.step is not None:
            end(self.step, 10)

    def overlap(self, nodes: Sequence[str], argv: Sequence[str], timeout: float) -> int:
        """`argv` once on each of `nodes`, beside the step (srun --overlap), time-limited: a hang's stack dumps."""
        n = str(len(nodes))
        srun = [self.srun, "--overlap", f"--nodes={n}", f"--ntasks={n}", f"--nodelist={','.join(nodes)}",
                "--export=ALL"]  # fmt: skip
        return run([*srun, *argv], timeout).returncode

    def free_port(self, node: str, start: int, here: bool, python: str) -> int | None:
        """The first free rendezvous port from `start` on `node`: here, or there through srun --overlap."""
        if here:
            return free_port_here(start)
        argv = [python, "-m", "launcher.node.supervisor", "--free-port", str(start)]
        words = run([self.srun, "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--export=ALL", *argv],
                    60).stdout.split()  # fmt: skip
        return int(words[0]) if words and words[0].isdigit() else None

    def start_watchdog(self, argv: Sequence[str]) -> None:
        self.stop_watchdog()
        self.watchdog = subprocess.Popen(list(argv))

    def stop_watchdog(self) -> None:
        if self.watchdog is not None:
            end(self.watchdog, 5)
            self.watchdog = None

    def touch(self, path: Path) -> None:
        path.touch()

    def remove(self, paths: Sequence[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)

    def make_dir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)

    def take_lock(self, checkpoints: Path, job: str) -> tuple[str, str] | None:
        return records.take_lock(checkpoints, job, lambda holder: self.job_field(holder, "JobState"))

    def record_requeue(self, path: Path, why: str, attempt: int, saved: str, nodes: Sequence[str]) -> None:
        records.append_requeue_record(path, why, attempt, saved, nodes)

    def amend_restart(self, path: Path, how: str) -> None:
        restart.amend(path, how)

    def restart_decision(self, step: restart.Step, job: Job, job_id: str, offset: int) -> restart.Decision:
        """launcher/node/restart.py's answer after `step`, from the job's log from `offset` and the run's files (it
        appends its record of a restart or a requeue)."""
        return restart.answer(step, job_id, job.checkpoints, job.file(P.RESTARTS_FILE), gpus=job.gpus_per_node,
                              log=job.log, offset=offset, ranks=job.file(P.RANKS_FILE),
                              metrics=job.file(P.METRICS))  # fmt: skip

    def sbatch(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """`sbatch ARGS...` (argv[0] is sbatch's place), in the job's environment less its own Slurm variables."""
        return run([self.sbatch_command, *argv[1:]], SBATCH_TIMEOUT_S, env=sbatch_env(os.environ))

    def jobs_named(self, name: str) -> list[str] | None:
        """The jobs of that name Slurm knows (any state it still holds); None where squeue does not answer."""
        out = run([self.squeue, "-h", "--states=all", f"--name={name}", "-o", "%i"], SQUEUE_TIMEOUT_S,
                  env=sbatch_env(os.environ))  # fmt: skip
        if out.returncode != 0:
            return None
        return [word for word in out.stdout.split() if word.replace("_", "").isdigit()]

    def jobs_alive(self, jobs: Iterable[str]) -> dict[str, bool | None]:
        """Whether each job may still run (protocol.LIVE_STATES), by one squeue for them all; None for each where
        squeue does not answer (a job Slurm no longer knows has ended)."""
        wanted = sorted(set(jobs))
        if not wanted:
            return {}
        out = run([self.squeue, "-h", "-j", ",".join(wanted), "-o", "%i %T"], SQUEUE_TIMEOUT_S)
        if out.returncode != 0:
            gone = "Invalid job id" in out.stderr
            return {job: (False if gone else None) for job in wanted}
        rows = [line.split() for line in out.stdout.splitlines()]
        live = {words[0] for words in rows if len(words) == 2 and words[1] in P.LIVE_STATES}
        return {job: job in live for job in wanted}

    def remove_tree(self, path: Path) -> None:
        purge.remove_tree(path)

    def s3(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """An S3 client's command (s5cmd: a listing, a copy, a marker), a child process, time-limited."""
        return client.run(argv, timeout)
