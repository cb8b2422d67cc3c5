"""Every decision the supervisor makes, as pure functions of its state and what it read: what a notice does in each
phase, whether the port is tried again, what follows the restart decision, and how the attempt ends. Each returns
what to do (the lines to print as `(name, fields)`, the files to touch, the exit code); the attempt does it through
its effects. docs/supervisor.md has them as tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher import protocol as P
from launcher.node import restart
from launcher.node.restart import Decision
from launcher.node.supervisor.state import DECISION_VERDICTS, HANG, TERM, WARN, Notice, Phase, Then, Verdict

Line = tuple[str, dict[str, object]]  # a contract line: its name in protocol.LINES and its fields
FINAL = (Notice.TERMINATED,)  # a notice nothing overrides: the attempt ends
STEP_PHASES = (Phase.NODE_CHECK, Phase.STEP)  # where a step runs (a hang's stacks can be dumped, the step stopped)
DEFAULT_KILL_WAIT_S = 30.0  # Slurm's KillWait where scontrol does not say
TERM_MARGIN_S = 2.0  # after a SIGTERM: the attempt's last lines are out this long before Slurm's SIGKILL
MIN_TERM_WAIT_S = 0.5
LEFT_STATUS = 128 + TERM  # the status of a step the supervisor stopped waiting for after a SIGTERM (Slurm ends it)


@dataclass(frozen=True)
class Reaction:
    """What a signal does: the notice after it, and its effects."""

    notice: Notice
    lines: tuple[Line, ...] = ()
    stop_file: bool = False  # touch the stop file (training checkpoints at its next step and exits)
    hang: bool = False  # dump the step's stacks, name the suspects, stop the step


def on_signal(phase: Phase, notice: Notice, signum: int) -> Reaction:
    """A notice that comes during `phase` while the attempt's notice is `notice`.

    - USR1: the time-limit (or preemption) warning: the stop file, and the notice is "warned", but after a SIGTERM
      (the attempt ends whatever comes next).
    - SIGTERM: the attempt ends (Slurm's verdict stands); while the job requeues itself, it is the requeue's own
      SIGTERM, and nothing.
    - USR2: the watchdog's hang, only while a step runs (a watchdog's signal after its step ended is stale); it
      dumps the stacks and stops the step, and the notice is "hung" where no warning or SIGTERM came first (those
      stand: the step ends by them).
    """
    if signum == WARN:
        kept = notice if notice in FINAL else Notice.WARNED
        return Reaction(kept, (("warned", {}),), stop_file=True)
    if signum == TERM:
        if phase == Phase.REQUEUING:
            return Reaction(notice)
        return Reaction(Notice.TERMINATED, (("terminated", {}),))
    if signum == HANG:
        if phase not in STEP_PHASES or notice in FINAL:
            return Reaction(notice)
        return Reaction(Notice.HUNG if notice == Notice.NONE else notice, hang=True)
    return Reaction(notice)


def wait_after_term(kill_wait_s: float | None) -> float:
    """How long the supervisor waits for the step after a SIGTERM (training may save meanwhile) before it ends the
    attempt without it: Slurm SIGKILLs every process of the job KillWait s after its SIGTERM, the supervisor too,
    and the attempt's last lines (`outcome`, `attempt_ended`) must be out before. Unknown KillWait: Slurm's
    default (30 s)."""
    kill_wait = DEFAULT_KILL_WAIT_S if kill_wait_s is None else kill_wait_s
    return max(MIN_TERM_WAIT_S, kill_wait - TERM_MARGIN_S)


def starts_step(notice: Notice) -> bool:
    """Whether a node step starts (or starts again): never after a SIGTERM."""
    return notice not in FINAL


def retry_port(port_taken: bool, notice: Notice) -> bool:
    """After the step ended: try another port where the first node found its port taken, and no notice came."""
    return port_taken and notice == Notice.NONE


NO_PYTHON_STATUS = (2, 13)  # srun's status where the task's program cannot start: execve's ENOENT, EACCES


def python_missing(status: int, image: str, report: str) -> bool:
    """Whether the node step never started in the container: srun could not run the job's Python in the image (the
    step itself never ends with those statuses, and a step that started would have reported its node check)."""
    return bool(image) and status in NO_PYTHON_STATUS and not report


def notice_at_step_end(notice: Notice, preempt_time: str, report: str) -> tuple[Notice, list[Line]]:
    """The notice as the step ends: a preemption Slurm recorded (PreemptTime) is the notice (a USR1 that came with it
    was the preemption's), but after a SIGTERM; a failed node check (its `report`) is one where nothing else came."""
    lines: list[Line] = []
    if notice != Notice.TERMINATED and preempt_time and preempt_time != "None":
        notice = Notice.PREEMPTED
        what = f"Slurm preempted this job at {preempt_time} for a job of higher priority"
        lines.append(("preemption", {"what": what}))
    if report and notice == Notice.NONE:
        notice = Notice.NODE_CHECK
    return notice, lines


def needs_decision(verdict: Verdict, max_restarts: int) -> bool:
    """Whether the restart decision is asked (else the attempt ends by the verdict)."""
    return verdict in DECISION_VERDICTS and max_restarts != 0


@dataclass(frozen=True)
class Next:
    """What follows the restart decision (`then`), by what: its lines, the requeue's nodes left out and reason, the
    exit code."""

    then: Then
    verdict: Verdict
    lines: tuple[Line, ...] = ()
    amend: str | None = None  # the restarts record's last line: "none" (dropped) or "requeue" (what the job did)
    exclude: tuple[str, ...] = ()
    why: str = ""  # the requeue's record's reason
    code: int = 0
    notice: Notice | None = None  # the notice from here on, where it changes
    resaved: bool = False  # what was saved is the latest checkpoint now (not training's word before the decision)


def _requeue_line(said: str, nodes: Sequence[str]) -> Line:
    return ("requeue_without", {"why": said, "without": f" without {' '.join(nodes)}" if nodes else ""})


def after_decision(notice: Notice, decision: Decision | None, verdict: Verdict, status: int) -> Next:
    """After the restart decision (None: it had no answer): a notice that came while it ran stands (a SIGTERM ends
    the attempt, a warning requeues as it would have), else its answer. A restart is RESTART here: restart_on_nodes
    checks the nodes."""
    action = decision.action if decision is not None else ""
    if notice == Notice.TERMINATED or (notice == Notice.WARNED and action not in (restart.REQUEUE, restart.STOP)):
        amend = None
        if notice == Notice.TERMINATED and action in (restart.RESTART, restart.REQUEUE):
            amend = "none"
        elif action == restart.RESTART:
            amend = "requeue"
        line: Line = ("notice_over_restart", {"notice": notice.value})
        verdict = Verdict.ENDED if notice == Notice.TERMINATED else Verdict.REQUEUE
        return Next(Then.END, verdict, (line,), amend, resaved=True)
    if decision is None or action not in (restart.RESTART, restart.REQUEUE, restart.STOP):
        return Next(Then.END, verdict, (("no_decision", {"answer": action or "nothing"}),))
    if action == restart.RESTART:
        return Next(Then.RESTART, verdict)
    if action == restart.REQUEUE:
        return Next(Then.REQUEUE, verdict, (_requeue_line(decision.said, decision.nodes),),
                    exclude=tuple(decision.nodes), why=decision.why)  # fmt: skip
    line = ("no_restart", {"why": decision.said, "reason": decision.reason, "fix": decision.fix})
    return Next(Then.EXIT, verdict, (line,), code=status if verdict == Verdict.FAILED else decision.code)


def restart_on_nodes(notice: Notice, decision: Decision, verdict: Verdict, step_nodes: Sequence[str], layout: int,
                     max_requeues: int, max_restarts: int) -> Next:  # fmt: skip
    """A restart, with the step's nodes chosen again without the failed ones: the step again where the layout's
    nodes are there; else a requeue without them (where the job may requeue itself), or the attempt's end."""
    said, nodes = decision.said, tuple(decision.nodes)
    if len(step_nodes) != layout:  # the allocation lost nodes since the decision read it
        said = f"{said}; {len(step_nodes)} of the layout's {layout} nodes left in the allocation"
        if max_requeues == 0:
            fix = "launch again to resume; --max_requeues N lets it requeue itself"
            line: Line = ("no_restart", {"why": said, "reason": "the job may not requeue itself", "fix": fix})
            return Next(Then.END, verdict, (line,), "none")
        return Next(Then.REQUEUE, verdict, (_requeue_line(said, nodes),), "requeue", nodes, decision.why)
    line = ("restart", {"count": decision.count, "most": max_restarts, "left": ",".join(nodes) or "none",
                        "nodes": ",".join(step_nodes), "step": decision.checkpoint, "why": said})  # fmt: skip
    after = Notice.NONE if notice in (Notice.HUNG, Notice.NODE_CHECK) else notice
    return Next(Then.RESTART, verdict, (line,), notice=after)


@dataclass(frozen=True)
class End:
    """How the attempt ends: its lines, a requeue (`why`, for the requeues record; `by_slurm`: Slurm requeues it
    itself as it ends) and the exit code."""

    lines: tuple[Line, ...]
    code: int
    requeue: str | None = None
    by_slurm: bool = False


def end_of_attempt(verdict: Verdict, notice: Notice, status: int, saved: str, time_limits: int, max_requeues: int,
                   slurm_requeues: bool, version: str = "") -> End:  # fmt: skip
    """The attempt's end by its verdict. Preemptions always requeue (Slurm itself where it requeues preempted jobs:
    `slurm_requeues`, read only for a preemption); time limits up to `max_requeues` times (`time_limits`: the job's
    requeues after time limits so far)."""
    if verdict == Verdict.REQUEUE:
        if notice == Notice.PREEMPTED:
            if slurm_requeues:
                return End((("requeue_by_slurm", {"step": saved, "version": version}),), 0, "preemption", True)
            return End((("requeue_preemption", {"step": saved}),), 0, "preemption")
        if time_limits < max_requeues:
            line: Line = ("requeue_time_limit", {"step": saved, "count": time_limits + 1, "most": max_requeues})
            return End((line,), 0, "time-limit")
        return End((("no_requeue_left", {"step": saved, "most": max_requeues}),), 3)
    if verdict == Verdict.HUNG:
        return End((), 1)
    if verdict == Verdict.UNHEALTHY:
        return End((), 5)
    if verdict == Verdict.STOPPED:
        return End((("stop_file", {"step": saved}),), 3)
    if verdict == Verdict.COMPLETE:
        lines: list[Line] = []
        if notice != Notice.NONE:
            lines.append(("late_notice", {"notice": notice.value}))
        if notice == Notice.PREEMPTED and slurm_requeues:  # (with Requeue=0 the job would end PREEMPTED)
            lines.append(("slurm_requeues_finished", {"version": version}))
        return End(tuple(lines), 0)
    return End((), status)  # ended, failed


def first_port(job: int) -> int:
    """Where the rendezvous port is first looked for: the job's own place in the window."""
    return P.RDZV_PORT_LOW + job % P.RDZV_PORT_SPAN


def next_port(port: int) -> int:
    """The port after `port` in the rendezvous window (wrapping)."""
    return P.RDZV_PORT_LOW + (port + 1 - P.RDZV_PORT_LOW) % P.RDZV_PORT_SPAN


def candidate_ports(start: int) -> list[int]:
    """The ports tried from `start` on the rendezvous host: RDZV_PORT_TRIES of them, wrapping in the window."""
    return [P.RDZV_PORT_LOW + (start - P.RDZV_PORT_LOW + k) % P.RDZV_PORT_SPAN for k in range(P.RDZV_PORT_TRIES)]


def choose_nodes(batch_node: str, allocation: Sequence[str], left_out: Sequence[str], layout: int) -> list[str]:
    """The step's nodes: the batch host first, then the allocation's, once each, without those left out, at most the
    layout's count (fewer: the allocation lost nodes, which the caller checks)."""
    chosen: list[str] = []
    for node in [batch_node, *allocation]:
        if node and node not in chosen and node not in left_out:
            chosen.append(node)
    return chosen[:layout]
