"""The planner (launcher.perf.planner) and `--plan`: every layout it offers is one nanotron accepts, those that fit
come first and fastest first, its step-time model against published runs (docs/planning.md's table), golden
outputs of `--plan`, and a `--plan` that writes nothing and imports no torch."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from launcher_helpers import run_launcher
from test_dry_run import HEAVY
from test_memory import B1, B3, B8, B80, DOC, V

from launcher.nanotron_config import gpus
from launcher.nanotron_config.parallel import ParallelDims, check_layout
from launcher.nanotron_config.shape import ModelShape
from launcher.perf.memory import Layout
from launcher.perf.planner import evaluate, search
from launcher.runs import launch

GOLDEN = Path(__file__).parent / "golden"
H100 = gpus.table()["h100"]
LLAMA_70B = ModelShape(8192, 28672, 80, 64, 8, 128256, 4096)
# (label, model, layout, published MFU %): nanotron's docs/benchmark_summary.svg (PLANNER.md)
PUBLISHED_MFU = [
    ("1.34B dp4 tp1 pp2, mbs 4", B1, Layout(4, 1, 2, 4, 16, 1), 44.32),
    ("3.57B dp4 tp1 pp2, mbs 2", B3, Layout(4, 1, 2, 2, 32, 1), 46.68),
    ("8.86B dp2 tp1 pp4, mbs 1", B8, Layout(2, 1, 4, 1, 128, 1), 45.22),
    ("8.86B dp16 tp1 pp2, mbs 1", B8, Layout(16, 1, 2, 1, 16, 1), 43.31),
    ("80B dp1 tp4 pp32, mbs 1", B80, Layout(1, 4, 32, 1, 256, 0), 34.29),
]
# Ultra-Scale Playbook: a 3B (28 layers, hidden 3072, 32 heads MHA) at seq 4096, dp 1, one micro-batch a step,
# tensor parallel with sequence parallelism: (tp, micro batch, tokens/s/GPU)
PLAYBOOK_TP = [(2, 3, 14167), (4, 9, 13460), (8, 18, 10889), (16, 40, 6159), (32, 90, 3610)]


def test_every_offered_layout_is_one_nanotron_accepts():
    model = ModelShape(1024, 4096, 24, 16, 4, 32000, 2048, tie_word_embeddings=True)
    plans = search(model, 32, 8, 256, H100, {}, Layout(1, 1, 1, 1, 1))
    assert plans
    for plan in plans:
        lay = plan.layout
        assert lay.dp * lay.tp * lay.pp == 32 and lay.dp * lay.micro_batch * lay.grad_accum == 256
        found = check_layout(model, ParallelDims(32, lay.dp, lay.tp, lay.pp, lay.grad_accum))
        assert found == []
        assert plan.fits == (plan.memory.total <= H100.memory_bytes)
    fitting = [p for p in plans if p.fits]
    assert plans[: len(fitting)] == fitting  # those that fit come first
    assert [p.step_s for p in fitting] == sorted(p.step_s for p in fitting)


def test_typed_flags_are_kept():
    plans = search(LLAMA_70B, 128, 8, 64, H100, {"tp": 8, "zero_stage": 1}, Layout(1, 1, 1, 1, 1))
    assert plans and all(p.layout.tp == 8 and p.layout.zero_stage == 1 for p in plans)


def test_the_full_search_of_1024_nodes_is_quick():
    start = time.perf_counter()
    plans = search(LLAMA_70B, 8192, 8, 4096, H100, {}, Layout(1, 1, 1, 1, 1))
    took = time.perf_counter() - start
    assert plans and plans[0].fits
    assert took < 3.0  # bench/bench_plan.py measures it (well under 1 s); this only catches a blow-up


@pytest.mark.parametrize("label,model,lay,published", PUBLISHED_MFU, ids=[p[0] for p in PUBLISHED_MFU])
def test_published_mfu_within_the_documented_error(label: str, model: ModelShape, lay: Layout, published: float):
    mfu = evaluate(model, lay, H100, 8).mfu * 100
    error = mfu / published - 1
    assert abs(error) <= 0.15
    row = f"| {label} | {mfu:.1f}% | {published:.2f}% | {error:+.1%} |"
    assert row in DOC.read_text(), f"docs/planning.md's step-time table lacks: {row}"


@pytest.mark.parametrize("tp,micro,published", PLAYBOOK_TP)
def test_playbook_tp_scaling_within_the_documented_error(tp: int, micro: int, published: int):
    model = ModelShape(3072, 8192, 28, 32, 32, V, 4096, tie_word_embeddings=True)
    plan = evaluate(model, Layout(1, tp, 1, micro, 1), H100, 8)
    tokens = micro * 4096 / plan.step_s / tp
    error = tokens / published - 1
    assert abs(error) <= 0.20
    row = f"| 3.57B tp{tp}, mbs {micro} | {tokens:,.0f} | {published:,} | {error:+.1%} |"
    assert row in DOC.read_text(), f"docs/planning.md's step-time table lacks: {row}"


PLAN_CASES = {
    "8b-4nodes": ["--model_size", "8b", "--nodes", "4"],
    "70b-16nodes": ["--model_size", "70b", "--nodes", "16"],
    "1b-1node-tp1": ["--model_size", "1b", "--nodes", "1", "--tp", "1", "--micro_batch_size", "4"],
}


@pytest.mark.parametrize("case", PLAN_CASES)
def test_plan_output_golden(case: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = launch.main(["--run_name", "p", *PLAN_CASES[case], "--gpu_type", "h100", "--plan"])
    text = capsys.readouterr().out
    assert code == 0 and not list(tmp_path.iterdir())  # nothing written
    path = GOLDEN / f"plan-{case}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; review and run UPDATE_GOLDEN=1 pytest {__file__}"


def test_plan_keeps_what_you_typed_and_marks_your_layout(capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    launch.main(["--run_name", "p", "--model_size", "1b", "--nodes", "1", "--tp", "1", "--plan", "--dry_run"])
    text = capsys.readouterr().out
    assert "Kept as you typed: --tp 1" in text and "<- yours" in text
    assert "H100 80GB SXM, 79.6 GiB (the default" in text  # a dry run asks the cluster nothing


def test_plan_writes_nothing_and_imports_no_torch(tmp_path: Path):
    out = run_launcher("--run_name", "x", "--model_size", "8b", "--nodes", "4", "--plan", "--dry_run",
                       cwd=tmp_path, block=HEAVY)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Best: tp" in out.stdout and "Nothing was written or submitted." in out.stdout
    assert list(tmp_path.iterdir()) == []
