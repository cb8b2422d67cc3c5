"""FlashAttention 4 (`flash-attn-4` on PyPI) behind the stand-in's FA2-shaped `flash_attn_varlen_func`.

FA4 is a pure-Python wheel whose kernels (CuTe DSL, `nvidia-cutlass-dsl`) are compiled at first use for the
GPU in hand: SM90 (H100, H200) and SM100/SM110 (Blackwell) forward and backward. It installs only
`flash_attn/cute/`, no `flash_attn/__init__.py`: `import flash_attn` then succeeds as a namespace package, so
"is the real flash_attn importable" must ask for the FA2 module nanotron imports (`flash_attn.flash_attn_interface`),
never for `flash_attn` alone (`real_flash_attn_error` in the package does).

Its `flash_attn_varlen_func` differs from FA2's: the 4th positional argument is `qv` (so cu_seqlens and
max_seqlen go by keyword: int32 tensors and Python ints), there is no `dropout_p`, and it returns `(out, lse)`.
`attend` takes a call where `applies` says FA4 can: a CUDA tensor on an SM90/SM100/SM110 GPU, fp16 or bf16, the
same head dim for q, k and v (8 to 128, or 192 on SM90, a multiple of 8), equal q and k lengths (training's self
attention; FA4's causal alignment for unequal lengths is left untested here). Everything else goes through
torch SDPA as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import torch

HALF = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = {9: 192, 10: 128, 11: 128}  # per compute capability major: what FA4's backward takes

_varlen: Callable[..., object] | None = None  # FA4's function, where it is installed and this GPU runs it
_major = 0  # the GPU's compute capability major


def load() -> str:
    """Import FA4 where installed (its modules stay in sys.modules under `flash_attn.cute`); returns what the job
    should say about it ("" where it is not installed)."""
    global _varlen, _major
    _varlen = None
    try:
        cute = importlib.import_module("flash_attn.cute")
        varlen = cute.flash_attn_varlen_func
    except ModuleNotFoundError as e:
        if e.name in ("flash_attn", "flash_attn.cute"):
            return ""  # not installed
        return f"flash-attn-4 not importable ({e})"
    except Exception as e:  # noqa: BLE001  # an install that does not import is the same as none, said why
        return f"flash-attn-4 not importable ({type(e).__name__}: {str(e)[:200]})"
    version = _package_version(cute)
    gpu = device_why_not()
    if gpu:
        return f"flash-attn-4 {version} installed, not used: {gpu}"
    _varlen = varlen
    _major, minor = torch.cuda.get_device_capability()
    return (
        f"attention through FlashAttention 4 (flash-attn-4 {version}, CuTe DSL kernels compiled at first use, "
        f"sm{_major}{minor}); torch SDPA where it does not apply; rotary and RMSNorm through torch"
    )


def loaded() -> bool:
    """Whether FA4 is imported and this GPU runs it."""
    return _varlen is not None


def device_why_not() -> str:
    """Why this process's GPU cannot run FA4's kernels ("" where it can)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major not in MAX_HEAD_DIM:
        return f"this GPU is sm{major}{minor}; FA4 trains on sm90, sm100 and sm110"
    return ""


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int) -> bool:
    """Whether FA4 computes this call (no host synchronization: shapes, dtypes and the device only)."""
    if _varlen is None or not q.is_cuda or q.dtype not in HALF:
        return False
    same_length = q.shape[0] == k.shape[0] and max_seqlen_q == max_seqlen_k
    return same_length and fits(_major, q.shape[-1], k.shape[-1], v.shape[-1])


def fits(major: int, head_dim_q: int, head_dim_k: int, head_dim_v: int) -> bool:
    """FA4's head-dim limits for training (forward and backward) on a GPU of compute capability `major`."""
    limit = MAX_HEAD_DIM.get(major)
    return (
        limit is not None and head_dim_q == head_dim_k == head_dim_v and 8 <= head_dim_q <= limit and not head_dim_q % 8
    )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None,
    causal: bool,
    deterministic: bool = False,
) -> torch.Tensor:
    """FA2's varlen call through FA4; the output alone, as FA2 returns it."""
    assert _varlen is not None, "fa4.attend without fa4.load()"
    result = _varlen(
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens_q.to(torch.int32),
        cu_seqlens_k=cu_seqlens_k.to(torch.int32),
        max_seqlen_q=int(max_seqlen_q),
        max_seqlen_k=int(max_seqlen_k),
        softmax_scale=softmax_scale,
        causal=causal,
        deterministic=deterministic,
    )
    return result[0] if isinstance(result, tuple) else result  # type: ignore[return-value]


def _package_version(module: ModuleType) -> str:
    try:
        from importlib.metadata import version

        return version("flash-attn-4")
    except Exception:  # noqa: BLE001
        return str(getattr(module, "__version__", "?"))
