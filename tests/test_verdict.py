"""The verdict's statistics (launcher/evals/verdict.py) against an independent computation written here from the
definitions: a draw-by-draw loop bootstrap (the items drawn once for both arms, each arm's seeds drawn with
replacement), the scores and differences computed directly; the words, ranking and noise; every refusal; the text
and the picture (launcher/evals/verdict_text.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.evals import verdict_text
from launcher.evals.verdict import Arm, Comparison, Seed, VerdictError, best_snr, verdict, verdicts

ITEMS = [f"doc-{i}" for i in range(200)]


def accuracy_arms(rng: np.random.Generator, skill: list[float], seeds: int = 2, checkpoints: int = 3) -> list[Arm]:
    """Arms answering the same items: an item's difficulty shared by every arm (what pairing exploits), each seed
    an offset of its own (what resampling the seeds must show), 0/1 per item and checkpoint."""
    difficulty = rng.normal(0, 1.5, len(ITEMS))
    arms = []
    for a, s in enumerate(skill):
        runs = []
        for k in range(seeds):
            logit = s + rng.normal(0, 0.15) - difficulty
            p = 1 / (1 + np.exp(-logit))
            runs.append(Seed(str(k + 1), ITEMS, (rng.random((checkpoints, len(ITEMS))) < p).astype(np.uint8)))
        arms.append(Arm(f"arm{a}", {"learning_rate": 10.0 ** -(a + 2)}, runs, steps=[80, 90, 100][-checkpoints:]))
    return arms


def per_item(seed: Seed, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A seed's per-item value over its checkpoints, by the definition: the mean ("mean"), or the sums ("ratio")."""
    values = np.atleast_2d(np.asarray(seed.values, dtype=float))
    if kind == "mean":
        return values.mean(axis=0), np.ones(values.shape[1])
    return values.sum(axis=0), np.atleast_2d(np.asarray(seed.totals, dtype=float)).sum(axis=0)


def direct_score(arm: Arm, kind: str) -> float:
    scores = []
    for s in arm.seeds:
        num, den = per_item(s, kind)
        scores.append(num.mean() if kind == "mean" else num.sum() / den.sum())
    return float(np.mean(scores))


def loop_bootstrap(arms: list[Arm], kind: str, draws: int, two_levels: bool = True, seed: int = 12345) -> np.ndarray:
    """draws x arms, one draw at a time: the item indices drawn once for every arm, then for each arm its seeds
    drawn with replacement (where `two_levels`), its value the mean over the drawn seeds of the aggregate over the
    drawn items."""
    rng = np.random.default_rng(seed)
    prepared = [[per_item(s, kind) for s in arm.seeds] for arm in arms]
    n = len(prepared[0][0][0])
    out = np.empty((draws, len(arms)))
    for b in range(draws):
        idx = rng.integers(0, n, n)
        for a, seeds in enumerate(prepared):
            chosen = rng.integers(0, len(seeds), len(seeds)) if two_levels else range(len(seeds))
            values = []
            for k in chosen:
                num, den = seeds[k]
                values.append(num[idx].mean() if kind == "mean" else num[idx].sum() / den[idx].sum())
            out[b, a] = np.mean(values)
    return out


