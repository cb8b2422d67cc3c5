"""What Slurm's commands print, as data: job records of `scontrol show job -o` and `sacct -P` lines, pure.

Unit-tested on recorded output (tests/test_slurm_parsing.py); `launcher.slurm.client` runs the commands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

# The states a job ends in (protocol.LIVE_STATES are those it may still run in: SPECIAL_EXIT, a job requeued and
# held, among them).
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's state name, e.g. PENDING, RUNNING, COMPLETED
    reason: str  # why pending / why it ended ("None" when there is none)
    exit_code: int | None  # the batch script's exit code once ended
    signal: int | None
    restarts: int  # how many times the job was requeued
    nodes: str
    dependency: str = ""  # what it waits for, as scontrol says it: "afterok:15(failed)"; "" when none or unknown
    start: str = ""  # a pending job's expected start, as `squeue --start` says it (the scheduler's estimate); ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


# Slurm 25.11 on: the command line that submitted the job, as typed (spaces, `=`, anything), always before WorkDir
SUBMIT_LINE = re.compile(r"(?:^|\s)SubmitLine=(?P<line>.*)\s+(?=WorkDir=)")


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value) as a dict; the first of a key where it repeats. Slurm
    25.11's SubmitLine is read whole, its words never taken for keys (docs/slurm-versions.md)."""
    text = text.strip()
    submitted = SUBMIT_LINE.search(text)
    if submitted:
        text = text[: submitted.start()] + " " + text[submitted.end() :]
    fields: dict[str, str] = {}
    for token in re.split(r"\s+(?=[A-Za-z:/]+=)", text):
        key, _, value = token.partition("=")
        fields.setdefault(key, value)
    if submitted:
        fields.setdefault("SubmitLine", submitted["line"])
    return fields


def _exit(code: str) -> tuple[int | None, int | None]:
    status, _, sig = code.partition(":")
    return (int(status) if status.isdigit() else None), (int(sig) if sig.isdigit() else None)


# sacct -X -n -P --duplicates -o SACCT_FIELDS: one line per attempt of a job (a requeue keeps the id), oldest first
SACCT_FIELDS = "JobID,State,ExitCode,Reason,NodeList,Submit,Start,End,ElapsedRaw,AllocTRES"


@dataclass(frozen=True)
class SacctRecord:
    """One attempt of a job as slurmdbd keeps it."""

    job_id: str
    state: str  # "CANCELLED by 0" -> CANCELLED; a requeued attempt reads REQUEUED (or PREEMPTED, NODE_FAIL, ...)
    exit_code: int | None
    signal: int | None
    reason: str
    nodes: str
    submit: datetime | None
    start: datetime | None  # None: not started (yet)
    end: datetime | None  # None: not ended (yet)
    elapsed_s: int
    gpus: int  # AllocTRES's gres/gpu (0 when it names none)


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text).astimezone()  # sacct prints the local time, without its zone
    except ValueError:
        return None  # "Unknown", "None"


def alloc_gpus(tres: str) -> int:
    """GPUs in an AllocTRES/ReqTRES string ("billing=2,cpu=2,gres/gpu=4,node=2" -> 4; typed ones are part of
    the total: "gres/gpu=8,gres/gpu:h100=8" -> 8)."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return 0


def parse_sacct_records(text: str) -> list[SacctRecord]:
    """`sacct -X -n -P -o SACCT_FIELDS` lines as records."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, code, reason, nodes, submit, start, end, elapsed, tres = (line.split("|") + [""] * 10)[:10]
        status, sig = _exit(code)
        records.append(
            SacctRecord(
                job_id,
                state.split()[0] if state else "UNKNOWN",
                status,
                sig,
                reason or "None",
                nodes,
                _time(submit),
                _time(start),
                _time(end),
                int(elapsed) if elapsed.isdigit() else 0,
                alloc_gpus(tres),
            )  # fmt: skip
        )
    return records


def state_from_sacct(job_id: str, records: list[SacctRecord]) -> JobState | None:
    """The job's state from its attempts' records (the last is the current one; the others its requeues), or None
    when sacct has none. A record that is not terminal is never read as running: it may be slurmdbd's lag behind
    an end the controller knows, or an end it never heard of; None then, as for a job it does not know."""
    if not records or records[-1].state not in TERMINAL:
        return None
    last = records[-1]
    return JobState(job_id, last.state, last.reason, last.exit_code, last.signal, len(records) - 1, last.nodes)


def parse_job_records(job_id: str, text: str) -> list[JobState]:
    """`scontrol show job -o JOB_ID` output: one record a line, one for a job or an array task, and for a whole
    array one a task (the tasks not started yet share one record)."""
    states = []
    for line in text.splitlines():
        if "JobState=" not in line:
            continue
        f = parse_scontrol(line)
        status, sig = _exit(f.get("ExitCode", ""))
        states.append(
            JobState(
                job_id,
                f["JobState"],
                f.get("Reason", "None"),
                status,
                sig,
                int(f.get("Restarts", "0") or 0),
                f.get("NodeList", ""),
                "" if f.get("Dependency", "(null)") == "(null)" else f["Dependency"],
                expected_start(f["JobState"], f.get("StartTime", "")),
            )
        )
    return states


