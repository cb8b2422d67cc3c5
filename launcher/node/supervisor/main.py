"""`python -m launcher.node.supervisor`: one attempt of the job, from the lock to the exit code (the batch script execs
it; docs/supervisor.md). The decisions are `decide`'s; this module sequences them: the lock, the heartbeat, the nodes
and the port, the node step (again after a restart, or on another port), the restart decision, the attempt's end."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path

from launcher import protocol as P
from launcher.node import restart
from launcher.node.supervisor import decide, table
from launcher.node.supervisor.decide import Answer
from launcher.node.supervisor.effects import Node, amend_restart_record, run, take_lock
from launcher.node.supervisor.settings import Settings
from launcher.node.supervisor.state import Action, Notice, Phase, State, Verdict
from launcher.node.supervisor.supervise import StepEnd, Supervisor

DECISION_TIMEOUT_S = 120  # the restart decision's answer, or none (the bash script's `timeout -k 5 120`)
TWO_WRITERS = 4  # the exit code of a job that finds another job of its run holding the lock
PORT_ATTEMPTS = 3  # ports tried when the first node finds its port taken before torchrun listens


def free_port_here(start: int) -> int | None:
    """The first free port of the rendezvous window's candidates from `start`, on this node."""
    for port in decide.candidate_ports(start):
        try:
            socket.create_server(("", port)).close()
        except OSError:
            continue
        return port
    return None


