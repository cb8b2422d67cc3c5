"""`python -m launcher.jobs verdict` on synthetic records written as the eval job writes them (tests/verdict_records.py;
no cluster): the arms and seeds a sweep and bundles make, the point each --at chooses, every refusal (exit code 2,
its reason, no traceback, the records untouched), and the JSON against an independent computation from the per-item
files (numpy's own reader, a bootstrap written here)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from verdict_records import domain_documents, make_run, make_sweep, mc_samples, ppl_samples

from launcher.evals import arms as A
from launcher.evals import decide
from launcher.jobs.command import main

N = 240  # items


def sweep_of(root: Path, last: dict[str, int] | None = None, skill: dict[str, float] | None = None,
             seeds: tuple[str, ...] = ("1", "2"), steps: tuple[int, ...] = (10, 20, 30)) -> Path:  # fmt: skip
    """2 learning rates x `seeds`, each evaluated at `steps` (a run's last step: `last[name]`) on a multiple-choice
    task of N items and a perplexity task of 50 documents."""
    rng = np.random.default_rng(0)
    difficulty = rng.normal(0, 1.2, N)
    size = rng.integers(40, 400, 50)
    points = []
    for lr in ("0.001", "0.003"):
        for seed in seeds:
            name = f"sw-{lr}-{seed}"
            base = (skill or {}).get(lr, 0.6 if lr == "0.003" else 0.0)
            evals = {}
            for step in steps:
                if step > (last or {}).get(name, max(steps)):
                    continue
                p = 1 / (1 + np.exp(-(base + step / 30 + rng.normal(0, 0.1) - difficulty)))
                right = (rng.random(N) < p).astype(int)
                gold = -(2.0 + difficulty - base + rng.normal(0, 0.3, N))
                ll = -size * (1.2 - base / 5) * rng.lognormal(0, 0.05, 50)
                web = size * (1.3 - base / 4) * rng.lognormal(0, 0.05, 50)
                evals[step] = {"mc": mc_samples(right, gold), "ppl": ppl_samples(ll, size),
                               "heldout:web": domain_documents(web, size // 4, size)}  # fmt: skip
            bundle = make_run(root, name, {"learning_rate": float(lr), "seed": int(seed)}, evals)
            points.append((name, {"learning_rate": lr, "seed": seed}, bundle))
    return make_sweep(root, "sw", points)


def verdict(*argv: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(["verdict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def files(root: Path) -> dict[str, str]:
    """Every record's digest: `verdict` changes none."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix != ".png"}  # fmt: skip


def test_a_sweeps_points_that_differ_only_by_seed_are_one_arm(tmp_path: Path):
    sweep = sweep_of(tmp_path)
    arms = A.group(A.from_sweep(sweep))
    assert [a.label for a in arms] == ["learning_rate=0.001", "learning_rate=0.003"]
    found = [[(r.name, r.seed) for r in a.runs] for a in arms]
    assert found == [[("sw-0.001-1", "1"), ("sw-0.001-2", "2")], [("sw-0.003-1", "1"), ("sw-0.003-2", "2")]]
    bundles = [p.bundle for a in arms for p in a.runs]
    by_bundle = A.group(A.from_bundles(bundles))  # the same runs named one by one: their flags tell the arms
    assert [(a.label, len(a.runs)) for a in by_bundle] == [("learning_rate=0.001", 2), ("learning_rate=0.003", 2)]


def test_json_equals_an_independent_computation_from_the_per_item_files(tmp_path: Path, capsys):
    sweep = sweep_of(tmp_path)
    before = files(tmp_path)
    code, out, _ = verdict(str(sweep), "--task", "mc", "--json", "--last_k", "2", capsys=capsys)
    assert code == 0
    got = json.loads(out)
    assert got["task"] == "mc" and got["metric"] == "acc" and got["at"] == {"tokens": 30_000}
    assert [a["label"] for a in got["arms"]] == ["learning_rate=0.001", "learning_rate=0.003"]
    assert all(a["seeds"] == ["1", "2"] and a["steps"] == [20, 30] for a in got["arms"])
    # by hand: each seed's items (numpy's reader), averaged over its last 2 steps, meaned; the arm's mean over seeds
    per_seed = {}
    for lr in ("0.001", "0.003"):
        for seed in ("1", "2"):
            evals = tmp_path / "logs/configs" / f"sw-{lr}-{seed}" / "20261206-000000" / "evals"
            rows = [np.load(evals / f"step-{s}-k0.items.npz")["mc|acc"] for s in (20, 30)]
            per_seed[(lr, seed)] = np.mean(rows, axis=0)
    arm = {lr: np.mean([per_seed[(lr, s)].mean() for s in ("1", "2")]) for lr in ("0.001", "0.003")}
    (pair,) = got["pairs"]
    assert pair["diff"] == pytest.approx(arm["0.001"] - arm["0.003"], abs=1e-12)
    assert abs(pair["diff"]) > 1 / N  # more than one item apart: the comparison can fail
    # a two-level paired bootstrap written here: the items drawn once for both arms, each arm's seeds redrawn
    rng = np.random.default_rng(99)
    draws = np.empty(4000)
    for b in range(len(draws)):
        idx = rng.integers(0, N, N)
        means = {lr: np.mean([per_seed[(lr, s)][idx].mean() for s in rng.choice(["1", "2"], 2)])
                 for lr in ("0.001", "0.003")}  # fmt: skip
        draws[b] = means["0.001"] - means["0.003"]
    low, high = np.percentile(draws, [2.5, 97.5])
    width = high - low
    assert abs(pair["low"] - low) < 0.08 * width and abs(pair["high"] - high) < 0.08 * width, (pair, low, high)
    assert pair["verdict"] == ("b" if high < 0 else "indistinguishable")
    assert set(got["noise"]["mc"]) == {"noise", "signal", "snr"}
    assert files(tmp_path) == before  # nothing in the records changed


def test_the_text_names_the_point_and_the_picture_is_drawn(tmp_path: Path, capsys):
    sweep = sweep_of(tmp_path)
    code, out, _ = verdict(str(sweep), "--task", "mc:gold_bpb", "--task", "ppl", capsys=capsys)
    assert code == 0, out
    assert out.startswith("Compared at tokens 30,000: the most tokens every run reached at an evaluated step")
    assert "mc gold_bpb at tokens 30,000: 2 arms, 2 seeds each, 240 items; lower is better" in out
    assert "ppl bits_per_byte at tokens 30,000: 2 arms, 2 seeds each, 50 items; lower is better" in out
    assert "best signal-to-noise:" in out and (sweep / "verdict.png").stat().st_size > 10_000
    code, out, _ = verdict(str(sweep), "--task", "mc", "--task", "ppl", "--json", capsys=capsys)
    assert [v["task"] for v in json.loads(out)] == ["mc", "ppl"]  # several --task: a list


def test_each_at_chooses_the_point_it_says(tmp_path: Path, capsys):
    sweep = sweep_of(tmp_path, last={"sw-0.003-2": 20}, steps=(10, 20, 30, 40))  # one run stopped at step 20
    arms = A.group(A.from_sweep(sweep))
    found = A.series(arms, "mc")
    point = A.choose("tokens", found)
    assert point.value == 20_000 and {r.name: [e.step for e in s][-1] for r, s in point.steps.items()} == {
        "sw-0.001-1": 20, "sw-0.001-2": 20, "sw-0.003-1": 20, "sw-0.003-2": 20}  # fmt: skip
    last = A.choose("last", found)
    assert {r.name: s[-1].step for r, s in last.steps.items()}["sw-0.003-2"] == 20 and "not equal compute" in last.said
    assert {r.name: s[-1].step for r, s in A.choose("step", found, 10).steps.items()} == dict.fromkeys(
        ["sw-0.001-1", "sw-0.001-2", "sw-0.003-1", "sw-0.003-2"], 10)  # fmt: skip
    # GPU-hours: learning rate 0.003's runs cost twice as much a step; run sw-0.003-2 reached 20 steps = 40 h
    hours = lambda run: lambda step: step * (2.0 if "0.003" in run.name else 1.0)  # noqa: E731
    by_hours = A.choose("gpu_hours", found, hours_of=hours)
    assert by_hours.value == 40.0 and "gpu_hours 40" in by_hours.said
    assert {r.name: s[-1].step for r, s in by_hours.steps.items()} == {
        "sw-0.001-1": 40, "sw-0.001-2": 40, "sw-0.003-1": 20, "sw-0.003-2": 20}  # fmt: skip
    code, out, err = verdict(str(sweep), "--task", "mc", "--at", "step", "30", capsys=capsys)
    assert code == 2 and "--at step 30: not evaluated in sw-0.003-2 (evaluated at 10, 20)" in err
    code, out, _ = verdict(str(sweep), "--task", "mc", "--at", "last", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["at"] == "last"


def test_one_seed_a_sweep_says_its_interval_is_over_items_only(tmp_path: Path, capsys):
    sweep = sweep_of(tmp_path, seeds=("1",))
    code, out, _ = verdict(str(sweep), "--task", "mc", capsys=capsys)
    assert code == 0 and "95% intervals over items only (one seed per arm)" in out


def refused(capsys, *argv: str) -> str:
    code, out, err = verdict(*argv, capsys=capsys)
    assert code == 2 and "Traceback" not in out + err and err.startswith("error: "), (code, out, err)
    return err


def test_what_cannot_be_compared_is_refused_with_its_reason(tmp_path: Path, capsys):
    sweep = sweep_of(tmp_path / "s")
    before = files(tmp_path)
    assert "has no per-item nosuch: its metrics are acc, gold_bpb" in refused(capsys, str(sweep), "--task", "mc:nosuch")
    assert "no evaluated step holds other" in refused(capsys, str(sweep), "--task", "other")
    one = str(tmp_path / "s/logs/configs/sw-0.001-1/20261206-000000")
    assert "one run (sw-0.001-1): a verdict compares two arms or more" in refused(capsys, one, "--task", "mc")
    twin = str(tmp_path / "s/logs/configs/sw-0.001-2/20261206-000000")
    assert "differ only by seed: one arm" in refused(capsys, one, twin, "--task", "mc")
    assert "--at soon: tokens, gpu_hours, step N or last" in refused(capsys, str(sweep), "--task", "mc", "--at", "soon")
    assert files(tmp_path) == before

    r = tmp_path / "r"  # runs that cannot be compared: no evals, one item, other limits, sizes and items
    rows = lambda n, docs=None: {10: {"mc": mc_samples([1, 0] * (n // 2) + [1] * (n % 2), [-1.0] * n, docs)}}  # noqa: E731
    a = make_run(r, "a", {"learning_rate": 0.1}, rows(40))
    none = make_run(r, "none", {"learning_rate": 0.2}, {})
    assert "no evals to compare in none (no evaluated step holds mc)" in refused(capsys, str(a), str(none), "--task",
                                                                                  "mc")  # fmt: skip
    single = [make_run(r, f"one{i}", {"learning_rate": i}, rows(1)) for i in (1, 2)]
    assert "1 item(s): an interval needs two items or more" in refused(capsys, *map(str, single), "--task", "mc")
    limited = make_run(r, "limited", {"learning_rate": 0.3}, rows(40), limit=40)
    assert "other --eval_limit (a: all, limited: 40)" in refused(capsys, str(a), str(limited), "--task", "mc")
    smaller = make_run(r, "smaller", {"learning_rate": 0.4}, rows(30))
    assert "data of different sizes" in refused(capsys, str(a), str(smaller), "--task", "mc")
    other = make_run(r, "other", {"learning_rate": 0.5}, rows(40, docs=list(range(100, 140))))
    assert "are not" in refused(capsys, str(a), str(other), "--task", "mc")


def test_rank_by_a_sweep_with_seeds_is_the_verdicts_ranking(tmp_path: Path):
    sweep = sweep_of(tmp_path, skill={"0.001": 0.0, "0.003": 1.5})
    lines = decide.ranking_lines([], "mc", lambda p, b: ["fallback"], sweep)
    assert lines[0].startswith("Ranked by mc acc, by the lower bound of each arm's 95% interval")
    assert lines[1].split()[:2] == ["1.", "learning_rate=0.003"] and "*" in lines[1] and "*" not in lines[2]
    assert decide.ranking_lines([], "mc", lambda p, b: ["fallback"], sweep_of(tmp_path / "one", seeds=("1",))) == [
        "fallback"]  # fmt: skip


def test_jobs_evals_ranks_a_sweep_with_seeds_by_the_verdict_and_the_sweeps_end_prints_it(tmp_path: Path, capsys):
    from launcher.runs import sweep as sweep_run

    sweep = sweep_of(tmp_path, skill={"0.001": 0.0, "0.003": 1.5})
    assert main(["evals", str(sweep), "--rank_by", "mc"]) == 0
    out = capsys.readouterr().out
    assert "Ranked by mc acc, by the lower bound of each arm's 95% interval" in out
    assert "Ranked by mc acc, by the lower bound" in sweep_run.results(sweep, {}, plot=False, rank_by="mc")
    lines = decide.sweep_lines(sweep, ["mc", "nosuch"])
    assert lines[1].startswith("Compared at tokens 30,000") and "mc acc at tokens 30,000: 2 arms" in "\n".join(lines)
    assert any(line.startswith("No verdict on nosuch: nosuch: no evals to compare") for line in lines)


def test_the_launch_and_the_jobs_command_import_no_numpy_until_a_verdict_is_asked():
    import os
    import subprocess
    import sys

    from launcher_helpers import ROOT

    code = "import sys, launcher.runs.launch, launcher.jobs.command\n"
    code += "print(sorted({'numpy', 'matplotlib'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert done.stdout.strip() == "[]"


def test_a_held_out_domain_is_judged_over_its_documents(tmp_path: Path, capsys):
    """`--task heldout:NAME`: bits per byte (the default) and loss are ratios over the domain's documents: the
    score is summed NLL bits over summed bytes (tokens), the interval over documents."""
    sweep = sweep_of(tmp_path)
    code, out, _ = verdict(str(sweep), "--task", "heldout:web", "--task", "heldout:web:loss", "--json", capsys=capsys)
    assert code == 0
    bpb, loss = json.loads(out)
    assert (bpb["metric"], loss["metric"]) == ("bits_per_byte", "loss")
    sums = {}
    for lr in ("0.001", "0.003"):
        scores = []
        for seed in ("1", "2"):
            with np.load(tmp_path / f"logs/configs/sw-{lr}-{seed}/20261206-000000/evals/step-30-k0.items.npz") as f:
                scores.append(-f["heldout:web|ll"].sum() / np.log(2) / f["heldout:web|bytes"].sum())
        sums[lr] = np.mean(scores)
    (pair,) = bpb["pairs"]
    assert pair["diff"] == pytest.approx(sums["0.001"] - sums["0.003"], rel=1e-9)
    assert pair["verdict"] == "b" and bpb["arms"][0]["score"] > bpb["arms"][1]["score"]  # lower is better
