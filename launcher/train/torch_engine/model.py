"""The portable engine's model: a Llama (launcher.train.torch_engine.llama, transformers' modules in plain torch),
shaped and initialised like nanotron's.

nanotron's `RandomInit` (LlamaForTraining.init_model_randomly) draws every column-parallel linear (q, k, v,
gate, up, lm_head) and the embedding from N(0, std), the row-parallel ones (o_proj, down_proj) from
N(0, std / sqrt(2 * num_layers)), and sets RMSNorm weights to 1. The same here.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from launcher.nanotron_config.shape import ModelShape
from launcher.train.torch_engine.llama import LlamaForCausalLM

ROW_PARALLEL = ("o_proj", "down_proj")  # nanotron's TensorParallelRowLinear layers: scaled init


def llama_config(shape: ModelShape):  # type: ignore[no-untyped-def]  # transformers.LlamaConfig
    """transformers' LlamaConfig for a nanotron model shape (the tests' and benches' reference model; the engine
    trains launcher.train.torch_engine.llama's, which a test holds to transformers' logits)."""
    from transformers import LlamaConfig

    return LlamaConfig(  # type: ignore[call-arg]
        **shape.llama_config_kwargs(),
        use_cache=False,
        attn_implementation="sdpa",  # taken by PretrainedConfig(**kwargs); not in LlamaConfig's signature
    )


@torch.no_grad()
def init_like_nanotron(model: nn.Module, std: float, num_layers: int) -> None:
    """Re-draw every weight as nanotron's RandomInit does (the caller seeds torch first)."""
    row_std = std / math.sqrt(2 * num_layers)
    done: set[int] = set()  # tied lm_head/embedding: initialise the shared tensor once
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or id(weight) in done:
            continue
        done.add(id(weight))
        if isinstance(module, nn.Linear):
            nn.init.normal_(weight, mean=0.0, std=row_std if name.endswith(ROW_PARALLEL) else std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(weight, mean=0.0, std=std)
        elif type(module).__name__.endswith("RMSNorm"):
            weight.fill_(1.0)
        else:
            raise AssertionError(f"no init rule for {name} ({type(module).__name__})")


def build_model(shape: ModelShape, init_std: float, seed: int) -> nn.Module:
    """A freshly initialised Llama (launcher.train.torch_engine.llama) in float32 on the CPU, identical on every rank
    for one seed."""
    model = LlamaForCausalLM(shape)
    torch.manual_seed(seed)  # after construction: the draws depend on the seed alone, not on how modules are built
    init_like_nanotron(model, init_std, shape.num_layers)
    return model


def next_token_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting tokens[:, 1:], with the logits upcast to float32 as nanotron does."""
    logits = F.linear(hidden, lm_head_weight)
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


class WithLoss(nn.Module):
    """The model and its loss as one module, so DDP's forward returns the loss (and a compiled loss fuses the
    float32 logits away: they are never stored whole)."""

    def __init__(self, model: nn.Module, loss=next_token_loss):  # type: ignore[no-untyped-def]
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Loss of one micro-batch of (batch, sequence_length + 1) token windows."""
        lm: Any = self.model  # a LlamaForCausalLM: its decoder stack `model` and its `lm_head`
        hidden = lm.model(input_ids=tokens[:, :-1]).last_hidden_state
        return self.loss(hidden, lm.lm_head.weight, tokens)


def compile_for_gpu(model: nn.Module) -> nn.Module:
    """WithLoss(model) with each decoder layer, the final norm and the loss compiled by torch.compile.

    Compiling the whole model gains little (transformers' Llama breaks the graph); layer by layer fuses RMSNorm,
    rotary embedding and SwiGLU, and the compiled loss avoids the float32 logits. On one H100, 1b preset, seq 4096:
    MFU 33% -> 45.5% (bench/bench_train.py). TORCH_COMPILE_DISABLE=1 turns it off. A node where compiling fails
    (no C compiler for Triton, say) trains eager, with PyTorch's warning, rather than ending the job.
    """
    torch._dynamo.config.suppress_errors = True
    lm: Any = model  # a LlamaForCausalLM, as in WithLoss
    for layer in lm.model.layers:
        layer.compile()
    lm.model.norm.compile()
    return WithLoss(model, torch.compile(next_token_loss))


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: nn.Module, shape: ModelShape, sequence_length: int) -> float:
    """Training FLOPs per token: 6 x (weights used in matmuls, lm_head included) + 12 x layers x hidden x seq."""
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6.0 * matmul_weights + 12.0 * shape.num_layers * shape.hidden_size * sequence_length
