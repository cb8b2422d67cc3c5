"""One attempt of the job, from the lock to the exit code: the supervisor's one orchestrator. Its signal handlers only
note a signal (the notices are handled between the step's polls, never inside a handler); it takes the lock, says a
heartbeat, picks the step's nodes and port, runs the node step through srun (again after a restart, or on another
port), judges how it ended, asks the restart decision, restarts, requeues, and ends the attempt. The decisions are
`decide`'s and `table`'s; all it does to the world goes through `effects.Effects`."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.evals import record as eval_record
from launcher.evals import submit as evals
from launcher.node import restart, watchdog
from launcher.node.job import Job
from launcher.node.restart import Decision
from launcher.node.supervisor import decide, records, table
from launcher.node.supervisor.effects import Effects
from launcher.node.supervisor.followers import AfterCheckpoints
from launcher.node.supervisor.state import SIGNALS, Allocation, Notice, Phase, State, Then, Verdict
from launcher.retention import purge

STOP_GRACE_S = 60  # after a hang's `stop`: how long the step has to end before srun itself is ended
DECISION_TIMEOUT_S = 120  # the restart decision's answer, or none
TWO_WRITERS = 4  # the exit code of a job that finds another job of its run holding the lock
PORT_ATTEMPTS = 3  # ports tried when the first node finds its port taken before torchrun listens
STEP_FILES = (P.OUTCOME_FILE, P.PROGRESS_FILE, P.HUNG_FILE, P.NODE_CHECK_REPORT, P.PORT_TAKEN_FILE, P.RANKS_FILE)


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


class Attempt:
    """One attempt: the job's settings, Slurm's word on the job, the state, the effects."""

    def __init__(self, job: Job, slurm: Allocation, effects: Effects) -> None:
        self.job, self.slurm, self.effects = job, slurm, effects
        self.state = State(slurm.job, slurm.attempt, slurm.batch_node, decide.first_port(int(slurm.job)))
        self.stop_by: float | None = None  # after a hang: when srun itself is ended, if the step still runs
        self.kill_wait_s: float | None = None  # Slurm's KillWait (Effects.kill_wait), read as the attempt starts
        self.leave_by: float | None = None  # after a SIGTERM: when the step is left to Slurm (its SIGKILL is near)
        # What follows each complete checkpoint: each looks at the checkpoints folder between the step's polls (a stat
        # a pointer every few seconds) and does its work in a thread of its own while the step runs.
        self.evals = evals.Evals(job, slurm.job, effects) if job.evals else None
        owed = (lambda folder: eval_record.owed(job.checkpoints, folder.complete, job.evaluated)) if job.evals else None
        self.retention = purge.Retention(job.retention, job.checkpoints, slurm.job, job.file(P.CHECKPOINTS_RECORD),
                                         effects, owed)  # fmt: skip
        work = ([self.evals.on_checkpoint] if self.evals else []) + ([self.retention.on_checkpoint]
                                                                      if job.retention.active else [])  # fmt: skip
        self.followers = AfterCheckpoints(job.checkpoints, work)
        self.beating = threading.Event()

    def step_command(self, *args: str) -> list[str]:
        """The node step's command (launcher/node/step.py) with the job's Python and the bundle's job.json."""
        return [str(self.job.python), "-m", "launcher.node.step", str(self.job.file(P.JOB_FILE)), *args]

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
        state, now = self.state, time.monotonic()
        if self.stop_by is not None and now >= self.stop_by:  # a hung step that did not end: srun ended
            self.stop_by = None
            self.effects.stop_step()
        if state.phase == Phase.NODE_CHECK and self.job.file(P.PROGRESS_FILE).exists():
            state.phase = Phase.STEP
        while state.pending:
            reaction = decide.on_signal(state.phase, state.notice, state.pending.pop(0))
            for name, fields in reaction.lines:
                self.effects.say(name, **fields)
            if reaction.stop_file:
                self.effects.touch(self.job.file(P.STOP_FILE))  # read (and removed) by training
            if reaction.notice == Notice.TERMINATED and self.leave_by is None and state.phase in decide.STEP_PHASES:
                self.leave_by = now + decide.wait_after_term(self.kill_wait_s)
            state.notice = reaction.notice
            if reaction.hang:
                self.on_hang()
        self.after_checkpoints(wait=state.phase not in decide.STEP_PHASES)
        return self.leave_by is None or time.monotonic() < self.leave_by

    def on_hang(self) -> None:
        """The watchdog's hang: the step's stacks dumped, the suspects named, the step stopped."""
        state, step_nodes = self.state, self.state.step_nodes
        hung_step, idle, allowed = ((_text(self.job.file(P.HUNG_FILE)) or "").split() + ["0", "?", "?"])[:3]
        stacks = self.job.log_dir / f"stacks-{state.job}-{state.attempt}{state.restart_suffix}"
        self.effects.make_dir(stacks)
        if step_nodes:
            self.effects.overlap(step_nodes, self.step_command("dump", str(stacks)), 90)
        self.effects.say("hung", step=hung_step, idle=idle, limit=allowed, stacks=stacks)
        found, _ = watchdog.suspects(stacks, self.job.max_excluded)
        if found:
            self.effects.say("suspected", nodes=" ".join(found))
        if state.notice == Notice.HUNG:
            state.suspects = found
        if step_nodes:  # the training processes stopped on every node: srun then ends by itself
            self.effects.overlap(step_nodes, self.step_command("stop"), 60)
        self.stop_by = time.monotonic() + (STOP_GRACE_S if step_nodes else 0)

    # -- after each complete checkpoint
    def after_checkpoints(self, wait: bool) -> None:
        """The eval job of each evaluated step submitted (--eval_tasks), then retention's purge (--keep_last/
        --keep_every): where the checkpoints folder changed since the last look, in a thread while the step runs; at
        once where `wait` (the step has ended: a checkpoint saved as it ended). node/supervisor/followers.py."""
        self.followers.poll(wait)

    # -- the nodes and the port
    def allocation_now(self) -> list[str]:
        now = self.effects.job_field(self.slurm.job, "NodeList")
        return self.effects.hostnames(self.slurm.nodelist if now in ("", "(null)") else now)

    def choose_nodes(self) -> list[str]:
        nodes = decide.choose_nodes(self.state.batch_node, self.allocation_now(), self.state.left_out, self.job.nodes)
        self.state.step_nodes = nodes
        return nodes

    def partition_spare(self) -> int:
        total = self.effects.partition_field(self.slurm.partition, "TotalNodes")
        excluded = self.effects.job_field(self.slurm.job, "ExcNodeList")
        count = len(self.effects.hostnames(excluded)) if excluded not in ("", "(null)") else 0
        return int(total) - self.job.allocated - count if total.isdigit() else self.job.max_excluded

    def slurm_requeues_preempted(self) -> tuple[bool, str]:
        """Since Slurm 24.05 a preempted job is requeued by Slurm as it ends where PreemptMode is REQUEUE."""
        version = self.effects.version()
        numbers = tuple(int(n) for n in version.split(".")[:2] if n.isdigit())
        mode = self.effects.partition_field(self.slurm.partition.split(",")[0], "PreemptMode")
        return numbers >= (24, 5) and "REQUEUE" in mode, version

    # -- a node step
    def run_step(self, argv: list[str]) -> int:
        """One node step to its end, the notices handled as they come: srun's exit status."""
        self.state.phase, self.stop_by = Phase.NODE_CHECK, None
        status = self.effects.run_step(argv, self.handle_pending)
        self.state.phase, self.stop_by = Phase.DECIDING, None
        return status

    def judge(self, status: int) -> StepEnd:
        """How the step that ended with `status` ended: the notice as it ended, training's word, the verdict."""
        state, job = self.state, self.job
        self.after_checkpoints(wait=True)  # a checkpoint saved as the step ended
        report = _text(job.file(P.NODE_CHECK_REPORT)) or ""
        if decide.python_missing(status, job.image, report):  # the step never ran in the image: every node's check
            what = P.CONTAINER_NO_PYTHON.format(image=job.image, python=job.python)
            report = "".join(f"{node}: {what}\n" for node in state.step_nodes)
            for node in state.step_nodes:
                self.effects.say("node_check_failed", node=node, what=what)
        # (after a SIGTERM, no preemption is read: Slurm's SIGKILL is near, and the notice stands)
        preempt_time = "" if state.notice == Notice.TERMINATED else self.effects.job_field(state.job, "PreemptTime")
        state.notice, lines = decide.notice_at_step_end(state.notice, preempt_time, report)
        for name, fields in lines:
            self.effects.say(name, **fields)
        if state.notice == Notice.NODE_CHECK:
            state.suspects = table.node_check_suspects(report)
        outcome = table.read_outcome(_text(job.file(P.OUTCOME_FILE)))
        self.effects.say("outcome", word=outcome or "none")
        return StepEnd(status, outcome, table.verdict(state.notice, outcome, status))

    # -- the restart decision, in a thread: the notices that come meanwhile are handled as they come
    def ask(self, verdict: Verdict) -> Decision | None:
        word = {Verdict.FAILED: "failed", Verdict.HUNG: "hung", Verdict.UNHEALTHY: "unhealthy"}[verdict]
        st, job = self.state, self.job
        step = restart.Step(
            verdict=word,
            attempt=st.attempt,
            layout=job.nodes,
            step_nodes=st.step_nodes,
            allocation=self.allocation_now(),
            left_out=st.left_out,
            suspects=st.suspects,
            started_from=st.started_from,
            max_restarts=job.max_restarts,
            requeues_allowed=job.max_requeues > 0,
            max_excluded=job.max_excluded,
            partition_spare=self.partition_spare(),
        )
        got: list[Decision] = []

        def decide_now() -> None:
            try:
                got.append(self.effects.restart_decision(step, job, st.job, st.log_offset))
            except Exception:  # no answer: the attempt ends as without restarts (the traceback, to the log)
                traceback.print_exc()

        thread = threading.Thread(target=decide_now, daemon=True)
        thread.start()
        deadline = time.monotonic() + DECISION_TIMEOUT_S
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.2)
            self.handle_pending()
        self.handle_pending()
        return got[0] if got else None

    # -- the attempt
    def heartbeat(self) -> None:
        while not self.beating.wait(self.job.heartbeat_s):
            self.effects.say("heartbeat")

    def fresh_step(self) -> None:
        """What a node step leaves behind gone before the next one starts, training's ranks map with it (the restart
        decision reads it to blame nodes: never an earlier step's)."""
        self.effects.remove([self.job.file(name) for name in STEP_FILES])

    def lock(self) -> bool:
        """One writer per run: the lock taken (or found this job's own), else `two_writers` said."""
        checkpoints = self.job.checkpoints
        held = self.effects.take_lock(checkpoints, self.slurm.job)
        if held is not None:
            self.effects.say("two_writers", holder=held[0], state=held[1], lock=ckpt.lock_dir(checkpoints),
                             checkpoints=checkpoints)  # fmt: skip
        return held is None

    def run(self) -> int:
        job, st, fx = self.job, self.state, self.effects
        fx.remove([job.file(P.STOP_FILE)])
        self.fresh_step()
        if not self.lock():
            return TWO_WRITERS
        threading.Thread(target=self.heartbeat, daemon=True).start()
        self.kill_wait_s = fx.kill_wait()
        st.batch_node = st.batch_node or (fx.hostnames(self.slurm.nodelist) or [""])[0]
        self.choose_nodes()
        while True:
            if not decide.starts_step(st.notice):
                return self.finish(StepEnd(128 + 15, "", Verdict.ENDED))
            st.started_from = restart.checkpoint_step(job.checkpoints)
            st.log_offset = job.log.stat().st_size if job.log.exists() else 0
            if job.hang_timeout:
                fx.start_watchdog([str(job.python), "-m", "launcher.node.watchdog", "--progress",
                                   str(job.file(P.PROGRESS_FILE)), "--hung-file", str(job.file(P.HUNG_FILE)),
                                   "--notify", str(os.getpid()), *job.watchdog_options()])  # fmt: skip
            status = self.step_on_a_free_port()
            if status is None:
                return 1
            fx.stop_watchdog()  # it must not judge the next step by this one's progress, nor fire meanwhile
            end = self.judge(status)
            if not decide.needs_decision(end.verdict, job.max_restarts):
                return self.finish(end)
            decision = self.ask(end.verdict)
            nxt = decide.after_decision(st.notice, decision, end.verdict, end.status)
            if nxt.then == Then.RESTART and decision is not None:
                st.left_out += [n for n in decision.nodes if n not in st.left_out]
                nxt = decide.restart_on_nodes(st.notice, decision, end.verdict, self.choose_nodes(), job.nodes,
                                              job.max_requeues, job.max_restarts)  # fmt: skip
            if nxt.amend:
                fx.amend_restart(job.file(P.RESTARTS_FILE), nxt.amend)
            for name, fields in nxt.lines:
                fx.say(name, **fields)
            if nxt.then == Then.RESTART and decision is not None:
                st.restart_suffix, st.suspects = f".{decision.count}", []
                st.notice = nxt.notice or st.notice
                self.fresh_step()
                st.port = decide.next_port(st.rdzv_port or st.port)  # the last port may linger
                continue
            if nxt.then == Then.REQUEUE:
                return self.requeue(nxt.why, table.saved(end.outcome), nxt.exclude)
            if nxt.then == Then.EXIT:
                return nxt.code
            saved = str(restart.checkpoint_step(job.checkpoints)) if nxt.resaved else None
            return self.finish(replace(end, verdict=nxt.verdict), saved)

    def step_on_a_free_port(self) -> int | None:
        """The node step on the rendezvous host's first free port, again on the next where the first node found its
        port taken before torchrun listened: srun's exit status, None where no port was free (said)."""
        job, st, fx = self.job, self.state, self.effects
        status = 1
        for _ in range(PORT_ATTEMPTS):
            head = st.step_nodes[0] if st.step_nodes else ""
            port = fx.free_port(head, st.port, head == st.batch_node, str(job.python))
            if port is None:
                fx.say("no_free_port", node=head, ports=f"{P.RDZV_PORT_TRIES} from {st.port} in {P.RDZV_PORT_WINDOW}")
                return None
            st.rdzv_port = port
            rdzv = f"{fx.node_addr(head) or head}:{port}"
            fx.say("rendezvous", endpoint=rdzv, backend=job.rdzv_backend, nodes=P.counted(job.nodes, "node"),
                   gpus=P.counted(job.gpus_per_node, "process"), python=job.python)  # fmt: skip
            csv = ",".join(st.step_nodes)
            status = self.run_step(["srun", f"--nodes={job.nodes}", f"--ntasks={job.nodes}", f"--nodelist={csv}",
                                    "--kill-on-bad-exit=1", "--export=ALL", *job.container_options,
                                    *self.step_command("run", rdzv, csv)])  # fmt: skip
            if not decide.retry_port(job.file(P.PORT_TAKEN_FILE).exists(), st.notice):
                break
            fx.say("port_taken", port=port, node=head)
            fx.remove([job.file(P.PORT_TAKEN_FILE)])
            st.port = decide.next_port(port)
        return status

    def requeue(self, why: str, saved: str, nodes: tuple[str, ...] = (), by_slurm: bool = False) -> int:
        """The job requeued (by Slurm itself as it ends where `by_slurm`), recorded first; the exit code (0)."""
        state = self.state
        self.effects.record_requeue(self.job.file(P.REQUEUES_FILE), why, state.attempt, saved, nodes)
        state.phase = Phase.REQUEUING  # the requeue's own SIGTERM comes to this process
        if not by_slurm:
            # only a pending job takes a new exclusion, and the requeue's SIGKILL follows its SIGTERM by KillWait (5 s
            # on the local cluster): what the job leaves out already is read before the requeue, not inside that window
            excluded = self.effects.job_field(state.job, "ExcNodeList") if nodes else ""
            self.effects.requeue(state.job)
            if nodes and not self.effects.exclude(state.job, nodes, excluded):
                self.effects.say("exclude_failed", nodes=" ".join(nodes))
        return 0

    def finish(self, end: StepEnd, saved: str | None = None) -> int:
        """The attempt's end by the step's verdict: its lines, a requeue, and the exit code."""
        by_slurm, version = self.slurm_requeues_preempted() if self.state.notice == Notice.PREEMPTED else (False, "")
        saved = table.saved(end.outcome) if saved is None else saved
        time_limits = records.requeued(self.job.file(P.REQUEUES_FILE), "time-limit")
        done = decide.end_of_attempt(end.verdict, self.state.notice, end.status, saved, time_limits,
                                     self.job.max_requeues, by_slurm, version)  # fmt: skip
        for name, fields in done.lines:
            self.effects.say(name, **fields)
        if done.requeue:
            self.requeue(done.requeue, saved, by_slurm=done.by_slurm)
        self.handle_pending()
        self.state.phase = Phase.ENDING
        return done.code

    def close(self) -> None:
        self.beating.set()
        self.effects.stop_watchdog()
        self.state.phase = Phase.ENDING
