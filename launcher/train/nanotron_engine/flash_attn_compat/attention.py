"""`flash_attn.flash_attn_interface`: varlen attention through torch's scaled_dot_product_attention.

flash-attn's contract, as nanotron 0.4's CoreAttention uses it: q is (total_q, heads_q, d), k and v are
(total_k, heads_k, d) and (total_k, heads_k, d_v), the sequences of a batch packed one after another, sequence b
occupying rows cu_seqlens[b]:cu_seqlens[b + 1]; no token attends across a sequence boundary. With `causal`, the
mask is aligned to the bottom right: query i of a sequence of seqlen_q queries and seqlen_k keys sees keys
j <= i + seqlen_k - seqlen_q (a query that sees no key gets zeros). heads_q is a multiple of heads_k: query head h
uses key/value head h // (heads_q / heads_k). The scale defaults to 1 / sqrt(d). The output alone is returned,
(total_q, heads_q, d_v), in the inputs' dtype.

Where FlashAttention 4 is installed and applies (`fa4.py`: Hopper and Blackwell GPUs), it computes the call;
otherwise, where every sequence is max_seqlen long (nanotron's training: a full sequence mask), the batch is one
SDPA call and nothing waits for the GPU; ragged cu_seqlens read the offsets on the host and attend sequence by
sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import torch
import torch.nn.functional as F

from launcher.train.nanotron_engine.flash_attn_compat import fa4

WHY = (
    "the launcher's flash_attn stand-in (torch SDPA) implements only what nanotron's training calls; install "
    "flash-attn on the GPU nodes for anything else"
)


def refuse(what: str) -> NoReturn:
    """Raise the stand-in's one error, naming what it does not implement."""
    raise NotImplementedError(f"{what}: {WHY}")


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over packed variable-length sequences (see the module's docstring); differentiable.

    `window_size` is in the signature because nanotron's starcoder2.py looks for it; only (-1, -1) (no window)
    is implemented, as are dropout_p 0, softcap 0 and no alibi, attention probabilities or paged cache.
    `deterministic` goes to FlashAttention 4 (its backward's order of accumulation); SDPA ignores it.
    """
    if dropout_p:
        refuse(f"flash_attn_varlen_func(dropout_p={dropout_p})")
    if tuple(window_size) != (-1, -1):
        refuse(f"flash_attn_varlen_func(window_size={tuple(window_size)})")
    if softcap:
        refuse(f"flash_attn_varlen_func(softcap={softcap})")
    if alibi_slopes is not None or return_attn_probs or block_table is not None:
        refuse("flash_attn_varlen_func with alibi_slopes, return_attn_probs or block_table")
    _check_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if fa4.applies(q, k, v, max_seqlen_q, max_seqlen_k):
        return fa4.attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          deterministic)  # fmt: skip
    batch = cu_seqlens_q.shape[0] - 1
    if q.shape[0] == batch * max_seqlen_q and k.shape[0] == batch * max_seqlen_k:
        # Every length is at most max_seqlen (flash-attn's contract) and they add up to batch * max_seqlen: all are
        # max_seqlen. One batched call, and cu_seqlens never leave the GPU.
        out = attend(
            q.view(batch, max_seqlen_q, *q.shape[1:]),
            k.view(batch, max_seqlen_k, *k.shape[1:]),
            v.view(batch, max_seqlen_k, *v.shape[1:]),
            causal,
            softmax_scale,
        )
        return out.reshape(q.shape[0], q.shape[1], v.shape[2])
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    _check_offsets(starts_q, q.shape[0], "cu_seqlens_q", max_seqlen_q)
    _check_offsets(starts_k, k.shape[0], "cu_seqlens_k", max_seqlen_k)
    pieces = [
        attend(q[a:b][None], k[c:d][None], v[c:d][None], causal, softmax_scale)[0]
        for a, b, c, d in zip(starts_q[:-1], starts_q[1:], starts_k[:-1], starts_k[1:], strict=True)
    ]
    if starts_q[-1] < q.shape[0]:  # rows past the last sequence belong to none (flash-attn leaves them unset)
        pieces.append(q.new_zeros(q.shape[0] - starts_q[-1], q.shape[1], v.shape[2]))
    return torch.cat(pieces)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> torch.Tensor:
    """Attention within each of a batch of equal-length sequences: q (batch, seqlen_q, heads_q, d), k and v
    (batch, seqlen_k, heads_k, d or d_v); returns (batch, seqlen_q, heads_q, d_v)."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if seqlen_q == 0 or seqlen_k == 0:
        return q.new_zeros(q.shape[0], seqlen_q, q.shape[2], v.shape[3])
    mask = None
    if causal and seqlen_q != seqlen_k:  # SDPA's is_causal is aligned to the top left; flash-attn's, bottom right
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        mask = torch.arange(seqlen_k, device=q.device)[None, :] <= rows + (seqlen_k - seqlen_q)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask,
        is_causal=causal and mask is None,
        scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    ).transpose(1, 2)
    if mask is not None and seqlen_q > seqlen_k:  # queries that see no key: zeros, as flash-attn
        out = out.masked_fill(~mask.any(dim=1)[None, :, None, None], 0.0)
    return out


def _check_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor
) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        shapes = ", ".join(str(tuple(t.shape)) for t in (q, k, v))
        raise ValueError(f"q, k, v must be (total, heads, head_dim); got {shapes}")
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} do not fit together")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 2:
        raise ValueError(
            f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k {tuple(cu_seqlens_k.shape)} must be "
            "(batch + 1,) each"
        )


def _check_offsets(starts: list[int], total: int, name: str, max_seqlen: int) -> None:
    lengths = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    if starts[0] != 0 or min(lengths) < 0 or starts[-1] > total:
        raise ValueError(f"{name} {starts} are not offsets from 0 that grow to at most {total}")
    if max(lengths) > max_seqlen:
        raise ValueError(f"{name} has a sequence of {max(lengths)} tokens, more than max_seqlen {max_seqlen}")


def flash_attn_with_kvcache(*args: object, **kwargs: object) -> None:
    """Refused: used by nanotron only for inference (generation with a key/value cache)."""
    refuse("flash_attn_with_kvcache (inference only)")


def _flash_attn_varlen_forward(*args: object, **kwargs: object) -> None:
    """Refused: nanotron main's ring attention (context parallelism) calls it; its Llama never does."""
    refuse("_flash_attn_varlen_forward (nanotron main's ring attention)")


def _flash_attn_varlen_backward(*args: object, **kwargs: object) -> None:
    """Refused: nanotron main's ring attention (context parallelism) calls it; its Llama never does."""
    refuse("_flash_attn_varlen_backward (nanotron main's ring attention)")


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **options: object,
) -> torch.Tensor:
    """`flash_attn_varlen_func` with k and v packed as kv (total_k, 2, heads_k, d) (nanotron main's Qwen2)."""
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv must be (total_k, 2, heads_k, head_dim); got {tuple(kv.shape)}")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, **options)  # type: ignore[arg-type]  # fmt: skip
