"""The flash_attn stand-in against plain-torch references written here (float64 math, written from flash-attn's
documented semantics), in float32 and bfloat16, full-length and ragged, GQA, forward and gradients."""

from __future__ import annotations

import inspect
import sys
from itertools import pairwise

import pytest
import torch

from launcher.train.nanotron_engine import flash_attn_compat
from launcher.train.nanotron_engine.flash_attn_compat.attention import flash_attn_varlen_func, flash_attn_with_kvcache
from launcher.train.nanotron_engine.flash_attn_compat.layer_norm import layer_norm_fn
from launcher.train.nanotron_engine.flash_attn_compat.rotary import RotaryEmbedding

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).requires_grad_()


def reference_attention(q, k, v, offsets_q, offsets_k, causal, scale=None):  # type: ignore[no-untyped-def]
    """Sequence by sequence, head by head, in float64: softmax(q k^T * scale + mask) v; causal aligned to the
    bottom right; query head h reads key/value head h // (heads_q / heads_k); a query that sees no key gets 0."""
    group = q.shape[1] // k.shape[1]
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for a, b, c, d in zip(offsets_q[:-1], offsets_q[1:], offsets_k[:-1], offsets_k[1:], strict=True):
        for h in range(q.shape[1]):
            qs, ks, vs = q[a:b, h].double(), k[c:d, h // group].double(), v[c:d, h // group].double()
            scores = qs @ ks.T * scale
            if causal:
                i = torch.arange(b - a)[:, None]
                j = torch.arange(d - c)[None, :]
                scores = scores.masked_fill(j > i + (d - c) - (b - a), float("-inf"))
            weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without a key: all -inf -> 0
            out[a:b, h] = weights @ vs
    return out


CASES = {
    "full, MHA": ([0, 8, 16, 24], [0, 8, 16, 24], 4, 4),
    "full, GQA 4/2": ([0, 8, 16], [0, 8, 16], 4, 2),
    "ragged, GQA 6/2": ([0, 3, 10, 11, 16], [0, 3, 10, 11, 16], 6, 2),
    "ragged, k longer than q": ([0, 2, 5], [0, 6, 9], 4, 1),
    "ragged, q longer than k": ([0, 5, 7], [0, 3, 7], 2, 2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", list(CASES))
def test_varlen_attention_and_its_gradients_match_the_reference(case: str, causal: bool, dtype: torch.dtype) -> None:
    offsets_q, offsets_k, heads_q, heads_k = CASES[case]
    q = rand(offsets_q[-1], heads_q, 16, dtype=dtype, seed=1)
    k = rand(offsets_k[-1], heads_k, 16, dtype=dtype, seed=2)
    v = rand(offsets_k[-1], heads_k, 8, dtype=dtype, seed=3)
    cu_q, cu_k = torch.tensor(offsets_q, dtype=torch.int32), torch.tensor(offsets_k, dtype=torch.int32)
    max_q = max(b - a for a, b in pairwise(offsets_q))
    max_k = max(b - a for a, b in pairwise(offsets_k))

    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal)
    ref = reference_attention(q, k, v, offsets_q, offsets_k, causal)
    assert out.shape == (q.shape[0], heads_q, 8) and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])

    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(
        reference_attention(q64, k64, v64, offsets_q, offsets_k, causal), (q64, k64, v64), grad.double()
    )
    for name, g, w in zip("qkv", got, want, strict=True):
        assert g.dtype == dtype, name
        torch.testing.assert_close(g.double(), w, **TOL[dtype], msg=lambda m, n=name: f"d{n}: {m}")


def test_uniform_batches_take_one_call_and_ragged_ones_stay_apart() -> None:
    """A full-length batch is one SDPA call; packing two sequences as one would let them see each other."""
    q, k, v = (rand(12, 2, 8, dtype=torch.float32, seed=s) for s in (5, 6, 7))
    as_one = flash_attn_varlen_func(q, k, v, torch.tensor([0, 12]), torch.tensor([0, 12]), 12, 12, causal=True)
    apart = flash_attn_varlen_func(q, k, v, torch.tensor([0, 6, 12]), torch.tensor([0, 6, 12]), 6, 6, causal=True)
    assert torch.allclose(as_one[:6], apart[:6]) and not torch.allclose(as_one[6:], apart[6:])
    torch.testing.assert_close(
        apart.double(), reference_attention(q, k, v, [0, 6, 12], [0, 6, 12], True), **TOL[torch.float32]
    )


