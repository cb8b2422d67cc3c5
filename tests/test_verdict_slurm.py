"""Issue 52's "Done when" on the local cluster, offline, on CPU: a sweep of 2 learning rates x 2 seeds of the tiny
model, each evaluated at steps 5 and 10 on a multiple-choice task of the test's own (240 items); `jobs verdict
--json`: each pair's difference is an independent computation's from the per-item records and its interval a loop
bootstrap's (within tolerance); the arms ranked; `--at tokens` and `--at gpu_hours` choose the points they say; the
runs of one seed say their interval is over items only; the sweep's end prints the verdict. Then `jobs evaluate` on
a finished point evaluates two kept steps once (a second call submits nothing) and their scores are lm-eval's by
hand on `jobs export` of those steps. One sweep, 10 steps a run: its time is said in docs/performance.md."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_e2e_training import bundles, finish, launch, paced, wait_for
from test_evals_job import RIGHT, SUBJECTS, WRONG, by_hand, write_tasks

from launcher.bundle import manifest
from launcher.evals import record as eval_record
from launcher.ledger.breakdown import hours_at
from launcher.ledger.usage import trained_hours
from launcher.node import job as job_file

pytestmark = pytest.mark.slurm
ITEMS = 240
LRS = ("3e-3", "3e-4")


def write_mc(folder: Path) -> Path:
    """verdict_mc: ITEMS multiple-choice rows (3 choices) over the demo's words, as a task YAML over local JSONL."""
    rng = random.Random(5)
    folder.mkdir(parents=True)
    with open(folder / "mc.jsonl", "w") as f:
        for _ in range(ITEMS):
            choices = [rng.choice(RIGHT), *rng.sample(WRONG, 2)]
            rng.shuffle(choices)
            label = next(i for i, c in enumerate(choices) if c in RIGHT)
            f.write(json.dumps({"query": f"{rng.choice(SUBJECTS)} {rng.choice(RIGHT)} and then", "choices": choices,
                                "label": label}) + "\n")  # fmt: skip
    task = {"task": "verdict_mc", "dataset_path": "json", "test_split": "test", "output_type": "multiple_choice",
            "dataset_kwargs": {"data_files": {"test": str(folder / "mc.jsonl")}}, "doc_to_text": "{{query}}",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}",
            "metric_list": [{"metric": "acc"}]}  # fmt: skip
    (folder / "mc.yaml").write_text(json.dumps(task))
    return folder


def jobs(env: dict, *args: str, code: int = 0) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher.jobs", *args], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout


def acc_rows(bundle: Path, step: int) -> np.ndarray:
    """A run's per-item acc at a step, read from its items file with numpy alone."""
    (result,) = [r for (s, _), r in eval_record.results(bundle).items() if s == step and "verdict_mc" in r["tasks"]]
    with np.load(bundle / result["items"]["file"]) as found:
        return found["verdict_mc|acc"].astype(float)


