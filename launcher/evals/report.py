"""A run's or a sweep's evaluations on the screen: `python -m launcher.jobs evals BUNDLE|SWEEP|JOB_ID` (the table of
step x task with the tokens consumed, and the picture: score against tokens, a panel per task, a line per point of a
sweep), the end of --show_logs (the table so far, and which eval jobs still run), a sweep's points ranked by an
eval score (--rank_by), the eval line of the ledger. Reads the run's eval records (launcher/evals/record.py) and
its job's settings (job.json); asks Slurm once, for the eval jobs that have no result yet."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.bundle import manifest, sweep_record
from launcher.errors import ConfigError, LauncherError, SlurmUnavailable
from launcher.evals import record as eval_record
from launcher.evals.record import RunEvals
from launcher.evals.settings import EvalSettings
from launcher.node import job as job_file
from launcher.report import pictures
from launcher.slurm import client
from launcher.slurm.follow import Cadence
from launcher.slurm.parse import TERMINAL

PICTURE = "evals.png"


def of(run: manifest.Manifest) -> RunEvals:
    return eval_record.of_run(run.bundle_dir, run.checkpoints)


def settings(run: manifest.Manifest) -> EvalSettings | None:
    """The run's --eval_tasks as its job reads them (None: none, or a bundle of another release)."""
    try:
        return job_file.load(run.bundle_dir).evals
    except job_file.JobFileError:
        return None


def asked(run: manifest.Manifest) -> bool:
    """Whether the run is evaluated: launched with --eval_tasks, or steps of it given to `jobs evaluate`."""
    if settings(run) is not None:
        return True
    try:
        return bool(eval_record.submissions(run.checkpoints))
    except KeyError:  # a manifest that names no checkpoints (a bundle of an earlier release): none evaluated
        return False


def open_states(found: RunEvals) -> dict[str, str]:
    """The state Slurm says of each eval job with no result yet (one query for them all; {} where it is away)."""
    jobs = [str(r["job"]) for r in found.open.values() if r.get("job")]
    if not jobs:
        return {}
    try:
        return {job: state.state for job, state in client.job_states_many(jobs).items()}
    except (SlurmUnavailable, LauncherError):
        return {}


