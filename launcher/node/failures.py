"""What a job's log says went wrong, as data: the Python exceptions its ranks raised, torchrun's failure summaries,
NCCL's watchdog, the job's own `error: ...` line, srun's and slurmstepd's complaints. Pure: text in, data out.

`first_failure` names the failure that came first, skipping what only follows from it: the ranks that lost their
peer ("Connection closed by peer", an aborted NCCL communicator) and the ranks torchrun or srun stopped (SIGTERM,
exit code 143). Recorded torchrun logs to test it on are in tests/fixtures/triage/.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

NANOTRON_PACKAGE = "/nanotron/"  # a frame in nanotron's own package (not the launcher's nanotron_engine)
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:[ ]?")  # torch's excepthook (and C++ log) prefix after init_process_group
TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")
AGENT_EXCEPTIONS = ("ChildFailedError", "SignalException")  # torchrun's own: its summary, or srun stopping it
# What a rank raises when another one died first: consequences, never the cause
SECONDARY = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "ncclRemoteError",
    "remote process exiting prematurely",
    "failed to recv, got 0 bytes",
    "DistNetworkError",
    "DistStoreError",
    "KeyboardInterrupt",
)
LOST_PEERS = "it lost its peers"  # the detail of a failure that is only a consequence (no first cause found)
STOPPED = {-15: "SIGTERM", -2: "SIGINT", -1: "SIGHUP"}  # how torchrun and srun stop the ranks that did not fail
SIGNALS = {-6: "SIGABRT", -7: "SIGBUS", -9: "SIGKILL", -11: "SIGSEGV", -4: "SIGILL", -8: "SIGFPE"}
FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\((?P<work>.*?)\) ran for (?P<ms>\d+) milliseconds"
)
RANK_IN_TEXT = re.compile(r"\bRank (\d+)\]")
USER_ERROR = re.compile(r"^error: (?P<message>.+)$")  # run_train.py's one line for bad data or config (exit 2)
SRUN_TASK = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? [\d,\-]+: (?P<what>.+)$")
HOST_OOM = re.compile(r"oom_kill event|: Out Of Memory$|oom-kill")
# GPU memory exhausted, as printed without a Python traceback (a C++ abort, a logged line, CUDA's own error)
GPU_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation")


@dataclass(frozen=True)
class Raised:
    """An exception a process died of, as Python printed it (the last of a chain)."""

    rank: int | None  # from torch's "[rankN]:" prefix; None before init_process_group
    type: str  # "ValueError", "torch.OutOfMemoryError"
    message: str  # its first line
    detail: tuple[str, ...]  # the lines that continue the message (an NCCL error's "Last error: ...")
    frame: str | None  # the innermost frame, "fail.py:70 in main"
    line: int  # where its traceback starts in the text
    nanotron: str | None = None  # the innermost frame in nanotron's own package, "nanotron/trainer.py:559 in train"

    @property
    def secondary(self) -> bool:
        """Raised because another rank died first (the peer closed, the communicator aborted)."""
        text = " ".join((self.type, self.message, *self.detail))
        return any(pattern in text for pattern in SECONDARY)


@dataclass(frozen=True)
class ChildFailure:
    """One entry of torchrun's failure summary ("Root Cause (first observed failure)" or "Failures")."""

    rank: int
    host: str
    exitcode: int
    time: str  # torchrun's "2026-11-23_09:13:01" (the error file's time, else when torchrun saw it)
    root: bool
    exception: str | None  # the last line of the traceback its error file recorded (torchrun's @record)
    line: int

    @property
    def stopped(self) -> bool:
        """Stopped by torchrun or srun after another failure, not failed itself."""
        return self.exitcode in STOPPED


def _strip(lines: list[str]) -> list[tuple[int | None, str]]:
    out: list[tuple[int | None, str]] = []
    for line in lines:
        m = RANK_PREFIX.match(line)
        out.append((int(m.group(1)), line[m.end() :]) if m else (None, line))
    return out


def _exception_at(body: list[str], start: int) -> tuple[int, Raised | None]:
    """Read one traceback of one stream from body[start] ("Traceback ..."); return where it ends and what it
    raised (its rank filled in by the caller)."""
    frame, in_nanotron, i = None, None, start + 1
    while i < len(body) and (body[i].startswith(" ") or not body[i].strip()):
        m = FRAME.match(body[i])
        if m:
            frame = f"{m.group('file').rsplit('/', 1)[-1]}:{m.group('line')} in {m.group('func')}"
            package = m.group("file").rpartition(NANOTRON_PACKAGE)
            if package[1]:  # .../site-packages/nanotron/trainer.py, or a source tree's src/nanotron/...
                in_nanotron = f"nanotron/{package[2]}:{m.group('line')} in {m.group('func')}"
        i += 1
    if i >= len(body):
        return i, None
    m = EXCEPTION.match(body[i].strip())
    if not m:
        return i, None
    detail: list[str] = []
    j = i + 1
    while j < len(body) and len(detail) < 4 and body[j].strip() and not body[j].startswith((TRACEBACK, *CHAINED)):
        detail.append(body[j].strip())
        j += 1
    message = (m.group("message") or "").strip()
    return j, Raised(None, m.group("type"), message, tuple(detail), frame, start, in_nanotron)


