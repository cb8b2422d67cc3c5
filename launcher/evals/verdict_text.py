"""A verdict (launcher/evals/verdict.py) as the user reads it: per task, each arm's score with its interval, the
pairs' differences with theirs and the word on each, the ranking with the arms no pair tells apart from the best
marked, the noise line; then the line naming the task and metric with the best signal-to-noise ratio. And the
picture: each arm's score with its interval along tokens, and the pairs' differences at the point compared.
Pure: lines and a PNG from values; matplotlib is imported only to draw."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.evals.verdict import Pair, Verdict, best_snr

MAX_PAIRS = 28  # all pairs of up to 8 arms; beyond, those with the best arm and those next to each other in rank
Series = Mapping[str, Sequence[tuple[float, float, float, float]]]  # arm label -> [(tokens, score, low, high)]


def number(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 100 else f"{x:.1f}"


def signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + number(abs(x))


def point(at: Any) -> str:
    """The comparison point as the caller gave it: a string, or a mapping said as key=value."""
    if isinstance(at, Mapping):
        return ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in at.items())
    return "" if at is None else str(at)


def shown_pairs(v: Verdict, every: bool = False) -> list[Pair]:
    """The pairs printed and drawn: all of them for a few arms (or `every`); else those with the best arm and those
    of arms next to each other in the ranking (the rest are in --json)."""
    if every or len(v.pairs) <= MAX_PAIRS:
        return v.pairs
    rank = {label: i for i, label in enumerate(v.ranking)}
    shown = [p for p in v.pairs if v.ranking[0] in (p.a, p.b) or abs(rank[p.a] - rank[p.b]) == 1]
    return sorted(shown, key=lambda p: sorted((rank[p.a], rank[p.b])))  # the best's first, then down the ranking


def steps(numbers: Sequence[int]) -> str:
    return ", ".join(str(s) for s in numbers) if len(numbers) <= 3 else f"{numbers[0]}..{numbers[-1]} ({len(numbers)})"


def lines(v: Verdict, every_pair: bool = False) -> list[str]:
    """One task's verdict, a header and three blocks: arms, pairs, ranking and noise."""
    seeds = sorted({len(a.seeds) for a in v.arms})
    seed_words = (
        f"{seeds[0]} seed{'s' if seeds[0] > 1 else ''} each"
        if len(seeds) == 1
        else "seeds " + "-".join(str(s) for s in (seeds[0], seeds[-1]))
    )
    over = "over items only (one seed per arm)" if v.over_items_only else "over seeds and items"
    where = f" at {point(v.at)}" if point(v.at) else ""
    better = "lower" if v.lower_is_better else "higher"
    out = [
        f"{v.task} {v.metric}{where}: {len(v.arms)} arms, {seed_words}, {v.items:,} items; {better} is better",
        f"  95% intervals {over}: paired bootstrap, {v.draws:,} draws",
    ]
    width = max(len(a.label) for a in v.arms)
    out.append(f"  {'arm':<{width}}  {'score':>9}  {'95% interval':<21}  seeds  steps")
    for a in v.arms:
        interval = f"[{number(a.low)}, {number(a.high)}]"
        out.append(
            f"  {a.label:<{width}}  {number(a.score):>9}  {interval:<21}  {' '.join(a.seeds):<5}  {steps(a.steps)}"
        )
    pairs = shown_pairs(v, every_pair)
    pair_width = max(len(f"{p.a} - {p.b}") for p in pairs)
    out.append(f"  {'a - b':<{pair_width}}  {'diff':>9}  {'95% interval':<23}  better")
    for p in pairs:
        word = {"a": p.a, "b": p.b}.get(p.verdict, "cannot tell")
        interval = f"[{signed(p.low)}, {signed(p.high)}]"
        out.append(f"  {p.a + ' - ' + p.b:<{pair_width}}  {signed(p.diff):>9}  {interval:<23}  {word}")
    if len(pairs) < len(v.pairs):
        out.append(f"  ({len(v.pairs) - len(pairs)} more pairs in --json: those of arms not next in rank)")
    marked = [f"{label}{'*' if label in v.best_group else ''}" for label in v.ranking]
    out.append(f"  ranking, best first (* no pair tells it from the best): {', '.join(marked)}")
    out.append("  " + noise_line(v))
    return out


