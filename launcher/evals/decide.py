"""`python -m launcher.jobs verdict SWEEP|BUNDLE... --task TASK[:METRIC] [--task ...] [--at tokens|gpu_hours|step N|
last] [--last_k K] [--json] [--draws N] [--seed S]`: which arm is better, by how much, and how sure (issue 52;
docs/evals.md, "Deciding between runs").

The runs and arms, their evaluated steps and the point compared: launcher/evals/arms.py; each seed's per-item rows at
its last K evaluated steps up to the point: launcher/evals/items.py; the statistics: launcher/evals/verdict.py; the
words and the picture: launcher/evals/verdict_text.py. Here: the rows read into the verdict's arms, the text (or
`--json`: one object per --task, a list where several are given), the picture (`verdict.png` beside the sweep's
record or the first bundle), and the ranking `--rank_by` prints for a sweep with seeds. Nothing in the records
changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from launcher.bundle import manifest
from launcher.evals import arms as A
from launcher.evals import items, verdict_text
from launcher.evals import record as eval_record
from launcher.evals.arms import Asked
from launcher.evals.verdict import DRAWS, Arm, Comparison, Seed, Verdict, VerdictError, verdicts

PICTURE = "verdict.png"


Values = tuple[list[str], Any, Any]  # item ids, values, denominators (None: a mean)


class Rows:
    """Items files read once each (a sweep's evals can be hundreds of files): the columns of the wanted tasks' metrics
    only, reduced to each metric's values as read, kept until used once; each distinct list of item ids made once
    and shared (the verdict aligns shared lists at no cost)."""

    def __init__(self) -> None:
        self.columns: dict[Path, dict[str, list[str]]] = {}
        self.ids: dict[bytes, list[str]] = {}
        self.wanted: set[tuple[str, str]] = set()  # (task, metric)
        self.kept: dict[tuple[Path, str, str], Values] = {}
        self.by_digest: dict[str, list[str]] = {}  # items.digest -> the ids
        self.totals: dict[bytes, Any] = {}  # denominators by content: one array for equal ones
        self.digests: dict[Path, dict[str, str | None]] = {}  # a file -> its tasks' digests (its result's)

    def _open(self, e: A.Evaluated, read: Callable[[], object]) -> object:
        try:
            return read()
        except (OSError, ValueError, KeyError) as err:
            raise VerdictError(f"{e.items}: its per-item rows cannot be read ({err})") from None

    def names(self, e: A.Evaluated, task: str) -> list[str]:
        """The columns the task has in the step's file."""
        if e.items not in self.columns:
            self.columns[e.items] = self._open(e, lambda: items.names(e.items))  # type: ignore[assignment]
        if task not in self.columns[e.items]:
            raise VerdictError(f"{e.items} holds no rows of {task}")
        return self.columns[e.items][task]

    def want(self, task: str, metric: str, found: dict[A.Run, list[A.Evaluated]]) -> None:
        """`task` is judged on `metric`: read with the others from each file, once (its files' digests noted)."""
        self.wanted.add((task, metric))
        for steps in found.values():
            for e in steps:
                self.digests.setdefault(e.items, {})[task] = e.digest

    def get(self, e: A.Evaluated, task: str, metric: str, alone: bool = False) -> Values:
        """The task's item ids, values and denominators (None: a mean) at the step: read once, with every wanted
        (task, metric) of the file (`alone`: this one only), kept until asked for."""
        self.names(e, task)
        if (e.items, task, metric) not in self.kept:
            self._load(e, {(task, metric)} if alone else self.wanted | {(task, metric)}, {task: e.digest})
        return self.kept.pop((e.items, task, metric))

    def _load(self, e: A.Evaluated, wanted: set[tuple[str, str]], digests: dict[str, str | None]) -> None:
        """The file's wanted tasks, each reduced to its metric's values; the ids of a digest read once (the file's
        other tasks' digests are those its result names, where `digests` has them)."""
        import numpy as np

        digests = {**self.digests.get(e.items, {}), **digests}
        known = {t: d for t, d in digests.items() if d in self.by_digest}
        columns: dict[str, set[str]] = {}
        for task, metric in wanted:
            columns.setdefault(task, set() if task in known else {"doc_hash"}).update(items.needs(metric))
        found: dict = self._open(e, lambda: items.read(e.items, columns))  # type: ignore[assignment]
        for task, metric in wanted:
            if task not in found:
                continue
            table = found[task]
            if task in known:
                ids = self.by_digest[known[task]]
            else:
                key = table["doc_hash"].tobytes()
                ids = self.ids[key] if key in self.ids else self.ids.setdefault(key, items.ids(table))
                if digests.get(task):
                    self.by_digest[str(digests[task])] = ids
            v, t, _ = items.values(table, metric)
            if t is not None:  # a document's bytes are the same in every run: one array for them all
                small = t.dtype.kind in "iu" and (t.size == 0 or int(t.max()) < 2**31)
                t = t.astype(np.int32) if small else t
                t = self.totals.setdefault(t.tobytes(), t)
            self.kept[(e.items, task, metric)] = (ids, v, t)

    def prefetch(self, files: Sequence[A.Evaluated]) -> None:
        """The wanted tasks of these files read beforehand, two files at a time (zlib's inflating leaves the GIL)."""
        from concurrent.futures import ThreadPoolExecutor

        todo = list({e.items: e for e in files if not any((e.items, *w) in self.kept for w in self.wanted)}.values())
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda e: self._load(e, set(self.wanted), {}), todo))


