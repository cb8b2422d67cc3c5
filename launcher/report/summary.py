"""The summary printed after a launch: the model, the layout, the batch, the training, where everything went."""

from __future__ import annotations

from pathlib import Path

from launcher.bundle.files import BundlePaths
from launcher.bundle.storage import fitting, free_bytes
from launcher.checkpoint_layout import look
from launcher.config.spec import RunSpec
from launcher.evals import checks as eval_checks
from launcher.evals import plan as eval_plan
from launcher.nanotron_config import mixture, stages
from launcher.nanotron_config.presets import load_preset
from launcher.perf.sizes import disk, human_bytes, human_count, retention_rules


def _checkpoint_note(spec: RunSpec, figures: dict) -> str:
    each, count = figures["checkpoint_bytes"], figures["checkpoints"]
    rules = retention_rules(spec)
    note = f"~{human_bytes(each)} each, {count} over the run"
    at_once, peak = figures.get("checkpoints_at_once", count), figures.get("checkpoints_peak_bytes", each * count)
    if rules.active:
        note += f", at most {at_once} at once ({rules.describe()}, one being written): {human_bytes(peak)} at the peak"
        note += _not_saved(spec)
    else:
        note += f", all kept: {human_bytes(peak)} at the end"
    free = free_bytes(spec.args.paths.checkpoints_path)
    if free is None:
        return note
    note += f"; {human_bytes(free)} free"
    if peak > free:  # (with --keep_last/--keep_every, the forecast refused it before: here, a run that keeps all)
        fixes = fitting(disk(spec), free)
        note += f": not enough for all {count}: " + (f"{fixes[0]} fits (older ones are then removed), " if fixes
                                                     else "") + "or make room"  # fmt: skip
    return note


def _not_saved(spec: RunSpec) -> str:
    """The complete steps in the run's checkpoints folder that its launcher did not save: retention leaves them."""
    folder = look(spec.checkpoints_dir)
    foreign = sorted(set(folder.complete) - folder.saves)
    if not foreign:
        return ""
    shown = ", ".join(map(str, foreign[:4])) + (", ..." if len(foreign) > 4 else "")
    return f"; leaves alone {len(foreign)} step{'s' if len(foreign) > 1 else ''} this launcher did not save ({shown})"


def _data_note(spec: RunSpec, figures: dict) -> str:
    reads = f"the run reads {human_count(figures['total_training_tokens'])} tokens"
    dataset = spec.args.data.dataset
    if dataset is None:
        return f"{reads} of random tokens (--dataset none)" + _stages_note(spec, figures)
    if "dataset_mixture" in figures:
        mix = figures["dataset_mixture"]
        tokens = {name: part["tokens"] for name, part in mix.items() if part["tokens"]}
        dataset = mixture.describe({name: part["weight"] for name, part in mix.items()}, tokens)
    if "dataset_tokens" not in figures:
        return f"{reads} of {dataset}" + _stages_note(spec, figures)
    holder = "the dataset"
    if "dataset_mixture" in figures:
        reads, holder = f"{reads} of {dataset}", "what nanotron keeps of them"
    epochs = figures["epochs"]
    times = f"{epochs:.0f} epochs" if epochs >= 10 else f"{epochs:.2g} epochs" if epochs >= 0.1 else "under 0.1 epoch"
    holds = f"~{human_count(figures['dataset_tokens'])} ({figures['dataset_tokens_how']})"
    if figures.get("dataset_tokens_exact"):  # tokenized folders: counted, not estimated
        reads = f"the run reads {figures['total_training_tokens']:,} tokens of {dataset}"
        holder, holds = "the tokenized data", f"{figures['dataset_tokens']:,} tokens ({figures['dataset_tokens_how']})"
    return f"{reads}; {holder} holds {holds}: {times}" + _stages_note(spec, figures)


def _stages_note(spec: RunSpec, figures: dict) -> str:
    rewritten = f"; {spec.adapted['config']}" if "config" in spec.adapted else ""  # a --config's Nanoset form
    if "data_stages" not in figures:
        return rewritten
    return f"; data stages: {stages.describe(figures['data_stages'], spec.args.training.train_steps)}{rewritten}"


def _eval_note(spec: RunSpec) -> str:
    """--eval_tasks: which steps, on what, with which tasks (the eval job's script is in the bundle)."""
    e, a = spec.args.evals, spec.args
    found, _ = eval_checks.tasks_of(e)
    if found is None:
        return ""
    last = a.training.train_steps
    count = len(set(range(e.eval_every, last + 1, e.eval_every)) | {last}) if e.eval_every and e.eval_every > 0 else 1
    steps = f"every {e.eval_every} steps and the last ({count} evals)" if count > 1 else f"step {last}, the last"
    where = e.eval_partition or a.slurm.partition or "the default partition"
    on = f"{e.eval_gpus} GPU(s)" if e.eval_gpus else "CPUs"
    limit_said = "--eval_time_limit" if e.eval_time_limit is not None else "the run's --time_limit, at most 4 h"
    on += f", up to {eval_plan.time_limit(spec)}: {limit_said}"  # (as the eval job's script has it)
    held = f"; held-out loss on {e.eval_heldout}" if e.eval_heldout else ""
    limit = f", {e.eval_limit} samples a task" if e.eval_limit else ""
    return f"lm-eval on {found.said}{limit}: {steps}, a job each on {where} ({on}){held}"


