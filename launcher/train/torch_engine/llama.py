"""The torch engine's Llama, in plain torch: the same modules, parameter names and arithmetic as transformers'
LlamaForCausalLM (a test holds the two to the same logits), without transformers' import, which costs every rank
~2.3 s of CPU before its first step (torch._dynamo, torch.distributed.tensor, sympy).

Grouped-query attention through torch's scaled_dot_product_attention (causal), rotary embeddings as transformers
computes them (fp32 frequencies, cos/sin in the input's dtype, the two halves rotated), RMSNorm in fp32, SwiGLU.
The parameter names are transformers' (`model.layers.N.self_attn.q_proj.weight`, `lm_head.weight`, ...), so
checkpoints and nanotron-style initialisation (`launcher.train.torch_engine.model.init_like_nanotron`) read them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from launcher.nanotron_config.shape import ModelShape


class LlamaRMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and returned in the input's dtype."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class LlamaRotaryEmbedding(nn.Module):
    """cos and sin of every position's rotation angles, in the dtype of what they rotate."""

    def __init__(self, head_dim: int, theta: float, interleaved: bool = False):
        super().__init__()
        self.interleaved = interleaved
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=x.device, dtype=torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = torch.outer(positions, self.inv_freq.to(x.device).float())
            angles = freqs.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): interleaved RoPE's pairs (GPT-J, rope_interleaved: true)."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    return x * cos + (_rotate_pairs(x) if interleaved else _rotate_half(x)) * sin


class LlamaAttention(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        h, heads, kv = shape.hidden_size, shape.num_heads, shape.num_kv_heads
        self.heads, self.kv_heads, self.head_dim = heads, kv, h // heads
        self.interleaved = shape.rope_interleaved
        self.q_proj = nn.Linear(h, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin, self.interleaved), _rotate(k, cos, sin, self.interleaved)
        groups = self.heads // self.kv_heads
        if groups > 1:  # each key/value head serves `groups` query heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        h, f = shape.hidden_size, shape.intermediate_size
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)
        if shape.hidden_act != "silu":
            raise ValueError(f"the torch engine's Llama uses silu, not {shape.hidden_act!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape):  # (transformers' order of modules: the init draws them in this order)
        super().__init__()
        self.self_attn = LlamaAttention(shape)
        self.mlp = LlamaMLP(shape)
        self.input_layernorm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class DecoderOutput:
    last_hidden_state: torch.Tensor  # (batch, length, hidden), after the final norm


class LlamaModel(nn.Module):
    """The decoder stack: embeddings, layers, final norm."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(shape.head_dim, shape.rope_theta, shape.rope_interleaved)

    def forward(self, input_ids: torch.Tensor) -> DecoderOutput:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(x, input_ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return DecoderOutput(self.norm(x))


class LlamaForCausalLM(nn.Module):
    """The decoder and its language-model head (tied to the embeddings where the shape says so)."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.model = LlamaModel(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits, (batch, length, vocab)."""
        return self.lm_head(self.model(input_ids).last_hidden_state)
