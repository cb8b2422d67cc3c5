"""FlashAttention 4 behind the stand-in (launcher/train/nanotron_engine/flash_attn_compat/fa4.py), on a CPU: a
package laid out as flash-attn-4 installs it (`flash_attn/cute/` alone, no `flash_attn/__init__.py`) must not pass
for the real flash_attn 2, must stay importable beside the stand-in, and must be called as FA4 takes its arguments
(qv 4th, the lengths by keyword, int32 offsets, Python ints, `(out, lse)` back). The kernels themselves run on a
Hopper GPU only: bench/gpu_session.py measures them there (docs/nanotron-gpu.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from launcher.train.nanotron_engine import flash_attn_compat
from launcher.train.nanotron_engine.flash_attn_compat import attention, fa4

# FA4's signature, as flash-attn-4 4.0.0b36's flash_attn/cute/interface.py declares it (the parameters a call
# from here may name), and a body that records the call and answers as FA4 does
FAKE_FA4 = """
import torch
from launcher.train.nanotron_engine.flash_attn_compat.attention import attend

calls = []


def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None, *,
                           softmax_scale=None, causal=False, deterministic=False, **rest):
    calls.append(dict(qv=qv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                      deterministic=deterministic, rest=rest))
    batch = cu_seqlens_q.shape[0] - 1
    out = attend(q.view(batch, max_seqlen_q, *q.shape[1:]), k.view(batch, max_seqlen_k, *k.shape[1:]),
                 v.view(batch, max_seqlen_k, *v.shape[1:]), causal, softmax_scale).reshape(q.shape)
    return out, torch.zeros(q.shape[1], q.shape[0])
"""


@pytest.fixture
def fa4_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_flash_attn: None) -> Path:
    """A site folder holding `flash_attn/cute/__init__.py` (FA4's layout) first on sys.path; FA4 unloaded after."""
    cute = tmp_path / "site" / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text(FAKE_FA4)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(fa4, "_varlen", None)
    return cute


def test_flash_attn_4_alone_is_not_taken_for_flash_attn_2(
    fa4_installed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import flash_attn  # a namespace package: this import succeeds, which is why the check asks for more

    assert not hasattr(flash_attn, "__file__") or flash_attn.__file__ is None
    assert flash_attn_compat.real_flash_attn_error() is not None
    assert flash_attn_compat.install(is_main=True)
    said = capsys.readouterr().out
    assert "flash_attn not found: attention through torch SDPA" in said
    assert "flash-attn-4" in said and "not used: no CUDA GPU" in said  # this machine: no GPU, said so
    from flash_attn.flash_attn_interface import flash_attn_varlen_func

    assert flash_attn_varlen_func is attention.flash_attn_varlen_func
    assert sys.modules["flash_attn.cute"].__file__ == str(fa4_installed / "__init__.py")  # FA4 kept beside
    assert flash_attn_compat.backend() == "sdpa"


def test_flash_attn_4_takes_the_call_as_it_takes_its_arguments(
    fa4_installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flash_attn_compat.install(is_main=False)
    cute = sys.modules["flash_attn.cute"]
    monkeypatch.setattr(fa4, "_varlen", cute.flash_attn_varlen_func)  # as load() does on a Hopper GPU
    monkeypatch.setattr(fa4, "applies", lambda *a: True)  # a CPU tensor never applies: this tests the call
    q, k, v = (
        torch.randn(2 * 8, h, 16, generator=torch.Generator().manual_seed(s)) for s, h in ((1, 4), (2, 2), (3, 2))
    )
    cu = torch.tensor([0, 8, 16], dtype=torch.int64)
    out = attention.flash_attn_varlen_func(q, k, v, cu, cu, torch.tensor(8), 8, causal=True, softmax_scale=0.3)
    (call,) = cute.calls
    assert call["qv"] is None and call["rest"] == {}
    assert call["cu_seqlens_q"].dtype == call["cu_seqlens_k"].dtype == torch.int32
    assert (type(call["max_seqlen_q"]), type(call["max_seqlen_k"])) == (int, int)
    assert (call["causal"], call["softmax_scale"], call["deterministic"]) == (True, 0.3, False)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape  # the output alone, as FA2 returns it
    monkeypatch.setattr(fa4, "applies", lambda *a: False)  # the same call through SDPA: the same output
    sdpa = attention.flash_attn_varlen_func(q, k, v, cu, cu, 8, 8, causal=True, softmax_scale=0.3)
    assert len(cute.calls) == 1
    torch.testing.assert_close(out, sdpa)


@pytest.mark.parametrize(
    ("major", "dims", "takes"),
    [
        (9, (128, 128, 128), True),  # Llama's 128 on Hopper
        (9, (64, 64, 64), True),
        (9, (192, 192, 192), True),  # SM90's backward reaches 192
        (9, (256, 256, 256), False),
        (10, (192, 192, 192), False),  # Blackwell's standard range ends at 128
        (10, (128, 128, 128), True),
        (8, (128, 128, 128), False),  # Ampere: FA4 has no backward there
        (12, (128, 128, 128), False),
        (9, (128, 128, 64), False),  # GQA's backward wants q and v head dims equal
        (9, (4, 4, 4), False),
        (9, (100, 100, 100), False),  # not a multiple of 8
    ],
)
def test_what_flash_attn_4_trains(major: int, dims: tuple[int, int, int], takes: bool) -> None:
    assert fa4.fits(major, *dims) is takes


def test_a_cpu_tensor_never_goes_to_flash_attn_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fa4, "_varlen", lambda *a, **k: pytest.fail("FA4 called on a CPU tensor"))
    monkeypatch.setattr(fa4, "_major", 9)
    q = torch.randn(16, 4, 16, dtype=torch.bfloat16)
    assert not fa4.applies(q, q, q, 8, 8)
