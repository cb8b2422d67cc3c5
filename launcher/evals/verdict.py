"""Which arm of a sweep is better, by how much, and how sure: the statistics of `python -m launcher.jobs verdict`
(issue 52). Pure: numpy, no files, no torch; launcher/evals/verdict_text.py says it in words and a picture.

The input, for one (task, metric): ARMS (a sweep's points that differ in more than their seed), each with one SEED
or more (replicate runs), each seed with one value per ITEM at each checkpoint averaged (its last K evaluated ones
up to the comparison point, K >= 1), on the same items for every arm (their ids are checked). Two kinds of score:
"mean" (the mean over items of a per-item value: accuracy 0/1, the gold answer's bits per byte) and "ratio" (the
sum over items of a numerator over the sum of a denominator: a perplexity task's or a held-out domain's bits per
byte, summed NLL bits over summed UTF-8 bytes; a loss, summed NLL over summed tokens).

- A seed's per-item value is the mean over its K checkpoints ("ratio": both sums over them), as Signal and Noise
  averages a run's last checkpoints; its score is the item aggregate of those; an arm's score the mean over seeds.
- Every pair's difference, score(a) - score(b), has a 95% percentile interval from a paired two-level bootstrap:
  each draw resamples the item indices once for every arm (paired: the same items, so a difference's interval is
  far narrower than two arms' intervals suggest), and each arm's seeds with replacement where it has two or more
  (launcher/evals/resample.py draws). The generators are seeded by (seed, number of items) alone: the same input
  gives the same numbers whatever is computed beside it, and tasks with as many items share the draws (`verdicts`).
- Noise and signal as in Heineman et al. 2025, "Signal and Noise" (arXiv 2508.13144; the authors' snr/metrics.py,
  `signal_to_noise_ratio`): signal = max_{j,k} |m_j - m_k| / mean(m) over the models' scores m (here the arms'),
  noise = sd / mean of one run's scores over its last n checkpoints (np.std). Here the sd is pooled: every single
  checkpoint's score of every seed of an arm about that arm's mean (sum of squares over sum of (count - 1)), so it
  holds the checkpoint-to-checkpoint and the seed-to-seed spread; with one seed, each run's noise as the paper's
  (its np.std times sqrt(K / (K - 1))) averaged over the arms in quadrature. snr = signal / noise = (max - min of
  the arms' scores) / pooled sd, which needs no sign of the mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from launcher.errors import VerdictError
from launcher.evals.resample import interval, resampled_sums

DRAWS = 10_000  # the fewest bootstrap draws a verdict takes
__all__ = ["DRAWS", "Arm", "Comparison", "Seed", "Verdict", "VerdictError", "best_snr", "verdict", "verdicts"]
Kind = Literal["mean", "ratio"]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Seed:
    """One replicate run of an arm, at the checkpoints averaged."""

    name: str  # the replicate's name in the output (its seed: "2")
    items: Sequence[str]  # the item ids (lm-eval's doc_hash), in the order of `values`' columns
    values: npt.ArrayLike  # K x N (or N: one checkpoint): "mean": the item's value; "ratio": its numerator
    totals: npt.ArrayLike | None = None  # K x N, "ratio" only: the item's denominator (UTF-8 bytes, tokens)
    # Where given: the seed's score at each of its K checkpoints, and `values` (and `totals`) already reduced over them
    # to one row (the per-item mean of "mean" values; the per-item sums of "ratio" ones): what the verdict keeps of
    # K x N anyway, so a reader of many checkpoints need never hold them all at once
    scores: npt.ArrayLike | None = None


@dataclass(frozen=True)
class Arm:
    label: str  # its name in the output ("learning_rate=0.003")
    values: Mapping[str, Any]  # the swept values but the seed
    seeds: Sequence[Seed]
    steps: Sequence[int] = ()  # passed through to the output: the steps averaged


@dataclass(frozen=True)
class Comparison:
    """The arms of one (task, metric) at one comparison point."""

    task: str
    metric: str
    arms: Sequence[Arm]
    kind: Kind = "mean"
    lower_is_better: bool = False
    at: Any = None  # passed through to the output: the comparison point as the caller says it


@dataclass(frozen=True)
class ArmScore:
    label: str
    values: Mapping[str, Any]
    seeds: list[str]
    steps: list[int]
    score: float
    low: float
    high: float


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    diff: float  # score(a) - score(b)
    low: float
    high: float
    verdict: str  # "a" (a is better), "b", or "indistinguishable" (the interval holds 0)


@dataclass(frozen=True)
class Noise:
    noise: float | None  # pooled sd of single-checkpoint scores about their arm's mean, over |mean score|
    signal: float | None  # (max - min) of the arms' scores over |mean score|
    snr: float | None  # (max - min) / pooled sd; None where nothing varied (one seed, one checkpoint) or sd is 0
    sd: float | None  # the pooled sd itself, in the metric's unit


@dataclass(frozen=True)
class Verdict:
    task: str
    metric: str
    at: Any
    kind: Kind
    lower_is_better: bool
    items: int
    draws: int
    over_items_only: bool  # every arm has one seed: the intervals are over items only
    arms: list[ArmScore]  # in the input's order
    pairs: list[Pair]  # every (a, b) with a before b in the input
    noise: Noise
    ranking: list[str] = field(default_factory=list)  # the arms' labels, best first
    best_group: list[str] = field(default_factory=list)  # the best and those no pair tells apart from it

    def to_json(self) -> dict[str, Any]:
        """The `--json` object of issue 52."""
        return {
            "task": self.task,
            "metric": self.metric,
            "at": self.at,
            "arms": [
                {"label": a.label, "values": dict(a.values), "seeds": a.seeds, "steps": a.steps, "score": a.score}
                | {"low": a.low, "high": a.high}
                for a in self.arms
            ],
            "pairs": [
                {"a": p.a, "b": p.b, "diff": p.diff, "low": p.low, "high": p.high, "verdict": p.verdict}
                for p in self.pairs
            ],
            "noise": {self.task: {"noise": self.noise.noise, "signal": self.noise.signal, "snr": self.noise.snr}},
        }


@dataclass
class _Runs:
    """One comparison made ready: a column per run (arm-seed), aligned on the first run's items."""

    comparison: Comparison
    n: int
    values: Floats  # N x runs: the per-item value ("mean") or numerator ("ratio"), checkpoints averaged/summed
    totals: Floats | None  # N x runs ("ratio"), or N x 1 where every run has the same denominators
    arm_columns: list[range]
    seed_scores: list[Floats]  # per arm: each seed's score
    checkpoint_scores: list[Floats]  # per arm: every seed's every checkpoint's score


