"""The hang watchdog: a run whose training step has not advanced for too long is hung (a rank stuck in a collective
waits for a peer that never comes; a GPU kernel that never returns; a data loader that deadlocked), and burns its
whole allocation unless something ends it.

Training's rank 0 writes its progress to the bundle's `progress` file ("STEP UNIXTIME PHASE": `step` after each
step, `saving` around a checkpoint save). This watchdog, started by the batch script, reads it every few seconds
and counts time since it last changed, by its own clock (the file's writer may be another node). The limit:

- before the first step and during a save: `--floor` seconds (start-up, compilation, a large checkpoint);
- between steps: `--factor` x the median step time seen so far, at least min(60 s, floor).

Past the limit it writes "STEP IDLE LIMIT" to `--hung-file` and sends SIGUSR2 to the batch script, which dumps every
rank's stacks, ends the training and requeues the run once without the suspected node.

`--suspects DIR` reads the stack dumps (py-spy's, one file a process, named NODE-PID.txt) and prints the nodes
whose processes are not waiting in a collective: where a hang starts, the others only wait for it.

Standard library only, run as a script by path with the job's Python.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run by path with the job's Python: the launcher package is two levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher import protocol as P  # noqa: E402  (standard library only, like this file)

STEP_FLOOR_S = 60.0
# What a rank waiting for its peers shows in its stack (torch.distributed's Python API and NCCL/gloo waits).
COLLECTIVE = ("all_reduce", "allreduce", "barrier", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
              "recv", "send", "_wait", "wait_tensor", "synchronize", "ProcessGroup")  # fmt: skip


def read_progress(path: Path) -> tuple[int, str] | None:
    """(step, phase) from the progress file, None while there is none (or it is being replaced)."""
    try:
        fields = path.read_text(encoding="utf-8").split()
        return int(fields[0]), fields[2] if len(fields) > 2 else "step"
    except (OSError, ValueError, IndexError):
        return None


def limit(step_times: list[float], phase: str, factor: float, floor: float) -> float:
    """Seconds without progress after which the run counts as hung."""
    if phase != "step" or not step_times:
        return floor
    return max(factor * statistics.median(step_times), min(STEP_FLOOR_S, floor))


def watch(progress: Path, hung_file: Path, notify: int, factor: float, floor: float, poll: float) -> int:
    """Watch until a hang (then write hung_file, signal `notify`, return 0) or until killed."""
    last: tuple[int, str] | None = None
    changed = time.monotonic()
    step_times: list[float] = []
    step_seen: tuple[int, float] | None = None  # the last step and when it was seen
    while True:
        now, seen = time.monotonic(), read_progress(progress)
        if seen != last and seen is not None:
            if seen[1] == "step" and step_seen is not None and seen[0] > step_seen[0]:
                step_times = (step_times + [(now - step_seen[1]) / (seen[0] - step_seen[0])])[-50:]
            if seen[1] == "step":
                step_seen = (seen[0], now)
            last, changed = seen, now
        phase = last[1] if last else "starting"
        allowed = limit(step_times, phase, factor, floor)
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


def suspects(stacks: Path) -> list[str]:
    """Nodes with a process that is not waiting in a collective, from py-spy dumps named NODE-PID.txt."""
    elsewhere = set()
    for dump in sorted(stacks.glob("*-*.txt")):
        text = dump.read_text(encoding="utf-8", errors="replace")
        if "Thread" in text and not any(word in text for word in COLLECTIVE):
            elsewhere.add(dump.name.rsplit("-", 1)[0])
    return sorted(elsewhere)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--progress", type=Path, help="training's progress file")
    parser.add_argument("--hung-file", type=Path, help="where to write 'STEP IDLE LIMIT' on a hang")
    parser.add_argument("--notify", type=int, help="the process to send SIGUSR2 on a hang (the batch script)")
    parser.add_argument("--factor", type=float, default=10.0, help="limit between steps: x the median step time")
    parser.add_argument("--floor", type=float, default=1800.0, help="limit before the first step and while saving")
    parser.add_argument("--poll", type=float, default=0.0, help="seconds between looks (default: floor / 20, 1-30)")
    parser.add_argument("--suspects", type=Path, help="print the suspected nodes from this directory of stack dumps")
    args = parser.parse_args(argv)
    if args.suspects is not None:
        print(" ".join(suspects(args.suspects)))
        return 0
    poll = args.poll or min(max(args.floor / 20, 1.0), 30.0)
    return watch(args.progress, args.hung_file, args.notify, args.factor, args.floor, poll)


if __name__ == "__main__":
    sys.exit(main())
