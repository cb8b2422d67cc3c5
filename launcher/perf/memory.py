"""Peak GPU memory of one training process of nanotron 0.4, as it runs the config the launcher writes. Pure.

Derived from nanotron 0.4's code (docs/planning.md has the formulas and what each comes from):

- model states, per local parameter (a pipeline stage's share, / tp): bf16 weights (2 B), the fp32 gradient
  buffer of *every* local parameter (4 B, optim/gradient_accumulator.py: ZeRO-1 does not shard it), fp32 master
  weights and Adam's two moments (4 + 8 B, / dp under ZeRO-1: optim/zero.py), and DDP's bf16 buckets (2 B) when
  nanotron wraps the model in DDP (dp > 1, unless ZeRO-1 with fp32 accumulation: trainer.py `make_ddp`);
- activations saved for backward, per layer and micro-batch (models/llama.py, tensor_parallel/functional.py):
  layer norms' inputs, the linear layers' inputs (sequence-sharded under REDUCE_SCATTER with async communication),
  flash-attention's q, k, v (MHA keeps the whole fused qkv copy) and output, the SwiGLU MLP's 8·s·b·F/t bytes;
- in-flight micro-batches (parallel/pipeline_parallel/engine.py): 1F1B keeps pp - rank on stage `rank` (at most
  grad_accum); AFAB keeps all of them;
- the last stage's logits: fp32 softmax kept for backward (4·s·b·V/t), and an fp32 copy beside it while the loss
  runs; a stage's layers split by nanotron's cost rule (models/base.py `build_model`), the embedding on the first
  stage and the head on the last (both, when tied and pp > 1);
- the bf16 gradients of a stage, alive until its backward ends, which is the peak where they outweigh a
  micro-batch's activations.

The headroom beside the allocator's peak (CUDA context, NCCL buffers, fragmentation) is stated in HEADROOM_*.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from launcher.nanotron_config.shape import ModelShape

GIB = 1024**3
HEADROOM_CONTEXT = 1.0 * GIB  # CUDA context, cuBLAS workspaces, kernels
HEADROOM_NCCL = 0.5 * GIB  # NCCL's buffers, per process group in use (tp, dp, pp, and the world's)
HEADROOM_FRAGMENTATION = 0.08  # the caching allocator's reserved-but-unused memory, as a share of the peak


@dataclass(frozen=True)
class Layout:
    """How the model runs: parallelism, batch and the config's memory-relevant settings."""

    dp: int
    tp: int
    pp: int
    micro_batch: int
    grad_accum: int
    zero_stage: int = 0
    pp_engine: str = "1f1b"
    tp_mode: str = "REDUCE_SCATTER"
    tp_async: bool = True  # parallelism.tp_linear_async_communication
    fp32_grad_accum: bool = True  # optimizer.accumulate_grad_in_fp32
    dtype_bytes: int = 2  # model.dtype: bfloat16
    vocab_multiple: int = 1  # model.make_vocab_size_divisible_by
    cp: int = 1  # nanotron main's context parallelism: each GPU holds 1/cp of every sequence's activations