def test_a_sweep_of_two_learning_rates_by_two_seeds_gets_its_verdict(tmp_path: Path, slurm_env: dict, demo_data):
    flags = (
        "--train_steps",
        "10",
        "--save_interval",
        "5",
        "--sweep",
        f"learning_rate={','.join(LRS)} seed=1,2",
        "--eval_tasks",
        "verdict_mc",
        "--eval_include",
        str(write_mc(tmp_path / "mine")),
        "--eval_every",
        "5",
        "--run_train_script",
        paced(tmp_path, 0.3),
    )  # fmt: skip  (paced: GPU-hours grow with the steps)
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "vd", *flags, nodes="1"), timeout=1500)
    assert code == 0, out
    assert "waiting for the points' eval jobs, for the verdict" in out and "verdict_mc acc at tokens" in out, out
    (sweep,) = [p.parent for p in tmp_path.glob("logs/configs/vd/*/sweep.json")]
    points = {(lr, seed): bundles(tmp_path, f"vd-{i}")[0] for i, (lr, seed) in
              enumerate([(lr, s) for lr in LRS for s in ("1", "2")], start=1)}  # fmt: skip

    got = json.loads(jobs(slurm_env, "verdict", str(sweep), "--task", "verdict_mc", "--json"))
    tokens = {k: manifest.load(b).data["derived"]["global_batch_tokens"] * 10 for k, b in points.items()}
    assert got["at"] == {"tokens": min(tokens.values())} and got["metric"] == "acc"
    assert [a["label"] for a in got["arms"]] == [f"learning_rate={lr}" for lr in LRS]
    assert all(a["seeds"] == ["1", "2"] and a["steps"] == [10] for a in got["arms"])
    per_seed = {k: acc_rows(b, 10) for k, b in points.items()}
    assert all(len(v) == ITEMS for v in per_seed.values())
    score = {lr: np.mean([per_seed[(lr, s)].mean() for s in ("1", "2")]) for lr in LRS}
    (pair,) = got["pairs"]
    assert abs(pair["diff"] - (score[LRS[0]] - score[LRS[1]])) <= 1 / ITEMS  # to one item (here: exactly)
    assert pair["diff"] == pytest.approx(score[LRS[0]] - score[LRS[1]], abs=1e-12)
    rng = np.random.default_rng(7)
    draws = np.empty(3000)
    for b in range(len(draws)):  # the items drawn once for both arms, each arm's seeds redrawn
        idx = rng.integers(0, ITEMS, ITEMS)
        arm = [np.mean([per_seed[(lr, s)][idx].mean() for s in rng.choice(["1", "2"], 2)]) for lr in LRS]
        draws[b] = arm[0] - arm[1]
    low, high = np.percentile(draws, [2.5, 97.5])
    tolerance = 0.1 * (high - low) + 1e-9
    assert abs(pair["low"] - low) <= tolerance and abs(pair["high"] - high) <= tolerance, (pair, low, high)

    text = jobs(slurm_env, "verdict", str(sweep), "--task", "verdict_mc")
    ranked = re.search(r"ranking, best first \(\* no pair tells it from the best\): (.*)", text)
    assert ranked is not None
    order = [label.rstrip("*") for label in ranked.group(1).split(", ")]
    assert order == sorted([f"learning_rate={lr}" for lr in LRS], key=lambda a: -score[a.split("=")[1]])
    assert "95% intervals over seeds and items" in text and (sweep / "verdict.png").is_file()

    # equal GPU-hours: the least every run reached at its last evaluated step (the ledger's trained GPU-hours)
    by_hours = json.loads(jobs(slurm_env, "verdict", str(sweep), "--task", "verdict_mc", "--at", "gpu_hours",
                               "--json"))  # fmt: skip
    curves = {k: trained_hours(manifest.load(b)) for k, b in points.items()}
    reached = {k: hours_at(c, 10) for k, c in curves.items()}
    least = min(h for h in reached.values() if h is not None)
    assert least > 0 and by_hours["at"] == {"gpu_hours": pytest.approx(least, abs=1e-6)}
    for arm, lr in zip(by_hours["arms"], LRS, strict=True):
        expected = sorted({max(s for s in (5, 10) if (hours_at(curves[(lr, seed)], s) or 0) <= least + 1e-6)
                           for seed in ("1", "2")})  # fmt: skip
        assert arm["steps"] == expected, (arm, reached)

    one_seed = jobs(slurm_env, "verdict", str(points[(LRS[0], "1")]), str(points[(LRS[1], "1")]), "--task",
                    "verdict_mc")  # fmt: skip
    assert "95% intervals over items only (one seed per arm)" in one_seed

    # jobs evaluate on a finished point: two kept steps, once, on other tasks
    tasks = write_tasks(tmp_path / "theirs")
    point = points[(LRS[0], "1")]
    asked = ("evaluate", str(point), "--eval_tasks", "evals_mc,evals_ppl", "--eval_include", str(tasks), "--steps",
             "5,10")  # fmt: skip
    first = jobs(slurm_env, *asked)
    assert len(re.findall(r"step (5|10): eval job \d+ submitted", first)) == 2, first
    run = manifest.load(point)

    sweeps_key = job_file.load(point).evals.key  # type: ignore[union-attr]

    def scored() -> dict[int, dict] | None:
        """Step -> jobs evaluate's result (the key that is not the sweep's own), once both have ended."""
        rows = {s: r for (s, k), r in eval_record.results(point).items() if k != sweeps_key}
        ended = sorted(rows) == [5, 10] and all(r["state"] in ("done", "failed") for r in rows.values())
        return rows if ended else None

    rows = wait_for(scored, timeout=600, every=2)
    assert all(r["state"] == "done" for r in rows.values()), rows
    again = jobs(slurm_env, *asked)
    assert not re.search(r"eval job \d+ submitted", again) and again.count("nothing submitted") == 2, again
    assert again.count("(eval job") == 2 and again.count(", done): nothing submitted") == 2, again
    for step in (5, 10):
        hand = by_hand(run, tasks, tmp_path / f"hand-{step}", step=step)
        for task, metrics in rows[step]["tasks"].items():
            for metric, value in metrics.items():
                assert math.isclose(value, hand[task][f"{metric},none"], rel_tol=1e-9), (step, task, metric)
    assert len(eval_record.submissions(run.checkpoints)) == 4  # the sweep's 2 and jobs evaluate's 2
