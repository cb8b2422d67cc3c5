"""Why a job ended badly, in one or two lines, and what to do about it: the verdict printed after "Job N ended
STATE" (by `--show_logs`, `jobs attach` and `jobs status`) and recorded in the manifest.

Pure: Slurm's view of the job (state, reason, nodes, exit code) and its log's text in, a `Verdict` out. The log is
read by the caller through `excerpt` (the last attempt's first failure and its tail, whatever the log's size); what
it says (tracebacks, torchrun's summaries, NCCL), by `launcher.node.failures`, shared with the restart decision.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher import protocol as P
from launcher.node import failures
from launcher.slurm.awaited_jobs import NEVER_SATISFIED
from launcher.slurm.fixes import FIXES, RESUME, oom_fix
from launcher.slurm.parse import JobState

# The job's own lines (launcher/protocol.py's formats, which its supervisor, node step and node check print).
HUNG = P.pattern("hung")
NODE_CHECK = P.pattern("node_check_failed")
PREEMPTION = P.pattern("preemption")
ATTEMPT = P.pattern("attempt_started", whole=False)
NO_REQUEUE_LEFT = P.pattern("no_requeue_left")
STOP_FILE = P.pattern("stop_file")
WARNED = P.pattern("warned")
PRE_LAUNCH = P.pattern("pre_launch_ended")
OUTCOME = P.pattern("outcome")
RESTART = P.pattern("restart")
NO_RESTART = P.pattern("no_restart")
STEP = P.step_pattern()
NODE_FAILURE = re.compile(r"srun: error: Node failure on (?P<node>\S+)")

TAIL_LINES, WINDOWS, WINDOW_LINES, LINE_CHARS = 1500, 4, 150, 2000  # at most ~4 MB, whatever the log's size
FIRST_SIGNS = re.compile(
    "|".join(
        [r"Traceback \(most recent|^error: |Watchdog caught|NCCL error|Root Cause", HUNG.pattern, NODE_CHECK.pattern]
    )
)


@dataclass(frozen=True)
class Verdict:
    """Why a job ended other than COMPLETED: a short cause name, where, what happened, and what to do."""

    cause: str  # one of CAUSES
    message: str  # what happened, where: one line, or two
    fix: str  # what to do, in the launcher's words (its flags)
    rank: int | None = None
    node: str | None = None

    @property
    def where(self) -> str:
        rank = "" if self.rank is None else f"rank {self.rank}"
        return f"{rank} on {self.node}" if rank and self.node else rank or self.node or ""

    def lines(self) -> list[str]:
        """The lines printed after "Job N ended STATE"."""
        first, *rest = self.message.splitlines()
        return [f"  why: {first}", *(f"       {line}" for line in rest), f"  fix: {self.fix}"]

    def record(self) -> dict[str, Any]:
        """As the manifest stores it."""
        return {
            "cause": self.cause,
            "where": {"rank": self.rank, "node": self.node},
            "message": self.message,
            "fix": self.fix,
        }


def excerpt(lines: Iterable[str]) -> str:
    """What triage reads of a log: of its last attempt, WINDOW_LINES lines from each of the first WINDOWS signs of
    failure (a traceback, an `error:` line, NCCL's watchdog, torchrun's summary), the batch script's own lines,
    and the last TAIL_LINES lines; "..." where lines were left out. Bounded memory: give it a file read with
    `iter(lambda: f.readline(LINE_CHARS), "")`, so that even a line of gigabytes is read in pieces."""
    kept: list[tuple[int, str]] = []
    tail: deque[tuple[int, str]] = deque(maxlen=TAIL_LINES)
    windows, open_until = WINDOWS, -1
    for n, line in enumerate(lines):
        line = line.rstrip("\n")[:LINE_CHARS]
        if ATTEMPT.match(line) or RESTART.match(line):  # a new attempt or node step: what the last one said is over
            kept, windows, open_until = [], WINDOWS, -1
            tail.clear()
        if n > open_until and windows and FIRST_SIGNS.search(line):
            windows, open_until = windows - 1, n + WINDOW_LINES - 1
        if n <= open_until or (line.startswith(P.LINE_START) and len(kept) < WINDOWS * WINDOW_LINES):
            kept.append((n, line))
        tail.append((n, line))
    out: list[str] = []
    previous = None
    for n, line in sorted({*kept, *tail}):
        if previous is not None and n > previous + 1:
            out.append("...")
        out.append(line)
        previous = n
    return "\n".join(out)


def _progress(lines: list[str]) -> str:
    steps = [m for m in map(STEP.match, lines) if m]
    return f" at step {steps[-1]['step']} of {steps[-1]['steps']}" if steps else ""


def _oom(summary: str) -> str:
    m = re.search(r"allocate (\S+ \S+?)\. GPU (\d+) has a total capacity of (\S+ \S+) of which (\S+ \S+) is", summary)
    return f" on GPU {m[2]}: tried to allocate {m[1]} with {m[4]} of {m[3]} free" if m else ""


def _nccl(summary: str) -> str:
    """torch's "NCCL error in: FILE:LINE, WHAT (run with NCCL_DEBUG=INFO for details), NCCL version V" shortened."""
    m = re.search(r"NCCL error in: \S+, (.*?) \(run with NCCL_DEBUG=INFO for details\), NCCL version (\S+)", summary)
    return f"NCCL error: {m[1]} (NCCL {m[2]})" if m else summary.split(": ", 1)[-1]