def verdict(comparison: Comparison, draws: int = DRAWS, seed: int = 0) -> Verdict:
    """One (task, metric)'s verdict; raises VerdictError naming what cannot be compared."""
    return verdicts([comparison], draws, seed)[0]


def verdicts(comparisons: Sequence[Comparison], draws: int = DRAWS, seed: int = 0) -> list[Verdict]:
    """Each comparison's verdict, as `verdict` gives it alone; those with as many items share the count matrix."""
    if draws < DRAWS:
        raise VerdictError(f"{draws} bootstrap draws: a verdict takes {DRAWS:,} or more")
    runs = [_prepare(c) for c in comparisons]
    results: dict[int, Verdict] = {}
    for n in sorted({r.n for r in runs}):
        group = [(i, r) for i, r in enumerate(runs) if r.n == n]
        blocks, offsets = [], [0]
        for _, r in group:
            block = _columns(r)
            blocks.append(block)
            offsets.append(offsets[-1] + block.shape[1])
        sums = resampled_sums(np.ascontiguousarray(np.hstack(blocks), dtype=np.float32), draws, seed)
        for (i, r), start, stop in zip(group, offsets, offsets[1:], strict=False):
            results[i] = _judge(r, sums[:, start:stop], draws, seed)
    return [results[i] for i in range(len(runs))]


def best_snr(results: Sequence[Verdict]) -> Verdict | None:
    """The (task, metric) with the best signal-to-noise ratio: the benchmark that can best tell these arms apart."""
    known = [v for v in results if v.noise.snr is not None]
    return max(known, key=lambda v: v.noise.snr or 0.0) if known else None


