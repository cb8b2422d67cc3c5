"""`python -m launcher.node.supervisor JOB`: one attempt of the job, JOB the bundle's job.json (the batch script execs
it: docs/supervisor.md). Around the --pre_launch_commands, the batch script runs it twice more:

- `JOB --before-pre-launch`: the attempt's start said and the run's lock taken before the commands run (exit 4, its
  end said: another job of the run holds the lock);
- `JOB --pre-launch-ended CODE COMMAND`: a command ended the attempt: which one, and the attempt's end;

then execs `JOB --started-said`. `--free-port START`: the first free rendezvous port from START on this node (run on
the rendezvous host through srun --overlap where it is not the batch host)."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

from launcher.node import job as jobs
from launcher.node.supervisor.attempt import TWO_WRITERS, Attempt
from launcher.node.supervisor.effects import Node, free_port_here, say
from launcher.node.supervisor.state import Allocation


def now() -> str:
    """The attempt's start and end, to the second with the time zone (as `date --iso-8601=seconds`)."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launcher.node.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", help="the bundle's job.json (or the bundle's directory)")
    parser.add_argument("--free-port", type=int, help="print the first free rendezvous port from this one")
    parser.add_argument("--started-said", action="store_true", help="the attempt's start was said before")
    parser.add_argument("--before-pre-launch", action="store_true", help="say the start, take the lock (exit 4: held)")
    parser.add_argument("--pre-launch-ended", nargs=2, metavar=("CODE", "COMMAND"),
                        help="a pre-launch command ended the attempt with CODE")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.free_port is not None:
        port = free_port_here(args.free_port)
        if port is not None:
            print(port)
        return 0 if port is not None else 1
    slurm = Allocation.from_env(os.environ)
    if args.pre_launch_ended:
        code, command = args.pre_launch_ended
        say("pre_launch_ended", command=command, code=code)
        say("attempt_ended", job=slurm.job, attempt=slurm.attempt, when=now(), code=code)
        return int(code) if code.isdigit() else 1
    started = args.started_said
    try:
        attempt = Attempt(jobs.load(args.job or ""), slurm, Node())
    except Exception as e:  # job.json unreadable (a damaged bundle, another release's format)
        if not started:
            say("attempt_started", job=slurm.job, attempt=slurm.attempt, when=now(), nodes=slurm.nodelist)
        failed(e)
        say("attempt_ended", job=slurm.job, attempt=slurm.attempt, when=now(), code=1)
        return 1
    if not args.before_pre_launch:
        attempt.install()  # Slurm's notices from here on are the attempt's
    if not started:
        say("attempt_started", job=slurm.job, attempt=slurm.attempt, when=now(), nodes=slurm.nodelist)
    if args.before_pre_launch:
        if attempt.lock():
            return 0
        say("attempt_ended", job=slurm.job, attempt=slurm.attempt, when=now(), code=TWO_WRITERS)
        return TWO_WRITERS
    if attempt.job.debug:
        say("debug")
    code = 1
    try:
        code = attempt.run()
    except Exception as e:  # a bug of the supervisor's: its traceback in the log, the line, the attempt's end
        failed(e)
    finally:
        attempt.close()
        say("attempt_ended", job=slurm.job, attempt=slurm.attempt, when=now(), code=code)
    return code


def failed(e: Exception) -> None:
    """A bug of the supervisor's (a traceback, not a decision): its traceback in the log, then the line."""
    traceback.print_exc()
    sys.stderr.flush()
    say("supervisor_failed", error=f"{type(e).__name__}: {e}".strip().splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
