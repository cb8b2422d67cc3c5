"""The supervisor at work: its signal handlers (they only note the signal; the notices are handled between the
step's polls, never inside a handler), one node step to its end and its verdict, and the attempt's end. The
decisions are `decide`'s and `table`'s; the effects go through `effects.Effects`."""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from launcher import protocol as P
from launcher.node import evals, watchdog
from launcher.node.supervisor import decide, table
from launcher.node.supervisor.effects import Effects, append_requeue_record, requeued
from launcher.node.supervisor.state import SIGNALS, Notice, Phase, State, Verdict

STOP_GRACE_S = 60  # after a hang's `node.sh stop`: how long the step has to end before srun itself is ended


@dataclass(frozen=True)
class Files:
    """The files the supervisor shares with the node step and training (the batch script's LAUNCHER_* values)."""

    stop: Path
    outcome: Path
    progress: Path
    hung: Path
    preflight: Path
    port_taken: Path
    requeues: Path
    restarts: Path
    log_dir: Path

    @classmethod
    def in_dir(cls, folder: Path, log_dir: Path | None = None) -> Files:
        """The files under one folder, by the protocol's names (tests; a bundle names each in its script)."""
        return cls(folder / P.STOP_FILE, folder / P.OUTCOME_FILE, folder / P.PROGRESS_FILE, folder / P.HUNG_FILE,
                   folder / P.PREFLIGHT_REPORT, folder / P.PORT_TAKEN_FILE, folder / P.REQUEUES_FILE,
                   folder / P.RESTARTS_FILE, log_dir or folder)  # fmt: skip

    def fresh_step(self) -> None:
        """What a node step's end leaves behind, gone before the next one starts."""
        for path in (self.outcome, self.progress, self.hung, self.preflight, self.port_taken):
            path.unlink(missing_ok=True)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


@dataclass(frozen=True)
class StepEnd:
    """How a node step ended."""

    status: int  # srun's exit status
    outcome: str  # training's report ("" for none)
    verdict: Verdict