def metric_of(columns: list[str], task: str, asked: str | None) -> str:
    """The metric judged: `asked`, where the task's rows have it; else the task's main one."""
    known = items.metrics(dict.fromkeys(columns))  # type: ignore[arg-type]
    if asked and asked not in known:
        raise VerdictError(f"{task} has no per-item {asked}: its metrics are {', '.join(known)} (`gold_bpb`: the "
                           "gold answer's bits per byte, multiple choice)")  # fmt: skip
    chosen = asked or eval_record.main_metric(dict.fromkeys(known, 0.0))
    if chosen is None:
        raise VerdictError(f"{task}: its rows hold no metric")
    return chosen


def seed_of(run: A.Run, steps: Sequence[A.Evaluated], task: str, metric: str, rows: Rows,
            alone: bool = False) -> Seed:  # fmt: skip
    """A run's rows at its steps as one replicate, in its first step's item order, reduced as they are read (the
    verdict keeps no more of K x N): each item's mean of a "mean" metric (the sums of a "ratio" one's numerators and
    denominators) over the steps, and the run's score at each step."""
    import numpy as np

    ids: list[str] | None = None
    summed: Any = None
    summed_totals: Any = None
    scores = []
    for e in steps:
        mine, v, t = rows.get(e, task, metric, alone)
        if ids is None:
            ids = mine
        elif mine is not ids and mine != ids:
            if sorted(mine) != sorted(ids):
                raise VerdictError(f"{task}: {run.name}'s steps {steps[0].step} and {e.step} were evaluated on other "
                                   "items: compare steps evaluated on the same data")  # fmt: skip
            where = {item: j for j, item in enumerate(mine)}
            order = np.array([where[item] for item in ids])
            v, t = v[order], (t[order] if t is not None else None)
        summed = v.astype(np.float64) if summed is None else summed + v
        if t is not None:
            summed_totals = t.astype(np.float64) if summed_totals is None else summed_totals + t
            scores.append(float(v.sum(dtype=np.float64) / t.sum(dtype=np.float64)))
        else:
            scores.append(float(v.mean(dtype=np.float64)))
    assert ids is not None
    if summed_totals is not None:  # a ratio: the sums over the steps
        return Seed(run.seed or run.name, ids, summed[None, :], summed_totals[None, :], scores=scores)
    return Seed(run.seed or run.name, ids, (summed / len(steps))[None, :], scores=scores)