def tracebacks(lines: list[str]) -> list[Raised]:
    """The exceptions the processes died of, in the order their tracebacks start; torchrun's own left out."""
    streams: dict[int | None, list[tuple[int, str]]] = {}
    for n, (rank, text) in enumerate(_strip(lines)):
        streams.setdefault(rank, []).append((n, text))
    found: list[Raised] = []
    for rank, numbered in streams.items():
        body = [text for _, text in numbered]
        i, chain_start = 0, None
        while i < len(body):
            if not body[i].startswith(TRACEBACK):
                i += 1
                continue
            chain_start = chain_start if chain_start is not None else i
            end, raised = _exception_at(body, i)
            chained = any(body[k].startswith(CHAINED) for k in range(end, min(end + 3, len(body))))
            if not chained:  # the chain's last exception is the one the process died of
                if raised and not raised.type.endswith(AGENT_EXCEPTIONS):
                    found.append(dataclasses.replace(raised, rank=rank, line=numbered[chain_start][0]))
                chain_start = None
            i = max(end, i + 1)
    return sorted(found, key=lambda r: r.line)


def child_failures(lines: list[str]) -> list[ChildFailure]:
    """Every entry of every torchrun failure summary in the text (one summary per node whose torchrun saw it)."""
    entries: list[ChildFailure] = []
    fields: dict[str, str] = {}
    root, start, exception = False, 0, None

    def close() -> None:
        code = re.match(r"(-?\d+)", fields.get("exitcode", ""))
        rank = re.match(r"(\d+)", fields.get("rank", ""))
        if code and rank:
            host, time = fields.get("host", "?"), fields.get("time", "")
            entries.append(ChildFailure(int(rank.group(1)), host, int(code.group(1)), time, root, exception, start))

    for n, line in enumerate(lines):
        if line.startswith(("Root Cause (first observed failure)", "Failures:", "====", "----")) or (
            re.match(r"^\[\d+\]:$", line)
        ):
            if fields:
                close()
            fields, exception = {}, None
            if line.startswith("Root Cause"):
                root = True
            elif line.startswith(("Failures:", "====")):
                root = False
            continue
        m = FIELD.match(line)
        if m:
            if not fields:
                start = n
            fields[m.group(1)] = m.group(2).strip()
        elif fields and line.startswith("  ") and not line.startswith("   "):
            e = EXCEPTION.match(line.strip())
            if e and e.group("message") is not None:
                exception = line.strip()  # the exception line of an error file's traceback
    if fields:
        close()
    return entries


@dataclass(frozen=True)
class Failure:
    """The failure that came first: what it was, where, and the line that says so."""

    kind: str  # "exception", "nanotron", "cuda_oom", "nccl", "nccl_timeout", "bad_input", "crash", "host_oom", "exited"
    summary: str  # one line: "ValueError: shard 7 ..." / "collective ALLREDUCE ... timed out after 600 s"
    rank: int | None
    node: str | None
    detail: str = ""  # a second line, where there is one (the innermost frame, NCCL's last error)
    stopped: int = 0  # ranks torchrun or srun stopped after it (their SIGTERM, exit code -15 or 143)


def _kind(raised: Raised) -> str:
    text = " ".join((raised.type, raised.message, *raised.detail))
    if "OutOfMemoryError" in raised.type or "CUDA out of memory" in text:
        return "cuda_oom"
    if "DistBackendError" in raised.type or re.search(r"\bNCCL\b|\bnccl[A-Z]", text):
        return "nccl"
    return "exception"


def first_failure(text: str) -> Failure | None:
    """The failure that came first in a job's log (an excerpt of it: see `triage.excerpt`), or None."""
    lines = text.splitlines()
    failures = child_failures(lines)
    first = _first(lines, failures)
    return dataclasses.replace(first, stopped=sum(f.stopped for f in failures)) if first else None


