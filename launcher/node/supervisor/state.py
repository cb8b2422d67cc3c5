"""The supervisor's words and its state: what the batch script keeps today in a dozen bash globals."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum


class Notice(str, Enum):
    """What the attempt was told, or found, while its step ran (the bash script's `notice`)."""

    NONE = "none"
    WARNED = "warned"  # USR1 (--signal): the time limit is near, or a preemption's own signal
    PREEMPTED = "preempted"  # Slurm's PreemptTime is set as the step ends (a USR1 with it is the preemption's)
    TERMINATED = "terminated"  # SIGTERM to the supervisor: a cancel, the time limit itself, a grace time's end
    HUNG = "hung"  # the watchdog's USR2: no progress for too long
    PREFLIGHT = "preflight"  # the node checks failed on some nodes (the preflight report is not empty)


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

    STARTING = "starting"  # the lock, the pre-launch commands, the nodes and the port: no step yet
    NODE_CHECK = "node check"  # the step runs, training has not reported progress yet (the node checks, torchrun)
    STEP = "step"  # training runs
    DECIDING = "deciding"  # the step ended: the verdict, the restart decision
    REQUEUING = "requeuing"  # `scontrol requeue` is under way (its own SIGTERM comes to the supervisor)
    ENDING = "ending"  # the exit code is chosen: nothing more starts


class Action(str, Enum):
    """The restart decision's answer (launcher/node/restart.py's Decision.action), or none could be had."""

    RESTART = "restart"
    REQUEUE = "requeue"
    STOP = "stop"
    NOTHING = ""  # no answer (a traceback, a timeout): the attempt ends as it would without restarts


# The signals the supervisor takes, by what they mean (docs/preemption.md)
WARN, TERM, HANG = signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2
SIGNALS = (WARN, TERM, HANG)
DECISION_VERDICTS = (Verdict.HUNG, Verdict.UNHEALTHY, Verdict.FAILED)  # the restart decision's to answer


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