def expected_start(state: str, start: str) -> str:
    """A pending job's StartTime is the scheduler's estimate of its start (what `squeue --start` prints): kept for a
    pending job where there is one; "" otherwise (Unknown, N/A, or a job no longer pending)."""
    return start if state == "PENDING" and start[:1].isdigit() else ""


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` ("SlurmctldParameters     = enable_expedited_requeue" lines) as a dict."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields


GRES_ITEM = re.compile(r",(?![^()]*\))")  # commas between GRES items, not inside "(S:0-1,3)"


def parse_gres_types(text: str, partition: str | None = None) -> list[str | None]:
    """`sinfo -h -o "%P %G"` lines ("debug* gpu:h100:8(S:0-1)", "gpu gpu:8,shard:16", "cpu (null)") -> the GPU
    types of the partition's nodes (None for GPUs without a type), the default partition's (marked *) when none
    is named."""
    types: list[str | None] = []
    for line in text.splitlines():
        name, _, gres = line.strip().partition(" ")
        default = name.endswith("*")
        if not name or (name.rstrip("*") != partition if partition else not default):
            continue
        for item in GRES_ITEM.split(gres.strip()):
            fields = re.sub(r"\(.*?\)", "", item).split(":")
            if fields[0] != "gpu":
                continue
            named = len(fields) >= 3 or (len(fields) == 2 and not fields[1].isdigit())
            types.append(fields[1] if named else None)
    return types


def _gpu_count(gres: str) -> int:
    """GPUs in one node's GRES ("gpu:h100:8(S:0-1)", "gpu:2,shard:16", "(null)")."""
    count = 0
    for item in GRES_ITEM.split(gres.strip()):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit() and len(fields) >= 2:
            count += int(fields[-1])
    return count


def _in_partition(name: str, partition: str | None) -> bool:
    """Whether sinfo's partition column (`debug*`: the default one) is `partition`, or the default when None."""
    return bool(name) and (name.rstrip("*") == partition if partition else name.endswith("*"))


def parse_node_shapes(text: str, partition: str | None = None) -> list[tuple[int, int]]:
    """`sinfo -h -o "%P|%c|%G"` lines ("debug*|96|gpu:h100:8(S:0-1)") -> (CPUs, GPUs) of each kind of node in the
    partition (the default partition, marked *, when none is named)."""
    shapes = []
    for line in text.splitlines():
        name, cpus, gres = (line.strip().split("|") + ["", ""])[:3]
        if _in_partition(name, partition) and cpus.isdigit():
            shapes.append((int(cpus), _gpu_count(gres)))
    return shapes


# One line a node and partition (`sinfo -h -N -o NODE_STATES`): name, partition, state, GRES, why it is out of service
NODE_STATES = "%N|%P|%T|%G|%E"
# sinfo's long states (and their flags) of a node Slurm places no job on now, though it may return: drained or
# draining, down, failing, in maintenance or a reservation, not yet known, rebooting; `*`: not responding
OUT_OF_SERVICE = ("down", "drain", "fail", "maint", "reserved", "unknown", "inval", "future", "reboot", "*")


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's long state with its flags: "idle", "mixed", "drained", "down*"
    gpus: int
    reason: str  # why it is out of service, as the admin or Slurm said it ("none" where it is not)

    @property
    def in_service(self) -> bool:
        """Whether Slurm may place a job on it now (a busy node is in service: a job waits for it in the queue)."""
        return not any(word in self.state.lower() for word in OUT_OF_SERVICE)


def parse_node_states(text: str, partition: str | None = None) -> list[NodeState]:
    """`sinfo -h -N -o NODE_STATES` lines ("node2|debug*|drained|gpu:h100:8|bad DIMM") -> the nodes of the
    partition (the default partition when none is named), each once."""
    nodes: dict[str, NodeState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|", 4)
        if len(fields) == 5 and fields[0] and _in_partition(fields[1], partition):
            nodes.setdefault(fields[0], NodeState(fields[0], fields[2], _gpu_count(fields[3]), fields[4].strip()))
    return list(nodes.values())


# Many jobs' states in one query (`squeue -j ID,ID,... -t all -h -O ...`): one field per column, each ending in |
# (no width given: squeue pads nothing); exit_code is the raw wait status (512 = exit code 2; 9 = signal 9).
SQUEUE_STATES = "JobID:|,State:|,Reason:|,exit_code:|,RestartCnt:|,NodeList:|,Dependency:|,StartTime:|"


def _wait_status(text: str) -> tuple[int | None, int | None]:
    """squeue's exit_code ("512", a raw wait status; "2:0" where a version says it as scontrol does) -> (exit
    code, signal), as scontrol's ExitCode=2:0 says them."""
    if ":" in text or not text.isdigit():
        return _exit(text)
    status = int(text)
    return (0, status & 0x7F) if status & 0x7F else (status >> 8, 0)


def parse_squeue_states(text: str) -> dict[str, JobState]:
    """`squeue -h -O SQUEUE_STATES` output -> job id -> its state, as `parse_job_records` would read it."""
    found = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 7 or not fields[0] or not fields[1]:
            continue
        job_id, state, reason, code, restarts, nodes, dependency, start = (fields + [""])[:8]
        status, sig = _wait_status(code)
        found[job_id] = JobState(
            job_id,
            state,
            reason or "None",
            status,
            sig,
            int(restarts) if restarts.isdigit() else 0,
            nodes,
            "" if dependency in ("(null)", "") else dependency,
            expected_start(state, start),
        )
    return found


SQUEUE_JOBS = "%i|%T|%o"  # job id, state, command (the batch script's path)


def parse_squeue_jobs(text: str) -> list[tuple[str, str, str]]:
    """`squeue -h -o "%i|%T|%o"` output as (job id, state, command) triples; squeue lists live jobs only."""
    rows = []
    for line in text.splitlines():
        job_id, _, rest = line.strip().partition("|")
        state, _, command = rest.partition("|")
        if job_id and state:
            rows.append((job_id, state, command))
    return rows