class Attempt:
    """One attempt: the settings, the supervisor, Slurm through `Node`."""

    def __init__(self, settings: Settings, node: Node | None = None) -> None:
        self.s = settings
        self.node = node or Node()
        state = State(
            settings.job, settings.restart_count + 1, settings.batch_node, decide.first_port(int(settings.job))
        )
        self.sup = Supervisor(state, self.node, settings.files, ["/bin/bash", str(settings.node_script)],
                              settings.max_excluded)  # fmt: skip
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.beating = threading.Event()

    @property
    def state(self) -> State:
        return self.sup.state

    # -- helpers beside the step
    def heartbeat(self) -> None:
        while not self.beating.wait(self.s.heartbeat_s):
            self.node.say("heartbeat")

    def start_watchdog(self) -> None:
        self.stop_watchdog()
        if self.s.watchdog:
            argv = [self.s.python, "-m", "launcher.node.watchdog", "--progress", str(self.s.files.progress),
                    "--hung-file", str(self.s.files.hung), "--notify", str(os.getpid()), *self.s.watchdog]  # fmt: skip
            self.watchdog = subprocess.Popen(argv)

    def stop_watchdog(self) -> None:
        """As each step ends: it must not judge the next step by this one's progress, nor fire meanwhile."""
        if self.watchdog is not None:
            self.watchdog.terminate()
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
            self.watchdog = None

    # -- the nodes and the port
    def allocation_now(self) -> list[str]:
        now = self.node.job_field(self.s.job, "NodeList")
        return self.node.hostnames(self.s.nodelist if now in ("", "(null)") else now)

    def choose_nodes(self) -> list[str]:
        nodes = decide.choose_nodes(self.state.batch_node, self.allocation_now(), self.state.left_out, self.s.layout)
        self.state.step_nodes = nodes
        return nodes

    def free_port(self, start: int) -> int | None:
        head = self.state.step_nodes[0]
        if head == self.state.batch_node:
            return free_port_here(start)
        argv = [self.s.python, "-m", "launcher.node.supervisor", "--free-port", str(start)]
        out = run(["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={head}", "--export=ALL", *argv], 60)
        return int(out.stdout.split()[0]) if out.stdout.split() and out.stdout.split()[0].isdigit() else None

    def partition_spare(self) -> int:
        total = self.node.partition_field(self.s.partition, "TotalNodes")
        excluded = self.node.job_field(self.s.job, "ExcNodeList")
        count = len(self.node.hostnames(excluded)) if excluded not in ("", "(null)") else 0
        return int(total) - self.s.allocated - count if total.isdigit() else self.s.max_excluded

    def slurm_requeues_preempted(self) -> tuple[bool, str]:
        """Since Slurm 24.05 a preempted job is requeued by Slurm as it ends where PreemptMode is REQUEUE."""
        version = self.node.version()
        numbers = tuple(int(n) for n in version.split(".")[:2] if n.isdigit())
        mode = self.node.partition_field(self.s.partition.split(",")[0], "PreemptMode")
        return numbers >= (24, 5) and "REQUEUE" in mode, version

    # -- the restart decision, in a thread: the notices that come meanwhile are handled as they come
    def ask(self, verdict: Verdict) -> Answer:
        word = {Verdict.FAILED: "failed", Verdict.HUNG: "hung", Verdict.UNHEALTHY: "unhealthy"}[verdict]
        st, s = self.state, self.s
        step = restart.Step(word, st.attempt, s.layout, st.step_nodes, self.allocation_now(), st.left_out,
                            st.suspects, st.started_from, s.max_restarts, s.max_requeues > 0, s.max_excluded,
                            self.partition_spare())  # fmt: skip
        got: list[restart.Decision] = []

        def decide_now() -> None:
            try:
                got.append(restart.answer(step, s.job, s.checkpoints, s.files.restarts, s.gpus, s.log,
                                          st.log_offset, s.ranks, s.metrics))  # fmt: skip
            except Exception:  # no answer: the attempt ends as without restarts (the traceback, to the log)
                traceback.print_exc()

        thread = threading.Thread(target=decide_now, daemon=True)
        thread.start()
        deadline = time.monotonic() + DECISION_TIMEOUT_S
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.2)
            self.sup.handle_pending()
        self.sup.handle_pending()
        if not got:
            return Answer(Action.NOTHING)
        d = got[0]
        return Answer(Action(d.action), d.why, d.said, tuple(d.nodes), d.checkpoint, d.reason, d.fix, d.code, d.count)

    # -- the attempt
    def fresh_step(self) -> None:
        """What a node step leaves behind gone before the next one starts: the step's files and training's ranks map
        (the restart decision reads it to blame nodes: never an earlier step's)."""
        self.s.files.fresh_step()
        if self.s.ranks != Path(""):
            self.s.ranks.unlink(missing_ok=True)

    def lock(self) -> bool:
        """One writer per run: the lock taken (or found this job's own), else `two_writers` said."""
        s, node = self.s, self.node
        held = take_lock(s.checkpoints, s.job, lambda job: node.job_field(job, "JobState"))
        if held is not None:
            node.say("two_writers", holder=held[0], state=held[1], lock=s.checkpoints / P.LOCK,
                     checkpoints=s.checkpoints)  # fmt: skip
        return held is None

    def run(self) -> int:
        s, st, node = self.s, self.state, self.node
        s.files.stop.unlink(missing_ok=True)
        self.fresh_step()
        if not self.lock():
            return TWO_WRITERS
        threading.Thread(target=self.heartbeat, daemon=True).start()
        self.sup.kill_wait_s = node.kill_wait()
        st.batch_node = st.batch_node or (node.hostnames(s.nodelist) or [""])[0]
        self.choose_nodes()
        while True:
            if not decide.starts_step(st.notice):
                return self.sup.finish(StepEnd(128 + 15, "", Verdict.ENDED), s.max_requeues)
            st.started_from = restart.checkpoint_step(s.checkpoints)
            st.log_offset = s.log.stat().st_size if s.log.exists() else 0
            self.start_watchdog()
            status = 1
            for _ in range(PORT_ATTEMPTS):
                port = self.free_port(st.port)
                head = st.step_nodes[0] if st.step_nodes else ""
                if port is None:
                    window = f"{P.RDZV_PORT_TRIES} from {st.port} in {P.RDZV_PORT_WINDOW}"
                    node.say("no_free_port", node=head, ports=window)
                    return 1
                st.rdzv_port = port
                rdzv = f"{node.node_addr(head) or head}:{port}"
                node.say("rendezvous", endpoint=rdzv, backend=s.backend, nodes=s.layout, gpus=s.gpus, python=s.python)
                csv = ",".join(st.step_nodes)
                argv = ["srun", f"--nodes={s.layout}", f"--ntasks={s.layout}", f"--nodelist={csv}",
                        "--kill-on-bad-exit=1", "--export=ALL", *s.container, "/bin/bash", str(s.node_script), "run",
                        rdzv, csv]  # fmt: skip
                status = self.sup.run_step(argv)
                if not decide.retry_port(s.files.port_taken.exists(), st.notice):
                    break
                node.say("port_taken", port=port, node=head)
                s.files.port_taken.unlink(missing_ok=True)
                st.port = decide.next_port(port)
            self.stop_watchdog()
            end = self.sup.judge(status)
            if not decide.needs_decision(end.verdict, s.max_restarts):
                return self.finish(end)
            answer = self.ask(end.verdict)
            nxt = decide.after_decision(st.notice, answer, end.verdict, end.status)
            if nxt.kind == "restart":
                st.left_out += [n for n in answer.nodes if n not in st.left_out]
                nxt = decide.restart_on_nodes(st.notice, answer, end.verdict, self.choose_nodes(), s.layout,
                                              s.max_requeues, s.max_restarts)  # fmt: skip
            if nxt.amend:
                amend_restart_record(s.files.restarts, nxt.amend)
            for name, fields in nxt.lines:
                node.say(name, **fields)
            saved = str(restart.checkpoint_step(s.checkpoints)) if nxt.resaved else None
            if nxt.kind == "restart":
                st.restart_suffix, st.suspects = f".{answer.count}", []
                st.notice = nxt.notice or st.notice
                self.fresh_step()
                st.port = decide.next_port(st.rdzv_port or st.port)  # the last port may linger
                continue
            if nxt.kind == "requeue":
                return self.sup.requeue(nxt.why, table.saved(end.outcome), nxt.exclude)
            if nxt.kind == "exit":
                return nxt.code
            return self.finish(replace(end, verdict=nxt.verdict), saved)

    def finish(self, end: StepEnd, saved: str | None = None) -> int:
        preempted = self.state.notice == Notice.PREEMPTED
        by_slurm, version = self.slurm_requeues_preempted() if preempted else (False, "")
        return self.sup.finish(end, self.s.max_requeues, by_slurm, version, saved)

    def close(self) -> None:
        self.beating.set()
        self.stop_watchdog()
        self.state.phase = Phase.ENDING
