"""`--compile_layers`: nanotron's decoder layers through `torch.compile`, as the torch engine compiles its own.

nanotron runs its layers eager: RMSNorm, rotary embedding and SwiGLU as several kernels each (flash-attn's fused
Triton kernels where flash-attn 2 is installed, plain torch through the launcher's stand-in otherwise). Each decoder
layer this rank holds is compiled in place (`Module.compile`): its parameters keep their names, so nanotron's
checkpoints, optimizer and tied parameters see the same model. Compilation happens at the first step (the watchdog's
`--startup_timeout` covers it); a layer dynamo cannot compile runs eager, with PyTorch's warning, rather than ending
the job.
"""

from __future__ import annotations

import torch
from torch import nn

COMPILED_LINE = "compile_layers: {count} decoder layer(s) of this rank through torch.compile, at the first step"
SUMMARY_LINE = (
    "compile_layers: {graphs} graph(s) compiled in the first step, {breaks} graph break(s) (TORCH_LOGS=graph_breaks in "
    "--extra_env says where)"
)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers this rank holds: the modules of nanotron's PipelineBlocks (its `pp_block`, built only on
    the pipeline rank that runs the block) whose class is a `...DecoderLayer` (0.4's and main's Llama, main's
    Qwen2)."""
    blocks = (getattr(m, "pp_block", None) for m in model.modules() if type(m).__name__ == "PipelineBlock")
    return [b for b in blocks if b is not None and type(b).__name__.endswith("DecoderLayer")]


def compile_decoder_layers(model: nn.Module) -> int:
    """Compile each of `model`'s decoder layers on this rank, in place; how many."""
    torch._dynamo.config.suppress_errors = True  # eager, with a warning, where a layer cannot be compiled
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)


def summary() -> str:
    """What dynamo did in this process so far: the graphs it compiled and the graph breaks it met (each a piece of
    a layer left eager)."""
    from torch._dynamo.utils import counters

    return SUMMARY_LINE.format(graphs=counters["stats"]["unique_graphs"], breaks=sum(counters["graph_break"].values()))
