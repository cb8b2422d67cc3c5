"""Submit a written bundle, follow the job to its end, and say how it ended: Slurm's final word, the verdict on why
(recorded in the manifest) and the run's pictures. `--show_logs`, `jobs attach` and `jobs status` end here."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher import protocol as P
from launcher.bundle import manifest
from launcher.bundle.files import BundlePaths
from launcher.errors import LauncherError
from launcher.evals import report as evals_report
from launcher.ledger import attempts, usage
from launcher.node import restart
from launcher.report import pictures, stragglers, summary
from launcher.slurm import client, follow, logread, releases, triage
from launcher.slurm.parse import JobState


def submit(paths: BundlePaths) -> manifest.Manifest:
    """Submit the bundle's script file; record the outcome in the manifest either way. Returns the manifest, job id
    recorded (`run.job_id`), to hand down."""
    try:
        job_id = client.submit(paths.script)
    except LauncherError as e:
        manifest.record(paths.manifest, submitted=False, error=str(e))
        raise LauncherError(f"{e}\nThe bundle is kept: {paths.bundle_dir}") from None
    run = manifest.record(paths.manifest, submitted=True, job_id=job_id)
    script = (run.data.get("files") or {}).get("export_script")
    if script:  # --export_hf: the export job, started by Slurm once the run has COMPLETED
        try:
            after = (f"--dependency=afterok:{job_id}", "--kill-on-invalid-dep=yes")
            export_id = client.submit(Path(script["path"]), *after)
        except LauncherError as e:
            print(f"warning: the export job (--export_hf) was not submitted: {e}\n  submit it yourself once the run "
                  f"has ended: sbatch --dependency=afterok:{job_id} {script['path']}", file=sys.stderr)  # fmt: skip
            return manifest.record(paths.manifest, export_error=str(e))
        return manifest.record(paths.manifest, export_job_id=export_id)
    return run


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
        return triage.excerpt(logread.tail_lines(log, line_chars=triage.LINE_CHARS))  # the last 64 MiB at most
    except OSError:
        return ""


def memory_note(run: manifest.Manifest | None) -> str | None:
    """The memory model's estimate recorded at launch (the manifest's derived figures), for an OOM's fix."""
    memory = (run.memory if run else None) or {}
    try:
        estimate, gpu_bytes, gpu = memory["estimate_bytes"] / 1024**3, memory["gpu_bytes"] / 1024**3, memory["gpu"]
    except (KeyError, TypeError):
        return None
    return (
        f"the launcher estimated ~{estimate:.1f} GiB per GPU of the {gpu_bytes:.1f} GiB of a {gpu} "
        "(docs/planning.md; --plan shows what fits)"
    )


def judge_end(
    final: JobState, log: Path, run: manifest.Manifest | None = None, text: str | None = None
) -> tuple[triage.Verdict | None, str]:
    """Why the job ended so (None when it COMPLETED), recorded with Slurm's final word in the manifest (if any);
    the second value says why it could not be recorded, or is "". `text`: the log as `read_log` reads it, if read."""
    text = read_log(log) if text is None else text
    final = releases.as_logged(final, text)  # the same exit code whichever release's sacct said it
    verdict = triage.for_job(final, text, flags=run.flags if run else None, memory_note=memory_note(run))
    if run is not None and run.path.is_file():
        ended = {"state": final.state, "exit_code": final.exit_code, "restarts": final.restarts,
                 "restarts_in_allocation": len(restarts_of(run, final.job_id))}  # fmt: skip
        try:
            manifest.record_end(run, ended, verdict.record() if verdict else None)
        except OSError as e:
            return verdict, f"not recorded in {run.path}: {e.strerror or e}"
    return verdict, ""


def restarts_of(run: manifest.Manifest, job: str | None) -> list[dict[str, str]]:
    """The restarts of training inside job `job`'s allocation (the run's, where None), as its batch script recorded
    them (oldest first): not another job's of the same script, submitted again by hand. A record that names no job
    (written before records named theirs) is taken as the job the bundle was launched as (the manifest's)."""
    job = job or run.job_id
    ours = (job, "") if job == run.job_id else (job,)
    return [
        r for r in restart.records(run.bundle_dir / P.RESTARTS_FILE) if r["action"] == "restart" and r["job"] in ours
    ]


UNASKED_REQUEUE = (
    "  Slurm requeued the job after attempt {attempt} had ended well (exit code 0, no requeue asked): Slurm 24.11 does "
    "so once more after a preemption past its grace time (docs/slurm-versions.md); attempt {next} found the run "
    "finished"
)


def report_end(final: JobState, log: Path, run: manifest.Manifest | None = None) -> triage.Verdict | None:
    """Say how the job ended and, unless it COMPLETED, why and what to do; record both in the manifest (if any)."""
    text = read_log(log)
    final = releases.as_logged(final, text)
    code = "" if final.exit_code is None else f", exit code {final.exit_code}"
    again = [f"requeued {final.restarts}x"] if final.restarts else []
    if run is not None and (inside := len(restarts_of(run, final.job_id))):
        again.append(f"restarted {inside}x in its allocation")
    print(f"Job {final.job_id} ended {final.state}{code}" + (f" ({'; '.join(again)})" if again else ""))
    for n in attempts.requeued_unasked(attempts.read_log(attempts.read_lines(log), final.job_id)):
        print(UNASKED_REQUEUE.format(attempt=n, next=n + 1))
    verdict, unrecorded = judge_end(final, log, run, text)
    if verdict is not None:
        print("\n".join(verdict.lines()))
    if unrecorded:
        print(f"  ({unrecorded})")
    return verdict


