"""Does the run fit its GPUs? The memory check of every launch, its fixes, and `--layout auto`. Pure.

The estimate is `launcher.perf.memory`'s, for the config the launcher writes (the flags, and the base or
--config YAML's other settings); the GPU is the spec's (flags, the cluster's GRES type, or the default). A layout
estimated not to fit is a problem like any other, and every fix it names has been estimated to fit.
"""

from __future__ import annotations

import dataclasses

from launcher.config import ranges
from launcher.config.spec import RunSpec
from launcher.nanotron_config import dialect
from launcher.nanotron_config.schema import get_path
from launcher.nanotron_config.shape import ModelShape
from launcher.perf import planner
from launcher.perf.memory import GIB, Estimate, Layout, estimate
from launcher.problems import Problem

MAX_MORE_NODES = 64  # "more nodes" looks this many times the job's size at most


def layout_of(spec: RunSpec) -> Layout:
    """The layout the written config runs: the flags, and what the base or --config YAML sets beside them."""
    p, t, cfg = spec.args.parallelism, spec.args.training, spec.base_config
    asked = get_path(cfg, ("parallelism", "tp_linear_async_communication"))
    asynchronous, _ = dialect.tp_async(spec.dialect.dialect, p.tp or 1, p.tp_mode, asked)
    dtype = str(get_path(cfg, ("model", "dtype")) or "bfloat16")
    return Layout(
        dp=p.dp or 1,
        tp=p.tp or 1,
        pp=p.pp or 1,
        cp=max(p.cp, 1),
        micro_batch=t.micro_batch_size,
        grad_accum=t.grad_accum_steps,
        zero_stage=p.zero_stage,
        pp_engine=p.pp_engine,
        tp_mode=p.tp_mode,
        tp_async=asynchronous,
        fp32_grad_accum=get_path(cfg, ("optimizer", "accumulate_grad_in_fp32")) is not False,
        dtype_bytes=4 if dtype in ("float32", "float") else 2,
        vocab_multiple=int(get_path(cfg, ("model", "make_vocab_size_divisible_by")) or 1),
    )


def checkable(spec: RunSpec, problems: list[Problem]) -> bool:
    """Whether the layout can be estimated: a valid shape and layout (otherwise those problems are said first)."""
    layout_flags = {"tp", "pp", "dp", "grad_accum_steps", "micro_batch_size", "max_seq_len", "zero_stage"}
    layout_flags |= {"hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"}
    layout_flags |= {"pp_engine", "tp_mode", "nodes", "gpus_per_node", "model_size", "layout"}
    if spec.world_size <= 0 or not spec.shape.resolved or any(p.flag in layout_flags for p in problems):
        return False
    return not ranges.problems(spec.args)  # a count no run takes: the estimate waits until it is fixed


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def describe(est: Estimate) -> str:
    """'62.1 GiB (weights 3.7, gradients 11.2, ... headroom 5.2)'."""
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in est.parts.items())
    return f"{gib(est.total)} ({parts}, headroom {est.headroom / GIB:.1f})"


def problems(spec: RunSpec, found: list[Problem]) -> list[Problem]:
    """The memory check of the pure phase, once the other checks (`found`: theirs) leave the layout estimable."""
    return memory_problems(spec) if checkable(spec, found) else []


def memory_problems(spec: RunSpec) -> list[Problem]:
    """The layout's estimated peak beyond the GPU's memory, with the fixes that fit (none with
    --skip_memory_check)."""
    if spec.args.execution.skip_memory_check:
        return []
    m, lay, gpu = spec.shape, layout_of(spec), spec.gpu.gpu
    est = estimate(m, lay)
    if est.total <= gpu.memory_bytes:
        return []
    states = sum(est.parts[k] for k in ("weights", "gradients", "optimizer"))
    flag = "tp" if states >= est.parts["activations"] + est.parts["logits"] else "micro_batch_size"
    where = f" on pipeline stage {est.stage}" if lay.pp > 1 else ""
    message = (
        f"the layout (dp {lay.dp} x tp {lay.tp} x pp {lay.pp}, micro batch {lay.micro_batch}, ZeRO-{lay.zero_stage}) "
        f"needs an estimated {describe(est)} per GPU{where}, more than the {gib(gpu.memory_bytes)} of the "
        f"{gpu.name} ({spec.gpu.origin})"
    )
    fixes = [f"{flags} ({gib(fitted.total)})" for flags, fitted in fixes_that_fit(spec, m, lay)]
    best = best_plan(spec)
    if best is not None:
        current = current_values(spec)
        changed = {k: v for k, v in best.flags().items() if current[k] != v}
        fixes.append(f"--layout auto, the planner's best ({_flags_text(changed)}: {gib(best.memory.total)})")
    fix = ("fits with " + "; or ".join(fixes)) if fixes else "no layout of this job fits: more nodes or a smaller model"
    fix += "; --skip_memory_check to go ahead anyway (docs/planning.md)"
    return [Problem(flag, message, fix)]