def _value(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"


def table(found: RunEvals, states: dict[str, str] | None = None, indent: str = "  ") -> list[str]:
    """The steps evaluated (a row each: tokens, each task's main metric, each held-out domain's loss and bits per
    byte), then the failed steps with their causes, then the eval jobs still to end."""
    lines = []
    if found.done:
        tasks = found.tasks
        columns = [(t, eval_record.main_metric(next(r["tasks"][t] for r in found.done.values() if t in r["tasks"])))
                   for t in tasks]  # fmt: skip
        heads = [f"{t} {m}" for t, m in columns]
        domains = list(dict.fromkeys(name for r in found.done.values() for name in (r.get("heldout") or {})))
        heads += [f"{name} {what}" for name in domains for what in ("loss", "bits/byte")]
        widths = [max(len(h), 8) for h in heads]
        named = "  ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True))
        lines.append(f"{indent}{'step':>7}  {'tokens':>13}  {named}")
        for step in sorted(found.done):
            row = found.done[step]
            cells = [row["tasks"].get(t, {}).get(m or "") for t, m in columns]
            for name in domains:
                h = (row.get("heldout") or {}).get(name) or {}
                cells += [h.get("loss"), h.get("bits_per_byte")]
            shown = ["-" if c is None else _value(float(c)) for c in cells]
            lines.append(f"{indent}{step:>7}  {int(row.get('tokens') or 0):>13,}  "
                         + "  ".join(f"{c:>{w}}" for c, w in zip(shown, widths, strict=True)))  # fmt: skip
    for step in sorted(found.failed):
        r = found.failed[step]
        lines.append(f"{indent}step {step}: {r.get('state')}" + (f" (job {r['job']})" if r.get("job") else "")
                     + f": {r.get('cause', '')}")  # fmt: skip
    states = states or {}
    running = []
    for step, r in sorted(found.open.items()):
        state = states.get(str(r.get("job")), "")
        if state in TERMINAL:  # Slurm says it ended, and it wrote no end (killed outright, or before it started)
            why = f": {r['cause']}" if r.get("cause") else ""
            lines.append(f"{indent}step {step}: eval job {r.get('job')} ended {state} without a result{why}")
        else:
            now = state or r.get("result") or r.get("state", "?")
            running.append(f"step {step} (job {r.get('job') or '?'}, {now})")
    if running:
        lines.append(f"{indent}still to end: " + ", ".join(running))
    if not lines:
        lines.append(f"{indent}no step evaluated yet")
    return lines


def run_lines(run: manifest.Manifest, ask_slurm: bool = True) -> list[str]:
    """The run's evaluations as `jobs evals` and the end of --show_logs say them."""
    found = of(run)
    name = run.data.get("run_name") or run.bundle_dir.parent.name
    tasks = found.tasks or list((settings(run) or EvalSettings(())).tasks)
    head = f"Evals of {name} (lm-eval: {', '.join(tasks) or 'no task yet'})"
    return [head, *table(found, open_states(found) if ask_slurm else None)]


def wait(bundles: list[Path], every_s: float | None = None) -> None:
    """Until no eval job of these runs is still to end (Slurm asked once a look, for all of them; a look every
    LAUNCHER_POLL_SECONDS, as the follower's)."""
    import time

    every_s = every_s if every_s is not None else Cadence.from_env().quiet
    while True:
        jobs = [str(r["job"]) for b in bundles for r in of(manifest.load(b)).open.values() if r.get("job")]
        if not jobs:
            return
        try:
            states = client.job_states_many(jobs)
        except (SlurmUnavailable, LauncherError):
            return
        if all(job not in states or states[job].terminal for job in jobs):
            return
        time.sleep(every_s)


def ledger_line(run: manifest.Manifest) -> str | None:
    """The eval jobs' GPU-hours, apart from training's; None without --eval_tasks."""
    if not asked(run):
        return None
    found = of(run)
    jobs = len(found.done) + len(found.failed)
    seconds = sum(float(r.get("seconds") or 0) for r in [*found.done.values(), *found.failed.values()])
    asked_for = settings(run)
    rows = [*found.done.values(), *found.failed.values()]
    gpus = asked_for.gpus if asked_for is not None else max((int(r.get("gpus") or 0) for r in rows), default=0)
    on = "GPUs" if gpus else "CPUs"
    still = f", {len(found.open)} still to end" if found.open else ""
    return f"{found.gpu_hours():.3f} GPU-hours in {jobs} eval job(s) on {on} ({seconds / 3600:.3f} hours{still}), apart"


@dataclass(frozen=True)
class Ranked:
    name: str
    bundle: Path
    step: int | None  # the step its score is of: its last evaluated one
    metric: str | None
    value: float | None


def rank(points: list[tuple[str, Path]], by: str) -> list[Ranked]:
    """A sweep's points, best first by `by` (TASK or TASK:METRIC) at each one's last evaluated step; those without a
    score last."""
    task, _, metric = by.partition(":")
    found = []
    for name, bundle in points:
        try:
            chosen, series = of(manifest.load(bundle)).series(task, metric or None)
        except (OSError, ValueError):
            chosen, series = None, []
        step, _, value = series[-1] if series else (None, 0, None)
        found.append(Ranked(name, bundle, step, chosen, value))
    scored = [r for r in found if r.value is not None and math.isfinite(r.value)]
    lower = any(r.metric in eval_record.LOWER_IS_BETTER for r in scored)
    scored.sort(key=lambda r: float(r.value or 0.0) * (1 if lower else -1))
    return scored + [r for r in found if r not in scored]


def ranking_lines(points: list[tuple[str, Path]], by: str) -> list[str]:
    ranked = rank(points, by)
    metric = next((r.metric for r in ranked if r.metric), by)
    order = "lowest" if metric in eval_record.LOWER_IS_BETTER else "highest"
    lines = [f"Ranked by {by.split(':')[0]} {metric}, {order} first (each point's last evaluated step)"]
    for i, r in enumerate(ranked, start=1):
        said = f"{_value(r.value)} at step {r.step}" if r.value is not None else "no score yet"
        lines.append(f"  {i}. {r.name:<16} {said}")
    return lines


def picture(runs: dict[str, RunEvals], png: Path, title: str) -> Path | None:
    """Score against tokens: a panel per task, a line per run."""
    panels: dict[str, tuple[str, dict[str, list[tuple[int, float]]]]] = {}
    for label, found in runs.items():
        for task in found.tasks:
            metric, series = found.series(task, panels[task][0] if task in panels else None)
            if series and metric:
                panels.setdefault(task, (metric, {}))[1][label] = [(tokens, value) for _, tokens, value in series]
    return pictures.evals_png(panels, png, title) if panels else None


def rank_by_problem(runs: list[RunEvals], by: str) -> str | None:
    """`jobs evals --rank_by TASK[:METRIC]` against the metrics the runs' records hold (nothing to say before any step
    is scored)."""
    task, colon, metric = by.partition(":")
    if not task or (colon and not metric.strip()):
        return f"{by!r} names no {'task' if not task else 'metric after the colon'}; give TASK or TASK:METRIC"
    held: dict[str, set[str]] = {}
    for found in runs:
        for row in found.done.values():
            for name, metrics in (row.get("tasks") or {}).items():
                held.setdefault(name, set()).update(m for m in metrics if "_stderr" not in m)
    if held and task not in held:
        return f"{task!r} is not a task the records hold ({', '.join(sorted(held))}); rank by one of them"
    if held and metric and metric not in held[task]:
        best = eval_record.main_metric(dict.fromkeys(held[task], 0.0)) or sorted(held[task])[0]
        return (f"the records hold no {metric!r} of {task} (they hold {', '.join(sorted(held[task]))}); e.g. "
                f"--rank_by {task}:{best}")  # fmt: skip
    return None


def command(target: manifest.Manifest | Path, rank_by: str | None = None,
            ranking: Callable[[list[tuple[str, Path]], str, Path], list[str]] | None = None) -> int:  # fmt: skip
    """`jobs evals`: a run's (its manifest) or a sweep's (its record's directory) evaluations, and the picture;
    `ranking`: the sweep's points ranked (launcher/evals/decide.py: by the verdict where it has seeds)."""
    if isinstance(target, manifest.Manifest):
        if rank_by:
            raise ConfigError(f"--rank_by: it ranks a sweep's points; give the sweep's directory ({target.bundle_dir} "
                              "is one run's bundle)")  # fmt: skip
        if not asked(target):
            raise LauncherError(f"{target.bundle_dir} was launched without --eval_tasks and none of its steps was "
                                "evaluated: evaluate some with `python -m launcher.jobs evaluate BUNDLE --eval_tasks "
                                "TASKS`")  # fmt: skip
        print("\n".join(run_lines(target)))
        drawn = picture({"run": of(target)}, target.bundle_dir / PICTURE, f"{target.data.get('run_name')}: evals")
        if drawn:
            print(f"  picture      {drawn}")
        return 0
    record = sweep_record.load(target)
    points = [(p.run_name, p.bundle) for p in record.points]
    loaded = {name: manifest.load(bundle) for name, bundle in points}
    runs = {name: of(run) for name, run in loaded.items()}
    said = rank_by_problem(list(runs.values()), rank_by) if rank_by else None
    if said:
        raise ConfigError(f"--rank_by: {said}")
    for run in loaded.values():
        print("\n".join(run_lines(run)))
    rank_by = rank_by or record.rank_by
    if rank_by:
        print("\n".join(ranking(points, rank_by, target) if ranking else ranking_lines(points, rank_by)))
    drawn = picture(runs, target / PICTURE, f"sweep {record.name}: evals")
    if drawn:
        print(f"  picture      {drawn}")
    return 0
