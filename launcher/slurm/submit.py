"""Submit a written bundle and follow the job to its end; say how to re-attach, see the status, or cancel."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.bundle import manifest
from launcher.bundle.files import BundlePaths
from launcher.errors import LauncherError
from launcher.report import plots
from launcher.slurm import client, follow
from launcher.slurm.dependencies import NEVER_SATISFIED


def submit(paths: BundlePaths) -> str:
    """Submit the bundle's script file; record the outcome in the manifest either way."""
    try:
        job_id = client.submit(paths.script)
    except LauncherError as e:
        manifest.record(paths.manifest, submitted=False, error=str(e))
        raise LauncherError(f"{e}\nThe bundle is kept: {paths.bundle_dir}") from None
    manifest.record(paths.manifest, submitted=True, job_id=job_id)
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


def _outputs(paths: BundlePaths) -> dict:
    found: dict[str, object] = {"bundle": paths.bundle_dir, "log": paths.log, "checkpoints": paths.checkpoints}
    if paths.metrics.exists():
        found["loss curve"] = plots.loss_curve(paths.metrics, paths.bundle_dir / "loss.png")
    return found


def submit_and_follow(paths: BundlePaths, follow: bool) -> int:
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
