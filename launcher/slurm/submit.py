"""Submit a written bundle and follow the job to its end; say how to re-attach, see the status, or cancel."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.bundle import manifest
from launcher.bundle.files import BundlePaths
from launcher.errors import LauncherError
from launcher.report import pictures, plots, summary
from launcher.slurm import client, follow, triage, usage
from launcher.slurm.parse import JobState


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


def read_log(log: Path) -> str:
    """What triage reads of a job's log: its last attempt's first failure and tail (`triage.excerpt`, bounded
    memory whatever the log's size); "" when there is no log."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            return triage.excerpt(iter(lambda: f.readline(triage.LINE_CHARS), ""))
    except OSError:
        return ""


def memory_note(manifest_path: Path | None) -> str | None:
    """The memory model's estimate recorded at launch (the manifest's derived figures), for an OOM's fix."""
    if manifest_path is None:
        return None
    try:
        memory = manifest.read_manifest(manifest_path.parent)["derived"]["memory"]
        gib = 1024**3
        return (
            f"the launcher estimated ~{memory['estimate_bytes'] / gib:.1f} GiB per GPU of the "
            f"{memory['gpu_bytes'] / gib:.1f} GiB of a {memory['gpu']} (docs/planning.md; --plan shows what fits)"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_flags(manifest_path: Path | None) -> dict | None:
    """The run's resolved flags from its manifest, one flat dict (micro_batch_size, tp, ...), or None."""
    try:
        resolved = manifest.read_manifest(manifest_path.parent)["resolved"] if manifest_path else None
    except (OSError, ValueError, KeyError):
        return None
    return (
        {k: v for group in resolved.values() if isinstance(group, dict) for k, v in group.items()} if resolved else None
    )


def judge_end(final: JobState, log: Path, manifest_path: Path | None = None) -> tuple[triage.Verdict | None, str]:
    """Why the job ended so (None when it COMPLETED), recorded with Slurm's final word in the manifest (if any);
    the second value says why it could not be recorded, or is ""."""
    verdict = triage.for_job(
        final, read_log(log), flags=run_flags(manifest_path), memory_note=memory_note(manifest_path)
    )
    if manifest_path is not None and manifest_path.is_file():
        ended = {"state": final.state, "exit_code": final.exit_code, "restarts": final.restarts}
        try:
            manifest.record_end(manifest_path, ended, verdict.record() if verdict else None)
        except OSError as e:
            return verdict, f"not recorded in {manifest_path}: {e.strerror or e}"
    return verdict, ""


def report_end(final: JobState, log: Path, manifest_path: Path | None = None) -> triage.Verdict | None:
    """Say how the job ended and, unless it COMPLETED, why and what to do; record both in the manifest (if any)."""
    code = "" if final.exit_code is None else f", exit code {final.exit_code}"
    print(
        f"Job {final.job_id} ended {final.state}{code}" + (f" (requeued {final.restarts}x)" if final.restarts else "")
    )
    verdict, unrecorded = judge_end(final, log, manifest_path)
    if verdict is not None:
        print("\n".join(verdict.lines()))
    if unrecorded:
        print(f"  ({unrecorded})")
    return verdict


def follow_to_end(job_id: str, log: Path, target: str, manifest_path: Path | None = None) -> int:
    """Follow until the job ends; exit code 0 only for COMPLETED. Ctrl-C stops following, not the job."""
    try:
        final = follow.follow(job_id, log)
    except KeyboardInterrupt:
        print(f"\nStopped following; job {job_id} keeps running.\n{how_to(target)}", file=sys.stderr)
        return 130
    report_end(final, log, manifest_path)
    return 0 if final.state == "COMPLETED" else 1


def _outputs(paths: BundlePaths) -> dict:
    found: dict[str, object] = {"bundle": paths.bundle_dir, "log": paths.log, "checkpoints": paths.checkpoints}
    if paths.metrics.exists():
        found["loss curve"] = plots.loss_curve(paths.metrics, paths.bundle_dir / "loss.png")
    found.update(pictures.render(paths.bundle_dir))
    found["gpu-hours"] = usage.line(paths.bundle_dir)  # the ledger (launcher.slurm.usage), kept in the manifest
    return found


def submit_and_follow(paths: BundlePaths, follow: bool) -> int:
    job_id = submit(paths)
    print(f"Submitted job {job_id}.")
    if not follow:
        print(how_to(str(paths.bundle_dir)))
        return 0
    code = follow_to_end(job_id, paths.log, str(paths.bundle_dir), paths.manifest)
    if code != 130:
        for name, value in _outputs(paths).items():
            print(f"  {name:<12} {summary.shown(value)}")
    return code