class Supervisor:
    """One attempt: its state, its effects, its files."""

    def __init__(self, state: State, effects: Effects, files: Files, node_script: Sequence[str] = (),
                 max_excluded: int = 1) -> None:  # fmt: skip
        self.state, self.effects, self.files = state, effects, files
        self.node_script = list(node_script)  # the command that runs the bundle's node script (dump, stop)
        self.max_excluded = max_excluded
        self.stop_by: float | None = None  # after a hang: when srun itself is ended, if the step still runs
        self.kill_wait_s: float | None = None  # Slurm's KillWait (Effects.kill_wait), read as the attempt starts
        self.leave_by: float | None = None  # after a SIGTERM: when the step is left to Slurm (its SIGKILL is near)

    # -- notices
    def install(self) -> None:
        """Slurm's notices and the watchdog's, noted as they come; handled by `handle_pending`."""
        for signum in SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.state.pending.append(signum)

    def handle_pending(self) -> bool:
        """The notices that came, in order, by `decide.on_signal` in the phase the attempt is in now. False: a
        SIGTERM came and Slurm's SIGKILL is near: stop waiting for the step (its end is Slurm's)."""
        state = self.state
        if self.stop_by is not None and time.monotonic() >= self.stop_by:  # a hung step that did not end: srun ended
            self.stop_by = None
            self.effects.stop_step()
        if state.phase == Phase.NODE_CHECK and self.files.progress.exists():
            state.phase = Phase.STEP
        while state.pending:
            reaction = decide.on_signal(state.phase, state.notice, state.pending.pop(0))
            for name, fields in reaction.lines:
                self.effects.say(name, **fields)
            if reaction.stop_file:
                self.files.stop.touch()  # read (and removed) by training
            if reaction.notice == Notice.TERMINATED and self.leave_by is None and state.phase in decide.STEP_PHASES:
                self.leave_by = time.monotonic() + decide.wait_after_term(self.kill_wait_s)
            state.notice = reaction.notice
            if reaction.hang:
                self.on_hang()
        evals.between_polls(wait=state.phase not in decide.STEP_PHASES)  # --eval_tasks' jobs (node/evals.py)
        return self.leave_by is None or time.monotonic() < self.leave_by

    def on_hang(self) -> None:
        """The watchdog's hang: the step's stacks dumped, the suspects named, the step stopped."""
        state = self.state
        hung_step, idle, allowed = ((_text(self.files.hung) or "").split() + ["0", "?", "?"])[:3]
        stacks = self.files.log_dir / f"stacks-{state.job}-{state.attempt}{state.restart_suffix}"
        stacks.mkdir(parents=True, exist_ok=True)
        if self.node_script:
            self.effects.overlap(state.step_nodes, [*self.node_script, "dump", str(stacks)], 90)
        self.effects.say("hung", step=hung_step, idle=idle, limit=allowed, stacks=stacks)
        found, _ = watchdog.suspects(stacks, self.max_excluded)
        if found:
            self.effects.say("suspected", nodes=" ".join(found))
        if state.notice == Notice.HUNG:
            state.suspects = found
        if self.node_script:  # the training processes stopped on every node: srun then ends by itself
            self.effects.overlap(state.step_nodes, [*self.node_script, "stop"], 60)
        self.stop_by = time.monotonic() + (STOP_GRACE_S if self.node_script else 0)

    # -- a node step
    def run_step(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        """One node step to its end, the notices handled as they come: srun's exit status."""
        self.state.phase, self.stop_by = Phase.NODE_CHECK, None
        status = self.effects.run_step(argv, dict(env) if env is not None else None, self.handle_pending)
        self.state.phase, self.stop_by = Phase.DECIDING, None
        return status

    def judge(self, status: int) -> StepEnd:
        """How the step that ended with `status` ended: the notice as it ended, training's word, the verdict."""
        state = self.state
        # (after a SIGTERM, no preemption is read: Slurm's SIGKILL is near, and the notice stands)
        preempt_time = "" if state.notice == Notice.TERMINATED else self.effects.job_field(state.job, "PreemptTime")
        report = _text(self.files.preflight) or ""
        state.notice, lines = decide.notice_at_step_end(state.notice, preempt_time, report)
        for name, fields in lines:
            self.effects.say(name, **fields)
        if state.notice == Notice.PREFLIGHT:
            state.suspects = table.preflight_suspects(report)
        outcome = table.read_outcome(_text(self.files.outcome))
        self.effects.say("outcome", word=outcome or "none")
        return StepEnd(status, outcome, table.verdict(state.notice, outcome, status))

    # -- the attempt's end
    def requeue(self, why: str, saved: str, nodes: Sequence[str] = (), by_slurm: bool = False) -> int:
        """The job requeued (by Slurm itself as it ends where `by_slurm`), recorded first; the exit code (0)."""
        state = self.state
        append_requeue_record(self.files.requeues, why, state.attempt, saved, nodes)
        state.phase = Phase.REQUEUING  # the requeue's own SIGTERM comes to this process
        if not by_slurm:
            # only a pending job takes a new exclusion, and the requeue's SIGKILL follows its SIGTERM by KillWait (5 s
            # on the local cluster): what the job leaves out already is read before the requeue, not inside that window
            excluded = self.effects.job_field(state.job, "ExcNodeList") if nodes else ""
            self.effects.requeue(state.job)
            if nodes and not self.effects.exclude(state.job, nodes, excluded):
                self.effects.say("exclude_failed", nodes=" ".join(nodes))
        return 0

    def finish(self, end: StepEnd, max_requeues: int, slurm_requeues: bool = False, version: str = "",
               saved: str | None = None) -> int:  # fmt: skip
        """The attempt's end by the step's verdict: its lines, a requeue, and the exit code."""
        saved = table.saved(end.outcome) if saved is None else saved
        time_limits = requeued(self.files.requeues, "time-limit")
        done = decide.end_of_attempt(end.verdict, self.state.notice, end.status, saved, time_limits, max_requeues,
                                     slurm_requeues, version)  # fmt: skip
        for name, fields in done.lines:
            self.effects.say(name, **fields)
        if done.requeue:
            self.requeue(done.requeue, saved, by_slurm=done.by_slurm)
        self.handle_pending()
        self.state.phase = Phase.ENDING
        return done.code
