"""`flash_attn.ops.triton.layer_norm`: the RMSNorm nanotron 0.4's TritonRMSNorm calls.

nanotron calls `layer_norm_fn(x, weight, None, residual=None, eps=eps, dropout_p=0.0, prenorm=False,
residual_in_fp32=False, is_rms_norm=True, return_dropout_mask=False)`. As flash-attn's Triton kernel does, the
norm is computed in float32 (x and weight upcast, y = x / sqrt(mean(x^2) + eps) * weight) and returned in x's
dtype; gradients flow to x and weight, computed in float32 too. As the kernel does, backward keeps only x (in
its dtype), the weight and one float32 rstd per row, not float32 copies of the activations. Under torch.compile
(`--compile_layers`) the same formula is plain torch operations, which inductor fuses, forward and backward, into
the layer's kernels (and whose saved tensors it chooses): dynamo cannot trace nanotron's parameter (a Parameter
subclass) inside an autograd.Function, and broke the layer's graph there. LayerNorm proper, a
bias, a residual, dropout and the other fused options are not implemented.
"""

from __future__ import annotations

import torch

from launcher.train.nanotron_engine.flash_attn_compat.attention import refuse


def layer_norm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
    x1: torch.Tensor | None = None,
    weight1: torch.Tensor | None = None,
    bias1: torch.Tensor | None = None,
    eps: float = 1e-6,
    dropout_p: float = 0.0,
    rowscale: torch.Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    is_rms_norm: bool = False,
    return_dropout_mask: bool = False,
    **more: object,
) -> torch.Tensor:
    """RMSNorm over the last dimension (`is_rms_norm=True` only); see the module's docstring."""
    if not is_rms_norm:
        refuse("layer_norm_fn(is_rms_norm=False) (LayerNorm; nanotron's Llama uses RMSNorm)")
    fused = {"bias": bias, "residual": residual, "x1": x1, "weight1": weight1, "bias1": bias1, "rowscale": rowscale}
    given = [name for name, value in fused.items() if value is not None]
    given += [name for name, value in more.items() if value is not None]
    if given or dropout_p or prenorm or return_dropout_mask:
        refuse(f"layer_norm_fn with {', '.join(given) or 'dropout or prenorm'}")
    if torch.compiler.is_compiling():
        return _rms_norm(x, weight, eps)[0]
    return _RMSNorm.apply(x, weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y in x's dtype, and the float32 rstd per row."""
    x32 = x.float()
    rstd = torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + eps)
    return (x32 * rstd * weight.float()).to(x.dtype), rstd


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        y, rstd = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        grad32 = grad.float()
        grad_weight = (grad32 * normed).reshape(-1, normed.shape[-1]).sum(dim=0)
        grad_normed = grad32 * weight.float()
        # d/dx of x * rstd(x): rstd * (g - normed * mean(g * normed)) over the last dimension
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(dim=-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None
