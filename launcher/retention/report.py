"""`python -m launcher.jobs checkpoints BUNDLE|JOB_ID`: a run's checkpoints as retention sees them
(docs/checkpoints.md): every step on disk with its size, complete or not, why it stays (the pointer, the last N,
every K, a reader's lease) or what removes it; then what was removed, a line per purge of the run's bundles'
records, and the bytes in all.

The judgement is the job's own (launcher/node/retention.py's `judge`, by the bundle's --keep_last/--keep_every),
read-only: nothing is removed here. The readers' Slurm jobs are asked in one query."""

from __future__ import annotations

import time
from pathlib import Path

from launcher import checkpoint_layout as layout
from launcher import protocol as P
from launcher.bundle.manifest import Manifest
from launcher.bundle.records import checkpoint_totals, read_metrics
from launcher.errors import LauncherError, SlurmUnavailable
from launcher.perf.sizes import human_bytes
from launcher.retention.purge import readers
from launcher.retention.rules import Judged, Rules, judge
from launcher.slurm import client


def rules_of(run: Manifest) -> Rules:
    flags = run.flags
    try:
        return Rules.from_dict({key: flags.get(key) for key in ("keep_last", "keep_every", "train_steps")})
    except (TypeError, ValueError) as e:
        raise LauncherError(f"{run.path}: its keep_last, keep_every or train_steps is not a count ({e})") from None


def job_states(jobs: object) -> dict[str, bool | None]:
    """Each lease's job alive? One controller query; None for each where Slurm cannot be asked."""
    wanted = sorted(set(jobs))  # type: ignore[call-overload]
    try:
        states = client.job_states_many(wanted)
    except SlurmUnavailable:
        return dict.fromkeys(wanted)
    return {job: (job in states and not states[job].terminal) for job in wanted}


def show(run: Manifest) -> int:
    root, rules = run.checkpoints, rules_of(run)
    folder = layout.look(root)
    plan = judge(folder, rules, readers(folder, job_states, drop_stale=False))
    print(f"Checkpoints of run {run.data.get('run_name', run.bundle_dir.parent.name)} in {root}: it keeps "
          f"{rules.describe()}")  # fmt: skip
    if not plan.steps:
        print("  none on disk" + ("" if root.is_dir() else f" ({root} does not exist)"))
    sizes = [layout.size_of(_path(root, j)) for j in plan.steps]
    for j, size in zip(plan.steps, sizes, strict=True):
        state = "complete" if j.complete else f"partial ({Path(j.path).name})"
        print(f"  {j.step:>9}  {human_bytes(size):>9}  {state:<10}  {_why(j)}")
    for left in plan.leftovers:
        print(f"  {'-':>9}  {human_bytes(layout.size_of(Path(left))):>9}  {'leftover':<10}  {Path(left).name}: left by "
              "an interrupted purge; removed by the next")  # fmt: skip
    if plan.steps:
        print(f"  on disk: {len(plan.steps)} step(s), {human_bytes(sum(sizes))}")
    _removed(run)
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
        rows += [r for r in read_metrics(record) if r.get("event") == "purge"]
    if not rows:
        print("  removed: nothing" + ("" if rules_of(run).active else " (no --keep_last or --keep_every)"))
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