def comparison(task: str, metric: str, arms: Sequence[A.ArmRuns], point: A.Point, last_k: int,
               rows: Rows) -> Comparison:  # fmt: skip
    """One task's arms at the point, their rows read."""
    columns = rows.names(point.steps[arms[0].runs[0]][-1], task)
    sizes = {}
    out = []
    for arm in arms:
        seeds = []
        for run in arm.runs:
            steps = list(point.steps[run])[-last_k:]
            seeds.append(seed_of(run, steps, task, metric, rows))
            sizes[f"{arm.label} ({run.name})"] = len(seeds[-1].items)
        out.append(Arm(arm.label, dict(arm.values), seeds, sorted({e.step for r in arm.runs for e in
                                                                   list(point.steps[r])[-last_k:]})))  # fmt: skip
    if len(set(sizes.values())) > 1:
        said = ", ".join(f"{name}: {n:,}" for name, n in sizes.items())
        raise VerdictError(f"{task}: the arms were evaluated on data of different sizes ({said} items): compare runs "
                           "evaluated on the same items (the same data and --eval_limit)")  # fmt: skip
    kind = items.kind(metric, columns)
    return Comparison(task, metric, out, kind=kind, lower_is_better=metric in eval_record.LOWER_IS_BETTER,  # type: ignore[arg-type]
                      at=point.as_json())  # fmt: skip


def runs_of(targets: Sequence[Path]) -> list[A.Run]:
    from launcher.bundle import sweep_record

    sweeps = [d for t in targets if (d := sweep_record.directory_of(t)) is not None]
    if sweeps and len(targets) > 1:
        raise VerdictError("give one sweep, or bundles: not a sweep beside other targets")
    return A.from_sweep(sweeps[0]) if sweeps else A.from_bundles(list(targets))


def judge(asked: Asked, hours_of: A.HoursOf | None = None,
          with_series: bool = False) -> tuple[list[Verdict], list[A.Point], list]:  # fmt: skip
    """The verdicts of every --task, their points, and (`with_series`) the picture's series."""
    runs = runs_of(asked.targets)
    arms = A.group(runs)
    if len(runs) < 2:
        raise VerdictError(f"one run ({runs[0].name if runs else 'none'}): a verdict compares two arms or more: "
                           "give a sweep, or two bundles or more")  # fmt: skip
    if len(arms) < 2:
        raise VerdictError(f"the {len(runs)} runs differ only by seed: one arm, nothing to compare it with")
    rows = Rows()
    chosen = []  # every task's point and metric first: then each file is read once for all of them
    for spec in asked.tasks:
        task, metric = A.split_task(spec)
        found = A.series(arms, task)
        point = A.choose(asked.at, found, asked.step, hours_of)
        A.check_comparable(point, task)
        metric = metric_of(rows.names(point.steps[arms[0].runs[0]][-1], task), task, metric)
        rows.want(task, metric, found)
        chosen.append((task, metric, found, point))
    rows.prefetch([e for *_, point in chosen for steps in point.steps.values() for e in steps[-asked.last_k :]])
    comparisons = [comparison(task, metric, arms, point, asked.last_k, rows) for task, metric, _, point in chosen]
    panels = [series(arms, found, task, metric, rows) if with_series else {} for task, metric, found, _ in chosen]
    return verdicts(comparisons, asked.draws or DRAWS, asked.seed), [p for *_, p in chosen], panels


def series(arms: Sequence[A.ArmRuns], found: dict, task: str, metric: str, rows: Rows) -> dict:
    """Each arm's score along tokens, at the steps all its seeds were evaluated at (its items averaged over its
    seeds), with a 95% band over items: +-1.96 standard errors (a ratio's by the delta method), cheap at any size;
    the verdict's own interval, over seeds and items, is drawn at the point compared. The picture's left panel."""
    import numpy as np

    out: dict[str, list[tuple[float, float, float, float]]] = {}
    for arm in arms:
        common = set.intersection(*({e.step for e in found[r]} for r in arm.runs))
        points = []
        for step in sorted(common):
            per = [seed_of(r, [next(e for e in found[r] if e.step == step)], task, metric, rows, alone=True)
                   for r in arm.runs]  # fmt: skip
            value = np.mean([np.asarray(s.values, dtype=float)[0] for s in per], axis=0)
            total = np.mean([np.asarray(s.totals, dtype=float)[0] for s in per], axis=0) if per[0].totals is not None \
                else np.ones_like(value)  # fmt: skip
            score = float(value.sum() / total.sum())
            spread = 0.0 if len(value) < 2 else 1.96 * float(np.std(value - score * total, ddof=1)) / (
                np.sqrt(len(value)) * float(total.mean()))  # fmt: skip
            tokens = next(e.tokens for e in found[arm.runs[0]] if e.step == step)
            points.append((float(tokens), score, score - spread, score + spread))
        out[arm.label] = points
    return out