def interval(x: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(x, [2.5, 97.5])
    return float(low), float(high)


def test_two_arms_of_two_seeds_against_an_independent_loop_bootstrap():
    arms = accuracy_arms(np.random.default_rng(0), [0.3, 0.0])
    v = verdict(Comparison("mc", "acc", arms, at={"tokens": 1_000_000}))
    a, b = v.arms
    assert a.score == direct_score(arms[0], "mean") and b.score == direct_score(arms[1], "mean")
    [pair] = v.pairs
    assert (pair.a, pair.b) == ("arm0", "arm1")
    assert pair.diff == direct_score(arms[0], "mean") - direct_score(arms[1], "mean")
    draws = loop_bootstrap(arms, "mean", 5_000)
    low, high = interval(draws[:, 0] - draws[:, 1])
    width = high - low
    assert abs(pair.low - low) < 0.06 * width and abs(pair.high - high) < 0.06 * width, (pair, low, high)
    for arm, column in zip(v.arms, draws.T, strict=True):
        arm_low, arm_high = interval(column)
        assert abs(arm.low - arm_low) < 0.06 * (arm_high - arm_low) and abs(arm.high - arm_high) < 0.06 * width
    # the comparison can fail: drawing the items apart for each arm, or leaving the seeds out, gives other intervals
    apart = loop_bootstrap(arms[:1], "mean", 2_000)[:, 0] - loop_bootstrap(arms[1:], "mean", 2_000, seed=1)[:, 0]
    assert np.ptp(interval(apart)) > 1.3 * width
    one_level = loop_bootstrap(arms, "mean", 2_000, two_levels=False)
    assert np.ptp(interval(one_level[:, 0] - one_level[:, 1])) < 0.85 * width
    assert not v.over_items_only and v.items == 200 and v.draws == 10_000


def test_ratio_scores_of_one_seed_each_are_over_items_only():
    rng = np.random.default_rng(1)
    size = rng.integers(50, 3000, len(ITEMS))  # bytes per document
    hardness = rng.gamma(2.0, 0.5, len(ITEMS))
    arms = []
    for a, level in enumerate([1.0, 1.02, 1.2]):
        bits = size * hardness * level * rng.lognormal(0, 0.05, (2, len(ITEMS)))
        counted = size + 3 * (a == 2)  # the last arm's denominators its own (another tokenizer's tokens, say)
        arms.append(Arm(f"arm{a}", {"a": a}, [Seed("1", ITEMS, bits, np.stack([counted, counted]))]))
    v = verdict(Comparison("heldout:web", "bits_per_byte", arms, kind="ratio", lower_is_better=True))
    assert v.over_items_only
    draws = loop_bootstrap(arms, "ratio", 5_000)
    for pair, (i, j) in zip(v.pairs, [(0, 1), (0, 2), (1, 2)], strict=True):
        assert pair.diff == direct_score(arms[i], "ratio") - direct_score(arms[j], "ratio")
        low, high = interval(draws[:, i] - draws[:, j])
        assert abs(pair.low - low) < 0.06 * (high - low) and abs(pair.high - high) < 0.06 * (high - low)
    assert [p.verdict for p in v.pairs] == ["a", "a", "a"]  # lower bits per byte wins
    assert v.ranking == ["arm0", "arm1", "arm2"] and v.best_group == ["arm0"]
    assert "over items only" in verdict_text.report([v])


def test_same_input_same_numbers_and_alone_as_in_company():
    arms = accuracy_arms(np.random.default_rng(2), [0.2, 0.1, 0.0])
    first = verdict(Comparison("mc", "acc", arms))
    assert verdict(Comparison("mc", "acc", arms)) == first
    other = verdict(Comparison("mc", "acc", arms), seed=7)
    assert [p.diff for p in other.pairs] == [p.diff for p in first.pairs]
    assert [p.low for p in other.pairs] != [p.low for p in first.pairs]
    # a task beside others of as many items shares their count matrix: its numbers stay its own
    company = accuracy_arms(np.random.default_rng(3), [0.0, 0.5])
    smaller = [Arm(a.label, {}, [Seed("1", ITEMS[:50], np.asarray(a.seeds[0].values)[:, :50])]) for a in company]
    beside = [Comparison("other", "acc", company), Comparison("mc", "acc", arms), Comparison("small", "acc", smaller)]
    together = verdicts(beside)
    assert together[1] == first and together == [verdict(c) for c in beside]


def test_an_obvious_difference_is_said_and_identical_arms_cannot_be_told_apart():
    rng = np.random.default_rng(4)
    arms = accuracy_arms(rng, [2.0, -2.0])
    assert verdict(Comparison("mc", "acc", arms)).pairs[0].verdict == "a"
    assert verdict(Comparison("mc", "acc", arms[::-1])).pairs[0].verdict == "b"
    twin = Arm("twin", {}, arms[0].seeds)
    [pair] = verdict(Comparison("mc", "acc", [arms[0], twin])).pairs
    assert pair.diff == 0.0 and pair.low < 0 < pair.high and pair.verdict == "indistinguishable"  # seeds drawn apart
    alone, twin = Arm("one", {}, arms[0].seeds[:1]), Arm("twin", {}, arms[0].seeds[:1])
    [pair] = verdict(Comparison("mc", "acc", [alone, twin])).pairs
    assert (pair.diff, pair.low, pair.high, pair.verdict) == (0.0, 0.0, 0.0, "indistinguishable")


def test_lower_is_better_turns_the_words_and_the_ranking():
    arms = accuracy_arms(np.random.default_rng(5), [1.5, 1.4, -1.0])
    higher = verdict(Comparison("mc", "gold_bpb", arms))
    lower = verdict(Comparison("mc", "gold_bpb", arms, lower_is_better=True))
    assert [(p.low, p.high) for p in lower.pairs] == [(p.low, p.high) for p in higher.pairs]
    swap = {"a": "b", "b": "a", "indistinguishable": "indistinguishable"}
    assert [p.verdict for p in lower.pairs] == [swap[p.verdict] for p in higher.pairs]
    assert lower.ranking == higher.ranking[::-1]
    assert higher.ranking[0] == "arm0" and "arm2" not in higher.best_group
    assert lower.ranking[0] == "arm2" and lower.best_group == ["arm2"]


def test_the_group_no_pair_tells_from_the_best():
    arms = accuracy_arms(np.random.default_rng(6), [1.0, 0.98, -1.5])
    v = verdict(Comparison("mc", "acc", arms))
    assert v.ranking[:2] in (["arm0", "arm1"], ["arm1", "arm0"]) and sorted(v.best_group) == ["arm0", "arm1"]
    text = verdict_text.report([v])
    assert f"{v.ranking[0]}*, {v.ranking[1]}*, arm2" in text and "cannot tell" in text


def test_noise_signal_and_their_ratio_from_the_checkpoints_and_seeds():
    arms = accuracy_arms(np.random.default_rng(7), [0.5, 0.0, -0.5], seeds=3, checkpoints=4)
    v = verdict(Comparison("mc", "acc", arms))
    squares, freedom, scores = 0.0, 0, []
    for arm in arms:
        single = [np.asarray(s.values, dtype=float)[k].mean() for s in arm.seeds for k in range(4)]
        squares += float(((np.array(single) - np.mean(single)) ** 2).sum())
        freedom += len(single) - 1
        scores.append(direct_score(arm, "mean"))
    sd = (squares / freedom) ** 0.5
    spread, mean = max(scores) - min(scores), float(np.mean(scores))
    assert v.noise.sd == pytest.approx(sd) and v.noise.noise == pytest.approx(sd / mean)
    assert v.noise.signal == pytest.approx(spread / mean) and v.noise.snr == pytest.approx(spread / sd)
    flat = verdict(Comparison("flat", "acc", [Arm(a.label, {}, a.seeds[:1]) for a in accuracy_arms(
        np.random.default_rng(8), [0.5, 0.0], seeds=1, checkpoints=1)]))  # fmt: skip
    assert flat.noise.snr is None and flat.noise.sd is None
    assert best_snr([flat, v]) is v and best_snr([flat]) is None
    assert "noise: not measured" in verdict_text.report([flat])
    assert "best signal-to-noise: mc acc" in verdict_text.report([flat, v])


def test_items_in_another_order_are_aligned():
    arms = accuracy_arms(np.random.default_rng(9), [0.3, 0.0])
    order = np.random.default_rng(10).permutation(len(ITEMS))
    shuffled = [Seed(s.name, [ITEMS[i] for i in order], np.asarray(s.values)[:, order]) for s in arms[1].seeds]
    again = verdict(Comparison("mc", "acc", [arms[0], Arm("arm1", {}, shuffled, arms[1].steps)]))
    plain = verdict(Comparison("mc", "acc", arms))
    assert [(p.diff, p.low, p.high) for p in again.pairs] == [(p.diff, p.low, p.high) for p in plain.pairs]


def refused(comparison: Comparison, draws: int = 10_000) -> str:
    with pytest.raises(VerdictError) as caught:
        verdict(comparison, draws)
    return str(caught.value)


def test_what_cannot_be_compared_is_refused_with_the_reason():
    arms = accuracy_arms(np.random.default_rng(11), [0.3, 0.0])
    assert "0 arm(s)" in refused(Comparison("mc", "acc", []))
    assert "1 arm(s): a verdict compares two arms or more" in refused(Comparison("mc", "acc", arms[:1]))
    assert "arm(s) arm1 have no evaluated run" in refused(Comparison("mc", "acc", [arms[0], Arm("arm1", {}, [])]))
    assert "arm labels repeat (arm0)" in refused(Comparison("mc", "acc", [arms[0], arms[0]]))
    one = [Arm(a.label, {}, [Seed("1", ITEMS[:1], [[1.0]])]) for a in arms]
    assert "1 item(s): an interval needs two items or more" in refused(Comparison("mc", "acc", one))
    fewer = Arm("arm1", {}, [Seed("3", ITEMS[:150], np.ones((3, 150)))])
    message = refused(Comparison("mc", "acc", [arms[0], fewer]))
    assert "arm arm1 seed 3: its 150 items are not arm arm0 seed 1's 200 (50 missing, 0 others)" in message
    assert "the same task, --eval_limit and data" in message
    other = Arm("arm1", {}, [Seed("1", ITEMS[:199] + ["elsewhere"], np.ones((3, 200)))])
    assert "(1 missing, 1 others)" in refused(Comparison("mc", "acc", [arms[0], other]))
    nan = Arm("arm1", {}, [Seed("1", ITEMS, np.full((3, 200), np.nan))])
    assert "arm arm1 seed 1: a value is not a number" in refused(Comparison("mc", "acc", [arms[0], nan]))
    shape = Arm("arm1", {}, [Seed("1", ITEMS, np.ones((3, 199)))])
    assert "values of shape (3, 199) (float64) for 200 items" in refused(Comparison("mc", "acc", [arms[0], shape]))
    words = Arm("arm1", {}, [Seed("1", ITEMS, [["right"] * 200])])
    assert "values of shape (1, 200) (<U5) for 200 items" in refused(Comparison("mc", "acc", [arms[0], words]))
    assert "needs each item's denominator" in refused(Comparison("ppl", "bits_per_byte", arms, kind="ratio"))
    zero = [Arm(a.label, {}, [Seed("1", ITEMS, np.ones(200), np.zeros(200))]) for a in arms]
    assert "denominator is not a positive number" in refused(Comparison("ppl", "bpb", zero, kind="ratio"))
    assert "a verdict takes 10,000 or more" in refused(Comparison("mc", "acc", arms), draws=999)
    twice = [Arm(a.label, {}, [Seed("1", ["x", "x"], [1.0, 0.0])]) for a in arms]
    assert "an item id appears twice" in refused(Comparison("mc", "acc", twice))


def test_the_json_object_is_issue_52s():
    arms = accuracy_arms(np.random.default_rng(12), [0.3, 0.0])
    out = json.loads(json.dumps(verdict(Comparison("mc", "acc", arms, at={"tokens": 5}), seed=0).to_json()))
    assert set(out) == {"task", "metric", "at", "arms", "pairs", "noise"} and out["at"] == {"tokens": 5}
    assert set(out["arms"][0]) == {"label", "values", "seeds", "steps", "score", "low", "high"}
    assert out["arms"][0]["values"] == {"learning_rate": 0.01} and out["arms"][0]["seeds"] == ["1", "2"]
    assert out["arms"][0]["steps"] == [80, 90, 100]
    assert set(out["pairs"][0]) == {"a", "b", "diff", "low", "high", "verdict"}
    assert set(out["noise"]) == {"mc"} and set(out["noise"]["mc"]) == {"noise", "signal", "snr"}


def test_the_picture_is_drawn(tmp_path: Path):
    arms = accuracy_arms(np.random.default_rng(13), [0.3, 0.0, -0.2])
    v = verdict(Comparison("mc", "acc", arms, at={"tokens": 3000}))
    series = {a.label: [(t * 1000.0, a.score, a.low, a.high) for t in (1, 2, 3)] for a in v.arms}
    png = verdict_text.picture([(v, series)], tmp_path / "verdict.png", at_tokens=3000)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_many_arms_print_the_pairs_with_the_best_and_those_next_in_rank():
    arms = accuracy_arms(np.random.default_rng(14), [0.1 * a for a in range(10)], seeds=1, checkpoints=1)
    v = verdict(Comparison("mc", "acc", arms))
    shown = verdict_text.shown_pairs(v)
    assert len(v.pairs) == 45 and len(shown) == 9 + 8 and "28 more pairs in --json" in verdict_text.report([v])


arms_strategy = st.tuples(
    st.integers(2, 4),  # arms
    st.integers(1, 3),  # seeds
    st.integers(1, 3),  # checkpoints
    st.integers(2, 30),  # items
    st.sampled_from(["mean", "ratio"]),
    st.integers(0, 2**31),
)


@given(arms_strategy)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_words_follow_the_intervals_and_the_scores_the_definition(shape):
    count, seeds, checkpoints, n, kind, entropy = shape
    rng = np.random.default_rng(entropy)
    items = [f"i{j}" for j in range(n)]
    arms = []
    for a in range(count):
        runs = []
        for s in range(seeds):
            values = (
                rng.integers(0, 2, (checkpoints, n)).astype(float) if kind == "mean" else rng.random((checkpoints, n))
            )
            totals = rng.integers(1, 50, (checkpoints, n)) if kind == "ratio" else None
            runs.append(Seed(str(s), items, values, totals))
        arms.append(Arm(f"a{a}", {}, runs))
    lower = bool(entropy % 2)
    v = verdict(Comparison("t", "m", arms, kind=kind, lower_is_better=lower))
    score = {a.label: direct_score(arm, kind) for a, arm in zip(v.arms, arms, strict=True)}
    assert all(a.score == score[a.label] for a in v.arms)
    for p in v.pairs:
        assert p.diff == score[p.a] - score[p.b] and p.low <= p.high
        if p.low <= 0 <= p.high:
            assert p.verdict == "indistinguishable"
        else:
            a_higher = p.low > 0
            assert p.verdict == ("a" if a_higher != lower else "b")
    ranked = [score[label] for label in v.ranking]
    assert ranked == sorted(ranked, reverse=not lower)
    assert v.best_group[0] == v.ranking[0] and set(v.best_group) <= set(v.ranking)
    assert v.over_items_only == (seeds == 1)


def reduced(seed: Seed, kind: str) -> Seed:
    """The seed as a reader of many checkpoints hands it over: one row (the per-item mean, or the sums), and its
    score at each checkpoint."""
    v = np.atleast_2d(np.asarray(seed.values, dtype=np.float64))
    if kind == "mean":
        return Seed(seed.name, seed.items, v.mean(axis=0)[None, :], scores=v.mean(axis=1))
    t = np.atleast_2d(np.asarray(seed.totals, dtype=np.float64))
    return Seed(seed.name, seed.items, v.sum(axis=0)[None, :], t.sum(axis=0)[None, :], scores=v.sum(1) / t.sum(1))


def test_seeds_reduced_over_their_checkpoints_give_the_same_verdict():
    rng = np.random.default_rng(7)
    arms = accuracy_arms(rng, [0.0, 0.2, 0.25], seeds=3, checkpoints=4)
    size = rng.integers(50, 3000, len(ITEMS))

    def ratio_seed(k: int) -> Seed:
        return Seed(str(k), ITEMS, size * rng.lognormal(0, 0.1, (3, len(ITEMS))), np.stack([size] * 3))

    ratio_arms = [Arm(f"r{a}", {"a": a}, [ratio_seed(k) for k in range(2)]) for a in range(2)]
    for kind, these in (("mean", arms), ("ratio", ratio_arms)):
        whole = verdict(Comparison("t", "m", these, kind=kind))  # type: ignore[arg-type]
        less = [Arm(a.label, a.values, [reduced(s, kind) for s in a.seeds], a.steps) for a in these]
        same = verdict(Comparison("t", "m", less, kind=kind))  # type: ignore[arg-type]
        scores = [(a.score, a.low, a.high) for a in whole.arms]
        assert [(a.score, a.low, a.high) for a in same.arms] == pytest.approx(scores, rel=1e-12)
        pairs = [(p.diff, p.low, p.high) for p in whole.pairs]
        assert [(p.diff, p.low, p.high) for p in same.pairs] == pytest.approx(pairs, rel=1e-12)
        assert (same.noise.noise, same.noise.snr) == pytest.approx((whole.noise.noise, whole.noise.snr), rel=1e-9)
    bad = Arm("x", {}, [Seed("1", ITEMS, np.zeros((2, len(ITEMS))), scores=[0.0, 0.0])])
    assert "one row" in refused(Comparison("t", "m", [bad, arms[0]]))
