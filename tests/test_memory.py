"""The per-GPU memory model (launcher.perf.memory) against hand-computed cases and the published figures of
docs/planning.md, whose accuracy table these tests hold to the code."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from launcher.nanotron_config.shape import ModelShape
from launcher.perf.memory import (
    GIB,
    HEADROOM_FRAGMENTATION,
    Layout,
    estimate,
    in_flight,
    layer_activations,
    model_states,
    padded_vocab,
    stage_params,
    stages,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "planning.md"
V = 131072
# nanotron's benchmark shapes (scripts/scaling_benchmarks.py: MHA, tied below 10k intermediate), seq 4096, 1F1B
B1 = ModelShape(2048, 8192, 16, 32, 32, V, 4096, tie_word_embeddings=True)  # 1.34B
B3 = ModelShape(3072, 8192, 28, 32, 32, V, 4096, tie_word_embeddings=True)  # 3.57B
B8 = ModelShape(4096, 14336, 32, 32, 32, V, 4096)  # 8.86B
B80 = ModelShape(8192, 28672, 80, 64, 64, V, 4096)  # 80B
# (label, model, layout, published GiB): nanotron's docs/benchmark_summary.svg (PLANNER.md)
PUBLISHED = [
    ("1.34B dp4 tp1 pp2, mbs 4, ZeRO-1", B1, Layout(4, 1, 2, 4, 16, 1), 41.76),
    ("3.57B dp4 tp1 pp2, mbs 2, ZeRO-1", B3, Layout(4, 1, 2, 2, 32, 1), 56.87),
    ("8.86B dp2 tp1 pp4, mbs 1, ZeRO-1", B8, Layout(2, 1, 4, 1, 128, 1), 63.07),
    ("8.86B dp16 tp1 pp2, mbs 1, ZeRO-1", B8, Layout(16, 1, 2, 1, 16, 1), 61.10),
    ("80B dp1 tp4 pp32, mbs 1, ZeRO-0", B80, Layout(1, 4, 32, 1, 256, 0), 61.18),
]
TINY = ModelShape(
    hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=1000, max_seq_len=128
)


def test_stages_split_by_nanotrons_cost_rule():
    # 1.34B on pp 2: 16 layers of 67.1M cost and a 268.4M head; after 10 layers the running cost equals rank 0's
    # share exactly (not more), so the 11th layer still goes to rank 0
    assert [(s.layers, s.embedding, s.head) for s in stages(B1, 1, 2)] == [(11, True, False), (5, False, True)]
    assert [s.layers for s in stages(B8, 1, 4)] == [9, 9, 8, 6]  # the head weighs on the last stage
    assert [s.layers for s in stages(TINY, 1, 1)] == [2]


def test_stage_parameters_by_hand():
    # TINY, tp 1: a layer = q, k, v, o (64 x 16 x (2x4 + 2x2) = 12288) + MLP (3 x 64 x 256 = 49152) + norms 128
    (stage,) = stages(TINY, 1, 1)
    assert stage_params(TINY, stage, 1) == 2 * (12288 + 49152 + 128) + 2 * 1000 * 64 + 64
    tied = replace(TINY, tie_word_embeddings=True)
    assert stage_params(tied, stage, 1) == 2 * (12288 + 49152 + 128) + 1000 * 64 + 64  # one table on one stage
    first, last = stages(tied, 1, 2)
    assert stage_params(tied, first, 1) == (12288 + 49152 + 128) * first.layers + 1000 * 64  # both end stages
    assert stage_params(tied, last, 1) == (12288 + 49152 + 128) * last.layers + 1000 * 64 + 64  # hold a copy
    assert padded_vocab(1000, 8) == 1000 and padded_vocab(1001, 8) == 1008 and padded_vocab(1000, 3, 64) == 1152


def test_model_states_by_hand():
    # 1000 parameters: bf16 weights 2 B, fp32 gradient buffer 4 B (+ DDP's bf16 buckets 2 B when dp > 1 without
    # ZeRO-1), fp32 master + Adam 12 B (/ dp under ZeRO-1)
    assert model_states(1000, Layout(1, 1, 1, 1, 1)) == {"weights": 2000, "gradients": 4000, "optimizer": 12000}
    assert model_states(1000, Layout(4, 1, 1, 1, 1)) == {"weights": 2000, "gradients": 6000, "optimizer": 12000}
    assert model_states(1000, Layout(4, 1, 1, 1, 1, 1)) == {"weights": 2000, "gradients": 4000, "optimizer": 3000}
    no_accumulator = Layout(4, 1, 1, 1, 1, 1, fp32_grad_accum=False)  # bf16 gradients, bf16 moments, DDP
    assert model_states(1000, no_accumulator) == {"weights": 2000, "gradients": 4000, "optimizer": 1000}


def test_layer_activations_by_hand():
    # TINY, micro batch 2: s x b = 256 tokens, h = 64, GQA 4/2, F = 256; bytes, bf16
    lay = Layout(1, 1, 1, 2, 1)
    norms = 2 * 2 * 256 * 64  # two RMSNorm inputs
    linears = 2 * 2 * 256 * 64  # qkv's and gate_up's inputs
    attention = 2 * 256 * 64 + 2 * 2 * 256 * 64 * 2 // 4 + 2 * 256 * 64 + 4 * 256 * 4  # q, k+v, out, logsumexp
    mlp = 8 * 256 * 256
    assert layer_activations(TINY, lay) == norms + linears + attention + mlp == 757760
    # tp 2 under REDUCE_SCATTER with async communication: everything sharded; ALL_REDUCE keeps norms and inputs whole
    rs = Layout(1, 2, 1, 2, 1)
    ar = Layout(1, 2, 1, 2, 1, tp_mode="ALL_REDUCE", tp_async=False)
    assert layer_activations(TINY, rs) == 757760 // 2
    assert layer_activations(TINY, ar) == 757760 // 2 + (norms + linears) // 2
    mha = replace(TINY, num_kv_heads=4)  # the fused qkv copy stays alive: 5 x s·b·h
    assert layer_activations(mha, lay) - layer_activations(TINY, lay) == 2 * 256 * 64 * 5 - (2 * 256 * 64 * 2)


def test_micro_batches_in_flight():
    one_f_one_b, afab = Layout(1, 1, 4, 1, 8), Layout(1, 1, 4, 1, 8, pp_engine="afab")
    assert [in_flight(one_f_one_b, r) for r in range(4)] == [4, 3, 2, 1]
    assert [in_flight(afab, r) for r in range(4)] == [8] * 4
    assert in_flight(Layout(1, 1, 4, 1, 3), 0) == 3  # never more than there are


def test_the_last_stage_holds_the_logits():
    lay = Layout(1, 1, 1, 2, 8)
    est = estimate(TINY, lay)
    assert est.parts["logits"] == 2 * 4 * 256 * 1000  # fp32 softmax kept, and an fp32 copy while the loss runs
    assert estimate(TINY, Layout(1, 1, 1, 2, 8, pp_engine="afab")).parts["logits"] == 9 * 4 * 256 * 1000


def test_playbook_model_states_of_llama_3_8b():
    # Ultra-Scale Playbook: Llama-3.1-8B weights 14.957 GiB (bf16), Adam's moments 59.83 GiB (8 B a parameter)
    llama = ModelShape(4096, 14336, 32, 32, 8, 128256, 4096)
    (stage,) = stages(llama, 1, 1)
    states = model_states(stage_params(llama, stage, 1), Layout(1, 1, 1, 1, 1))
    assert states["weights"] / GIB == pytest.approx(14.957, abs=0.01)
    assert states["optimizer"] * 8 / 12 / GIB == pytest.approx(59.83, abs=0.05)  # ours adds the fp32 master (4 B)


def _reserved(model: ModelShape, lay: Layout) -> float:
    return estimate(model, lay).peak * (1 + HEADROOM_FRAGMENTATION) / GIB


@pytest.mark.parametrize("label,model,lay,published", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_memory_within_the_documented_error(label: str, model: ModelShape, lay: Layout, published: float):
    est = estimate(model, lay)
    reserved = _reserved(model, lay)
    error = reserved / published - 1
    assert abs(error) <= 0.20
    row = f"| {label} | {est.peak / GIB:.1f} | {reserved:.1f} | {published:.2f} | {error:+.1%} |"
    assert row in DOC.read_text(), f"docs/planning.md's accuracy table lacks: {row}"


def test_most_published_points_within_ten_percent():
    errors = [abs(_reserved(m, lay) / pub - 1) for _, m, lay, pub in PUBLISHED]
    assert sum(e <= 0.10 for e in errors) >= 4


def test_the_issues_examples_do_not_fit_an_h100():
    h100 = 79.6 * GIB
    llama3_8b = ModelShape(4096, 14336, 32, 32, 8, 128256, 4096)
    assert estimate(llama3_8b, Layout(8, 1, 1, 2, 8)).total > h100  # --model_size 8b --nodes 1 --tp 1
    llama32_1b = ModelShape(2048, 8192, 16, 32, 8, 128256, 4096, tie_word_embeddings=True)
    assert estimate(llama32_1b, Layout(16, 1, 1, 64, 8)).total > h100  # --micro_batch_size 64 --max_seq_len 4096
    assert estimate(llama32_1b, Layout(16, 1, 1, 2, 8)).total < h100  # the preset as it is fits
