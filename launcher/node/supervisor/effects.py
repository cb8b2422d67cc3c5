"""The supervisor's effects: the contract lines it prints, the records it writes, the one-writer lock, Slurm's
commands (argument lists, time-limited) and the node step as a child process. `Effects` is the interface the
supervisor acts through; `Node` is the real one (tests use it too, with real child processes, and replace only the
Slurm side where no cluster runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol

from launcher import protocol as P
from launcher.node.supervisor.decide import LEFT_STATUS

# A holder in one of these states is alive (pending, running, requeued, ...): its lock stands.
LIVE_STATES = frozenset(
    "PENDING RUNNING SUSPENDED REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING SIGNALING CONFIGURING COMPLETING STAGE_OUT "
    "SPECIAL_EXIT".split()
)
POLL_S = 0.2  # how often the supervisor looks at its pending notices while the step runs
RESTART_ACTION = re.compile(r"^(\S*) restart job ")
_PRINTING = threading.Lock()  # the heartbeat's thread prints too: one whole line at a time


def stamp() -> str:
    """The lines' time stamp, as the script's `date +%H:%M:%S.%3N`."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def say(name: str, out: IO[str] | None = None, **fields: object) -> None:
    """A contract line (protocol.LINES), printed whole and at once: `[launcher HH:MM:SS.mmm] ...`."""
    stream = out or sys.stdout
    with _PRINTING:
        stream.write(P.line(name, stamp=stamp(), **fields) + "\n")
        stream.flush()


def amend_restart_record(path: Path, how: str) -> None:
    """The restart decision's record (the restarts file's last line) of a restart the job did not make: "none"
    drops it (this attempt ends), else its action becomes `how` (the job requeued instead)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return
    if lines and how == "none":
        lines.pop()
    elif lines:
        lines[-1] = RESTART_ACTION.sub(lambda m: f"{m[1]} {how} job ", lines[-1], count=1)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(path)


def append_requeue_record(path: Path, why: str, attempt: int, saved: str, nodes: Sequence[str]) -> None:
    """One REQUEUE_FORMAT line: why the job requeued itself, in which attempt, from which step, without which nodes."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(P.REQUEUE_FORMAT.format(why=why, attempt=attempt, step=saved, nodes=" ".join(nodes) or "-") + "\n")


def requeued(path: Path, why: str) -> int:
    """How many times the job's records say it requeued for `why`."""
    try:
        return sum(line.startswith(why + " ") for line in path.read_text(encoding="utf-8").splitlines())
    except OSError:
        return 0


def take_lock(checkpoints: Path, job: str, job_state: Callable[[str], str]) -> tuple[str, str] | None:
    """One writer per run: the lock under the checkpoints path (a directory: mkdir is atomic, on shared filesystems
    too) names the job that trains the run. Taken (or this job's own, from an earlier attempt): None. Held by a job
    alive: (that job, its state). A dead job's lock is taken over."""
    lock = checkpoints / P.LOCK
    checkpoints.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            pass
        holder = _holder(lock)
        if not holder:
            time.sleep(1)  # being written by the job that just made it
            holder = _holder(lock)
        if holder == job:
            break
        state = job_state(holder or "0")
        if state in LIVE_STATES:
            return holder, state
        stale = lock.with_name(f"{P.LOCK}.stale.{job}")
        try:
            lock.rename(stale)
        except OSError:
            continue  # another job took it over first: look again
        for child in stale.iterdir():
            child.unlink()
        stale.rmdir()
    (lock / P.LOCK_HOLDER).write_text(job + "\n", encoding="utf-8")
    return None


def _holder(lock: Path) -> str:
    try:
        return (lock / P.LOCK_HOLDER).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def run(argv: Sequence[str], timeout: float, kill_after: float = 10) -> subprocess.CompletedProcess[str]:
    """A command, its output kept, ended (then killed) after `timeout` s: a node that does not answer holds up
    nothing. A command that cannot run is a failed one (exit code 127), not a traceback."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def field_of(text: str, name: str) -> str:
    """A `Name=value` field of scontrol's one-line output (`-o`), "" where absent."""
    for word in text.split():
        if word.startswith(name + "="):
            return word[len(name) + 1 :]
    return ""


EXCLUDE_TRIES, EXCLUDE_EVERY_S = 6, 0.5  # the exclusion's tries after a requeue: within KillWait (5 s here)


class Effects(Protocol):
    """What the supervisor does to the world, and all it reads of it besides its own files."""

    def say(self, name: str, **fields: object) -> None: ...
    def job_field(self, job: str, name: str) -> str: ...
    def hostnames(self, hostlist: str) -> list[str]: ...
    def node_addr(self, node: str) -> str: ...
    def partition_field(self, partition: str, name: str) -> str: ...
    def version(self) -> str: ...
    def kill_wait(self) -> float | None: ...
    def requeue(self, job: str) -> bool: ...
    def exclude(self, job: str, nodes: Sequence[str], excluded: str) -> bool: ...
    def run_step(self, argv: Sequence[str], env: dict[str, str] | None, wake: Callable[[], bool]) -> int: ...
    def stop_step(self) -> None: ...
    def overlap(self, nodes: Sequence[str], argv: Sequence[str], timeout: float) -> int: ...


class Node:
    """The real effects: the batch host's view of Slurm (scontrol, srun) and its child processes."""

    def __init__(self, out: IO[str] | None = None, scontrol: str = "scontrol", srun: str = "srun") -> None:
        self.out = out
        self.scontrol, self.srun = scontrol, srun
        self.step: subprocess.Popen[bytes] | None = None

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

    def run_step(self, argv: Sequence[str], env: dict[str, str] | None, wake: Callable[[], bool]) -> int:
        """The node step as a child process, to its end: its exit status (a signal's: 128 + its number, as bash
        says). `wake` runs every POLL_S s meanwhile: the supervisor handles the notices that came; where it answers
        False (Slurm's SIGKILL is near), the step is left to Slurm and the status is `LEFT_STATUS`."""
        self.step = subprocess.Popen(list(argv), env=env)
        try:
            while True:
                try:
                    code = self.step.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    if not wake():
                        return LEFT_STATUS
            wake()  # a notice that came as the step ended
        finally:
            self.step = None
        return 128 - code if code < 0 else code

    def stop_step(self) -> None:
        """End the step that runs (a hang's end, once its stacks are dumped): SIGTERM, then SIGKILL after 10 s."""
        step = self.step
        if step is None or step.poll() is not None:
            return
        step.terminate()
        try:
            step.wait(timeout=10)
        except subprocess.TimeoutExpired:
            step.kill()

    def overlap(self, nodes: Sequence[str], argv: Sequence[str], timeout: float) -> int:
        """`argv` once on each of `nodes`, beside the step (srun --overlap), time-limited: a hang's stack dumps."""
        n = str(len(nodes))
        srun = [
            self.srun,
            "--overlap",
            f"--nodes={n}",
            f"--ntasks={n}",
            f"--nodelist={','.join(nodes)}",
            "--export=ALL",
        ]
        return run([*srun, *argv], timeout).returncode


def environment(extra: dict[str, str]) -> dict[str, str]:
    """The step's environment: the supervisor's own (srun's --export=ALL), with `extra`."""
    return {**os.environ, **extra}