def _memory_note(spec: RunSpec, figures: dict) -> str:
    mem = figures["memory"]
    gib = 1024**3
    parts = ", ".join(f"{k} {v / gib:.1f}" for k, v in mem["parts"].items())
    where = f", pp stage {mem['stage']}" if spec.args.parallelism.pp and spec.args.parallelism.pp > 1 else ""
    note = (
        f"~{mem['estimate_bytes'] / gib:.1f} of {mem['gpu_bytes'] / gib:.1f} GiB per GPU ({parts}{where}); "
        f"{mem['gpu']} ({mem['gpu_origin']})"
    )
    if not mem["fits"]:
        note += "; estimated NOT to fit: going ahead as --skip_memory_check says"
    return note


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" + ("" if number == 1 else "s")


def shown(path: object) -> str:
    """A path as the user reads it best: relative to where they launched, when it lies below; else whole."""
    text = str(path)
    try:
        relative = Path(text).relative_to(Path.cwd())
    except ValueError:
        return text
    return str(relative) if str(relative) != "." else text


def _cpu_note(spec: RunSpec) -> str:
    s = spec.args.slurm
    cpus = s.cpus_per_node or 1
    per_process = max(cpus // max(s.gpus_per_node, 1), 1)
    origin = spec.adapted.get("cpus_per_node", "--cpus_per_node")
    return f"{cpus} per node: {per_process} per process (OMP_NUM_THREADS={per_process}); {origin}"


def _restart_note(spec: RunSpec) -> str:
    s = spec.args.slurm
    if not s.max_restarts:
        return "none: a hang, a failed process or node ends the job (--max_restarts 0)"
    spares = (
        f"{s.spare_nodes} spare node{'s' if s.spare_nodes > 1 else ''} beyond the layout's {s.nodes} (the job holds "
        f"{s.nodes + s.spare_nodes}, the spares idle until a node fails)"
        if s.spare_nodes
        else "no spare node (--spare_nodes): a failed node is left out by a requeue"
    )
    return f"up to {s.max_restarts} in the allocation after a hang, a failed process or node; {spares}"


def _vocab(spec: RunSpec) -> str:
    vocab, padded = spec.args.model.vocab_size, spec.padded_vocab
    return (
        f"{vocab}" if padded == vocab else f"{vocab}, padded by nanotron to {padded} for tp {spec.args.parallelism.tp}"
    )


def _engine(spec: RunSpec) -> str:
    engine = spec.args.job.engine
    if engine == "auto":
        return "auto (nanotron's trainer where the nodes have CUDA and nanotron, else the torch engine)"
    return f"{engine} (--engine)"


def _theta(spec: RunSpec) -> str:
    return f"; rope_theta: {spec.adapted['rope_theta']}" if "rope_theta" in spec.adapted else ""


def _container_note(record: dict) -> str:
    image = f"{record['path']} (sha256 {record['sha256'][:16]}...)" if "path" in record else record["reference"]
    return f"{image}: the node step runs in it (pyxis), the run's host paths mounted at the same paths"


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
            f"{origin}: {human_count(figures['parameters'])} parameters "
            f"(hidden {a.model.hidden_size}, {a.model.num_layers} layers, {a.model.num_heads} heads / "
            f"{a.model.num_kv_heads} kv, vocab {_vocab(spec)}, seq {a.model.max_seq_len})",
        ),
        ("nanotron", f"config in nanotron {spec.dialect.dialect}'s dialect: {spec.dialect.why}" + _theta(spec)),
        (
            "layout",
            f"dp {lay['dp']} x tp {lay['tp']} x pp {lay['pp']} = {_count(figures['world_size'], 'GPU')} "
            f"({_count(a.slurm.nodes, 'node')} x {a.slurm.gpus_per_node})"
            + (", chosen by --layout auto (--plan shows why)" if a.parallelism.layout == "auto" else "")
            + (
                f"; {spec.adapted['tp_linear_async_communication']}"
                if "tp_linear_async_communication" in spec.adapted
                else ""
            ),
        ),
        ("rendezvous", "torchrun's {} ({}); engine: {}".format(*spec.rendezvous, _engine(spec))),
        ("cpus", _cpu_note(spec)),
        ("restarts", _restart_note(spec)),
        ("memory", _memory_note(spec, figures)),
        (
            "batch",
            f"{figures['global_batch_sequences']} sequences = {human_count(figures['global_batch_tokens'])} tokens "
            f"per step (micro {a.training.micro_batch_size} x accum {a.training.grad_accum_steps} x dp "
            f"{lay['dp']})",
        ),
        (
            "training",
            f"{a.training.train_steps} steps = {human_count(figures['total_training_tokens'])} tokens, "
            f"lr {a.training.learning_rate:g} -> {a.training.min_lr:g} ({a.training.lr_decay_style}, "
            f"{a.training.warmup_steps} warmup"
            + (f", {spec.adapted['warmup_steps']}" if "warmup_steps" in spec.adapted else "")
            + ")",
        ),
        ("data", _data_note(spec, figures)),
        *([("evals", _eval_note(spec))] if spec.args.evals.eval_tasks is not None else []),
        *(
            [("after", f"{a.slurm.dependency} (Slurm's --dependency; cancelled if it can no longer be met)")]
            if a.slurm.dependency
            else []
        ),
        *([("container", _container_note(figures["container"]))] if "container" in figures else []),
        ("bundle", shown(paths.bundle_dir)),
        ("config", shown(paths.config)),
        ("script", shown(paths.script)),
        ("manifest", shown(paths.manifest)),
        ("log", shown(paths.log)),
        ("checkpoints", f"{shown(paths.checkpoints)} ({_checkpoint_note(spec, figures)})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