def outputs(run: manifest.Manifest, final: JobState | None = None) -> dict[str, object]:
    """What a run left, to show at its end: bundle, log, checkpoints, and its pictures (drawn now)."""
    named = run.data.get("outputs", {})
    found: dict[str, object] = {"bundle": run.bundle_dir}
    found.update({name: Path(named[name]) for name in ("log", "checkpoints") if named.get(name)})
    if run.metrics.exists():
        found["loss curve"] = pictures.loss_curve(run.metrics, run.bundle_dir / "loss.png")
    found.update(pictures.render(run))
    found["gpu-hours"] = usage.line(run, final)  # the ledger (launcher.ledger.usage), kept in the manifest
    if restarted := restarts_of(run, final.job_id if final else None):
        found["restarts"] = "; ".join(
            f"after {r['why'].replace('-', ' ')} at step {r['at']}" + (f", without {r['nodes']}" if r["nodes"] != "-"
                                                                      else ", on the same nodes")
            for r in restarted
        )  # fmt: skip
    if named := stragglers.named(run):
        found["stragglers"] = "; ".join(named)
    return found


def follow_to_end(job_id: str, log: Path, target: str, run: manifest.Manifest | None = None) -> int:
    """Follow until the job ends, then say how it ended and show what it left (`outputs`, where its manifest is
    known); exit code 0 only for COMPLETED. Ctrl-C stops following, not the job. The one end of `--show_logs` and
    `jobs attach`."""
    try:
        final = follow.follow(job_id, log)
    except KeyboardInterrupt:
        print(f"\nStopped following; job {job_id} keeps running.\n{how_to(target)}", file=sys.stderr)
        return 130
    verdict = report_end(final, log, run)
    if run is not None:
        for name, value in outputs(run, final).items():
            print(f"  {name:<12} {summary.shown(value)}")
        if evals_report.asked(run):  # --eval_tasks: the scores so far, and the eval jobs still to end
            print("\n".join(evals_report.run_lines(run)))
    trained = final.state == "COMPLETED" and verdict is None
    if run is not None and run.export_job_id is not None:
        return follow_export(run, target) if trained else _export_dropped(run)
    return 0 if trained else 1


def export_lines(run: manifest.Manifest) -> list[str]:
    """The export's result (--export_hf), as the end summary and `jobs status` show it; [] before it has one."""
    result = run.export_result
    if not result:
        return []
    lines = [f"  {'hf model':<12} {result.get('output')} (step {result.get('step')})"]
    if result.get("perplexity") is not None:
        lines.append(f"  {'perplexity':<12} {result['perplexity']:.4g} (loss {result['loss']:.4f} over "
                     f"{result['tokens']} tokens of {result['held_out']})")  # fmt: skip
    return lines


def follow_export(run: manifest.Manifest, target: str) -> int:
    """Follow the export job (--export_hf) to its end; show the model and its perplexity, recorded in the manifest."""
    job, log = str(run.export_job_id), run.output("export_log")
    print(f"Following the export, job {job} (log {log}).")
    try:
        final = follow.follow(job, log)
    except KeyboardInterrupt:
        print(f"\nStopped following; export job {job} keeps running.\n{how_to(target)}", file=sys.stderr)
        return 130
    code = "" if final.exit_code is None else f", exit code {final.exit_code}"
    print(f"Export job {job} ended {final.state}{code}")
    lines = export_lines(run)
    print("\n".join(lines) if lines else f"  the export wrote no result; its log: {log}")
    record_export(run, final)
    return 0 if final.state == "COMPLETED" and run.export_result and "perplexity" in run.export_result else 1


def record_export(run: manifest.Manifest, final: JobState) -> None:
    """The export job's end and its result (export.json), in the manifest (`export`)."""
    if run.path.is_file():
        run.data["export"] = {"job_id": final.job_id, "state": final.state, **(run.export_result or {})}
        manifest.write_manifest(run.path, run.data)


def _export_dropped(run: manifest.Manifest) -> int:
    print(f"  export       job {run.export_job_id} will not run: the run did not complete (Slurm cancels it)")
    return 1


def submit_and_follow(paths: BundlePaths, follow: bool) -> int:
    run = submit(paths)
    assert run.job_id is not None, "recorded by submit"
    print(f"Submitted job {run.job_id}." + (f" Its export (--export_hf): job {run.export_job_id}, once it has "
                                           "completed." if run.export_job_id else ""))  # fmt: skip
    if not follow:
        print(how_to(str(paths.bundle_dir)))
        return 0
    return follow_to_end(run.job_id, paths.log, str(paths.bundle_dir), run)