def test_softmax_scale_and_rows_past_the_last_sequence() -> None:
    q, k, v = (rand(10, 2, 8, dtype=torch.float32, seed=s) for s in (8, 9, 10))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)  # rows 7..9 belong to no sequence
    out = flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, softmax_scale=0.3, causal=True)
    torch.testing.assert_close(
        out[:7].double(), reference_attention(q, k, v, [0, 3, 7], [0, 3, 7], True, 0.3)[:7], **TOL[torch.float32]
    )
    assert torch.equal(out[7:], torch.zeros(3, 2, 8))


def test_what_training_never_asks_for_is_refused_clearly() -> None:
    q = torch.zeros(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    for options in ({"dropout_p": 0.1}, {"window_size": (3, 0)}, {"softcap": 1.0}, {"return_attn_probs": True}):
        with pytest.raises(NotImplementedError, match="implements only what nanotron's training calls"):
            flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, **options)
    with pytest.raises(NotImplementedError, match="flash_attn_with_kvcache"):
        flash_attn_with_kvcache(q, q, q)
    with pytest.raises(NotImplementedError, match="packed qkv"):
        RotaryEmbedding(8)(torch.zeros(1, 4, 3, 2, 8))
    with pytest.raises(NotImplementedError, match="XPos"):
        RotaryEmbedding(8, scale_base=512)
    with pytest.raises(NotImplementedError, match="LayerNorm"):
        layer_norm_fn(q, torch.ones(8), None)
    with pytest.raises(NotImplementedError, match="residual"):
        layer_norm_fn(q, torch.ones(8), None, residual=q, is_rms_norm=True)
    with pytest.raises(ValueError, match="not a multiple"):
        flash_attn_varlen_func(torch.zeros(4, 3, 8), q, q, cu, cu, 4, 4)


