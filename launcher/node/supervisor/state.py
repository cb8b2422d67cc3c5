"""The supervisor's words and its state: the notices, the verdicts, the phases, what follows a step, and the attempt
as one dataclass; what Slurm tells the job through its environment."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Notice(str, Enum):
    """What the attempt was told, or found, while its step ran."""

    NONE = "none"
    WARNED = "warned"  # USR1 (--signal): the time limit is near, or a preemption's own signal
    PREEMPTED = "preempted"  # Slurm's PreemptTime is set as the step ends (a USR1 with it is the preemption's)
    TERMINATED = "terminated"  # SIGTERM to the supervisor: a cancel, the time limit itself, a grace time's end
    HUNG = "hung"  # the watchdog's USR2: no progress for too long
    NODE_CHECK = "node check"  # the node check failed on some nodes (its report is not empty)


class Verdict(str, Enum):
    """How the step ended (the end-of-attempt table's verdict)."""

    ENDED = "ended"  # terminated: Slurm's own verdict stands
    COMPLETE = "complete"
    REQUEUE = "requeue"
    HUNG = "hung"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"  # on request: the stop file, no notice
    FAILED = "failed"


class Phase(str, Enum):
    """Where the attempt is when a notice comes."""

    STARTING = "starting"  # the lock, the nodes and the port: no step yet
    NODE_CHECK = "node check"  # the step runs, training has not reported progress yet (the node check, torchrun)
    STEP = "step"  # training runs
    DECIDING = "deciding"  # the step ended: the verdict, the restart decision
    REQUEUING = "requeuing"  # `scontrol requeue` is under way (its own SIGTERM comes to the supervisor)
    ENDING = "ending"  # the exit code is chosen: nothing more starts


class Then(str, Enum):
    """What follows the restart decision."""

    RESTART = "restart"  # the node step again, in this allocation
    REQUEUE = "requeue"  # the job, requeued by itself
    EXIT = "exit"  # the attempt ends with the decision's exit code
    END = "end"  # the attempt ends by the step's verdict (decide.end_of_attempt)


# The signals the supervisor takes, by what they mean (docs/preemption.md)
WARN, TERM, HANG = signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2
SIGNALS = (WARN, TERM, HANG)
DECISION_VERDICTS = (Verdict.HUNG, Verdict.UNHEALTHY, Verdict.FAILED)  # the restart decision's to answer


@dataclass(frozen=True)
class Allocation:
    """What Slurm tells the job of itself, in its environment."""

    job: str  # SLURM_JOB_ID
    attempt: int  # SLURM_RESTART_COUNT + 1
    nodelist: str  # SLURM_JOB_NODELIST, as the job started
    batch_node: str  # SLURMD_NODENAME: the node the supervisor runs on ("": the allocation's first)
    partition: str = ""  # SLURM_JOB_PARTITION

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Allocation:
        return cls(env.get("SLURM_JOB_ID", "0"), int(env.get("SLURM_RESTART_COUNT") or 0) + 1,
                   env.get("SLURM_JOB_NODELIST", ""), env.get("SLURMD_NODENAME", ""),
                   env.get("SLURM_JOB_PARTITION", ""))  # fmt: skip


@dataclass
class State:
    """One attempt of the job, as the supervisor knows it."""

    job: str  # SLURM_JOB_ID
    attempt: int  # SLURM_RESTART_COUNT + 1
    batch_node: str  # the node the supervisor runs on (the rendezvous host while it is healthy)
    port: int  # where the next rendezvous port is looked for (decide.first_port, then decide.next_port)
    phase: Phase = Phase.STARTING
    notice: Notice = Notice.NONE
    step_nodes: list[str] = field(default_factory=list)  # the step's nodes, the rendezvous host first
    left_out: list[str] = field(default_factory=list)  # nodes this attempt left out after failures
    suspects: list[str] = field(default_factory=list)  # a hang's suspects, or the nodes that failed their check
    rdzv_port: int | None = None  # the port of the step that runs (or ran last)
    started_from: int = 0  # the checkpoint step the step started from
    log_offset: int = 0  # where the step's part of the job's log starts (bytes)
    restart_suffix: str = ""  # ".N" after the Nth restart: the stack dumps' directory name
    pending: list[int] = field(default_factory=list)  # signals come and not yet handled (the handlers append)
