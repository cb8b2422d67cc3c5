"""Submitted runs: submit a bundle and follow it, and later re-attach to it, show its status or cancel it.

python -m launcher.jobs status|attach|cancel BUNDLE_DIR_OR_JOB_ID
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher import bundle, follow, slurm, sweep
from launcher.dependency import NEVER_SATISFIED
from launcher.errors import LauncherError, SubmissionError, closed_pipe


def _record(paths_manifest: Path, **slurm_fields: object) -> None:
    data = bundle.read_manifest(paths_manifest.parent)
    data["slurm"].update(slurm_fields)
    bundle.write_manifest(paths_manifest, data)


def submit(paths: bundle.BundlePaths) -> str:
    """Submit the bundle's script file; record the outcome in the manifest either way."""
    try:
        job_id = slurm.submit(paths.script)
    except LauncherError as e:
        _record(paths.manifest, submitted=False, error=str(e))
        raise LauncherError(f"{e}\nThe bundle is kept: {paths.bundle_dir}") from None
    _record(paths.manifest, submitted=True, job_id=job_id)
    return job_id


def how_to(target: str) -> str:
    return (
        f"  re-attach: python -m launcher.jobs attach {target}\n"
        f"  status:    python -m launcher.jobs status {target}\n"
        f"  cancel:    python -m launcher.jobs cancel {target}"
    )


def follow_to_end(job_id: str, log: Path, target: str) -> int:
    """Follow until the job ends; exit code 0 only for COMPLETED. Ctrl-C stops following, not the job."""
    try:
        final = follow.follow(job_id, log)
    except KeyboardInterrupt:
        print(f"\nStopped following; job {job_id} keeps running.\n{how_to(target)}", file=sys.stderr)
        return 130
    code = "" if final.exit_code is None else f", exit code {final.exit_code}"
    print(f"Job {job_id} ended {final.state}{code}" + (f" (requeued {final.restarts}x)" if final.restarts else ""))
    if final.reason == NEVER_SATISFIED:
        print(f"  it never started: its dependency can no longer be met ({final.dependency or 'see scontrol'})")
    return 0 if final.state == "COMPLETED" else 1


def _outputs(paths: bundle.BundlePaths) -> dict:
    found = {"bundle": paths.bundle_dir, "log": paths.log, "checkpoints": paths.checkpoints}
    if paths.metrics.exists():
        from launcher import plot  # matplotlib only once a run has metrics

        found["loss curve"] = plot.loss_curve(paths.metrics, paths.bundle_dir / "loss.png")
    return found


def submit_and_follow(paths: bundle.BundlePaths, follow: bool) -> int:
    job_id = submit(paths)
    print(f"Submitted job {job_id}.")
    if not follow:
        print(how_to(str(paths.bundle_dir)))
        return 0
    code = follow_to_end(job_id, paths.log, str(paths.bundle_dir))
    if code != 130:
        for name, value in _outputs(paths).items():
            print(f"  {name:<12} {value}")
    return code


def _resolve_target(target: str) -> tuple[str, Path, str]:
    """A bundle directory (or its manifest) or a job id -> (job id, log path, target to show)."""
    path = Path(target)
    if path.name == "manifest.json":
        path = path.parent
    if (path / "manifest.json").is_file():
        data = bundle.read_manifest(path)
        job_id = data["slurm"].get("job_id")
        if not job_id:
            raise LauncherError(f"{path} was never submitted ({data['slurm'].get('error', 'dry run')})")
        return job_id, Path(data["outputs"]["log"]), str(path)
    if slurm.JOB_ID.match(target):
        log = slurm.job_log_path(target)
        if log is None:
            raise LauncherError(f"Slurm does not know job {target}; give its bundle directory instead")
        return target, log, target
    raise LauncherError(f"{target} is neither a bundle directory nor a job id")


def _sweep_action(action: str, directory: Path) -> int:
    """status, attach or cancel for every run of a sweep."""
    if action == "attach":
        return sweep.follow(directory)
    job_ids = [e["job_id"] for e in sweep.read_record(directory)["points"] if e["job_id"]]
    states = {job_id: slurm.job_state(job_id) for job_id in job_ids}
    if action == "cancel":
        live = [job_id for job_id, state in states.items() if state is not None and not state.terminal]
        for job_id in live:
            slurm.cancel(job_id)
        print(f"Cancelled {len(live)} job(s): {' '.join(live) or 'none was still running'}.")
        return 0
    print(sweep.results(directory, {k: v.state for k, v in states.items() if v is not None}, plot=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobs", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("status", "attach", "cancel"))
    parser.add_argument("target", help="a bundle or sweep directory (logs/configs/RUN/STAMP) or a Slurm job id")
    args = parser.parse_args(argv)
    try:
        sweep_dir = Path(args.target).parent if args.target.endswith(sweep.RECORD) else Path(args.target)
        if (sweep_dir / sweep.RECORD).is_file():
            return _sweep_action(args.action, sweep_dir)
        job_id, log, target = _resolve_target(args.target)
        if args.action == "attach":
            return follow_to_end(job_id, log, target)
        if args.action == "cancel":
            slurm.cancel(job_id)
            print(f"Cancelled job {job_id}.")
            return 0
        state = slurm.job_state(job_id)
        if state is None:
            raise SubmissionError(f"Slurm no longer knows job {job_id}")
        print(follow.describe(state) + (f", exit code {state.exit_code}" if state.terminal else ""))
        print(f"  log: {log}")
        return 0
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return closed_pipe()


if __name__ == "__main__":
    sys.exit(main())