def reference_rotary(
    x: torch.Tensor, base: float, interleaved: bool, offset: int = 0, tables: torch.dtype | None = None
) -> torch.Tensor:
    """Rotate each pair of channels by position * base^(-2i/d), with cos/sin rounded to `tables` (default: x's
    dtype), in float64; the pairs are (2i, 2i+1) when interleaved (GPT-J), else (i, i + d/2) (GPT-NeoX)."""
    d, tables = x.shape[-1], tables or x.dtype
    positions = torch.arange(offset, offset + x.shape[1], dtype=torch.float64)
    angles = positions[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos = angles.cos().to(tables).double()[None, :, None, :]
    sin = angles.sin().to(tables).double()[None, :, None, :]
    x = x.double()
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., : d // 2], x[..., d // 2 :])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.stack((ra, rb), dim=-1).flatten(-2) if interleaved else torch.cat((ra, rb), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["gptj", "neox"])
def test_rotary_rotates_q_and_k_never_v(interleaved: bool, dtype: torch.dtype) -> None:
    q, kv = rand(2, 7, 4, 16, dtype=dtype, seed=11), rand(2, 7, 2, 2, 16, dtype=dtype, seed=12)
    rotary = RotaryEmbedding(dim=16, interleaved=interleaved)
    q_out, kv_out = rotary(q, kv=kv)
    assert q_out.dtype == kv_out.dtype == dtype and kv_out.shape == kv.shape
    torch.testing.assert_close(q_out.double(), reference_rotary(q, 10000.0, interleaved), **TOL[dtype])
    torch.testing.assert_close(
        kv_out[:, :, 0].double(), reference_rotary(kv[:, :, 0], 10000.0, interleaved), **TOL[dtype]
    )
    assert torch.equal(kv_out[:, :, 1], kv[:, :, 1])  # v is never rotated

    # a rotation is orthogonal: the gradient is the upstream gradient rotated back
    g_q, g_kv = torch.randn(q.shape).to(dtype), torch.randn(kv.shape).to(dtype)
    d_q, d_kv = torch.autograd.grad((q_out, kv_out), (q, kv), (g_q, g_kv))
    q64, kv64 = q.detach().double().requires_grad_(), kv.detach().double().requires_grad_()
    ref_q = reference_rotary(q64, 10000.0, interleaved, tables=dtype)
    ref_k = reference_rotary(kv64[:, :, 0], 10000.0, interleaved, tables=dtype)
    want_q, want_k = torch.autograd.grad((ref_q, ref_k), (q64, kv64), (g_q.double(), g_kv[:, :, 0].double()))
    torch.testing.assert_close(d_q.double(), want_q, **TOL[dtype])
    torch.testing.assert_close(d_kv[:, :, 0].double(), want_k[:, :, 0], **TOL[dtype])
    assert torch.equal(d_kv[:, :, 1], g_kv[:, :, 1])


def test_rotary_tables_are_float32_math_even_in_a_bf16_model() -> None:
    """nanotron builds its model in bf16, buffers included: the angles must still be float32 math."""
    rotary = RotaryEmbedding(dim=8, interleaved=True).to(torch.bfloat16)
    x = torch.randn(1, 300, 1, 8).to(torch.bfloat16)
    q, _ = rotary(x, kv=torch.zeros(1, 300, 2, 1, 8, dtype=torch.bfloat16))
    torch.testing.assert_close(q.double(), reference_rotary(x, 10000.0, True), **TOL[torch.bfloat16])
    q_off, _ = rotary(x[:, :5], kv=torch.zeros(1, 5, 2, 1, 8, dtype=torch.bfloat16), seqlen_offset=100)
    torch.testing.assert_close(
        q_off.double(), reference_rotary(x[:, :5], 10000.0, True, offset=100), **TOL[torch.bfloat16]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_in_float32_returned_in_the_input_dtype(dtype: torch.dtype) -> None:
    x, w = rand(3, 5, 32, dtype=dtype, seed=13), rand(32, dtype=dtype, seed=14)
    y = layer_norm_fn(x, w, None, residual=None, eps=1e-5, dropout_p=0.0, prenorm=False, residual_in_fp32=False,
                      is_rms_norm=True, return_dropout_mask=False)  # fmt: skip  # nanotron's TritonRMSNorm call

    def reference(x64: torch.Tensor, w64: torch.Tensor) -> torch.Tensor:
        return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64

    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = reference(x64, w64)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])
    g = torch.randn(y.shape).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    want_x, want_w = torch.autograd.grad(ref, (x64, w64), g.double())
    assert dx.dtype == dw.dtype == dtype
    torch.testing.assert_close(dx.double(), want_x, **TOL[dtype])
    torch.testing.assert_close(
        dw.double(), want_w, rtol=TOL[dtype]["rtol"], atol=0.1 if dtype == torch.bfloat16 else 1e-5
    )