def _from_failure(
    f: failures.Failure, exit_code: int | None, flags: Mapping[str, Any] | None, note: str | None
) -> Verdict:
    """The verdict on the first failure the log shows."""
    where = f"rank {f.rank}" if f.rank is not None else "a rank"
    where += f" on {f.node}" if f.node else ""
    killed = ""
    if exit_code in (143, 137):
        killed = f"exit code {exit_code} is srun stopping the other ranks after it, not a second failure"
    elif f.stopped:
        killed = "the other ranks' exit code -15 (SIGTERM) is torchrun stopping them after it"
    second = "; ".join(x for x in (f.detail, killed) if x)
    second = f"\n{second}" if second else ""
    trace = f'"[rank{f.rank}]:" lines in the log' if f.rank is not None else "in the log"
    cause, fix = f.kind, FIXES.get(f.kind, FIXES["unknown"]).format(trace=trace)
    if f.kind == "cuda_oom":
        message, fix = f"{where} ran out of GPU memory{_oom(f.summary)}", oom_fix(flags, note)
    elif f.kind == "nccl":
        message = f"{where}: {_nccl(f.summary)}"
    elif f.kind == "nccl_timeout":
        cause, message = "nccl", f"{where}: NCCL {f.summary}"
    elif f.kind == "bad_input":
        message, second = f"the job refused its data or config ({where}): {f.summary}", ""
    elif f.kind == "host_oom":
        message, second = f"a node ran out of host memory{' (' + f.node + ')' if f.node else ''}: {f.summary}", ""
    elif f.kind == "crash":
        fix = FIXES["killed"] if "SIGKILL" in f.summary else fix
        message = f"{where} {f.summary}"
    elif f.kind == "exited":
        cause, message = "exception", f"{where} {f.summary}"
    else:
        message = f"{where} raised {f.summary}"
    return Verdict(cause, message + second, fix, f.rank, f.node)


