"""`python -m launcher.node.supervisor`: the job's one attempt (the batch script execs it: a DRAFT, see
docs/supervisor.md); `--free-port START`: the first free rendezvous port from START on this node (run on the
rendezvous host through `srun --overlap` where it is not the batch host)."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

from launcher.node.supervisor.main import Attempt, free_port_here
from launcher.node.supervisor.settings import Settings


def now() -> str:
    """As `date --iso-8601=seconds`."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--free-port", type=int, help="print the first free rendezvous port from this one")
    parser.add_argument("--started-said", action="store_true", help="the batch script said the attempt started")
    args = parser.parse_args(argv)
    if args.free_port is not None:
        port = free_port_here(args.free_port)
        if port is not None:
            print(port)
        return 0 if port is not None else 1
    attempt = Attempt(Settings.from_env(os.environ))
    attempt.sup.install()
    s, say = attempt.s, attempt.node.say
    if not args.started_said:  # (it says it before the pre-launch commands)
        say("attempt_started", job=s.job, attempt=attempt.state.attempt, when=now(), nodes=s.nodelist)
    if s.debug:
        say("debug")
    code = 1
    try:
        code = attempt.run()
    except Exception:  # a bug of the supervisor's: its traceback in the log, and the attempt's end said
        traceback.print_exc()
    finally:
        attempt.close()
        say("attempt_ended", job=s.job, attempt=attempt.state.attempt, when=now(), code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
