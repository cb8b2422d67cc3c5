"""Why a job ended badly, in one or two lines, and what to do about it: the verdict printed after "Job N ended
STATE" (by `--show_logs`, `jobs attach` and `jobs status`) and recorded in the manifest.

Pure: Slurm's view of the job (state, reason, nodes, exit code) and the text of its log in, a `Verdict` out. The
log is read by the caller through `excerpt`, which keeps the last attempt's first failure and its tail whatever
the log's size. What the log itself says (tracebacks, torchrun's summaries, NCCL) is read by `failures`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher import protocol as P
from launcher.slurm import failures
from launcher.slurm.dependencies import NEVER_SATISFIED
from launcher.slurm.parse import JobState

# The job's own lines (launcher/protocol.py's formats, which the batch script and the node check print).
HUNG = P.pattern("hung")
PREFLIGHT = P.pattern("preflight_failed")
PREEMPTION = P.pattern("preemption")
ATTEMPT = P.pattern("attempt_started", whole=False)
NO_REQUEUE_LEFT = P.pattern("no_requeue_left")
STOP_FILE = P.pattern("stop_file")
WARNED = P.pattern("warned")
STEP = P.step_pattern()
NODE_FAILURE = re.compile(r"srun: error: Node failure on (?P<node>\S+)")

TAIL_LINES, WINDOWS, WINDOW_LINES, LINE_CHARS = 1500, 4, 150, 2000  # at most ~4 MB, whatever the log's size
FIRST_SIGNS = re.compile(
    "|".join(
        [r"Traceback \(most recent|^error: |Watchdog caught|NCCL error|Root Cause", HUNG.pattern, PREFLIGHT.pattern]
    )
)
RESUME = "launch the same command again: it resumes from the last checkpoint"
FIXES = {  # what to do, by cause, in the launcher's own words (its flags)
    "exception": "correct what its traceback ({trace}) points at, then " + RESUME,
    "nccl": "most often a network or node fault, not the run: " + RESUME + "; if it fails again on that node, "
    "--exclude it; --extra_env NCCL_DEBUG=INFO logs NCCL's details",
    "nccl_timeout": "one rank never reached that collective: look for a rank that failed, hung or lagged first (data "
    "loading, I/O, another code path); if none did, suspect the network (--extra_env NCCL_DEBUG=INFO); " + RESUME,
    "bad_input": "correct the data or config it names (--dataset, --text_column, --tokenizer, --config), then launch "
    "again",
    "host_oom": "ask for more host memory per node: --mem 0 takes all of it (or a larger --mem); a smaller "
    "--micro_batch_size needs less",
    "crash": "a crash in native code (CUDA, NCCL, an extension): the log shows its Python stack (faulthandler) "
    "above torchrun's summary; " + RESUME,
    "killed": "SIGKILL with no traceback is most often the host's out-of-memory killer: try a larger --mem",
    "exited": "read the log's lines before torchrun's summary; " + RESUME,
    "node_fail": "not the run's fault: " + RESUME + "; --exclude {node} keeps it off that node",
    "preflight": "keep the run off that node with --exclude {node} (and tell the cluster's admins), then launch again",
    "hung": "read the stacks in {stacks}: the rank not waiting where the others wait is the culprit (a collective it "
    "never reached, data loading, I/O); " + RESUME,
    "preempted": RESUME + "; --max_requeues N requeues it by itself; a --partition or --qos that is not "
    "preemptible avoids it",
    "time_limit_spent": "launch the same command again to resume from step {step}; a larger --max_requeues or "
    "--time_limit goes further per launch",
    "time_limit": RESUME + " (saved every --save_interval steps); with --max_requeues N it checkpoints and requeues "
    "itself at the limit",
    "time_limit_late": "; the warning came but the checkpoint did not finish in time: raise --signal_grace",
    "cancelled": "nothing failed: " + RESUME,
    "dependency": "launch it again once the job it waits for has succeeded, or with --dependency afterany:ID",
    "stopped": RESUME,
    "unknown": "read the end of the job's log",
}
CAUSES = (
    "exception", "cuda_oom", "nccl", "node_fail", "time_limit", "preempted", "bad_input", "dependency", "hung",
    "preflight", "cancelled", "host_oom", "crash", "stopped", "unknown",
)  # fmt: skip


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
        if ATTEMPT.match(line):  # a new attempt: what the last one said is over
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


def oom_fix(flags: Mapping[str, Any] | None = None, memory_note: str | None = None) -> str:
    """The fix for CUDA out of memory, from the run's flags where known (micro_batch_size, grad_accum_steps, tp, pp).

    `memory_note`: the memory model's estimate for these flags (launcher/config/memory.py, once it exists), e.g.
    "the memory model puts this run at 86 GiB per GPU of 80": it goes first."""
    flags = flags or {}
    mbs, accum, tp, pp = (flags.get(k) for k in ("micro_batch_size", "grad_accum_steps", "tp", "pp"))
    if isinstance(mbs, int) and isinstance(accum, int) and mbs > 1:
        batch = f"use --micro_batch_size {mbs // 2} --grad_accum_steps {accum * 2} (the same batch)"
    elif mbs == 1:
        batch = "--micro_batch_size is 1 already"
    else:
        batch = "halve --micro_batch_size and double --grad_accum_steps (the same batch)"
    tp_text = f"--tp {tp * 2}" if isinstance(tp, int) else "a larger --tp"
    split = f"{tp_text} or {f'--pp {pp * 2}' if isinstance(pp, int) else 'a larger --pp'}"
    fix = f"{batch}, or shard the model over more GPUs: {split}"
    return f"{memory_note}; {fix}" if memory_note else fix


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


def verdict(
    state: str,
    log_text: str,
    *,
    reason: str = "",
    nodes: str = "",
    exit_code: int | None = None,
    dependency: str = "",
    flags: Mapping[str, Any] | None = None,
    memory_note: str | None = None,
) -> Verdict | None:
    """Why a job in final `state` ended, from Slurm's view and its log (`excerpt`); None for COMPLETED.

    `flags`: the run's resolved flags where known (the OOM fix names values for micro_batch_size,
    grad_accum_steps, tp, pp); `memory_note`: see `oom_fix`."""
    if state == "COMPLETED":
        return None
    lines = log_text.splitlines()

    def last(pattern: re.Pattern[str]) -> re.Match[str] | None:
        return next((m for m in map(pattern.search, reversed(lines)) if m), None)

    if state == "CANCELLED" and reason == NEVER_SATISFIED:
        waits = dependency or "see scontrol show job"
        message = f"it never started: its dependency can no longer be met ({waits}), so Slurm cancelled it"
        return Verdict("dependency", message, FIXES["dependency"])
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        named = last(NODE_FAILURE)
        node = named["node"] if named else nodes or None
        what = ("failed to boot" if state == "BOOT_FAIL" else "failed (NODE_FAIL)") + _progress(lines)
        one = named or not any(c in nodes for c in ",[")
        message = f"node {node} {what}" if one else f"one of the job's nodes ({nodes}) {what}"
        message += ": the run's processes there died with it" if state == "NODE_FAIL" else ""
        return Verdict("node_fail", message, FIXES["node_fail"].format(node=node or "NODE"), None, node)
    preflight, hung = last(PREFLIGHT), last(HUNG)
    if preflight:
        message = f"the node check failed on {preflight['node']} before training: {preflight['what']}"
        return Verdict("preflight", message, FIXES["preflight"].format(node=preflight["node"]), None, preflight["node"])
    if hung:
        message = f"training hung at step {hung['step']}: no progress for {hung['idle']} s (limit {hung['limit']} s)"
        return Verdict("hung", message, FIXES["hung"].format(stacks=hung["stacks"]))
    notice, spent = last(PREEMPTION), last(NO_REQUEUE_LEFT)
    if state == "PREEMPTED" or notice:
        stopped = f", stopped at the checkpoint of step {spent['step']} with no requeue left" if spent else ""
        message = f"Slurm preempted the job{stopped or _progress(lines)}: a higher-priority job took its nodes"
        message += f" ({notice['what']})" if notice and notice["what"] else ""
        return Verdict("preempted", message, FIXES["preempted"])
    if spent:
        message = "it reached its time limit with no requeue left (--max_requeues): stopped at the checkpoint of step "
        return Verdict("time_limit", message + spent["step"], FIXES["time_limit_spent"].format(step=spent["step"]))
    if state in ("TIMEOUT", "DEADLINE"):
        fix = FIXES["time_limit"] + (FIXES["time_limit_late"] if last(WARNED) else "")
        return Verdict("time_limit", f"it reached its time limit (--time_limit){_progress(lines)}", fix)
    if state == "CANCELLED":
        when = _progress(lines) if last(ATTEMPT) else " before it started"
        return Verdict("cancelled", f"it was cancelled (scancel, by you or an administrator){when}", FIXES["cancelled"])
    found = failures.first_failure(log_text)
    if state == "OUT_OF_MEMORY":
        node = found.node if found and found.kind == "host_oom" else None
        found = failures.Failure("host_oom", "the kernel's out-of-memory killer stopped a process", None, node)
    stop = last(STOP_FILE)
    if stop and not found:
        return Verdict(
            "stopped", f"stopped on request (the stop file) at the checkpoint of step {stop['step']}", RESUME
        )
    if found:
        return _from_failure(found, exit_code, flags, memory_note)
    said = next((line.strip() for line in reversed(lines) if line.strip()), "")
    message = f"no cause found in the log (exit code {exit_code})" + (f"; its last line: {said[:200]}" if said else "")
    return Verdict("unknown", message, FIXES["unknown"])


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