def _first(lines: list[str], failures: list[ChildFailure]) -> Failure | None:
    failed = [f for f in failures if not f.stopped]
    host_of = {f.rank: f.host for f in failures}
    time_of = {f.rank: f.time for f in failed}
    srun = [m for m in map(SRUN_TASK.match, lines) if m]
    first_node = srun[0].group("node") if srun else None

    def node(rank: int | None) -> str | None:
        return host_of.get(rank) if rank is not None else None

    def when(rank: int | None) -> str:  # torchrun's time of the rank's failure; unknown ones sort last
        return time_of.get(rank, "~") if rank is not None else "~"

    if any(HOST_OOM.search(line) for line in lines):
        oom = next((m.group("node") for m in srun if "Out Of Memory" in m.group("what")), None)
        return Failure("host_oom", "the kernel's out-of-memory killer stopped a process", None, oom or first_node)
    candidates: list[tuple[str, int, Failure]] = []
    for raised in tracebacks(lines):
        if raised.secondary:
            continue
        where = f"at {raised.frame}" if raised.frame else ""
        kind = _kind(raised)
        if kind == "exception" and raised.nanotron:  # raised inside nanotron's trainer (or below it, in torch)
            kind, where = (
                "nanotron",
                f"inside nanotron's own code, at {raised.nanotron}"
                + (
                    f" (innermost: {raised.frame})"
                    if raised.frame and not raised.nanotron.endswith(raised.frame)
                    else ""
                ),
            )
        detail = "; ".join(x for x in (where, _last_error(raised.detail)) if x)
        summary = f"{raised.type}: {raised.message}" if raised.message else raised.type
        failure = Failure(kind, summary, raised.rank, node(raised.rank), detail)
        candidates.append((when(raised.rank), raised.line, failure))
    for n, line in enumerate(lines):
        rank_m = RANK_PREFIX.match(line)
        body = line[rank_m.end() :] if rank_m else line
        m = WATCHDOG.search(body)
        if m:
            rank = int(rank_m.group(1)) if rank_m else _int(RANK_IN_TEXT.search(body))
            work = dict(kv.split("=", 1) for kv in m.group("work").split(", ") if "=" in kv)
            what = f"collective {work.get('OpType', '?')} (SeqNum {work.get('SeqNum', '?')})"
            summary = f"{what} timed out after {int(m.group('ms')) / 1000:.0f} s waiting for the other ranks"
            candidates.append((when(rank), n, Failure("nccl_timeout", summary, rank, node(rank))))
            break
    for n, line in enumerate(lines):
        m = USER_ERROR.match(line)
        if m:
            roots = sorted((f for f in failed if f.exitcode == 2), key=lambda f: (not f.root, f.time))
            rank = roots[0].rank if roots else None
            more = [x.strip() for x in lines[n + 1 : n + 4] if x.startswith("  - ")]
            summary = m.group("message") + (" " + " ".join(more) if more else "")
            candidates.append((when(rank), n, Failure("bad_input", summary, rank, node(rank) or first_node)))
            break
    if candidates:
        return min(candidates, key=lambda c: (c[0], c[1]))[2]
    crashed = sorted(failed, key=lambda f: (not f.root, f.time, f.line))
    if oom := _gpu_oom(lines, crashed[0] if crashed else None):
        return oom
    if crashed:
        f = crashed[0]
        if f.exception:
            return Failure("exception", f.exception, f.rank, f.host)
        if f.exitcode < 0:
            name = SIGNALS.get(f.exitcode, f"signal {-f.exitcode}")
            return Failure("crash", f"died of {name} (exit code {f.exitcode}), with no traceback", f.rank, f.host)
        return Failure("exited", f"exited with code {f.exitcode}, with no traceback", f.rank, f.host)
    secondary = tracebacks(lines)
    if secondary:
        r = secondary[0]
        return Failure("exception", f"{r.type}: {r.message}", r.rank, node(r.rank), LOST_PEERS)
    if srun:
        return Failure("exited", f"exited (srun: {srun[0].group('what')})", None, srun[0].group("node"))
    return None


def _gpu_oom(lines: list[str], crashed: ChildFailure | None) -> Failure | None:
    """GPU memory exhausted with no traceback to say so: the first line that says it, and the rank it names (its
    "[rankN]:" prefix), else the rank torchrun saw fail first."""
    for line in lines:
        if GPU_OOM.search(line):
            m = RANK_PREFIX.match(line)
            rank = int(m.group(1)) if m else (crashed.rank if crashed else None)
            host = crashed.host if crashed and crashed.rank == rank else None
            return Failure("cuda_oom", line[m.end() :] if m else line.strip(), rank, host, "with no traceback")
    return None


def _int(m: re.Match[str] | None) -> int | None:
    return int(m.group(1)) if m else None


def _last_error(detail: tuple[str, ...]) -> str:
    """NCCL's own words on what failed: the line after its "Last error:" ("socketStartConnect: Connect to ...")."""
    for before, line in zip(detail, detail[1:], strict=False):
        if before.startswith("Last error"):
            return line
    return ""
