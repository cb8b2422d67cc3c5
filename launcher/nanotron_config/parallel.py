"""nanotron's rules for a model shape on a parallel layout: what it asserts at start-up, checked before the queue.

The layout is one value, `ParallelDims` (after torchtitan's), beside `ModelShape`: the degrees, the micro-batches a
step, and the job it runs on. `check_layout(shape, dims)` (or `dims.problems(shape)`) says every rule it breaks.
Shared by the launcher (`launcher.config.validate`, on the flags; the planner, on each candidate) and the training
job (`launcher.train.settings`, on the config and the processes torchrun actually started), so the two cannot
disagree. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.nanotron_config.shape import ModelShape
from launcher.problems import Problem


@dataclass(frozen=True)
class ParallelDims:
    """A parallel layout as nanotron runs it: dp x tp x pp (x cp) processes of a job of `world`, each step
    `grad_accum_steps` micro-batches. Self-checking against a model: `problems(shape)`."""

    world: int  # processes the job runs (GPUs)
    dp: int
    tp: int
    pp: int
    grad_accum_steps: int  # micro-batches a step (nanotron's 1F1B needs pp - 1 at least)
    cp: int = 1  # nanotron main's context parallelism: part of a model replica's GPUs
    nodes: int | None = None  # the job's nodes and GPUs per node, where known (the launcher's flags): fixes name them
    gpus_per_node: int | None = None
    started: bool = False  # the world is the processes torchrun started (the job's check), not the flags' job

    @property
    def world_flags(self) -> str:
        """What makes the world, as a message names it."""
        return "processes started by torchrun" if self.started else "--nodes x --gpus_per_node"

    @property
    def replica(self) -> int:
        """GPUs per model replica: tp x pp x cp."""
        return self.tp * self.pp * self.cp

    def problems(self, shape: ModelShape) -> list[Problem]:
        """Every rule of nanotron's this layout breaks for `shape` (`check_layout`)."""
        return check_layout(shape, self)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def _choices(values: list[int]) -> str:
    return ", ".join(map(str, values[:-1])) + (" or " if len(values) > 1 else "") + str(values[-1])