def noise_line(v: Verdict) -> str:
    n = v.noise
    if n.sd is None:
        return "noise: not measured (one seed and one checkpoint per arm: average the last checkpoints, or add seeds)"
    spread = "checkpoints and seeds" if not v.over_items_only else "checkpoints"
    relative = f" ({n.noise:.1%} of the mean)" if n.noise is not None else ""
    signal = f"signal {n.signal:.1%}; " if n.signal is not None else ""
    snr = f"signal/noise {n.snr:.2f}" if n.snr is not None else "signal/noise: no noise at all"
    return f"noise {number(n.sd)}{relative} over {spread}; {signal}{snr}"


def report(results: Sequence[Verdict], every_pair: bool = False) -> str:
    """Every task's verdict, then which task and metric can best tell these arms apart."""
    out: list[str] = []
    for v in results:
        out += lines(v, every_pair) + [""]
    best = best_snr(results)
    if best is not None and len(results) > 1:
        out.append(
            f"best signal-to-noise: {best.task} {best.metric} ({best.noise.snr:.2f}): the benchmark that tells these "
            "arms apart best at this scale"
        )
    return "\n".join(out).rstrip() + "\n"


def picture(panels: Sequence[tuple[Verdict, Series]], png: Path, at_tokens: float | None = None) -> Path:
    """A row per task: left, each arm's score with its 95% interval along tokens (`Series`), the point compared
    marked with each arm's interval from the verdict; right, the pairs' differences at that point with their
    intervals (coloured where one arm wins)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    heights = [max(3.6, 0.16 * len(shown_pairs(v))) for v, _ in panels]  # a readable line per pair
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, sum(heights)), dpi=100, squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    for (left, right), (v, series) in zip(axes, panels, strict=True):
        for label, points in series.items():
            tokens = [p[0] for p in points]
            (line,) = left.plot(tokens, [p[1] for p in points], marker="o", markersize=3, label=label)
            left.fill_between(tokens, [p[2] for p in points], [p[3] for p in points], alpha=0.2, color=line.get_color())
        if at_tokens is not None:
            left.axvline(at_tokens, color="black", linestyle="--", linewidth=1)
            for a in v.arms:  # the verdict's interval (over seeds and items) at the point compared
                left.errorbar([at_tokens], [a.score], yerr=[[a.score - a.low], [a.high - a.score]], fmt="none",
                              ecolor="black", elinewidth=1, capsize=4)  # fmt: skip
        left.xaxis.set_major_formatter(EngFormatter())
        left.set_xlabel("tokens")
        left.set_ylabel(f"{v.metric} ({'lower' if v.lower_is_better else 'higher'} is better)")
        left.set_title(f"{v.task}: score, 95% over items (bars at the point: the verdict's)", fontsize=10)
        left.grid(alpha=0.3)
        if 1 < len(series) <= 12:
            left.legend(frameon=False, fontsize=7)
        pairs = shown_pairs(v)
        rows = range(len(pairs))
        colours = ["tab:green" if p.verdict == "a" else "tab:red" if p.verdict == "b" else "grey" for p in pairs]
        right.hlines(list(rows), [p.low for p in pairs], [p.high for p in pairs], colors=colours, linewidth=2)
        right.scatter([p.diff for p in pairs], rows, c=colours, s=14, zorder=3)
        right.axvline(0, color="black", linewidth=1)
        right.set_yticks(list(rows), [f"{p.a} - {p.b}" for p in pairs], fontsize=7)
        right.invert_yaxis()
        right.set_xlabel(f"difference a - b ({point(v.at) or 'the point compared'})")
        right.set_title("pairs: green a better, red b better, grey cannot tell", fontsize=10)
        right.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png