def command(asked: Asked, as_json: bool, hours_of: A.HoursOf | None = None) -> int:
    """`jobs verdict`: the text and the picture, or the JSON."""
    if as_json:
        objects = [v.to_json() for v in judge(asked, hours_of)[0]]
        print(json.dumps(objects[0] if len(objects) == 1 else objects, indent=2))
        return 0
    print("\n".join(text(asked, hours_of)))
    return 0


def text(asked: Asked, hours_of: A.HoursOf | None = None) -> list[str]:
    """The verdict's lines: the point, each task's verdict, the best signal-to-noise, the picture."""
    results, points, panels = judge(asked, hours_of, with_series=True)
    lines = ["Compared at " + "; ".join(dict.fromkeys(p.said for p in points))]
    lines += verdict_text.report(results).rstrip("\n").split("\n")
    at_tokens = float(points[0].value) if points[0].by == "tokens" and points[0].value is not None else None
    try:
        drawn = verdict_text.picture(list(zip(results, panels, strict=True)), picture_path(asked.targets), at_tokens)
        lines.append(f"picture  {drawn}")
    except OSError as e:
        lines.append(f"no picture: {e}")
    return lines


def sweep_lines(sweep: Path, tasks: Sequence[str]) -> list[str]:
    """The end of --show_logs for a sweep whose points were evaluated: the verdict on `tasks` (its reason where
    there is none)."""
    if not tasks:
        return []
    head = "Verdict (python -m launcher.jobs verdict DIR --task TASK: --at, --last_k, --json)"
    try:
        return [head, *text(Asked([sweep], list(tasks)))]
    except VerdictError:
        pass
    lines = [head]
    for task in tasks:  # one task that cannot be judged (a group: its subtasks hold the rows) leaves the others
        try:
            lines += text(Asked([sweep], [task]))
        except VerdictError as e:
            lines.append(f"No verdict on {task}: {e}")
    return lines


def picture_path(targets: Sequence[Path]) -> Path:
    from launcher.bundle import sweep_record

    sweep = sweep_record.directory_of(targets[0])
    return (sweep if sweep is not None else targets[0]) / PICTURE


def ranking_lines(points: list[tuple[str, Path]], by: str, fallback: Callable[[list[tuple[str, Path]], str],
                  list[str]], sweep: Path | None = None) -> list[str]:  # fmt: skip
    """--rank_by: where the sweep has seeds (an arm of two runs or more), its arms ranked by the verdict at equal
    tokens, by the lower bound of each arm's interval (the upper, lower is better), the group no pair tells from the
    best said; else `fallback` (each point's score at its last evaluated step)."""
    if sweep is None:
        return fallback(points, by)
    try:
        arms = A.group(A.from_sweep(sweep))
        if all(len(a.runs) < 2 for a in arms) or len(arms) < 2:
            return fallback(points, by)
        (v,), (point,), _ = judge(Asked([sweep], [by]))
    except VerdictError as e:
        return [*fallback(points, by), f"  (no verdict: {e})"]
    bound = {a.label: (a.high if v.lower_is_better else a.low) for a in v.arms}
    order = sorted(v.arms, key=lambda a: bound[a.label] * (1 if v.lower_is_better else -1))
    head = f"Ranked by {v.task} {v.metric}, by the {'upper' if v.lower_is_better else 'lower'} bound of each arm's " \
           f"95% interval (verdict at {point.said})"  # fmt: skip
    lines = [head]
    for i, a in enumerate(order, start=1):
        mark = "*" if a.label in v.best_group else " "
        lines.append(f"  {i}. {a.label:<24} {a.score:.4f} [{a.low:.4f}, {a.high:.4f}] {mark} seeds {' '.join(a.seeds)}")
    lines.append(f"  * no pair tells it from the best ({', '.join(v.best_group)})")
    return lines


def hours_from_ledger(run: A.Run) -> Callable[[int], float | None]:
    """The ledger's trained GPU-hours of a run at a step (launcher/ledger/usage.py)."""
    from launcher.ledger.breakdown import hours_at
    from launcher.ledger.usage import trained_hours

    curves = trained_hours(manifest.load(run.bundle))
    return lambda step: hours_at(curves, step)
