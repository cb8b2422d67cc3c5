"""Submitted runs, later: re-attach to a run or a sweep, show its status, or cancel it.

python -m launcher.jobs status|attach|cancel BUNDLE_DIR_OR_JOB_ID
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher import protocol as P
from launcher import sweep
from launcher.bundle import manifest
from launcher.errors import LauncherError, SubmissionError, as_command
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
    job_ids = [e["job_id"] for e in sweep.read_record(directory)["points"] if e["job_id"]]
    states = {job_id: client.job_state(job_id) for job_id in job_ids}
    if action == "cancel":
        live = [job_id for job_id, state in states.items() if state is not None and not state.terminal]
        for job_id in live:
            client.cancel(job_id)
        print(f"Cancelled {len(live)} job(s): {' '.join(live) or 'none was still running'}.")
        return 0
    for entry in sweep.read_record(directory)["points"]:
        if (state := states.get(entry["job_id"])) is not None and state.terminal:
            sweep.judge_point(entry, state)  # as `status` of one run does
    print(sweep.results(directory, {k: v.state for k, v in states.items() if v is not None}, plot=False))
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
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobs", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("status", "attach", "cancel"))
    parser.add_argument("target", help="a bundle or sweep directory (logs/configs/RUN/STAMP) or a Slurm job id")
    args = parser.parse_args(argv)
    return as_command(lambda: _act(args.action, args.target))


def _act(action: str, target_text: str) -> int:
    sweep_dir = Path(target_text).parent if target_text.endswith(sweep.RECORD) else Path(target_text)
    if (sweep_dir / sweep.RECORD).is_file():
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