def _flags_text(values: dict[str, object]) -> str:
    return " ".join(f"--{k} {v}" for k, v in values.items())


def fixes_that_fit(spec: RunSpec, m: ModelShape, lay: Layout) -> list[tuple[str, Estimate]]:
    """The cheapest change of each kind that fits: a larger --tp, a larger --pp, ZeRO-1, a smaller micro batch
    with more accumulation (the same batch), more nodes (with ZeRO-1). Each is estimated before it is named."""
    gpu, per_node, nodes = spec.gpu.gpu, spec.args.slurm.gpus_per_node, spec.args.slurm.nodes
    world, out = spec.world_size, []

    def fitting(candidate: Layout, world_size: int) -> Estimate | None:
        if _refused(m, candidate, world_size):
            return None
        est = estimate(m, candidate)
        return est if est.total <= gpu.memory_bytes else None

    for tp in range(lay.tp + 1, world // lay.pp + 1):  # a larger --tp, dp following
        if world % (tp * lay.pp) == 0 and (
            found := fitting(dataclasses.replace(lay, tp=tp, dp=world // (tp * lay.pp)), world)
        ):
            out.append((f"--tp {tp}", found))
            break
    for pp in range(lay.pp + 1, world // lay.tp + 1):  # a larger --pp
        if world % (pp * lay.tp) == 0 and (
            found := fitting(dataclasses.replace(lay, pp=pp, dp=world // (pp * lay.tp)), world)
        ):
            out.append((f"--pp {pp}", found))
            break
    if lay.zero_stage == 0 and lay.dp > 1 and (found := fitting(dataclasses.replace(lay, zero_stage=1), world)):
        out.append(("--zero_stage 1", found))
    batch = lay.micro_batch * lay.grad_accum
    for b in range(lay.micro_batch - 1, 0, -1):
        if batch % b == 0 and (found := fitting(dataclasses.replace(lay, micro_batch=b, grad_accum=batch // b), world)):
            out.append((f"--micro_batch_size {b} --grad_accum_steps {batch // b}", found))
            break
    for more in range(nodes + 1, nodes * MAX_MORE_NODES + 1):
        size = more * per_node
        if size % (lay.tp * lay.pp):
            continue
        candidate = dataclasses.replace(lay, dp=size // (lay.tp * lay.pp), zero_stage=1)
        if found := fitting(candidate, size):
            out.append((f"--nodes {more}" + (" --zero_stage 1" if lay.zero_stage == 0 else ""), found))
            break
    return out


def _refused(m: ModelShape, lay: Layout, world: int) -> bool:
    return planner.refused(m, world, lay.dp, lay.tp, lay.pp, grad_accum_steps=lay.grad_accum)


def global_batch(spec: RunSpec) -> int:
    """Sequences a step, as the flags make it (micro batch x accumulation x dp)."""
    t = spec.args.training
    return t.micro_batch_size * t.grad_accum_steps * (spec.args.parallelism.dp or 1)


def plans(spec: RunSpec, fixed: dict[str, object]) -> list[planner.Plan]:
    """The planner's table for the spec's model, job, batch and GPU; `fixed`: layout values to keep."""
    return planner.search(
        spec.shape,
        spec.world_size,
        spec.args.slurm.gpus_per_node,
        global_batch(spec),
        spec.gpu.gpu,
        fixed,
        layout_of(spec),
    )


def best_plan(spec: RunSpec, fixed: dict[str, object] | None = None) -> planner.Plan | None:
    found = plans(spec, fixed or {})
    return found[0] if found and found[0].fits else None


def auto_layout(spec: RunSpec, explicit: set[str]) -> tuple[RunSpec, list[Problem]]:
    """`--layout auto`: the planner's best layout that fits, keeping what you typed of it (--tp, --pp, ...)."""
    a = spec.args
    fixed = {k: v for k, v in current_values(spec).items() if k in explicit}
    best = best_plan(spec, fixed)
    if best is None:
        kept = f" keeping {_flags_text(fixed)}" if fixed else ""
        return spec, [
            Problem("layout", f"no layout of {spec.world_size} GPUs{kept} fits the {spec.gpu.gpu.name}", "add nodes")
        ]
    lay = best.layout
    par = dataclasses.replace(
        a.parallelism, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage, pp_engine=lay.pp_engine,
        tp_mode=lay.tp_mode,
    )  # fmt: skip
    training = dataclasses.replace(a.training, micro_batch_size=lay.micro_batch, grad_accum_steps=lay.grad_accum)
    return dataclasses.replace(spec, args=dataclasses.replace(a, parallelism=par, training=training)), []


def current_values(spec: RunSpec) -> dict[str, object]:
    """The spec's layout, as the flags that set it."""
    return planner.flag_values(layout_of(spec))
