"""After a node step that training did not survive on its own (a process died, a node failed, a hang, a node check
failed): restart it inside the allocation, requeue the job, or stop, and why. The supervisor asks it once per such
step (`answer`) and acts on its `Decision`; docs/preemption.md tells the rules.

- **Which node**: a node that left the allocation (Slurm excised it: the job runs `--no-kill`), the hang's suspects,
  the nodes that failed their check, or the node of the rank whose failure came first in the step's part of the
  log (`failures.first_failure`), by the rank map training wrote as the step started (`RANKS_FILE`; without one,
  ranks in the order of the step's nodes), where that failure is a node's (a crash, a process killed, the host's
  memory, NCCL's network), not the run's own (an exception, out of GPU memory: NOT_A_NODES). Where the ranks only
  lost their peers (a node died before Slurm noticed it), the nodes whose tasks srun never heard end.
- **Stop** when a retry cannot help: the job refused its data or config, a file is missing, the same exception (or
  out-of-memory) at the same step as the failure before; when three steps in a row ended without a checkpoint newer
  than the one they started from; or when `--max_restarts` restarts and failure requeues are spent.
- **Restart** in the allocation without the failed nodes while it holds enough healthy nodes for the layout (the
  spares: `--spare_nodes`); a failure no node can be blamed for restarts on the same nodes.
- **Requeue** otherwise, without the failed nodes where the partition can spare them.

Every restart and requeue it answers is recorded in the bundle's `restarts` file (RESTART_FORMAT), with the job's
id: the next decision reads the failures of the same job before it there (the script submitted again is a new job,
with a budget of its own). Standard library and the ground floor only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from launcher import atomic, checkpoint_layout
from launcher import protocol as P
from launcher.node import failures

RECORD = re.compile(P._regex(P.RESTART_FORMAT))
RECORD_NO_JOB = re.compile(P._regex(P.RESTART_FORMAT_NO_JOB))  # written before records named their job
RANK_LINE = re.compile(P._regex(P.RANKS_FORMAT.strip()))
RESTART, REQUEUE, STOP = "restart", "requeue", "stop"  # the decision's actions
NO_PROGRESS_STEPS = 3  # node steps in a row without a newer checkpoint: the run cannot progress
SLICE = 4 << 20  # bytes of the step's log read from its start and from its end (a failure's first signs, its end)
MISSING_FILE = re.compile(r"FileNotFoundError|No such file or directory")
REPEATS = (
    "exception",
    "nanotron",
    "cuda_oom",
    "host_oom",
)  # failures a retry cannot fix when they come again at the same step
# failures of the run's code, config or size, not of a node: the step again on the same nodes (a node left out
# for them would be a healthy one lost; a requeue would wait in the queue for the same failure)
NOT_A_NODES = ("exception", "nanotron", "cuda_oom", "bad_input", "nccl_timeout")
RETRY = "launch the same command again once it is fixed: it resumes from the checkpoint of step {step}"


@dataclass(frozen=True)
class Step:
    """What the supervisor knows of the node step that just ended."""

    verdict: str  # "failed" (a process or a node), "hung", "unhealthy" (the node check)
    attempt: int
    layout: int  # nodes the layout needs
    step_nodes: list[str]  # the nodes it ran on, the rendezvous host first
    allocation: list[str]  # the job's nodes now (a failed node has left it)
    left_out: list[str] = field(default_factory=list)  # nodes this attempt already left out
    suspects: list[str] = field(default_factory=list)  # a hang's suspects, or the nodes that failed their check
    started_from: int = 0  # the checkpoint step the step started from
    max_restarts: int = 10
    requeues_allowed: bool = True  # --max_requeues > 0 (the job may requeue itself)
    max_excluded: int = 1  # nodes a requeue may leave out (max(1, nodes / 50))
    partition_spare: int = 0  # nodes the partition has beyond the job's


@dataclass(frozen=True)
class Found:
    """What went wrong, from the log and the files."""

    why: str  # REQUEUE_WHY's word: hang, node-check, node-failure, failure
    said: str  # in words: "a node failure (node2 left the allocation)"
    nodes: list[str]  # the nodes to blame (none: no one node)
    failure: failures.Failure | None = None
    at: int | None = None  # the last step training logged


@dataclass(frozen=True)
class Decision:
    """What follows the step: its action, why (REQUEUE_WHY's word, and in words), the nodes left out."""

    action: str  # RESTART | REQUEUE | STOP
    why: str
    said: str
    nodes: list[str]  # restart: left out; requeue: excluded
    checkpoint: int
    reason: str = ""  # stop: why not
    fix: str = ""
    code: int = 1  # stop: the job's exit code
    count: int = 0  # the job's restarts and failure requeues, this one included (its restart line says it)


def signature(found: Found) -> str:
    f = found.failure
    return "-" if f is None else f"{f.kind}: {f.summary}"[:300]


def records(path: Path, job: str | None = None) -> list[dict[str, str]]:
    """The restarts file's records, oldest first; `job`: only that job's. A record written before records named
    their job has the job "" (no job's: the file outlives its jobs, a script submitted again appends to it)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        if m := RECORD.fullmatch(line):
            found.append(m.groupdict())
        elif m := RECORD_NO_JOB.fullmatch(line):
            found.append({**m.groupdict(), "job": ""})
    return found if job is None else [r for r in found if r["job"] == job]


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def stop_for(step: Step, found: Found, past: list[dict[str, str]], checkpoint: int) -> tuple[str, str, int] | None:
    """(reason, fix, exit code) when no restart nor requeue can help, else None."""
    f, resume = found.failure, RETRY.format(step=checkpoint)
    if f is not None and f.kind == "bad_input":
        return f"the job refused its data or config ({f.summary})", "correct the data or config it names", 2
    if f is not None and MISSING_FILE.search(f"{f.summary} {f.detail}"):
        return f"a file is missing ({f.summary})", f"make it exist, or correct its path; {resume}", 1
    last = past[-1] if past else None
    if f is not None and f.kind in REPEATS and last and last["failure"] == signature(found):
        if _number(last["at"]) == found.at:  # (both None: before the run's first step)
            what = "out-of-memory" if f.kind.endswith("oom") else "exception"
            fix = "fit the step in memory (a smaller --micro_batch_size)" if what != "exception" else \
                "correct what its traceback points at"  # fmt: skip
            point = f"after step {found.at}" if found.at is not None else "before its first step"
            said = f"the same {what} as the failure before, at the same point of the run ({point})"
            return f"{said}: {f.summary}", f"{fix}; {resume}", 1
    steps = [(_number(r["start"]) or 0, _number(r["end"]) or 0) for r in past] + [(step.started_from, checkpoint)]
    if len(steps) >= NO_PROGRESS_STEPS and all(end <= start for start, end in steps[-NO_PROGRESS_STEPS:]):
        return (f"{NO_PROGRESS_STEPS} node steps in a row ended without a checkpoint newer than step {checkpoint}",
                "read the log of those steps: something stops the run before it saves; " + resume, 1)  # fmt: skip
    if len(past) >= step.max_restarts:
        return (f"{len(past)} restarts and requeues after failures already (--max_restarts {step.max_restarts})",
                f"{resume}; a larger --max_restarts goes on longer", 1)  # fmt: skip
    return None


def choose(step: Step, found: Found, past: list[dict[str, str]], checkpoint: int) -> Decision:
    """Restart, requeue or stop after the step `found` describes."""
    stop = stop_for(step, found, past, checkpoint)
    if stop is not None:
        reason, fix, code = stop
        return Decision(STOP, found.why, found.said, found.nodes, checkpoint, reason, fix, code)
    if found.why == "node-check" and set(step.step_nodes) <= set(found.nodes):
        reason = "every node failed its check: the run's problem, not a node's"
        fix = "correct what the node checks say (paths, data, the Python), then launch again"
        return Decision(STOP, found.why, found.said, found.nodes, checkpoint, reason, fix, 5)
    usable = [n for n in step.allocation if n not in step.left_out]
    healthy = [n for n in usable if n not in found.nodes]
    if len(healthy) >= step.layout:
        return Decision(RESTART, found.why, found.said, found.nodes, checkpoint)
    excludable = 0 < len(found.nodes) <= min(step.max_excluded, step.partition_spare)
    if not excludable and len(usable) >= step.layout and found.why != "node-failure":
        return Decision(RESTART, found.why, found.said + ", on the same nodes: none spare", [], checkpoint)
    if not step.requeues_allowed:
        reason = "the allocation has no healthy node left for the layout, and the job may not requeue itself"
        return Decision(STOP, found.why, found.said, found.nodes, checkpoint, reason,
                        "launch again to resume; --max_requeues N lets it requeue itself", 1)  # fmt: skip
    if found.nodes and not excludable:  # the requeued job could never start without them
        said = f"{found.said}; not leaving out {len(found.nodes)} nodes (at most {step.max_excluded}; the partition " \
            f"can spare {step.partition_spare})"  # fmt: skip
        return Decision(REQUEUE, found.why, said, [], checkpoint)
    return Decision(REQUEUE, found.why, found.said, found.nodes, checkpoint)


def ranks_map(path: Path) -> dict[int, str]:
    """Global rank -> node, from training's rank map (empty where it wrote none)."""
    found: dict[int, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return found
    for line in lines:
        if m := RANK_LINE.fullmatch(line.strip()):
            found.update({rank: m["node"] for rank in range(int(m["first"]), int(m["last"]) + 1)})
    return found


def log_slice(log: Path, offset: int) -> str:
    """The step's part of the job's log (from `offset`): all of it, or its first and last SLICE bytes."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, 2)
            f.seek(min(offset, size))
            head = f.read(SLICE)
            tail = b""
            if f.tell() < size:
                f.seek(max(f.tell(), size - SLICE))
                tail = b"\n...\n" + f.read()
    except OSError:
        return ""
    return (head + tail).decode("utf-8", errors="replace")


def last_logged_step(metrics: Path) -> int | None:
    """The step of the metrics file's last line (training's last logged step), None without one."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(f.seek(0, 2) - 4096, 0))
            tail = f.read().decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return None
    m = re.search(r'"step": (\d+)', tail[-1]) if tail else None
    return int(m.group(1)) if m else None


def checkpoint_step(checkpoints: Path) -> int:
    """The run's latest checkpoint, as its pointer names it (either engine's); 0 before any."""
    return checkpoint_layout.pointer_step(checkpoints) or 0


def find(step: Step, log_text: str, ranks: dict[int, str], gpus: int, at: int | None) -> Found:
    """What went wrong in the step, and which nodes to blame."""
    if step.verdict == "hung":
        return Found("hang", "a hang" + (f" (suspected: {', '.join(step.suspects)})" if step.suspects else ""),
                     step.suspects, at=at)  # fmt: skip
    if step.verdict == "unhealthy":
        return Found("node-check", f"a failed node check ({', '.join(step.suspects)})", step.suspects, at=at)
    gone = [n for n in step.step_nodes if n not in step.allocation]
    if gone:
        return Found("node-failure", f"a node failure ({', '.join(gone)} left the allocation)", gone, at=at)
    failure = failures.first_failure(log_text)
    if failure is None or failure.detail == failures.LOST_PEERS:  # the ranks only lost their peers: whose?
        ended = {m["node"] for m in map(failures.SRUN_TASK.match, log_text.splitlines()) if m}
        silent = [n for n in step.step_nodes if n not in ended]
        if ended and silent:  # srun heard every other node's task end, never these: a node gone (not yet DOWN)
            said = f"a failure (no word from {', '.join(silent)}: its tasks never ended as the others' did)"
            return Found("failure", said, silent, failure, at)
    if failure is None:
        return Found("failure", "a failure the log does not explain", [], at=at)
    node = ranks.get(failure.rank) if failure.rank is not None else None
    if node is None and failure.rank is not None and gpus > 0 and failure.rank // gpus < len(step.step_nodes):
        node = step.step_nodes[failure.rank // gpus]  # no rank map: ranks in the order of the step's nodes
    where = f"rank {failure.rank}" if failure.rank is not None else "a rank"
    said = f"a failure ({where}{f' on {node}' if node else ''}: {failure.summary})"
    if failure.detail == failures.LOST_PEERS:  # a consequence, and no first cause: no one node to blame
        return Found("failure", f"{said[:-1]}; {failures.LOST_PEERS}, no first cause found)"[:400], [], failure, at)
    return Found("failure", said[:400], [node] if node and failure.kind not in NOT_A_NODES else [], failure, at)


def _csv(text: str) -> list[str]:
    return [n for n in re.split(r"[,\s]+", text) if n]


def answer(step: Step, job: str, checkpoints: Path, records_file: Path, gpus: int = 0, log: Path | None = None,
           offset: int = 0, ranks: Path | None = None, metrics: Path | None = None) -> Decision:  # fmt: skip
    """The decision after `step`, from the job's log (from `offset`), training's rank map and metrics, the run's
    checkpoints and the job's records; a restart or a requeue is appended to the records (`records_file`). The
    supervisor calls it."""
    at = last_logged_step(metrics) if metrics else None
    text = log_slice(log, offset) if log and step.verdict == "failed" else ""
    found = find(step, text, ranks_map(ranks) if ranks else {}, gpus, at)
    checkpoint = checkpoint_step(checkpoints)
    past = records(records_file, job)
    decision = replace(choose(step, found, past, checkpoint), count=len(past) + 1)
    if decision.action != STOP:
        record = P.RESTART_FORMAT.format(why=found.why, action=decision.action, job=job, attempt=step.attempt,
                                         start=step.started_from, end=checkpoint, at="-" if at is None else at,
                                         nodes=",".join(decision.nodes) or "-", failure=signature(found))  # fmt: skip
        with open(records_file, "a", encoding="utf-8") as f:  # (a text line, RESTART_FORMAT)
            f.write(record + "\n")
    return decision


RESTART_ACTION = re.compile(r"^(\S*) restart job ")


def amend(records_file: Path, how: str) -> None:
    """The last decision's record (the restarts file's last line), of a restart the job did not make: "none" drops
    it (this attempt ends), else its action becomes `how` (the job requeued instead). This module is the file's one
    writer: `answer` appends, this amends."""
    try:
        lines = records_file.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return
    if lines and how == "none":
        lines.pop()
    elif lines:
        lines[-1] = RESTART_ACTION.sub(lambda m: f"{m[1]} {how} job ", lines[-1], count=1)
    atomic.replace(records_file, "".join(lines))
