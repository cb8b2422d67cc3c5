"""`flash_attn.layers.rotary`: the rotary embedding module nanotron 0.4's Llama trains with.

nanotron builds `RotaryEmbedding(dim=head_dim, interleaved=True)` and calls it as `q, kv = rotary(q, kv=kv)` with
q (batch, seqlen, heads, head_dim) and kv (batch, seqlen, 2, kv_heads, head_dim): q and k are rotated, v is not.
As flash-attn does: the angles are position x base^(-2i/dim), computed in float32 whatever the module's dtype
(nanotron builds its model in bf16, buffers included); the cos/sin tables are rounded to the input's dtype; the
products are taken in float32 and the result rounded to the input's dtype. `interleaved` rotates the pairs
(x[2i], x[2i+1]) (GPT-J), otherwise (x[i], x[i + dim/2]) (GPT-NeoX); channels past `dim` pass through.
flash-attn rotates in place and returns its inputs; this returns new tensors (nanotron uses only what is
returned). XPos (`scale_base`), packed qkv and tensor offsets are not implemented.
"""

from __future__ import annotations

import torch
from torch import nn

from launcher.train.nanotron_engine.flash_attn_compat.attention import refuse


def cos_sin(
    dim: int, base: float, seqlen: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (seqlen, dim / 2) cos and sin tables, computed in float32 and rounded to `dtype`."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inv_freq)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (batch, seqlen, heads, head_dim) rotated by (seqlen, rotary_dim / 2) tables; float32 products."""
    rotary_dim = 2 * cos.shape[-1]
    rotated, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    c, s = cos.float()[None, :, None, :], sin.float()[None, :, None, :]
    if interleaved:
        x0, x1 = rotated[..., 0::2], rotated[..., 1::2]
        out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = rotated.chunk(2, dim=-1)
        out = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((out.to(x.dtype), rest), dim=-1) if rest.shape[-1] else out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """flash-attn's RotaryEmbedding, for the call nanotron's training makes: `forward(q, kv=kv)`."""

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        interleaved: bool = False,
        scale_base: float | None = None,
        pos_idx_in_fp32: bool = True,
        device: torch.device | None = None,
    ):
        super().__init__()
        if scale_base is not None:
            refuse(f"RotaryEmbedding(scale_base={scale_base}) (XPos)")
        if dim % 2:
            raise ValueError(f"rotary dim must be even, got {dim}")
        self.dim, self.base, self.interleaved = dim, float(base), interleaved
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def _cos_sin(self, seqlen: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tables = self._tables
        if tables is None or not _fits(tables[0], seqlen, like):
            tables = self._tables = cos_sin(self.dim, self.base, seqlen, like.device, like.dtype)
        return tables[0][:seqlen], tables[1][:seqlen]

    def forward(
        self,
        qkv: torch.Tensor,
        kv: torch.Tensor | None = None,
        seqlen_offset: int = 0,
        max_seqlen: int | None = None,
        num_heads_q: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (batch, seqlen, heads, head_dim) and kv (batch, seqlen, 2, kv_heads, head_dim), q and k rotated."""
        if kv is None or num_heads_q is not None:
            refuse("RotaryEmbedding on packed qkv (nanotron's training passes q and kv)")
        if not isinstance(seqlen_offset, int) or max_seqlen is not None:
            refuse("RotaryEmbedding with tensor seqlen_offset or max_seqlen (inference only)")
        if qkv.dim() != 4 or kv.dim() != 5 or kv.shape[2] != 2 or qkv.shape[-1] < self.dim:
            raise ValueError(f"q {tuple(qkv.shape)} and kv {tuple(kv.shape)} are not (b, s, h, d) and (b, s, 2, h, d)")
        seqlen = qkv.shape[1]
        cos, sin = self._cos_sin(seqlen + seqlen_offset, qkv)
        cos, sin = cos[seqlen_offset:], sin[seqlen_offset:]
        q = apply_rotary(qkv, cos, sin, self.interleaved)
        k = apply_rotary(kv[:, :, 0], cos, sin, self.interleaved)
        return q, torch.stack((k, kv[:, :, 1]), dim=2)


def _fits(table: torch.Tensor, seqlen: int, like: torch.Tensor) -> bool:
    return table.shape[0] >= seqlen and table.device == like.device and table.dtype == like.dtype


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: int = 0, **kwargs: object) -> torch.Tensor:  # fmt: skip
    """flash-attn's functional rotary (nanotron main's `nn/rotary.py`): x (batch, seqlen, heads, head_dim) by
    (seqlen, rotary_dim / 2) tables; a new tensor (flash-attn's `inplace` writes back into x as well)."""
    if seqlen_offsets or kwargs.get("cu_seqlens") is not None:
        refuse("apply_rotary_emb with seqlen_offsets or cu_seqlens")
    out = apply_rotary(x, cos[: x.shape[1]], sin[: x.shape[1]], interleaved)
    if inplace:
        x.copy_(out)
        return x
    return out
