"""Figures about a run, pure: parameters, batch, tokens, and its checkpoints' size and count.

Checkpoint sizes: nanotron 0.4 writes bf16 weights, their fp32 master copies and AdamW's two fp32 moments
(14 bytes a parameter); the torch engine fp32 weights and the moments (12). Neither engine removes a checkpoint;
the job's supervisor does where --keep_last/--keep_every say (launcher/node/retention.py): `disk` is the run's
checkpoints at their peak, the forecast the launcher checks against the free space.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace

from launcher.config.spec import RunSpec
from launcher.nanotron_config import mixture, nanoset, nanoset_yaml, stages
from launcher.nanotron_config.schema import get_path, train_split
from launcher.nanotron_config.shape import ModelShape
from launcher.perf import datasize, fit
from launcher.perf.memory import estimate
from launcher.retention.rules import Rules, most_kept

BYTES_PER_PARAMETER = 14  # nanotron's checkpoint: what the summary plans with
MIN_BYTES_PER_PARAMETER = 12  # what either engine writes at least: what a refusal is based on


def parameter_count(shape: ModelShape) -> int:
    """Parameters of a Llama with grouped-query attention (RMSNorm weights included, no biases)."""
    hidden, heads = shape.hidden_size, shape.num_heads
    attention = 2 * hidden * hidden + 2 * hidden * shape.num_kv_heads * (hidden // heads)  # q, o; k, v
    mlp = 3 * hidden * shape.intermediate_size  # gate, up, down
    per_layer = attention + mlp + 2 * hidden  # two RMSNorms
    embeddings = shape.vocab_size * hidden * (1 if shape.tie_word_embeddings else 2)
    return shape.num_layers * per_layer + embeddings + hidden  # final norm


def parameters(spec: RunSpec) -> int:
    """The run's model's parameter count."""
    return parameter_count(dataclasses.replace(spec.shape, vocab_size=spec.padded_vocab))  # what nanotron builds


def checkpoint_count(train_steps: int, save_interval: int, save_initial_state: bool) -> int:
    """Saves over a whole run: every interval, the last step when it is not one, and the initial state."""
    if save_interval > 0:
        count = train_steps // save_interval + int(train_steps % save_interval != 0)
    else:
        count = 1
    return count + int(save_initial_state)


def retention_rules(spec: RunSpec) -> Rules:
    """The run's retention rules (--keep_last, --keep_every), as the job's supervisor applies them."""
    paths = spec.args.paths
    return Rules(paths.keep_last, paths.keep_every)


@dataclass(frozen=True)
class Disk:
    """The run's checkpoints on disk: each one's size, how many it saves, the most it keeps at once."""

    each: int  # bytes, estimated (the engine's bytes a parameter)
    saves: int
    most: int  # at once, one being written counted (every save where none is removed)
    rules: Rules
    train_steps: int = 0
    save_interval: int = 0
    save_initial_state: bool = False
    eval_every: int | None = None  # --eval_every: a step owed an eval stays until its eval has ended

    @property
    def peak(self) -> int:
        return self.each * self.most

    def most_with(self, rules: Rules) -> int | None:
        """The most checkpoints `rules` would keep at once over this run (None: every one)."""
        return most_kept(rules, self.train_steps, self.save_interval, self.save_initial_state, self.eval_every)


def disk(spec: RunSpec) -> Disk:
    """The run's checkpoints at their peak: nanotron's 14 bytes a parameter (the torch engine's 12 with --engine
    torch) times the most kept at once."""
    paths, t = spec.args.paths, spec.args.training
    saves = checkpoint_count(t.train_steps, paths.save_interval, paths.save_initial_state)
    rules, e = retention_rules(spec), spec.args.evals
    eval_every = (e.eval_every or None) if e.eval_tasks is not None else None
    found = Disk(checkpoint_bytes(spec), saves, saves, rules, t.train_steps, paths.save_interval,
                 paths.save_initial_state, eval_every)  # fmt: skip
    most = found.most_with(rules)
    return replace(found, most=saves if most is None else min(most, saves))


def checkpoint_bytes(spec: RunSpec) -> int:
    """A checkpoint's size, estimated: the engine's bytes a parameter (nanotron's unless --engine torch)."""
    per_parameter = MIN_BYTES_PER_PARAMETER if spec.args.job.engine == "torch" else BYTES_PER_PARAMETER
    return parameters(spec) * per_parameter


def global_batch_tokens(spec: RunSpec) -> int:
    """The tokens one step trains on: micro batch x accumulation x dp x the sequence length."""
    t, p = spec.args.training, spec.args.parallelism
    return t.micro_batch_size * t.grad_accum_steps * (p.dp or 0) * spec.shape.max_seq_len


def derived(spec: RunSpec) -> dict:
    """The numbers the summary shows, also stored in the manifest."""
    s, t, p, paths = spec.shape, spec.args.training, spec.args.parallelism, spec.args.paths
    params = parameters(spec)
    sequences = t.micro_batch_size * t.grad_accum_steps * (p.dp or 0)
    return {
        "parameters": params,
        "world_size": spec.world_size,
        "layout": {"dp": p.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp},
        "nanotron_dialect": {"dialect": spec.dialect.dialect, "why": spec.dialect.why},
        "padded_vocab": spec.padded_vocab,
        "global_batch_sequences": sequences,
        "global_batch_tokens": sequences * s.max_seq_len,
        "total_training_tokens": sequences * s.max_seq_len * t.train_steps,
        "checkpoint_bytes": checkpoint_bytes(spec),  # estimated: the engine's bytes a parameter
        "checkpoints": checkpoint_count(t.train_steps, paths.save_interval, paths.save_initial_state),
        **_disk_figures(spec),
        "memory": memory(spec),
        **data_volume(spec, sequences * s.max_seq_len * t.train_steps),
        **data_stages(spec),
    }


def _disk_figures(spec: RunSpec) -> dict:
    """The checkpoints' peak on disk (the forecast's figures)."""
    found = disk(spec)
    return {"checkpoints_at_once": found.most, "checkpoints_peak_bytes": found.peak}


def data_stages(spec: RunSpec) -> dict:
    """The run's data stages where it has more than one (nanotron main's): name, first step, dataset of each."""
    listed = stages.listed(spec.config, spec.args.data.dataset)
    return {"data_stages": listed} if listed else {}


def memory(spec: RunSpec) -> dict:
    """The memory estimate per GPU (bytes) against the GPU's memory, as the summary and the manifest say it."""
    est = estimate(spec.shape, fit.layout_of(spec))
    gpu = spec.gpu.gpu
    return {
        "gpu": gpu.name,
        "gpu_origin": spec.gpu.origin,
        "gpu_bytes": gpu.memory_bytes,
        "estimate_bytes": est.total,
        "parts": {**est.parts, "headroom": est.headroom},
        "stage": est.stage,
        "fits": est.total <= gpu.memory_bytes,
    }


def data_volume(spec: RunSpec, run_tokens: int) -> dict:
    """How many tokens a local dataset holds (estimated) and how many times the run reads it."""
    d = spec.args.data
    folders = [spec.nanosets.get(name) for name in mixture.names(spec.datasets)]
    if folders and all(folders):  # tokenized folders: the tokens they hold, counted exactly from their indexes
        caps = nanoset_yaml.caps_of(get_path(spec.config, ("data", "dataset")))  # what training reads of each
        names = mixture.names(spec.datasets)
        held = sum(min(f.tokens, caps.get(n, f.tokens)) for n, f in zip(names, folders, strict=True) if f is not None)
        how = "exactly, from the token files" + (f" of {len(folders)} folders" if len(folders) > 1 else "")
        if any(f is not None and caps.get(n, f.tokens) < f.tokens for n, f in zip(names, folders, strict=True)):
            tail = spec.args.evals.eval_heldout or ""
            how += f", as dataset_max_tokens caps {'them' if len(folders) > 1 else 'it'}"
            tails = [source for _, source in nanoset.heldout_domains(tail) if source.startswith(nanoset.TAIL)]
            how += f" (the last tokens held out: --eval_heldout {tails[0]})" if tails else ""
        return {"dataset_tokens": held, "dataset_tokens_how": how, "dataset_tokens_exact": True,
                "epochs": run_tokens / held} if held else {}  # fmt: skip
    if isinstance(spec.datasets, dict):
        return _mixture_volume(spec, spec.datasets, run_tokens)
    size = datasize.estimate(d.dataset, d.text_column, train_split(spec.base_config), d.tokenizer)
    if size is None or size.tokens <= 0:
        return {}
    return {"dataset_tokens": size.tokens, "dataset_tokens_how": size.how, "epochs": run_tokens / size.tokens}


def _mixture_volume(spec: RunSpec, mix: dict[str, float], run_tokens: int) -> dict:
    """A mixture's datasets, nanotron's fraction of each and their estimated tokens (where local); the tokens of
    the mix (what nanotron keeps of each) and the epochs where every part's size is known."""
    d = spec.args.data
    sizes = {name: datasize.estimate(name, d.text_column, train_split(spec.base_config), d.tokenizer) for name in mix}
    tokens = {name: size.tokens for name, size in sizes.items() if size is not None and size.tokens > 0}
    out: dict = {"dataset_mixture": {name: {"weight": w, "tokens": tokens.get(name)} for name, w in mix.items()}}
    kept = sum(w * tokens[name] for name, w in mix.items() if name in tokens)
    if len(tokens) == len(mix) and kept > 0:
        how = next(size.how for size in sizes.values() if size is not None)
        out.update(dataset_tokens=int(kept), dataset_tokens_how=how, epochs=run_tokens / kept)
    return out


def human_count(n: float) -> str:
    """1.05M, 3.21B: a count with its order of magnitude."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def human_bytes(n: float) -> str:
    """45.0 GB, 847 GB: three significant digits."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{max(0, 2 - int(math.log10(n / scale)))}f} {unit}"
    return f"{int(n)} B"
