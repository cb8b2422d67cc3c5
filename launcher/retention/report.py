"""`python -m launcher.jobs checkpoints BUNDLE|SWEEP|JOB_ID`: a run's checkpoints as retention sees them
(docs/checkpoints.md): every step on disk with its size, complete or not, why it stays (the pointer, the last N,
every K, a reader's lease, an eval still owed, not yet in the bucket) or what removes it; then what was removed, a
line per purge of the run's bundles' records, and the bytes in all; with --checkpoints_remote, the bucket's side
(launcher/remote/report.py). A sweep: each point's, under its name.

The judgement is the job's own (launcher/retention/rules.py's `judge`, by the rules in the bundle's job.json, the
steps owed an eval by the eval records), read-only: nothing is removed here. The readers' Slurm jobs are asked in one
query."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from launcher import checkpoint_layout as ckpt
from launcher import jsonl
from launcher import protocol as P
from launcher.bundle import manifest, sweep_record
from launcher.bundle.manifest import Manifest
from launcher.bundle.records import checkpoint_totals
from launcher.errors import LauncherError, SlurmUnavailable
from launcher.evals import record as eval_record
from launcher.node import job as job_file
from launcher.perf.sizes import human_bytes
from launcher.remote import report as remote_report
from launcher.retention.purge import readers
from launcher.retention.rules import Judged, judge, owed_an_eval, owed_merged
from launcher.slurm import client


def settings_of(run: Manifest) -> job_file.Job:
    """The run's job settings (its bundle's job.json): the retention rules, the steps it evaluates."""
    try:
        return job_file.load(run.bundle_dir)
    except job_file.JobFileError as e:
        raise LauncherError(f"{e}: this bundle was written by another release of the launcher; `jobs checkpoints` "
                            "reads the job's settings of this one's") from None  # fmt: skip


def jobs_alive(jobs: Iterable[str]) -> dict[str, bool | None]:
    """Each lease's job alive? One controller query; None for each where Slurm cannot be asked."""
    wanted = sorted(set(jobs))
    if not wanted:
        return {}
    try:
        states = client.job_states_many(wanted)
    except SlurmUnavailable:
        return dict.fromkeys(wanted)
    return {job: (job in states and not states[job].terminal) for job in wanted}


def command(sweep: Path) -> int:
    """Each point's checkpoints of a sweep (`sweep`: its directory)."""
    record = sweep_record.load(sweep)
    for n, point in enumerate(record.points):
        values = ", ".join(f"{k}={v}" for k, v in point.values.items())
        print(("\n" if n else "") + f"Point {point.run_name} ({values})")
        show(manifest.load(point.bundle))
    return 0


def show(run: Manifest) -> int:
    job = settings_of(run)
    root, rules = job.checkpoints, job.retention
    folder = ckpt.look(root)
    owed = owed_an_eval(eval_record.owed(root, folder.complete, job.evaluated))
    seen = remote_report.look(job) if job.remote is not None else None
    if seen is not None:
        owed = owed_merged(owed, remote_report.owed(seen, root, folder.complete))
    plan = judge(folder, rules, readers(folder, jobs_alive, drop_stale=False), owed)
    print(f"Checkpoints of run {run.data.get('run_name', run.bundle_dir.parent.name)} in {root}: it keeps "
          f"{rules.describe()}")  # fmt: skip
    if not plan.steps:
        print("  none on disk" + ("" if root.is_dir() else f" ({root} does not exist)"))
    sizes = [ckpt.size_of(_path(root, j)) for j in plan.steps]
    for j, size in zip(plan.steps, sizes, strict=True):
        state = "complete" if j.complete else f"partial ({Path(j.path).name})"
        print(f"  {j.step:>9}  {human_bytes(size):>9}  {state:<10}  {_why(j)}")
    for left in plan.leftovers:
        print(f"  {'-':>9}  {human_bytes(ckpt.size_of(Path(left))):>9}  {'leftover':<10}  {Path(left).name}: left by "
              "an interrupted purge; removed by the next")  # fmt: skip
    if plan.steps:
        print(f"  on disk: {len(plan.steps)} step(s), {human_bytes(sum(sizes))}")
    _removed(run)
    if seen is not None:
        remote_report.show(job, seen, sorted(p for p in run.bundle_dir.parent.iterdir() if p.is_dir()))
    return 0


def _when(row: dict) -> float:
    value = row.get("time")
    return float(value) if isinstance(value, int | float) else 0.0


def _purge_line(row: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.get("time") or 0))
    steps = ", ".join(str(r["step"]) for r in row.get("removed", [])) or "no step"
    why = "; ".join(dict.fromkeys(str(r["why"]) for r in row.get("removed", [])))
    left = f" and {len(row['leftovers'])} leftover(s) of an interrupted purge" if row.get("leftovers") else ""
    return f"    {when} job {row.get('job') or '?'} removed {steps}{left} ({human_bytes(row.get('freed') or 0)})" + (
        f": {why}" if why else ""
    )


def _path(root: Path, judged: Judged) -> Path:
    return Path(judged.path) if judged.path else root / str(judged.step)


def _why(judged: Judged) -> str:
    if judged.remove:
        return f"removed at the next purge: {judged.remove}"
    return "; ".join(judged.kept) + (f"; {judged.later}" if judged.later else "")


def _removed(run: Manifest) -> None:
    """What the purges of the run's launches (its bundles that name the same checkpoints) removed, oldest first."""
    rows = []
    for record in sorted(run.bundle_dir.parent.glob(f"*/{P.CHECKPOINTS_RECORD}")):
        rows += [r for r in jsonl.read(record) if r.get("event") == "purge"]
    if not rows:
        print("  removed: nothing" + ("" if settings_of(run).retention.active else " (no --keep_last or --keep_every)"))
        return
    print("  removed (a line per purge):")
    for row in sorted(rows, key=_when):
        try:
            print(_purge_line(row))
        except (KeyError, TypeError, ValueError, OverflowError, OSError):
            print(f"    a line of the record this command cannot read: {str(row)[:80]}")
    totals = checkpoint_totals(run.bundle_dir / P.CHECKPOINTS_RECORD)
    if totals:
        print(f"  this launch: {totals['saved']} saved ({human_bytes(totals['written_bytes'])}), {totals['removed']} "
              f"removed ({human_bytes(totals['freed_bytes'])} freed)")  # fmt: skip