@dataclass(frozen=True)
class Ending:
    """What the rules read: Slurm's view of the job, the run's flags where known, and its log's lines."""

    state: str
    lines: list[str]
    reason: str = ""
    nodes: str = ""
    exit_code: int | None = None
    dependency: str = ""
    flags: Mapping[str, Any] | None = None
    memory_note: str | None = None

    def last(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        """The last line of the log that `pattern` matches."""
        return next((m for m in map(pattern.search, reversed(self.lines)) if m), None)

    @property
    def progress(self) -> str:
        return _progress(self.lines)

    @functools.cached_property
    def failure(self) -> failures.Failure | None:
        """The first failure the log shows; for Slurm's OUT_OF_MEMORY, the host's out-of-memory killer."""
        found = failures.first_failure("\n".join(self.lines))
        if self.state == "OUT_OF_MEMORY":
            node = found.node if found and found.kind == "host_oom" else None
            found = failures.Failure("host_oom", "the kernel's out-of-memory killer stopped a process", None, node)
        return found


def _pre_launch(e: Ending) -> Verdict | None:
    """The pre-launch commands ended the attempt (a failing command under `set -e`, or an `exit`), with what the
    shell said about it: the last line before, if it is not one of the job's own."""
    if not (ended := e.last(PRE_LAUNCH)):
        return None
    at = next(n for n in range(len(e.lines) - 1, -1, -1) if PRE_LAUNCH.search(e.lines[n]))
    said = next((line for line in reversed(e.lines[:at]) if line.strip()), "")
    said = "" if said.startswith(P.LINE_START) else f"\n{said.strip()[:300]}"
    message = (
        f"the pre-launch commands ended the job before training, at: {ended['command']} (exit code {ended['code']})"
    )
    return Verdict("pre_launch", message + said, FIXES["pre_launch"])


def _not_trained(e: Ending) -> Verdict | None:
    """COMPLETED, but training stopped before its last step: its last word was "stopped", or it said none while its
    step lines stop short of the last. (A script that prints neither, like a stand-in for training, is not judged.)"""
    word = e.last(OUTCOME)
    if not word or word["word"].split(" ")[0] == P.FINISHED:
        return None
    steps = [m for m in map(STEP.match, e.lines) if m]
    short = bool(steps) and int(steps[-1]["step"]) < int(steps[-1]["steps"])
    if word["word"] == "none" and not short:
        return None
    said = "it never said how it ended" if word["word"] == "none" else f"its last word was '{word['word']}'"
    message = f"Slurm says COMPLETED, but training did not reach its last step{e.progress}: {said}"
    return Verdict("not_trained", message, FIXES["not_trained"])


def _dependency(e: Ending) -> Verdict | None:
    if e.state != "CANCELLED" or e.reason != NEVER_SATISFIED:
        return None
    waits = e.dependency or "see scontrol show job"
    message = f"it never started: its dependency can no longer be met ({waits}), so Slurm cancelled it"
    return Verdict("dependency", message, FIXES["dependency"])


def _node_failure(e: Ending) -> Verdict | None:
    named = e.last(NODE_FAILURE)
    node = named["node"] if named else e.nodes or None
    if e.state == "FAILED" and named and NODE_FAILURE.search(next(x for x in reversed(e.lines) if x.strip())):
        message = f"node {node} failed{e.progress}, and the job's batch script, which runs there, with it: Slurm ended "
        message += "the job (a restart in the allocation cannot outlive the node of the batch script)"  # no word after
        return Verdict("node_fail", message, FIXES["node_fail"].format(node=node), None, node)
    if e.state not in ("NODE_FAIL", "BOOT_FAIL"):
        return None
    what = ("failed to boot" if e.state == "BOOT_FAIL" else "failed (NODE_FAIL)") + e.progress
    one = named or not any(c in e.nodes for c in ",[")
    message = f"node {node} {what}" if one else f"one of the job's nodes ({e.nodes}) {what}"
    message += ": the run's processes there died with it" if e.state == "NODE_FAIL" else ""
    return Verdict("node_fail", message, FIXES["node_fail"].format(node=node or "NODE"), None, node)


def _preflight(e: Ending) -> Verdict | None:
    if not (found := e.last(NODE_CHECK)):
        return None
    message = f"the node check failed on {found['node']} before training: {found['what']}"
    if found["what"].startswith(P.CONTAINER_START):  # what the container lacks: the image's fault, not the node's
        return Verdict("container", message, FIXES["container"], None, found["node"])
    return Verdict("preflight", message, FIXES["preflight"].format(node=found["node"]), None, found["node"])


def _hung(e: Ending) -> Verdict | None:
    if not (hung := e.last(HUNG)):
        return None
    message = f"training hung at step {hung['step']}: no progress for {hung['idle']} s (limit {hung['limit']} s)"
    return Verdict("hung", message, FIXES["hung"].format(stacks=hung["stacks"]))


def _preempted(e: Ending) -> Verdict | None:
    notice, spent = e.last(PREEMPTION), e.last(NO_REQUEUE_LEFT)
    if e.state != "PREEMPTED" and not notice:
        return None
    stopped = f", stopped at the checkpoint of step {spent['step']} with no requeue left" if spent else ""
    message = f"Slurm preempted the job{stopped or e.progress}: a higher-priority job took its nodes"
    message += f" ({notice['what']})" if notice and notice["what"] else ""
    return Verdict("preempted", message, FIXES["preempted"])


def _time_limit(e: Ending) -> Verdict | None:
    if spent := e.last(NO_REQUEUE_LEFT):
        message = "it reached its time limit with no requeue left (--max_requeues): stopped at the checkpoint of step "
        return Verdict("time_limit", message + spent["step"], FIXES["time_limit_spent"].format(step=spent["step"]))
    if e.state not in ("TIMEOUT", "DEADLINE"):
        return None
    fix = FIXES["time_limit"] + (FIXES["time_limit_late"] if e.last(WARNED) else "")
    return Verdict("time_limit", f"it reached its time limit (--time_limit){e.progress}", fix)


def _cancelled(e: Ending) -> Verdict | None:
    if e.state != "CANCELLED":
        return None
    when = e.progress if e.last(ATTEMPT) else " before it started"
    return Verdict("cancelled", f"it was cancelled (scancel, by you or an administrator){when}", FIXES["cancelled"])


def _stopped(e: Ending) -> Verdict | None:
    stop = e.last(STOP_FILE)
    if not stop or e.failure:
        return None
    return Verdict("stopped", f"stopped on request (the stop file) at the checkpoint of step {stop['step']}", RESUME)


def _failed(e: Ending) -> Verdict | None:
    return _from_failure(e.failure, e.exit_code, e.flags, e.memory_note) if e.failure else None


def _unknown(e: Ending) -> Verdict:
    said = next((line.strip() for line in reversed(e.lines) if line.strip()), "")
    message = f"no cause found in the log (exit code {e.exit_code})" + (
        f"; its last line: {said[:200]}" if said else ""
    )
    return Verdict("unknown", message, FIXES["unknown"])


# The rules, in order: the first that has something to say gives the verdict.
RULES: tuple[Callable[[Ending], Verdict | None], ...] = (
    _pre_launch, _dependency, _node_failure, _preflight, _hung, _preempted, _time_limit, _cancelled, _stopped,
    _failed, _unknown,
)  # fmt: skip


def verdict(state: str, log_text: str, **known: Any) -> Verdict | None:
    """Why a job in final `state` ended, from Slurm's view and its log (`excerpt`); None for a COMPLETED job whose
    training finished.

    `known`: reason, nodes, exit_code, dependency (Slurm's record); flags, the run's resolved flags where known (the
    OOM fix names values for micro_batch_size, grad_accum_steps, tp, pp); memory_note, see `oom_fix`."""
    ending = Ending(state, log_text.splitlines(), **known)
    if state == "COMPLETED":  # a success only if training said it finished
        return _pre_launch(ending) or _not_trained(ending)
    found = next(v for rule in RULES if (v := rule(ending)) is not None)
    return _not_restarted(ending, found) or found


def _not_restarted(e: Ending, found: Verdict) -> Verdict | None:
    """The batch script would neither restart the run nor requeue it (launcher/node/restart.py): what failed, why
    no retry (a refused config, a missing file, the same failure at the same step, no progress, restarts spent),
    and the script's fix."""
    if not (said := e.last(NO_RESTART)):
        return None
    cause = found.cause if found.cause != "unknown" else "not_restarted"
    why = found.message if cause != "not_restarted" else f"training failed after {said['why']}"
    # two lines of why at most: after a two-line message (nanotron's frame), on its second line
    message = why + ("; " if "\n" in why else "\n") + f"not restarted: {said['reason']}"
    # the script knows only that a failure came again or the run made no progress: its fix (with the checkpoint the
    # run resumes from) is the better one after a plain exception, a crash, a hang; the cause's own says more after
    # a failure in nanotron (report it, --engine torch), an out-of-memory (the flags that fit the step), a node
    # check or a container that fails everywhere (what to correct)
    fix = said["fix"] if cause in ("exception", "crash", "hung", "not_restarted", "unknown") else found.fix
    return Verdict(cause, message, fix, found.rank, found.node)


def for_job(job: JobState, log_text: str, **known: Any) -> Verdict | None:
    """`verdict` for Slurm's record of a job (`client.job_state`); `known`: flags, memory_note."""
    return verdict(
        job.state,
        log_text,
        reason=job.reason,
        nodes=job.nodes,
        exit_code=job.exit_code,
        dependency=job.dependency,
        **known,
    )