def _prepare(c: Comparison) -> _Runs:
    where = f"{c.task}:{c.metric}"
    if c.kind not in ("mean", "ratio"):
        raise VerdictError(f"{where}: kind {c.kind!r}: 'mean' or 'ratio'")
    if len(c.arms) < 2:
        raise VerdictError(f"{where}: {len(c.arms)} arm(s): a verdict compares two arms or more")
    labels = [a.label for a in c.arms]
    if len(set(labels)) < len(labels):
        twice = sorted({x for x in labels if labels.count(x) > 1})
        raise VerdictError(f"{where}: arm labels repeat ({', '.join(twice)}): each arm needs a label of its own")
    empty = [a.label for a in c.arms if not a.seeds]
    if empty:
        raise VerdictError(f"{where}: arm(s) {', '.join(empty)} have no evaluated run")
    first = c.arms[0].seeds[0]
    reference = list(first.items)
    n = len(reference)
    if n < 2:
        raise VerdictError(f"{where}: {n} item(s): an interval needs two items or more")
    if len(set(reference)) < n:
        raise VerdictError(f"{where}: arm {c.arms[0].label} seed {first.name}: an item id appears twice")
    position = {item: j for j, item in enumerate(reference)}
    values: list[Floats] = []
    totals: list[Floats] = []
    arm_columns: list[range] = []
    seed_scores: list[Floats] = []
    checkpoint_scores: list[Floats] = []
    for arm in c.arms:
        start = len(values)
        arm_seed, arm_checkpoints = [], []
        for s in arm.seeds:
            name = f"{where}: arm {arm.label} seed {s.name}"
            order = _alignment(s.items, reference, position, name, f"arm {c.arms[0].label} seed {first.name}")
            v, t = _matrices(s, order, n, c.kind, name)
            if s.scores is not None:  # reduced over its checkpoints already
                given = np.atleast_1d(np.asarray(s.scores, dtype=np.float64))
                if v.shape[0] != 1 or given.ndim != 1 or given.size < 1 or not np.isfinite(given).all():
                    raise VerdictError(f"{name}: with its checkpoints' scores, values are one row (the reduced "
                                       f"items), got {v.shape[0]}; scores {given.shape}")  # fmt: skip
                values.append(v[0].astype(np.float64))
                if c.kind == "ratio":
                    assert t is not None
                    totals.append(t[0].astype(np.float64))
                    arm_seed.append(float(values[-1].sum() / totals[-1].sum()))
                else:
                    arm_seed.append(float(values[-1].mean()))
                arm_checkpoints.append(given)
                continue
            if c.kind == "mean":
                values.append(v.mean(axis=0, dtype=np.float64))
                per_checkpoint = v.mean(axis=1, dtype=np.float64)
                arm_seed.append(float(values[-1].mean()))
            else:
                assert t is not None
                values.append(v.sum(axis=0, dtype=np.float64))
                totals.append(t.sum(axis=0, dtype=np.float64))
                per_checkpoint = v.sum(axis=1, dtype=np.float64) / t.sum(axis=1, dtype=np.float64)
                arm_seed.append(float(values[-1].sum() / totals[-1].sum()))
            arm_checkpoints.append(per_checkpoint)
        arm_columns.append(range(start, len(values)))
        seed_scores.append(np.array(arm_seed))
        checkpoint_scores.append(np.concatenate(arm_checkpoints))
    total = None
    if totals:
        total = np.stack(totals, axis=1)
        total = total[:, :1] if bool((total == total[:, :1]).all()) else total
    return _Runs(c, n, np.stack(values, axis=1), total, arm_columns, seed_scores, checkpoint_scores)


def _alignment(items: Sequence[str], reference: list[str], position: dict[str, int], name: str, first: str) -> Any:
    """None where `items` is the reference order; else the columns that put them in it; refused where they differ."""
    if items is reference or list(items) == reference:
        return None
    mine = list(items)
    if len(mine) == len(reference) and set(mine) == position.keys():
        where = {item: j for j, item in enumerate(mine)}
        return np.array([where[item] for item in reference])
    missing, extra = len(position.keys() - set(mine)), len(set(mine) - position.keys())
    raise VerdictError(
        f"{name}: its {len(mine)} items are not {first}'s {len(reference)} ({missing} missing, {extra} others"
        f"{', some twice' if len(set(mine)) < len(mine) else ''}): compare runs evaluated on the same items "
        "(the same task, --eval_limit and data)"
    )


def _matrices(s: Seed, order: Any, n: int, kind: Kind, name: str) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None]:
    """The seed's values (and totals) as K x N numbers in the reference's item order, checked (as given: 0/1 as
    uint8 is never copied to float64)."""
    v = np.atleast_2d(np.asarray(s.values))
    if v.ndim != 2 or v.shape[1] != n or v.shape[0] < 1 or v.dtype.kind not in "biuf":
        raise VerdictError(f"{name}: values of shape {v.shape} ({v.dtype}) for {n} items (checkpoints x items)")
    if v.dtype.kind == "f" and not np.isfinite(v).all():
        raise VerdictError(f"{name}: a value is not a number (NaN or infinite)")
    if kind == "mean":
        if s.totals is not None:
            raise VerdictError(f"{name}: totals given for a score that is a mean over items (kind 'ratio'?)")
        return (v if order is None else v[:, order]), None
    if s.totals is None:
        raise VerdictError(f"{name}: a ratio score needs each item's denominator (totals)")
    t = np.atleast_2d(np.asarray(s.totals))
    if t.shape != v.shape or t.dtype.kind not in "biuf":
        raise VerdictError(f"{name}: totals of shape {t.shape} ({t.dtype}) for values of shape {v.shape}")
    if (t.dtype.kind == "f" and not np.isfinite(t).all()) or not (t > 0).all():
        raise VerdictError(f"{name}: an item's denominator is not a positive number (an empty document?)")
    return (v, t) if order is None else (v[:, order], t[:, order])