@dataclass(frozen=True)
class Stage:
    layers: int
    embedding: bool
    head: bool  # the LM head (and the final norm and the loss)


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU at the peak of the stage that peaks highest."""

    parts: dict[str, int]  # weights, gradients, optimizer, activations, logits: the allocator's peak
    headroom: int
    stage: int  # the pipeline stage (rank) whose peak this is

    @property
    def peak(self) -> int:
        """What torch.cuda.max_memory_allocated would report."""
        return sum(self.parts.values())

    @property
    def total(self) -> int:
        return self.peak + self.headroom


def padded_vocab(vocab: int, tp: int, multiple: int = 1) -> int:
    """nanotron pads the vocabulary to a multiple of tp x make_vocab_size_divisible_by (helpers.py)."""
    step = tp * multiple
    return -(-vocab // step) * step


def stages(m: ModelShape, tp: int, pp: int, vocab_multiple: int = 1) -> list[Stage]:
    """The pipeline stages as nanotron 0.4 builds them (models/base.py `build_model`): the blocks in forward order
    (embedding, layers, final norm, LM head, fp32 cast, loss), each costing 4·heads·head_dim·hidden + 3·F·hidden
    (a layer), V·hidden (the head) or nothing, go to the current rank, which moves on once the running cost passes
    its share, total · (rank + 1) / pp."""
    d = m.hidden_size // m.num_heads
    layer_cost = 4 * m.num_heads * d * m.hidden_size + 3 * m.intermediate_size * m.hidden_size
    head_cost = padded_vocab(m.vocab_size, tp, vocab_multiple) * m.hidden_size
    costs = [0] + [layer_cost] * m.num_layers + [0, head_cost, 0, 0]
    total = sum(costs)
    thresholds = [total * ((rank + 1) / pp) for rank in range(pp)]
    ranks, rank, running = [], 0, 0
    for cost in costs:
        ranks.append(rank)
        running += cost
        if running > thresholds[rank]:
            rank += 1
    layers = ranks[1 : m.num_layers + 1]
    head_rank = ranks[m.num_layers + 2]
    return [Stage(layers.count(r), r == ranks[0], r == head_rank) for r in range(pp)]


def stage_params(m: ModelShape, stage: Stage, tp: int, vocab_multiple: int = 1) -> int:
    """Parameters one GPU of the stage holds (matrices / tp, norms whole; a tied embedding once per stage)."""
    d = m.hidden_size // m.num_heads
    per_layer = (
        m.hidden_size * d * (2 * m.num_heads + 2 * m.num_kv_heads) + 3 * m.hidden_size * m.intermediate_size
    ) // tp + 2 * m.hidden_size
    table = padded_vocab(m.vocab_size, tp, vocab_multiple) * m.hidden_size // tp
    tables = int(stage.embedding) + int(stage.head)
    if m.tie_word_embeddings and stage.embedding and stage.head:
        tables = 1
    return stage.layers * per_layer + tables * table + (m.hidden_size if stage.head else 0)


def layer_activations(m: ModelShape, lay: Layout) -> int:
    """Bytes one layer saves for backward, per micro-batch (bf16, flash-attention; nanotron 0.4 recomputes
    nothing)."""
    t, sb, h = lay.tp, lay.micro_batch * m.max_seq_len, m.hidden_size
    sharded = lay.tp_mode == "REDUCE_SCATTER"
    norm_inputs = 2 * (2 * sb * h // (t if sharded else 1))  # the two RMSNorms' inputs
    linear_inputs = 2 * (2 * sb * h // (t if sharded and lay.tp_async else 1))  # qkv's and gate_up's inputs
    if m.num_kv_heads == m.num_heads:  # MHA: the fused [3, b, s, heads, d] copy, and the k/v pair rotary builds
        attention = 2 * sb * h * 5 // t
    else:  # GQA: q, and the k/v pair
        attention = 2 * sb * h // t + 2 * 2 * sb * h * m.num_kv_heads // m.num_heads // t
    attention += 2 * sb * h // t + 4 * sb * m.num_heads // t  # flash-attention's output, and its fp32 logsumexp
    mlp = 8 * sb * m.intermediate_size // t  # gate_up's output (kept by SiLU and the product), SiLU's, down's input
    return norm_inputs + linear_inputs + attention + mlp


def _workspace(m: ModelShape, lay: Layout) -> int:
    """The largest transient of one layer's backward: the MLP's gradients and a gathered [s, b, h]."""
    sb = lay.micro_batch * m.max_seq_len
    return 12 * sb * m.intermediate_size // lay.tp + 2 * sb * m.hidden_size


def in_flight(lay: Layout, rank: int) -> int:
    """Micro-batches whose activations a stage holds at once (engine.py)."""
    if lay.pp_engine == "afab":
        return lay.grad_accum
    return min(lay.pp - rank, lay.grad_accum)


def _uses_ddp(lay: Layout) -> bool:
    return lay.dp > 1 and not (lay.fp32_grad_accum and lay.zero_stage > 0)


def model_states(params: int, lay: Layout) -> dict[str, int]:
    """Weights, gradients and optimizer of `params` local parameters."""
    w = lay.dtype_bytes
    shards = lay.dp if lay.zero_stage > 0 else 1
    ddp = w * params if _uses_ddp(lay) else 0
    if lay.fp32_grad_accum:
        return {"weights": w * params, "gradients": 4 * params + ddp, "optimizer": math.ceil(12 * params / shards)}
    # no accumulator: bf16 gradients stay between micro-batches, AdamW's moments are kept in the weights' dtype
    return {"weights": w * params, "gradients": w * params + ddp, "optimizer": math.ceil(2 * w * params / shards)}


def headroom(peak: int, lay: Layout) -> int:
    groups = 1 + sum(1 for n in (lay.tp, lay.dp, lay.pp) if n > 1)
    return int(HEADROOM_CONTEXT + groups * HEADROOM_NCCL + HEADROOM_FRAGMENTATION * peak)


def estimate(m: ModelShape, lay: Layout) -> Estimate:
    """The peak of the stage that peaks highest (ties: the first)."""
    if lay.cp > 1:  # a cp rank computes its own slice of every sequence: the activations of seq / cp tokens
        m = dataclasses.replace(m, max_seq_len=max(m.max_seq_len // lay.cp, 1))
    per_layer = layer_activations(m, lay)
    workspace = _workspace(m, lay)
    vocab = padded_vocab(m.vocab_size, lay.tp, lay.vocab_multiple)
    sb = lay.micro_batch * m.max_seq_len
    best: Estimate | None = None
    for rank, stage in enumerate(stages(m, lay.tp, lay.pp, lay.vocab_multiple)):
        params = stage_params(m, stage, lay.tp, lay.vocab_multiple)
        parts = model_states(params, lay)
        k = in_flight(lay, rank)
        acts = stage.layers * per_layer + (2 * sb * m.hidden_size // lay.tp) * (1 + int(stage.head))  # + head's inputs
        kept_logits = 4 * sb * vocab // lay.tp if stage.head else 0
        loss_copy = 4 * sb * vocab // lay.tp if stage.head else 0
        forward_end = k * (acts + kept_logits) + loss_copy
        backward_end = (k - 1) * (acts + kept_logits) + lay.dtype_bytes * params  # + the stage's bf16 gradients
        if forward_end >= backward_end:
            parts.update(activations=k * acts + workspace, logits=k * kept_logits + loss_copy)
        else:
            parts["gradients"] += lay.dtype_bytes * params
            parts.update(activations=(k - 1) * acts + workspace, logits=(k - 1) * kept_logits)
        peak = sum(parts.values())
        if best is None or peak > best.peak:
            best = Estimate(parts, headroom(peak, lay), rank)
    assert best is not None
    return best
