"""The hang watchdog: a run whose training step has not advanced for too long is hung (a rank stuck in a collective
waits for a peer that never comes; a GPU kernel that never returns; a data loader that deadlocked), and burns its
whole allocation unless something ends it.

Training's rank 0 writes its progress to the bundle's `progress` file ("STEP UNIXTIME PHASE": `step` after each
step, `saving` around a checkpoint save). This watchdog, started by the supervisor, reads it every few seconds
and counts time since it last changed, by its own clock (the file's writer may be another node). The limit:

- before an attempt's first step: `--startup` seconds (start-up, data loading, compilation, a resume; default:
  `--floor`);
- during a save: `--floor` seconds (a large checkpoint);
- between steps: `--factor` x the median step time seen so far, at least min(60 s, floor).

Past the limit it writes "STEP IDLE LIMIT" to `--hung-file` and sends SIGUSR2 to the supervisor, which dumps every
rank's stacks, ends the training and starts it again without the suspected node (launcher/node/restart.py).

`--suspects DIR` reads the stack dumps (py-spy's, one file a process, named NODE-PID.txt) and prints the nodes
whose processes do something other than the great majority (where a hang starts, the others only wait for it),
at most `--max-suspects` of them: more point at no one node, and a requeue without them could not start.

Standard library (and `launcher.protocol`) only: the supervisor runs it with the job's Python as
`python -m launcher.node.watchdog ...`, the project on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from launcher import protocol as P  # standard library only, like this module

STEP_FLOOR_S = 60.0
# What a rank waiting for its peers shows in its stack (torch.distributed's Python API and NCCL/gloo waits; a DDP
# rank idle in autograd's backward waits for the gradient all-reduce, which DDP's reducer runs inside backward, in
# C++: no Python frame of its own).
COLLECTIVE = ("all_reduce", "allreduce", "barrier", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "recv",
              "send", "_wait", "wait_tensor", "synchronize", "ProcessGroup", "_engine_run_backward")  # fmt: skip


def read_progress(path: Path) -> tuple[int, str] | None:
    """(step, phase) from the progress file, None while there is none (or it is being replaced)."""
    try:
        fields = path.read_text(encoding="utf-8").split()
        return int(fields[0]), fields[2] if len(fields) > 2 else "step"
    except (OSError, ValueError, IndexError):
        return None


def limit(step_times: list[float], phase: str, factor: float, floor: float, startup: float | None = None) -> float:
    """Seconds without progress after which the run counts as hung, in `phase`: "starting" (no progress yet this
    attempt: `startup`, default `floor`), "saving", or "step"."""
    if phase == "starting":
        return floor if startup is None else startup
    if phase != "step" or not step_times:
        return floor
    return max(factor * statistics.median(step_times), min(STEP_FLOOR_S, floor))


def watch(
    progress: Path, hung_file: Path, notify: int, factor: float, floor: float, poll: float, startup: float | None = None
) -> int:
    """Watch until a hang (then write hung_file, signal `notify`, return 0), until killed, or until `notify` is gone
    (a supervisor killed with SIGKILL leaves no watchdog behind: return 1)."""
    last: tuple[int, str] | None = None
    changed = time.monotonic()
    step_times: list[float] = []
    step_seen: tuple[int, float] | None = None  # the last step and when it was seen
    while True:
        if not alive(notify):
            return 1
        now, seen = time.monotonic(), read_progress(progress)
        if seen != last and seen is not None:
            if seen[1] == "step" and step_seen is not None and seen[0] > step_seen[0]:
                step_times = (step_times + [(now - step_seen[1]) / (seen[0] - step_seen[0])])[-50:]
            if seen[1] == "step":
                step_seen = (seen[0], now)
            last, changed = seen, now
        phase = last[1] if last else "starting"
        allowed = limit(step_times, phase, factor, floor, startup)
        if now - changed > allowed:
            hung_file.write_text(
                P.HUNG_FILE_FORMAT.format(
                    step=last[0] if last else 0, idle=f"{now - changed:.0f}", limit=f"{allowed:.0f}"
                ),
                encoding="utf-8",
            )
            os.kill(notify, signal.SIGUSR2)
            return 0
        time.sleep(poll)


def alive(pid: int) -> bool:
    """Whether process `pid` is there (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def signature(text: str) -> tuple[str, ...] | None:
    """What a process is doing, from its py-spy dump: the frames of its first thread listed as active (else the
    first), function and file without line numbers (a loop's iterations differ by line), innermost 8."""
    threads = text.split("\nThread ")[1:]
    if not threads:
        return None
    chosen = next((t for t in threads if "(active" in t.split("\n", 1)[0]), threads[0])
    frames = []
    for line in chosen.splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith(("Thread ", "Process ", "Python v")) or " (" not in line:
            continue
        function, where = line.split(" (", 1)
        frames.append(f"{function} ({where.rsplit(':', 1)[0]})")
    return tuple(frames[:8])


def suspects(stacks: Path, max_suspects: int = 0) -> tuple[list[str], str]:
    """(the suspected nodes, why none is) from py-spy dumps named NODE-PID.txt.

    Processes are grouped by what they are doing (`signature`). Where a hang starts, one node's processes do
    something else while the thousands of others wait in the same place: the suspects are the nodes with a
    process in a group under a tenth of the largest. Where no group is that small (a few processes), a process
    outside any collective while others wait in one is the suspect. More suspects than `max_suspects` (0: no
    limit) point at no one node: none then (a requeue must be able to start without them)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for dump in stacks.glob("*-*.txt"):
        sig = signature(dump.read_text(encoding="utf-8", errors="replace"))
        if sig is not None:
            groups.setdefault(sig, []).append(dump.name.rsplit("-", 1)[0])
    if not groups:
        return [], "no stacks to compare (py-spy missing or no dump answered)"
    largest = max(len(nodes) for nodes in groups.values())
    odd = {node for nodes in groups.values() if len(nodes) * 10 < largest for node in nodes}
    if not odd and any(any(w in " ".join(sig) for w in COLLECTIVE) for sig in groups):
        odd = {n for sig, nodes in groups.items() if not any(w in " ".join(sig) for w in COLLECTIVE) for n in nodes}
    if max_suspects and len(odd) > max_suspects:
        return [], f"{len(odd)} nodes' stacks differ from the others': more than {max_suspects}, so no one node"
    return sorted(odd), "" if odd else f"no node's processes stand out ({len(groups)} kinds of stacks, none rare)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--progress", type=Path, help="training's progress file")
    parser.add_argument("--hung-file", type=Path, help="where to write 'STEP IDLE LIMIT' on a hang")
    parser.add_argument("--notify", type=int, help="the process to send SIGUSR2 on a hang (the supervisor)")
    parser.add_argument("--factor", type=float, default=10.0, help="limit between steps: x the median step time")
    parser.add_argument("--floor", type=float, default=1800.0, help="limit while saving, and least between steps")
    parser.add_argument("--startup", type=float, default=None, help="limit before the first step (default: --floor)")
    parser.add_argument("--poll", type=float, default=0.0, help="seconds between looks (default: floor / 20, 1-30)")
    parser.add_argument("--suspects", type=Path, help="print the suspected nodes from this directory of stack dumps")
    parser.add_argument("--max-suspects", type=int, default=0, help="more suspects than this: none (0: no limit)")
    args = parser.parse_args(argv)
    if args.suspects is not None:
        found, why = suspects(args.suspects, args.max_suspects)
        print(" ".join(found))
        if why:
            print(f"no suspected node: {why}", file=sys.stderr)
        return 0
    poll = args.poll or min(max(args.floor / 20, 1.0), 30.0)
    return watch(args.progress, args.hung_file, args.notify, args.factor, args.floor, poll, args.startup)


if __name__ == "__main__":
    sys.exit(main())
