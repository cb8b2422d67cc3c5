"""The parallelism planner: every layout nanotron accepts for a model, a job and a global batch, with its memory
(`launcher.perf.memory`) and an estimated step time, best first. Pure, no torch: 1024 nodes x 8 GPUs in well
under a second (bench/bench_plan.py).

The step-time model, per optimizer step (docs/planning.md has the assumptions and how they compare with
published runs):

- compute: nanotron's own FLOP count (models/llama.py `get_flops`: 3 x forward, attention counted whole, the LM
  head included) at EFFICIENCY of the GPU's peak;
- pipeline: (micro-batches + pp - 1) x the slowest stage's time per micro-batch: 1F1B and AFAB idle alike;
- tensor parallel, per layer and micro-batch: under REDUCE_SCATTER 4 all-gathers/reduce-scatters forward and 6
  backward (the async column linears gather their input again), TP_HIDDEN of them (a fifth) hidden behind the
  matmuls; under ALL_REDUCE 4 all-reduces, none hidden;
- data parallel: the fp32 gradients all-reduced (DDP overlaps it with the last backward; ZeRO-1 runs it after the
  backward, then all-gathers the bf16 weights);
- pipeline sends: a micro-batch's hidden states each way across each boundary;
- memory-bound work at HBM_EFFICIENCY of the GPU's bandwidth: fp32 gradient accumulation after every
  micro-batch, AdamW on the master weights, the fp32 -> bf16 copy;
- collectives at the GPU's NVLink bus bandwidth inside a node, and between nodes NIC_GBPS for each of a group's
  members on a node (nanotron places tp innermost, then dp, then pp: parallel/context.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from launcher.nanotron_config.gpus import Gpu
from launcher.nanotron_config.parallel import ParallelDims, check_layout, divisors
from launcher.nanotron_config.shape import ModelShape
from launcher.perf.memory import Estimate, Layout, estimate, padded_vocab, stage_params, stages

EFFICIENCY = 0.5  # achieved share of peak FLOP/s in nanotron's matmul-bound work (calibrated: docs/planning.md)
HBM_EFFICIENCY = 0.8
NIC_GBPS = 30.0  # what a collective gets from one GPU's 400 Gb/s NIC (50 GB/s) between nodes, in effect
TP_HIDDEN = 0.2  # share of REDUCE_SCATTER's collectives hidden behind matmuls (async communication)
STEP_OVERHEAD_S = 0.04  # per step: loss and grad-norm reductions, clipping, logging, the data loader


@dataclass(frozen=True)
class Plan:
    layout: Layout
    memory: Estimate
    step_s: float  # estimated seconds per optimizer step
    mfu: float  # nanotron's model FLOPs / (step time x GPUs x peak)
    times: dict[str, float]  # seconds per step: compute, bubble, tp, dp, pp, memory-bound
    fits: bool

    def flags(self) -> dict[str, object]:
        return flag_values(self.layout)


def flag_values(lay: Layout) -> dict[str, object]:
    """A layout as the flags that set it."""
    return {
        "tp": lay.tp,
        "pp": lay.pp,
        "dp": lay.dp,
        "micro_batch_size": lay.micro_batch,
        "grad_accum_steps": lay.grad_accum,
        "zero_stage": lay.zero_stage,
        "pp_engine": lay.pp_engine,
        "tp_mode": lay.tp_mode,
    }


def model_flops(m: ModelShape, tokens: int, vocab: int) -> float:
    """nanotron's FLOP count for `tokens` tokens (forward + backward = 3 x forward)."""
    d = m.hidden_size // m.num_heads
    matmuls = m.hidden_size * d * (2 * m.num_heads + 2 * m.num_kv_heads) + 3 * m.hidden_size * m.intermediate_size
    forward = (
        2 * tokens * (m.num_layers * matmuls + m.hidden_size * vocab)
        + 4 * tokens * m.max_seq_len * m.hidden_size * m.num_layers
    )
    return 3.0 * forward


