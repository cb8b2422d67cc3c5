"""The user-facing error hierarchy, and what a command does when its output pipe closes.

Every error a user can cause is a `LauncherError`: the entry scripts print its message (which says what is wrong
and how to fix it) and exit non-zero. Anything else escaping is a bug in the launcher, and shows a traceback.
"""

import os
import sys
from collections.abc import Callable


class LauncherError(Exception):
    """Base of all user-facing errors; the message says what is wrong and how to fix it."""

    exit_code = 1


class ConfigError(LauncherError):
    """The flags or config describe a run that cannot work; nothing was written or submitted."""

    exit_code = 2


class SubmissionError(LauncherError):
    """Slurm refused the job (its own message is included); the bundle is kept."""


class QueueFull(SubmissionError):
    """Slurm cannot take a job now: its queue holds MaxJobCount jobs (a state of the cluster, not of the flags)."""


class SlurmUnavailable(LauncherError):
    """Slurm's commands are missing or its controller does not answer."""


class VerdictError(LauncherError):
    """Arms that cannot be compared (`jobs verdict`: no evals, one run, one item, other items, a metric a task lacks, a
    value that is not a number): the message names the arm, the seed and the problem."""

    exit_code = 2


class TrainError(LauncherError):
    """The training job cannot start or continue with this config or environment."""

    exit_code = 2


def closed_pipe() -> int:
    """The exit code for a command whose stdout went to a pipe that closed (`| head`): nothing left to say, and
    Python must not complain again while flushing at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def as_command(body: Callable[[], int]) -> int:
    """A command line's exit code: `body`'s, or a LauncherError's message on stderr and its exit code, 130 for
    Ctrl-C, or a closed output pipe's. The one way every command ends (`slurm_launcher.py`, `python -m launcher.X`)."""
    try:
        return body()
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return closed_pipe()
