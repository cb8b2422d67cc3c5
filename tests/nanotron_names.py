"""nanotron's Llama tensors (weights or gradients) under transformers' names, which the torch engine's Llama uses
too: for the tests that compare nanotron's model (0.4's, main's) with it on the same weights. Torch only: main's
test driver imports it in a process with main's source first."""

from __future__ import annotations

from collections.abc import Callable

import torch

Rows = Callable[[torch.Tensor, int], torch.Tensor]


def as_transformers(
    named: dict[str, torch.Tensor], heads: int, kv_heads: int, head_dim: int, inter: int, rotary: Rows | None = None
) -> dict[str, torch.Tensor]:
    """qkv_proj and gate_up_proj are fused in nanotron; `rotary(rows, n_heads)` reorders q's and k's rows where
    nanotron's rotary pairs other channels than transformers' (None: as they are)."""
    keep: Rows = rotary or (lambda rows, n: rows)
    out = {}
    for name, t in named.items():
        name = name.replace(".pp_block", "")
        if name.endswith("token_embedding.weight"):
            out["model.embed_tokens.weight"] = t
        elif name == "model.final_layer_norm.weight":
            out["model.norm.weight"] = t
        elif name == "model.lm_head.weight":
            out["lm_head.weight"] = t
        elif ".decoder." in name:
            layer = f"model.layers.{name.split('.')[2]}."
            leaf = name.split(".", 3)[3]
            if leaf == "attn.qkv_proj.weight":
                q, k, v = t.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
                out[layer + "self_attn.q_proj.weight"] = keep(q, heads)
                out[layer + "self_attn.k_proj.weight"] = keep(k, kv_heads)
                out[layer + "self_attn.v_proj.weight"] = v
            elif leaf == "mlp.gate_up_proj.weight":
                out[layer + "mlp.gate_proj.weight"], out[layer + "mlp.up_proj.weight"] = t.split([inter, inter])
            else:
                out[layer + leaf.replace("attn.o_proj", "self_attn.o_proj")] = t
        else:
            raise AssertionError(f"unmapped nanotron parameter {name}")
    return out