def _bandwidth(span: int, members_per_node: int, gpus_per_node: int, gpu: Gpu) -> float:
    """Bytes/s of a collective over a group whose ranks lie within `span` consecutive ranks: NVLink inside a node;
    between nodes one NIC per member a node holds (NCCL runs a ring per NIC), at most NVLink's."""
    if span <= gpus_per_node:
        return gpu.nvlink_gbps * 1e9
    return min(gpu.nvlink_gbps, NIC_GBPS * max(1, min(members_per_node, gpus_per_node))) * 1e9


def step_time(m: ModelShape, lay: Layout, gpu: Gpu, gpus_per_node: int) -> tuple[float, dict[str, float]]:
    """Seconds per optimizer step, and its parts."""
    t, p, n, b, k = lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.grad_accum
    vocab = padded_vocab(m.vocab_size, t, lay.vocab_multiple)
    flops_per_s = gpu.tflops * 1e12 * EFFICIENCY
    sbh2 = 2.0 * b * m.max_seq_len * m.hidden_size  # bytes of one micro-batch's bf16 hidden states
    tp_bw = _bandwidth(t, t, gpus_per_node, gpu)
    ring = (t - 1) / t
    if lay.tp_mode == "REDUCE_SCATTER":
        tp_layer = (10 + (1 + m.intermediate_size / m.hidden_size) / t) * sbh2 * ring / tp_bw * (1 - TP_HIDDEN)
    else:
        tp_layer = 4 * 2 * sbh2 * ring / tp_bw
    tokens = b * m.max_seq_len
    layer_flops = model_flops(replace(m, num_layers=1), tokens, 0) / t
    head_flops = 3.0 * 2 * tokens * m.hidden_size * vocab / t
    per_stage = []
    params = []
    for stage in stages(m, t, p, lay.vocab_multiple):
        compute = (stage.layers * layer_flops + (head_flops if stage.head else 0)) / flops_per_s
        comm = stage.layers * tp_layer + (3 * sbh2 * ring / tp_bw if stage.head and t > 1 else 0)
        per_stage.append((compute, comm))
        params.append(stage_params(m, stage, t, lay.vocab_multiple))
    compute, tp_comm = max(per_stage, key=lambda ct: ct[0] + ct[1])
    pp_comm = 0.0
    if p > 1:
        pp_bw = _bandwidth(t * n * p, 1, gpus_per_node, gpu)
        pp_comm = 2 * sbh2 / (t if lay.tp_mode == "REDUCE_SCATTER" else 1) / pp_bw
    micro = compute + tp_comm + pp_comm
    phi = max(params)
    dp_comm = 0.0
    if n > 1:
        dp_bw = _bandwidth(t * n, min(n, gpus_per_node // t), gpus_per_node, gpu)
        all_reduce = 2 * (n - 1) / n * 4 * phi / dp_bw
        if lay.zero_stage > 0:
            dp_comm = all_reduce + (n - 1) / n * 2 * phi / dp_bw
        else:
            dp_comm = max(0.0, all_reduce - 2 / 3 * micro)  # DDP: behind the last micro-batch's backward
    shards = n if lay.zero_stage > 0 else 1
    hbm = gpu.hbm_tbps * 1e12 * HBM_EFFICIENCY
    memory_bound = (k * 10 * phi + 34 * phi / shards + 8 * phi) / hbm
    times = {
        "compute": k * compute,
        "bubble": (p - 1) * micro,
        "tp": k * tp_comm,
        "pp": k * pp_comm,
        "dp": dp_comm,
        "memory-bound": memory_bound,
        "overhead": STEP_OVERHEAD_S,
    }
    return sum(times.values()), times


def evaluate(m: ModelShape, lay: Layout, gpu: Gpu, gpus_per_node: int) -> Plan:
    """One layout's memory and step time."""
    mem = estimate(m, lay)
    step, times = step_time(m, lay, gpu, gpus_per_node)
    tokens = lay.dp * lay.grad_accum * lay.micro_batch * m.max_seq_len
    world = lay.dp * lay.tp * lay.pp
    mfu = model_flops(m, tokens, padded_vocab(m.vocab_size, lay.tp, lay.vocab_multiple)) / (
        step * world * gpu.tflops * 1e12
    )
    return Plan(lay, mem, step, mfu, times, mem.total <= gpu.memory_bytes)


def layouts(m: ModelShape, world: int, global_batch: int, fixed: dict[str, object], base: Layout) -> Iterator[Layout]:
    """Every layout nanotron accepts for the model on `world` GPUs with `global_batch` sequences a step, keeping
    the values in `fixed` (flags the user typed, by flag name); `base` carries the config's other settings."""
    for tp in divisors(world):
        for pp in (d for d in divisors(world // tp) if d <= m.num_layers):
            dp = world // (tp * pp)
            # the shape and the degrees alone: the accumulation, chosen below, is given one 1F1B accepts
            if global_batch % dp or refused(m, world, dp, tp, pp, grad_accum_steps=pp):
                continue
            for b in divisors(global_batch // dp):
                k = global_batch // dp // b
                if pp > 1 and k < pp - 1:
                    continue
                for zero in (0, 1) if dp > 1 else (0,):
                    for engine in ("1f1b", "afab") if pp > 1 else ("1f1b",):
                        for mode in ("REDUCE_SCATTER", "ALL_REDUCE") if tp > 1 else ("REDUCE_SCATTER",):
                            lay = replace(
                                base, dp=dp, tp=tp, pp=pp, micro_batch=b, grad_accum=k, zero_stage=zero,
                                pp_engine=engine, tp_mode=mode, tp_async=mode == "REDUCE_SCATTER",
                            )  # fmt: skip
                            values = flag_values(lay)
                            if all(values[f] == v for f, v in fixed.items()):
                                yield lay


def refused(m: ModelShape, world: int, dp: int, tp: int, pp: int, *, grad_accum_steps: int) -> bool:
    """Whether nanotron refuses the layout (`launcher.nanotron_config.parallel`, as validation applies it)."""
    return bool(check_layout(m, ParallelDims(world, dp, tp, pp, grad_accum_steps)))


def search(
    m: ModelShape, world: int, gpus_per_node: int, global_batch: int, gpu: Gpu, fixed: dict[str, object], base: Layout
) -> list[Plan]:
    """Every accepted layout, evaluated: those that fit first, fastest first (then the least memory)."""
    plans = [evaluate(m, lay, gpu, gpus_per_node) for lay in layouts(m, world, global_batch, fixed, base)]
    return sorted(plans, key=_rank)


def _rank(plan: Plan) -> tuple:
    """Fits first; then the fastest; then the least memory."""
    return (not plan.fits, plan.step_s, plan.memory.total)


def why(best: Plan, plans: list[Plan]) -> str:
    """Why the best wins: against the next that fits, the part of the step time that differs the most."""
    fitting = [p for p in plans if p.fits]
    if len(fitting) < 2:
        unfit = len(plans) - len(fitting)
        return f"the only layout that fits ({unfit} others do not)" if unfit else "the only layout"
    runner = fitting[1]
    gap = runner.step_s / best.step_s - 1
    if gap < 0.01:
        return f"within 1% of the next ({_short(runner)}), closer than this model can tell: either will do"
    part = max(best.times, key=lambda k: runner.times[k] - best.times[k])
    return (
        f"{gap:.0%} faster than the next ({_short(runner)}), which spends "
        f"{runner.times[part] - best.times[part]:.2f} s more a step on {part}"
    )


def _short(plan: Plan) -> str:
    lay = plan.layout
    return f"tp {lay.tp}, pp {lay.pp}, dp {lay.dp}, micro batch {lay.micro_batch}, ZeRO-{lay.zero_stage}"
