"""Submitted runs, later: re-attach to a run or a sweep, show its status, cancel it, or say where its GPU-hours
went.

python -m launcher.jobs status|attach|cancel BUNDLE_DIR_OR_JOB_ID
python -m launcher.jobs ledger [BUNDLE_OR_SWEEP_DIR] [--since 2026-11-01] [--configs_path logs/configs]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher import protocol as P
from launcher import sweep
from launcher.bundle import manifest, sweep_record
from launcher.errors import LauncherError, SubmissionError, as_command
from launcher.gpu_hours import ledger_command, run_ledger_line, sweep_ledger_line
from launcher.slurm import client, follow
from launcher.submission import follow_to_end, report_end


def _resolve_target(target: str) -> tuple[str, Path, str, manifest.Manifest | None]:
    """A bundle directory (or its manifest) or a job id -> (job id, log path, target to show, manifest or None)."""
    path = Path(target)
    if path.name == P.MANIFEST:
        path = path.parent
    if (path / P.MANIFEST).is_file():
        try:
            run = manifest.load(path)
            job_id, log_path = run.job_id, run.log
        except (OSError, ValueError, KeyError) as e:
            raise LauncherError(f"cannot read the manifest of {path}: {e}") from None
        if not job_id:
            raise LauncherError(f"{path} was never submitted ({run.not_submitted})")
        return job_id, log_path, str(path), run
    if client.JOB_ID.match(target):
        log = client.job_log_path(target)
        if log is None:
            raise LauncherError(f"Slurm does not know job {target}; give its bundle directory instead")
        return target, log, target, None
    raise LauncherError(f"{target} is neither a bundle directory nor a job id")


def _sweep_action(action: str, directory: Path) -> int:
    """status, attach or cancel for every run of a sweep."""
    if action == "attach":
        return sweep.follow(directory)
    record = sweep_record.load(directory)
    job_ids = [p.job_id for p in record.submitted if p.job_id]
    states = client.job_states_many(job_ids)  # one controller query for them all
    if action == "cancel":
        live = [job_id for job_id, state in states.items() if not state.terminal]
        for job_id in live:
            client.cancel(job_id)
        print(f"Cancelled {len(live)} job(s): {' '.join(live) or 'none was still running'}.")
        return 0
    for point in record.submitted:
        if (state := states.get(point.job_id or "")) is not None and state.terminal:
            sweep.judge_point(point, state)  # as `status` of one run does
    print(sweep.results(directory, {k: v.state for k, v in states.items()}, plot=False))
    print(sweep_ledger_line(record))
    return 0


def _status(job_id: str, log: Path, run: manifest.Manifest | None) -> int:
    """The job's state; once it has ended, the verdict on why (recorded in the manifest) too."""
    state = client.job_state(job_id)
    if state is None:
        raise SubmissionError(f"Slurm no longer knows job {job_id}")
    if state.terminal:
        report_end(state, log, run)
    else:
        print(follow.describe(state))
    print(f"  log: {log}")
    if run is not None:
        print(run_ledger_line(run, state))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobs", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("status", "attach", "cancel", "ledger"))
    parser.add_argument("target", nargs="?", help="a bundle or sweep directory (logs/configs/RUN/STAMP) or a Slurm "
                        "job id; ledger without one: every run under --configs_path since --since")  # fmt: skip
    parser.add_argument("--since", help="ledger: runs launched since this date (YYYY-MM-DD[THH:MM]; default: 7 days)")
    parser.add_argument("--configs_path", default="logs/configs", help="ledger: where the runs' bundles are")
    args = parser.parse_args(argv)
    if args.action == "ledger":
        return as_command(lambda: ledger_command(args.target, args.since, Path(args.configs_path)))
    if args.target is None:
        parser.error(f"{args.action} needs a target: a bundle or sweep directory, or a job id")
    return as_command(lambda: _act(args.action, args.target))


def _act(action: str, target_text: str) -> int:
    sweep_dir = sweep_record.directory_of(Path(target_text))
    if sweep_dir is not None:
        return _sweep_action(action, sweep_dir)
    job_id, log, target, run = _resolve_target(target_text)
    if action == "attach":
        return follow_to_end(job_id, log, target, run)
    if action == "cancel":
        client.cancel(job_id)
        print(f"Cancelled job {job_id}.")
        return 0
    return _status(job_id, log, run)


if __name__ == "__main__":
    sys.exit(main())
