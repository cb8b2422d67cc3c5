"""Where a command's CPU goes, by kind of process (Linux's /proc): what the tests' time is made of. Not a test.

    python bench/cpu_by_process.py -- python -m pytest -q tests/test_e2e_training.py -k demo_flow

Runs the command and, every 0.3 s until it ends, reads every process's CPU seconds (utime + stime) and command
line, the local cluster's daemons and the jobs' processes included (they are not the command's children); then
prints the CPU each kind of process took meanwhile (a process seen before the start counts from there), the
machine's busy CPU seconds of all it had, and the processes that took the most. A process that starts and ends
between two looks is missed: the figures are a floor.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
# the first of these a command line holds names its kind: torchrun's agents before the ranks they start (a rank's
# command line, run_train.py's or a test's wrapper of it, holds --config-file), the tests' temporary paths last
KINDS = (("slurm_launcher", "the launcher"), ("torch.distributed.run", "torchrun's agents"),
         ("torchrun", "torchrun's agents"), ("--config-file", "ranks"), ("launcher.node", "the job's supervisor"),
         ("launcher.jobs", "launcher.jobs"), ("slurmctld", "slurmctld"), ("slurmstepd", "slurmstepd"),
         ("slurmd", "slurmd"), ("slurmdbd", "slurmdbd"), ("srun", "srun"), ("munged", "munged"),
         ("mariadbd", "mariadbd"), ("pytest", "pytest and what it runs"))  # fmt: skip


def kind(command: str) -> str:
    return next((label for needle, label in KINDS if needle in command), command.split(" ")[0][-40:] or "?")


def processes() -> dict[tuple[str, str], tuple[float, str]]:
    """{(pid, start time): (CPU seconds, command line)} of every process now."""
    seen = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        seen[(entry.name, fields[19])] = ((int(fields[11]) + int(fields[12])) / HZ, command or f"[{name}]")
    return seen


def machine() -> tuple[float, float]:
    """(all CPU seconds, idle ones) since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values) / HZ, (values[3] + values[4]) / HZ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="+")
    parser.add_argument("--top", type=int, default=12, help="the processes that took the most, how many")
    args = parser.parse_args()
    base, last = processes(), {}
    start, (all0, idle0) = time.monotonic(), machine()
    child = subprocess.Popen(args.command)
    while child.poll() is None:
        for key, (cpu, command) in processes().items():  # a zombie's command line is empty: keep the last seen
            last[key] = (cpu, command if key not in last or not command.startswith("[") else last[key][1])
        time.sleep(0.3)
    all1, idle1 = machine()
    took = {key: (cpu - base.get(key, (0.0, ""))[0], command) for key, (cpu, command) in last.items()}
    by_kind = Counter()
    for cpu, command in took.values():
        by_kind[kind(command)] += cpu
    busy = (all1 - all0) - (idle1 - idle0)
    print(f"\n{time.monotonic() - start:.0f} s; the machine busy {busy:.0f} CPU s of {all1 - all0:.0f} "
          f"(exit code {child.returncode})")  # fmt: skip
    for name, cpu in by_kind.most_common():
        if cpu >= 0.1:
            print(f"{cpu:8.1f} CPU s  {name}")
    print("the processes that took the most:")
    for cpu, command in sorted(took.values(), reverse=True)[: args.top]:
        print(f"{cpu:8.1f} CPU s  {command[:140]}")


if __name__ == "__main__":
    main()
