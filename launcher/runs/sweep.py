"""--sweep: one run per point of a grid of flag values: the grid, the sweep's record, following its points
together and the results table. `launcher.runs.launch.launch_sweep` launches them, all or none.

    python slurm_launcher.py --run_name lr --sweep "learning_rate=1e-4,3e-4,1e-3 seed=1,2" ...

makes 6 runs, lr-1 .. lr-6, each an ordinary run: its own bundle, script, log and checkpoints, its manifest's
command the single run it is (requeue and resume work per point as for any run). Every point is checked, and put
to Slurm, before anything is written. The sweep's record (`<configs_path>/<run_name>/<stamp>/sweep.json`)
lists the points, their values, bundles and job ids; `python -m launcher.jobs status|attach|cancel` takes it.
The results rank the points by final loss and say why each point that did not complete ended so (triage's
verdict, recorded in the point's manifest).
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher import jsonl
from launcher import protocol as P
from launcher.bundle import files, manifest, sweep_record
from launcher.bundle.sweep_record import SweepPoint
from launcher.config import flags
from launcher.evals import report as evals_report
from launcher.ledger import usage
from launcher.problems import Problem
from launcher.report import pictures
from launcher.runs.submission import how_to, judge_end
from launcher.slurm.follow import Cadence, LogTail, Watched, watch
from launcher.slurm.parse import JobState

MAX_POINTS = 64
NOT_SWEPT = {"run_name", "sweep", "dry_run", "show_logs", "rank_by"}
RECORD = sweep_record.RECORD


def values_text(values: dict[str, str]) -> str:
    return ", ".join(f"{flag}={value}" for flag, value in values.items())


@dataclass(frozen=True)
class Point:
    index: int  # 1-based
    run_name: str
    values: dict[str, str]  # flag -> value, as typed
    argv: list[str]  # the launcher's argv for this run alone

    @property
    def label(self) -> str:
        return f"{self.run_name}: {values_text(self.values)}"


def _fits(value: str, kind: type) -> bool:
    """Whether the command line would take `value` for a flag of this type."""
    if kind is bool:
        return value.lower() in ("true", "false", "yes", "no", "1", "0", "t", "f", "y", "n")
    try:
        kind(value)
    except ValueError:
        return False
    return True


def parse(text: str) -> tuple[list[tuple[str, list[str]]], list[Problem]]:
    """`flag=v1,v2 flag2=w1,...` (spaces or lines between axes) -> the axes, or the problems with them."""
    axes: list[tuple[str, list[str]]] = []
    problems = []
    known = set(flags.flag_names())
    kinds = flags.flag_types()
    for item in text.split():
        flag, sep, values = item.partition("=")
        flag = flag.removeprefix("--")
        bad = [v for v in values.split(",") if not v]
        if not sep or not values or bad:
            problems.append(Problem("sweep", f"{item!r} is not FLAG=VALUE,VALUE,...", "e.g. learning_rate=1e-4,3e-4"))
        elif flag not in known:
            problems.append(Problem("sweep", f"{flag!r} is not a flag", "sweep flags the launcher takes (--help)"))
        elif flag in NOT_SWEPT:
            problems.append(Problem("sweep", f"--{flag} cannot be swept", "sweep training, model or Slurm flags"))
        elif flag in dict(axes):
            problems.append(Problem("sweep", f"{flag} is given twice", "list all its values once: flag=a,b,c"))
        elif odd := [v for v in values.split(",") if not _fits(v, kinds[flag])]:
            what = kinds[flag].__name__
            problems.append(Problem("sweep", f"{flag}: {', '.join(odd)} is not of type {what}", f"give {what} values"))
        else:
            axes.append((flag, values.split(",")))
    if not axes and not problems:
        problems.append(Problem("sweep", "it names no flag", "e.g. --sweep 'learning_rate=1e-4,3e-4 seed=1,2'"))
    count = math.prod(len(choices) for _, choices in axes)
    if count > MAX_POINTS:
        problems.append(Problem("sweep", f"{count} points, more than {MAX_POINTS}", "sweep fewer values at once"))
    return axes, problems


def without(argv: list[str], flag: str) -> list[str]:
    """argv without `--flag VALUE` / `--flag=VALUE` (a flag's last occurrence wins, but a clean command reads
    better in each point's manifest)."""
    out, skip = [], False
    for i, token in enumerate(argv):
        if skip:
            skip = False
        elif token == f"--{flag}":
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        elif not token.startswith(f"--{flag}="):
            out.append(token)
    return out


def points(argv: list[str], run_name: str, axes: list[tuple[str, list[str]]]) -> list[Point]:
    """The grid's points, in order (the last axis varies fastest)."""
    base = without(without(without(argv, "sweep"), "run_name"), "rank_by")  # (the sweep's record keeps --rank_by)
    for flag, _ in axes:
        base = without(base, flag)
    out = []
    for index, combo in enumerate(itertools.product(*(values for _, values in axes)), start=1):
        values = {flag: value for (flag, _), value in zip(axes, combo, strict=True)}
        name = f"{run_name}-{index}"
        swept = [token for flag, value in values.items() for token in (f"--{flag}", value)]
        out.append(Point(index, name, values, ["--run_name", name, *base, *swept]))
    return out


def write_record(configs_path: str, run_name: str, sweep_text: str, grid: list[Point], bundles: list[Path],
                 rank_by: str | None = None) -> Path:  # fmt: skip
    """The sweep's record, in a directory of its own beside its points' bundles: the points, their values and
    bundles, --rank_by; their job ids are added as they are submitted (`record_job`). Returns the directory."""
    directory = files.claim_dir(Path(configs_path) / run_name)
    points = [SweepPoint(p.run_name, p.values, bundle, None) for p, bundle in zip(grid, bundles, strict=True)]
    sweep_record.write(directory, sweep_text, points, rank_by)
    return directory


def record_job(directory: Path, point: Point, job_id: str) -> None:
    """Note a point's job id in the sweep's record."""
    sweep_record.record_job(directory, point.index - 1, job_id)


def _log_of(point: SweepPoint) -> Path:
    """A point's log, from its manifest (a moved or damaged bundle: a path that is never there)."""
    try:
        return manifest.load(point.bundle).log
    except (OSError, ValueError, KeyError):
        return point.bundle / "no log"


def follow(record_dir: Path, cadence: Cadence | None = None, rank_by: str | None = None) -> int:
    """Report every point's state changes until all have ended, then the results; 0 only if all COMPLETED. One
    controller query for all points at a time (`launcher.slurm.follow.watch`); each point's log says when its
    attempts end. `rank_by` (--rank_by): the points' eval jobs are waited for too, and the results ranked by that
    score. Ctrl-C stops following, not the jobs."""
    record = sweep_record.load(record_dir)
    entries = {p.job_id: p for p in record.submitted if p.job_id}
    watched = []
    for job_id, entry in entries.items():
        log = _log_of(entry)
        tail = LogTail(log, None, offset=log.stat().st_size if log.is_file() else 0)  # its attempt lines from now on
        watched.append(Watched(job_id, tail, label=entry.run_name))
    try:
        finals = watch(
            watched,
            lambda w, text: print(f"[follow] {w.label}: {text}", file=sys.stderr, flush=True),
            cadence=cadence,
            on_end=lambda w, state: judge_point(entries[w.job_id], state),
        )
        tasks = [rank_by] if rank_by else _eval_tasks(list(entries.values()))
        if tasks:
            why = f"to rank them by {rank_by}" if rank_by else "for the verdict"
            print(f"[follow] waiting for the points' eval jobs, {why}", file=sys.stderr, flush=True)
            evals_report.wait([e.bundle for e in entries.values()])
    except KeyboardInterrupt:
        print(f"\nStopped following; the jobs keep running.\n{how_to(str(record_dir))}", file=sys.stderr)
        return 130
    print(results(record_dir, {k: v.state for k, v in finals.items()}, rank_by=rank_by))
    if tasks and len({values_text({k: v for k, v in e.values.items() if k != "seed"}) for e in record.points}) > 1:
        from launcher.evals import decide  # numpy: only where there is a verdict to give

        print("\n".join(decide.sweep_lines(record_dir, tasks)))
    points = [(e.run_name, e.bundle) for e in entries.values()]
    print("GPU-hours (python -m launcher.jobs ledger DIR: every attempt)")
    print("\n".join(usage.several(points, record_dir / "gpu-hours.png", record_dir.parent.name)))
    return 0 if all(s.state == "COMPLETED" for s in finals.values()) else 1


def _eval_tasks(points: list[SweepPoint]) -> list[str]:
    """The tasks the sweep's points are evaluated on (the first point's --eval_tasks, as its job reads them)."""
    try:
        found = evals_report.settings(manifest.load(points[0].bundle)) if points else None
    except (OSError, ValueError):
        return []
    return list(found.tasks) if found is not None else []


def judge_point(point: SweepPoint, state: JobState) -> None:
    """Why a point's job ended so, recorded in its bundle's manifest, as for one run (`submit.judge_end`); the
    results read it from there."""
    try:
        run = manifest.load(point.bundle)
        log = run.log
    except (OSError, ValueError, KeyError):
        return  # a bundle moved or damaged: the table still shows Slurm's state
    judge_end(state, log, run)


def _verdict(bundle: Path) -> dict | None:
    try:
        return manifest.load(bundle).verdict
    except (OSError, ValueError):
        return None


def _final(metrics: Path) -> dict | None:
    rows = jsonl.read(metrics)
    return max(rows, key=lambda r: r.get("step", -1)) if rows else None


def results(record_dir: Path, states: dict[str, str], plot: bool = True, rank_by: str | None = None) -> str:
    """The points as a table, lowest final loss first, and (`plot`) a PNG of their loss curves; ranked by an eval
    score too where --rank_by asked (`rank_by`, else the points' own flag)."""
    record = sweep_record.load(record_dir)
    rows = []
    for e in record.points:
        last = _final(e.bundle / P.METRICS)
        loss = last.get("loss") if last else None
        state = states.get(e.job_id or "", "not submitted" if not e.job_id else "?")
        rows.append((loss, e, state, last.get("step") if last else None))
    rows.sort(key=lambda r: (r[0] is None, r[0] if r[0] is not None else 0.0))
    values = [values_text(e.values) for _, e, _, _ in rows]
    width = max(len(v) for v in values)
    lines = [f"Sweep {record.name}: lowest final loss first", f"  {'run':<16} {'values':<{width}}  "
             f"{'job':>7}  {'state':<10} {'step':>6}  {'loss':>8}"]  # fmt: skip
    for (loss, e, state, step), text in zip(rows, values, strict=True):
        lines.append(
            f"  {e.run_name:<16} {text:<{width}}  {e.job_id or '-':>7}  {state:<10} "
            f"{step if step is not None else '-':>6}  {f'{loss:.4f}' if loss is not None else '-':>8}"
        )
    for _, e, state, _ in rows:  # why each point that did not complete ended so, and what to do
        if state != "COMPLETED" and (verdict := _verdict(e.bundle)):
            first, *rest = str(verdict.get("message", "")).splitlines() or [""]
            lines.append(f"  {e.run_name} ended {state}: {first}")
            lines.extend(f"      {line}" for line in rest)
            lines.append(f"      fix: {verdict.get('fix', '')}")
    series = {f"{e.run_name} ({values_text(e.values)})": e.bundle / P.METRICS for e in record.points}
    if plot and any(path.exists() for path in series.values()):
        lines.append(f"  loss curves  {pictures.sweep_curves(series, record_dir / 'loss.png')}")
    points = [(e.run_name, e.bundle) for e in record.points]
    if rank_by := rank_by or record.rank_by:
        from launcher.evals import decide  # numpy: only where there is a ranking to give

        lines += decide.ranking_lines(points, rank_by, evals_report.ranking_lines, record_dir)
    return "\n".join(lines)
