"""`python -m launcher.node.supervisor`: the job's one attempt (the batch script execs it: docs/supervisor.md);
`--lock`: only the run's lock (the batch script, before the pre-launch commands); `--free-port START`: the first free
rendezvous port from START on this node (run on the rendezvous host through `srun --overlap` where it is not the
batch host)."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

from launcher.node.supervisor.effects import say
from launcher.node.supervisor.main import TWO_WRITERS, Attempt, free_port_here
from launcher.node.supervisor.settings import Settings


def now() -> str:
    """As `date --iso-8601=seconds`."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--free-port", type=int, help="print the first free rendezvous port from this one")
    parser.add_argument("--started-said", action="store_true", help="the batch script said the attempt started")
    parser.add_argument("--lock", action="store_true", help="only take the run's lock (exit 4: another job holds it)")
    args = parser.parse_args(argv)
    if args.free_port is not None:
        port = free_port_here(args.free_port)
        if port is not None:
            print(port)
        return 0 if port is not None else 1
    try:
        attempt = Attempt(Settings.from_env(os.environ))
    except Exception as e:  # a value the batch script did not export, or not as a number: the template's bug
        job, number = os.environ.get("SLURM_JOB_ID", "?"), int(os.environ.get("SLURM_RESTART_COUNT") or 0) + 1
        if not args.started_said and not args.lock:
            say("attempt_started", job=job, attempt=number, when=now(), nodes=os.environ.get("SLURM_JOB_NODELIST"))
        failed(e)
        if not args.lock:  # (the batch script says the attempt's end where the lock's call fails)
            say("attempt_ended", job=job, attempt=number, when=now(), code=1)
        return 1
    if args.lock:  # before the pre-launch commands (the batch script's bash)
        return 0 if attempt.lock() else TWO_WRITERS
    attempt.sup.install()
    s = attempt.s
    if not args.started_said:  # (it says it before the pre-launch commands)
        say("attempt_started", job=s.job, attempt=attempt.state.attempt, when=now(), nodes=s.nodelist)
    if s.debug:
        say("debug")
    code = 1
    try:
        code = attempt.run()
    except Exception as e:  # a bug of the supervisor's: its traceback in the log, the line, the attempt's end
        failed(e)
    finally:
        attempt.close()
        say("attempt_ended", job=s.job, attempt=attempt.state.attempt, when=now(), code=code)
    return code


def failed(e: Exception) -> None:
    """A bug of the supervisor's (a traceback, not a decision): its traceback in the log, then the line."""
    traceback.print_exc()
    sys.stderr.flush()
    say("supervisor_failed", error=f"{type(e).__name__}: {e}".strip().splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