def _nodes_for(replica: int, world: int, nodes: int) -> int:
    """The smallest node count whose GPUs hold a whole number of model replicas."""
    per_node = max(world // max(nodes, 1), 1)
    return next(n for n in range(1, replica + 1) if (n * per_node) % replica == 0)


def check_layout(shape: ModelShape, dims: ParallelDims) -> list[Problem]:
    """nanotron's constraints on model shape and parallelism (what it asserts at start-up, after the queue).

    A vocabulary tp does not divide is fine: nanotron pads it to a multiple of tp x make_vocab_size_divisible_by
    (`memory.padded_vocab`). cp (nanotron main's context parallelism) is part of a model replica's GPUs."""
    out: list[Problem] = []
    world, dp, tp, pp, cp, world_flags = dims.world, dims.dp, dims.tp, dims.pp, dims.cp, dims.world_flags
    hidden, intermediate, layers = shape.hidden_size, shape.intermediate_size, shape.num_layers
    heads, kv_heads, grad_accum = shape.num_heads, shape.num_kv_heads, dims.grad_accum_steps
    nodes_hint, gpus_per_node = dims.nodes or 1, dims.gpus_per_node
    sizes = {**shape.sizes(), "dp": dp, "tp": tp, "pp": pp}
    del sizes["max_seq_len"]  # validation says it (training's check); nanotron's layout rules do not read it
    for flag, value in sizes.items():
        if value <= 0:
            out.append(Problem(flag, f"must be a positive integer, got {value}", f"give --{flag} >= 1"))
    if out:
        return out
    cp_text = f" x --cp {cp}" if cp > 1 else ""
    if dp * tp * pp * cp != world:
        if world % (tp * pp * cp):
            out.append(
                Problem(
                    "tp",
                    f"--tp {tp} x --pp {pp}{cp_text} = {tp * pp * cp} GPUs per model replica does not divide the job's "
                    f"{world} GPUs ({world_flags})",
                    f"make the job a multiple of {tp * pp * cp} GPUs "
                    f"(e.g. --nodes {_nodes_for(tp * pp * cp, world, nodes_hint)}) or lower --tp/--pp",
                )
            )
        else:
            used = dp * tp * pp * cp
            nodes = (  # the job that runs exactly the GPUs the layout uses, where whole nodes make it
                f", or --nodes {used // gpus_per_node} to run {used} GPUs"
                if gpus_per_node and used % gpus_per_node == 0
                else ""
            )
            out.append(
                Problem(
                    "dp",
                    f"--dp {dp} x --tp {tp} x --pp {pp}{cp_text} = {used}, but the job has {world} GPUs "
                    f"({world_flags}); nanotron requires them equal",
                    f"use --dp {world // (tp * pp * cp)} or leave --dp out to derive it{nodes}",
                )
            )
    # a --tp to suggest divides both head counts and the MLP, and fits the job (tp x pp x cp | GPUs)
    tp_ok = [
        d for d in divisors(math.gcd(heads, kv_heads)) if world % (d * pp * cp) == 0 and intermediate % d == 0
    ] or [1]
    undivided = [
        f"--{what} {count}" for what, count in (("num_heads", heads), ("num_kv_heads", kv_heads)) if count % tp
    ]
    if undivided:
        out.append(Problem("tp", f"--tp {tp} does not divide {' nor '.join(undivided)}", f"use --tp {_choices(tp_ok)}"))
    if heads % kv_heads:
        out.append(
            Problem(
                "num_kv_heads",
                f"--num_kv_heads {kv_heads} does not divide --num_heads {heads}",
                f"use --num_kv_heads {_choices(divisors(heads))}",
            )
        )
    if hidden % heads or (hidden // heads) % 2:
        out.append(
            Problem(
                "hidden_size",
                f"--hidden_size {hidden} / --num_heads {heads} is not an even head size",
                f"use a hidden size that is a multiple of {2 * heads}",
            )
        )
    if layers < pp:
        out.append(Problem("pp", f"--pp {pp} is more than --num_layers {layers}", f"use --pp <= {layers}"))
    if intermediate % tp:
        out.append(
            Problem(
                "intermediate_size",
                f"--intermediate_size {intermediate} is not divisible by --tp {tp}",
                f"use a multiple of {tp}, e.g. {-(-intermediate // tp) * tp}",
            )
        )
    if pp > 1 and grad_accum < pp - 1:
        out.append(
            Problem(
                "grad_accum_steps",
                f"nanotron's 1F1B pipeline needs --grad_accum_steps >= --pp - 1 = {pp - 1}, got {grad_accum}",
                f"use --grad_accum_steps {pp - 1} or more",
            )
        )
    return out


def resume_relayout(saved: dict[str, int], new: dict[str, int], written: str) -> str | None:
    """Why nanotron cannot resume a checkpoint saved in layout `saved` into layout `new` (each {dp, tp, pp,
    zero_stage}), in the dialect `written`; None where it can (the same layout, or a change nanotron re-shards:
    docs/engines.md, "Changing the layout on resume")."""
    changed = [k for k in ("dp", "tp", "pp", "zero_stage") if saved.get(k, 1 if k != "zero_stage" else 0) != new[k]]
    if not changed:
        return None
    was = ", ".join(f"{k} {saved.get(k)}" for k in ("dp", "tp", "pp", "zero_stage"))
    now = ", ".join(f"{k} {new[k]}" for k in changed)
    if "zero_stage" in changed or new["zero_stage"] > 0:
        return (f"its checkpoint was saved with {was} and this launch has {now}: nanotron re-shards a ZeRO-1 "
                "optimizer into no other layout (its loader looks for the saved layout's shard names), nor one "
                "ZeRO stage into the other")  # fmt: skip
    if written == "main" and ("tp" in changed or "pp" in changed):
        return (f"its checkpoint was saved with {was} and this launch has {now}: nanotron main resumes into "
                "another dp only (its LR schedule is saved per tp and pp rank, and its optimizer merge across pp "
                "reads a shard that lacks the parameter)")  # fmt: skip
    return None