def _columns(r: _Runs) -> Floats:
    """What the count matrix multiplies: each run's values less the item's mean over runs, then that mean (and
    the totals, "ratio")."""
    centre = r.values.mean(axis=1, keepdims=True)
    parts = [r.values - centre, centre] + ([r.totals] if r.totals is not None else [])
    return np.hstack(parts)


def _judge(r: _Runs, sums: npt.NDArray[np.float32], draws: int, seed: int) -> Verdict:
    c = r.comparison
    draws_by_arm = _arm_draws(r, np.ascontiguousarray(sums.T, dtype=np.float64), seed)  # arms x draws
    arm_low, arm_high = interval(draws_by_arm)
    scores = np.array([float(x.mean()) for x in r.seed_scores])
    arms = [ArmScore(a.label, a.values, [s.name for s in a.seeds], list(a.steps), float(scores[i]),
                     float(arm_low[i]), float(arm_high[i])) for i, a in enumerate(c.arms)]  # fmt: skip
    first, second = np.triu_indices(len(c.arms), k=1)
    low, high = interval(draws_by_arm[first] - draws_by_arm[second])
    pairs = []
    for i, j, lo, hi in zip(first.tolist(), second.tolist(), low, high, strict=True):
        word = "indistinguishable" if lo <= 0 <= hi else ("a" if (lo > 0) != c.lower_is_better else "b")
        pairs.append(Pair(c.arms[i].label, c.arms[j].label, float(scores[i] - scores[j]), float(lo), float(hi), word))
    order = sorted(range(len(c.arms)), key=lambda i: scores[i] if c.lower_is_better else -scores[i])
    best = c.arms[order[0]].label
    tied = {p.a if p.b == best else p.b for p in pairs if best in (p.a, p.b) and p.verdict == "indistinguishable"}
    return Verdict(
        c.task, c.metric, c.at, c.kind, c.lower_is_better, r.n, draws,
        all(len(x) == 1 for x in r.arm_columns), arms, pairs, _noise(scores, r.checkpoint_scores),
        [c.arms[i].label for i in order], [c.arms[i].label for i in order if i == order[0] or c.arms[i].label in tied],
    )  # fmt: skip


def _arm_draws(r: _Runs, sums: Floats, seed: int) -> Floats:
    """arms x draws: each arm's score in each draw, from the columns' sums (columns x draws): each run's item
    aggregate, then the mean over the arm's seeds drawn with replacement (a generator of its own, so that the
    seeds' draws never shift the items')."""
    runs = r.values.shape[1]
    per_run = sums[:runs] + sums[runs]
    per_run = per_run / r.n if r.comparison.kind == "mean" else per_run / sums[runs + 1 :]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1, r.n))))
    out = np.empty((len(r.arm_columns), sums.shape[1]))
    for a, columns in enumerate(r.arm_columns):
        seeds = len(columns)
        if seeds == 1:
            out[a] = per_run[columns.start]
            continue
        picks = rng.integers(0, seeds, size=(seeds, sums.shape[1]))
        weights = (picks[None, :, :] == np.arange(seeds)[:, None, None]).sum(axis=1) / seeds
        out[a] = (per_run[columns.start : columns.stop] * weights).sum(axis=0)
    return out


def _noise(scores: Floats, checkpoints: list[Floats]) -> Noise:
    """Signal and Noise's figures for these arms (the module's docstring says how)."""
    squares = sum(float(((x - x.mean()) ** 2).sum()) for x in checkpoints)
    freedom = sum(len(x) - 1 for x in checkpoints)
    sd = math.sqrt(squares / freedom) if freedom else None
    spread, mean = float(scores.max() - scores.min()), abs(float(scores.mean()))
    return Noise(
        noise=sd / mean if sd is not None and mean else None,
        signal=spread / mean if mean else None,
        snr=spread / sd if sd else None,
        sd=sd,
    )
