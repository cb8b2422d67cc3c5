"""nanotron main's own code on CPU (its source vendored in ../shared/vendor, run in a process of its own by
tests/nanotron_main_cpu.py, whose docstring lists what is patched there): its modules import through the
launcher's stand-ins (flash_attn, triton, grouped_gemm), its ParallelContext builds its groups in a one-process
gloo group, and its LlamaForTraining trains forward and backward like the torch engine's Llama."""

from __future__ import annotations

import pytest
from nanotron_main import on_cpu


def test_mains_llama_trains_through_the_stand_in_like_the_torch_engines_llama() -> None:
    """Same weights, same tokens, each RoPE layout (rope_theta 500000): main's loss, logits and every gradient
    equal the torch engine's (launcher/train/llama.py), whose attention, rotary and RMSNorm are its own; in bf16
    (main's dtype, buffers included) the loss is near and the gradients finite."""
    cases = [{"rope_interleaved": False, "dtype": "float32"}, {"rope_interleaved": True, "dtype": "float32"},
             {"rope_interleaved": False, "dtype": "bfloat16"}]  # fmt: skip
    plain, interleaved, bf16 = on_cpu("llamas", cases=cases)
    for seen in (plain, interleaved, bf16):
        assert seen["devices"] == ["cpu"] and seen["backend"] == "gloo" and seen["world"] == [1, 1, 1, 1]
        assert seen["grads_finite"]
    for seen in (plain, interleaved):
        assert seen["loss"] == pytest.approx(seen["reference_loss"], rel=1e-5)
        assert seen["logits"] < 1e-5 and seen["worst_grad"] < 1e-4, seen
        assert seen["grad_dtypes"] == ["torch.float32"]
    assert plain["loss"] != interleaved["loss"], "the two layouts are different models from the same weights"
    assert bf16["grad_dtypes"] == ["torch.bfloat16"]
    assert bf16["loss"] == pytest.approx(bf16["reference_loss"], rel=2e-2) and bf16["worst_grad"] < 0.1