def test_installed_as_flash_attn_for_nanotrons_imports(
    restore_flash_attn: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert flash_attn_compat.install(is_main=True), "a real flash_attn is importable here"
    assert capsys.readouterr().out == "flash_attn not found: attention through torch SDPA\n"
    assert flash_attn_compat.install(is_main=True) and capsys.readouterr().out == ""  # once
    from flash_attn import bert_padding
    from flash_attn.flash_attn_interface import flash_attn_varlen_func as imported
    from flash_attn.layers.rotary import RotaryEmbedding as ImportedRotary
    from flash_attn.ops.triton.layer_norm import layer_norm_fn as imported_norm

    assert (imported, ImportedRotary, imported_norm) == (flash_attn_varlen_func, RotaryEmbedding, layer_norm_fn)
    with pytest.raises(NotImplementedError, match="inference only"):
        bert_padding.unpad_input(torch.zeros(1), torch.ones(1))
    # what nanotron's starcoder2.py inspects at import, and what transformers' availability check reads
    assert "window_size" in inspect.signature(imported).parameters
    import importlib.util

    assert importlib.util.find_spec("flash_attn") is not None
    from transformers.utils import is_flash_attn_2_available

    is_flash_attn_2_available.cache_clear()
    assert not is_flash_attn_2_available()  # no flash-attn distribution: transformers is not misled


def test_rms_norm_keeps_no_float32_copy_of_its_input_for_backward() -> None:
    """As flash-attn's kernel: x in its own dtype, the weight and one float32 rstd per row; a float32 copy of a bf16
    activation per norm would add gigabytes to a 1b model at sequence 4096."""
    x, w = rand(4, 6, 32, dtype=torch.bfloat16, seed=15), rand(32, dtype=torch.bfloat16, seed=16)
    saved: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer_norm_fn(x, w, None, eps=1e-5, is_rms_norm=True)
    assert sorted(saved, key=str) == sorted(
        [(torch.bfloat16, (4, 6, 32)), (torch.bfloat16, (32,)), (torch.float32, (4, 6, 1))], key=str
    )


def test_kv_packed_varlen_attention_is_varlen_attention_of_k_and_v(restore_flash_attn: None) -> None:
    """nanotron main's Qwen2 imports `flash_attn.modules.mha.flash_attn_varlen_kvpacked_func`: kv (total, 2, h, d)."""
    flash_attn_compat.install(is_main=False)
    from flash_attn.modules.mha import flash_attn_varlen_kvpacked_func

    offsets = [0, 3, 10, 11, 16]
    q, k, v = rand(16, 6, 8, dtype=torch.float32, seed=1), rand(16, 2, 8, dtype=torch.float32, seed=2), rand(
        16, 2, 8, dtype=torch.float32, seed=3)  # fmt: skip
    cu = torch.tensor(offsets, dtype=torch.int32)
    packed = flash_attn_varlen_kvpacked_func(q, torch.stack((k, v), dim=1), cu, cu, 7, 7, causal=True)
    expected = reference_attention(q, k, v, offsets, offsets, causal=True)
    torch.testing.assert_close(packed.double(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="kv must be"):
        flash_attn_varlen_kvpacked_func(q, k, cu, cu, 7, 7)


def test_grouped_gemm_and_triton_stand_ins_import_and_triton_leaves_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """nanotron main's trainer imports grouped_gemm.ops (its MoE layers) and Triton kernels at module level: both
    import through the stand-ins and raise when called; the triton stand-in then leaves sys.modules (torch takes
    an importable triton for the real one), and what imported it keeps its placeholders."""
    import importlib.util

    from launcher.train.nanotron_engine import triton_compat

    real_triton = importlib.util.find_spec("triton") is not None
    for name in [n for n in sys.modules if n.split(".")[0] in ("triton", "grouped_gemm")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)  # unimportable here, whatever this machine has
    monkeypatch.setitem(sys.modules, "grouped_gemm", None)
    monkeypatch.setitem(sys.modules, "grouped_gemm.ops", None)
    assert triton_compat.install() and triton_compat.install_grouped_gemm()
    import grouped_gemm.ops as ops
    import triton
    import triton.language as tl

    with pytest.raises(NotImplementedError, match=r"grouped_gemm\.ops\.gmm: .*a dense model never calls it"):
        ops.gmm(torch.zeros(1), torch.zeros(1), torch.zeros(1))

    @triton.jit
    def kernel(x: tl.constexpr) -> None: ...

    with pytest.raises(NotImplementedError, match="Triton kernel kernel"):
        kernel[(1,)](1)
    triton_compat.uninstall()
    assert not [n for n in sys.modules if n.split(".")[0] == "triton" and sys.modules[n] is not None]
    from torch.utils._triton import has_triton_package

    assert has_triton_package() == real_triton, "torch sees the real triton, or none"
    assert sys.modules["grouped_gemm.ops"] is ops, "grouped_gemm stays: nothing mistakes it"
