"""Figures about a run (parameters, batch, tokens) and the summary printed after a launch."""

from __future__ import annotations

from launcher import storage
from launcher.bundle import BundlePaths
from launcher.spec import RunSpec, load_preset


def parameter_count(
    *, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, tied: bool
) -> int:
    """Parameters of a Llama with grouped-query attention (RMSNorm weights included, no biases)."""
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    mlp = 3 * hidden * intermediate  # gate, up, down
    per_layer = attention + mlp + 2 * hidden  # two RMSNorms
    embeddings = vocab * hidden * (1 if tied else 2)
    return layers * per_layer + embeddings + hidden  # final norm


def parameters(spec: RunSpec) -> int:
    """The run's model's parameter count."""
    s = spec.shape
    return parameter_count(
        hidden=s.hidden,
        intermediate=s.intermediate,
        layers=s.layers,
        heads=s.heads,
        kv_heads=s.kv_heads,
        vocab=s.vocab,
        tied=spec.tie_word_embeddings,
    )


def checkpoint_plan(spec: RunSpec) -> storage.CheckpointPlan:
    """The run's checkpoints: size, count, and the room where they go (read now)."""
    p = spec.args.paths
    return storage.checkpoint_plan(
        parameters(spec), spec.args.training.train_steps, p.save_interval, p.save_initial_state, p.checkpoints_path
    )


def derived(spec: RunSpec) -> dict:
    """The numbers the summary shows, also stored in the manifest."""
    s, t, p = spec.shape, spec.args.training, spec.args.parallelism
    params = parameters(spec)
    plan = checkpoint_plan(spec)
    sequences = t.micro_batch_size * t.grad_accum_steps * (p.dp or 0)
    return {
        "parameters": params,
        "world_size": spec.world_size,
        "layout": {"dp": p.dp, "tp": p.tp, "pp": p.pp},
        "global_batch_sequences": sequences,
        "global_batch_tokens": sequences * s.seq,
        "total_training_tokens": sequences * s.seq * t.train_steps,
        "checkpoint_bytes": plan.bytes_each,  # estimated: nanotron's 14 bytes a parameter
        "checkpoints": plan.count,
    }


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def _checkpoint_note(spec: RunSpec, figures: dict) -> str:
    each, count = figures["checkpoint_bytes"], figures["checkpoints"]
    note = f"~{storage.human_bytes(each)} each, {count} over the run"
    free = checkpoint_plan(spec).free
    if free is None:
        return note
    note += f"; {storage.human_bytes(free)} free"
    if each * count > free:
        note += f": not enough for all {count} (none is pruned): raise --save_interval or make room"
    return note


def render(spec: RunSpec, paths: BundlePaths, figures: dict) -> str:
    """The text printed after the bundle is written."""
    a = spec.args
    lay = figures["layout"]
    preset = load_preset(a.model.model_size)["model"]
    as_preset = all(getattr(a.model, k) == v for k, v in preset.items() if hasattr(a.model, k) and k != "vocab_size")
    origin = f"{a.model.model_size} preset" if as_preset else f"{a.model.model_size} preset, reshaped by flags/--config"
    rows = [
        (
            "model",
            f"{origin}: {_human(figures['parameters'])} parameters "
            f"(hidden {a.model.hidden_size}, {a.model.num_layers} layers, {a.model.num_heads} heads / "
            f"{a.model.num_kv_heads} kv, vocab {a.model.vocab_size}, seq {a.model.max_seq_len})",
        ),
        (
            "layout",
            f"dp {lay['dp']} x tp {lay['tp']} x pp {lay['pp']} = {figures['world_size']} GPUs "
            f"({a.slurm.nodes} nodes x {a.slurm.gpus_per_node})",
        ),
        (
            "batch",
            f"{figures['global_batch_sequences']} sequences = {_human(figures['global_batch_tokens'])} tokens "
            f"per step (micro {a.training.micro_batch_size} x accum {a.training.grad_accum_steps} x dp "
            f"{lay['dp']})",
        ),
        (
            "training",
            f"{a.training.train_steps} steps = {_human(figures['total_training_tokens'])} tokens, "
            f"lr {a.training.learning_rate:g} -> {a.training.min_lr:g} ({a.training.lr_decay_style}, "
            f"{a.training.warmup_steps} warmup)",
        ),
        *(
            [("after", f"{a.slurm.dependency} (Slurm's --dependency; cancelled if it can no longer be met)")]
            if a.slurm.dependency
            else []
        ),
        ("bundle", str(paths.bundle_dir)),
        ("config", str(paths.config)),
        ("script", str(paths.script)),
        ("manifest", str(paths.manifest)),
        ("log", str(paths.log)),
        ("checkpoints", f"{paths.checkpoints} ({_checkpoint_note(spec, figures)})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
