"""A command run to its end or to its time, the job side's one way (standard library: the supervisor's Slurm
commands, the uploader's s5cmd): its output kept; a command that cannot run is a failed one (exit code 127), never a
traceback; one past its time is ended (then killed) and its exit code is 124, with what it said."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence


def run(argv: Sequence[str], timeout: float, *, kill_after: float = 10,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`argv` to its end, or ended `timeout` s in (SIGTERM, then SIGKILL `kill_after` s later); no stdin."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=None if env is None else dict(env))  # fmt: skip
    except OSError as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return subprocess.CompletedProcess(list(argv), 124, out, f"{err}\n{argv[0]} did not end in {timeout:g} s")
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
