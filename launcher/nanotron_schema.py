"""All knowledge of nanotron 0.4's config schema lives here.

- `build_config(spec, checkpoints_dir)`: the launcher's resolved spec, overlaid on a base YAML
  (configs/nanotron-0.4-base.yaml or the user's --config), as the dict written to config.yaml.
- `flags_from_config(config)`: a nanotron YAML's values under the launcher's flag names (for --config).
- `load_train_config(path)`: a config file as the training job's `TrainConfig`.

nanotron's main branch has another schema (data_stages, context and expert parallelism): it would be a second
module with these three functions, chosen by a --target flag.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import yaml

from launcher.train.config import LRSchedule, ModelShape, TrainConfig

if TYPE_CHECKING:
    from launcher.spec import RunSpec

YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's where PyYAML has it: the same text, faster
ROPE_THETA = 10000.0  # nanotron 0.4's Llama has no rope_theta field and uses this value

# launcher flag -> (section path in the YAML). One table serves both directions.
FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "project": ("general", "project"),
    "seed": ("general", "seed"),
    "dp": ("parallelism", "dp"),
    "tp": ("parallelism", "tp"),
    "pp": ("parallelism", "pp"),
    "hidden_size": ("model", "model_config", "hidden_size"),
    "intermediate_size": ("model", "model_config", "intermediate_size"),
    "num_layers": ("model", "model_config", "num_hidden_layers"),
    "num_heads": ("model", "model_config", "num_attention_heads"),
    "num_kv_heads": ("model", "model_config", "num_key_value_heads"),
    "vocab_size": ("model", "model_config", "vocab_size"),
    "max_seq_len": ("tokens", "sequence_length"),
    "tie_word_embeddings": ("model", "model_config", "tie_word_embeddings"),
    "tokenizer": ("tokenizer", "tokenizer_name_or_path"),
    "save_interval": ("checkpoints", "checkpoint_interval"),
    "save_initial_state": ("checkpoints", "save_initial_state"),
    "log_interval": ("logging", "iteration_step_info_interval"),
    "train_steps": ("tokens", "train_steps"),
    "micro_batch_size": ("tokens", "micro_batch_size"),
    "grad_accum_steps": ("tokens", "batch_accumulation_per_replica"),
    "weight_decay": ("optimizer", "weight_decay"),
    "grad_clip": ("optimizer", "clip_grad"),
    "learning_rate": ("optimizer", "learning_rate_scheduler", "learning_rate"),
    "min_lr": ("optimizer", "learning_rate_scheduler", "min_decay_lr"),
    "warmup_steps": ("optimizer", "learning_rate_scheduler", "lr_warmup_steps"),
    "lr_decay_style": ("optimizer", "learning_rate_scheduler", "lr_decay_style"),
    "dataset": ("data", "dataset", "hf_dataset_or_datasets"),
    "text_column": ("data", "dataset", "text_column_name"),
}


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(tree.get(key), dict):
            tree[key] = {}
        tree = tree[key]
    tree[path[-1]] = value


def flags_from_config(config: dict) -> dict[str, Any]:
    """The launcher flags a nanotron YAML sets (values that are present and not null; `dataset: null`, nanotron's
    random tokens, reads as --dataset none)."""
    values = {flag: _get(config, path) for flag, path in FLAG_PATHS.items()}
    optimizer = config.get("optimizer")
    if isinstance(optimizer, dict) and "clip_grad" in optimizer and optimizer["clip_grad"] is None:
        values["grad_clip"] = 0.0  # nanotron's null: no clipping (absent: the base's value)
    data = config.get("data", {})
    if data is None or (isinstance(data, dict) and "dataset" in data and data["dataset"] is None):
        values["dataset"] = "none"
    return {k: v for k, v in values.items() if v is not None}


# Keys nanotron types more loosely than the reference's value (str | list of splits, one name | a mixture).
LOOSE = {("data", "dataset", "hf_dataset_splits"), ("data", "dataset", "hf_dataset_or_datasets")}
SECTIONS = frozenset(
    ("general", "parallelism", "model", "tokenizer", "checkpoints", "logging", "tokens", "optimizer", "data")
    + ("profiler", "lighteval")
)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "a section"
    return "a list" if isinstance(value, list) else type(value).__name__


def _fits(value: Any, reference: Any) -> bool:
    if isinstance(reference, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(reference, bool)
    if isinstance(reference, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(reference))


def shape_problems(config: dict, reference: dict, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Where a nanotron YAML cannot be what nanotron 0.4 loads, judged against `reference` (a complete, valid
    config: the base YAML): sections nanotron does not have, and values of another kind than the reference's
    (text where a number belongs, ...). Returns (key path, what is wrong) pairs."""
    out: list[tuple[tuple[str, ...], str]] = []
    if not path:
        unknown = "is not a section of nanotron 0.4's config (the one PyPI release, which this launcher writes)"
        out += [((key,), unknown) for key in config if key not in SECTIONS]
    for key, value in config.items():
        ref = reference.get(key)
        if value is None or ref is None:
            continue
        if (*path, key) in LOOSE:
            continue
        if isinstance(ref, dict) and isinstance(value, dict):
            out += shape_problems(value, ref, (*path, key))
        elif not _fits(value, ref):
            hint = " (YAML reads 3e-4 as text: write 3.0e-4)" if isinstance(value, str) and _numeric(value) else ""
            out.append(((*path, key), f"is {value!r}, {_kind(value)}, where nanotron expects {_kind(ref)}{hint}"))
    return out


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_config(spec: RunSpec, checkpoints_dir: str) -> dict:
    """The nanotron config for this run: the base YAML with every launcher-controlled value set."""
    a = spec.args
    config = copy.deepcopy(spec.base_config)
    values: dict[str, Any] = {
        "project": a.paths.project,
        "seed": a.training.seed,
        "dp": a.parallelism.dp,
        "tp": a.parallelism.tp,
        "pp": a.parallelism.pp,
        "hidden_size": a.model.hidden_size,
        "intermediate_size": a.model.intermediate_size,
        "num_layers": a.model.num_layers,
        "num_heads": a.model.num_heads,
        "num_kv_heads": a.model.num_kv_heads,
        "vocab_size": a.model.vocab_size,
        "max_seq_len": a.model.max_seq_len,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "tokenizer": a.data.tokenizer,
        "save_interval": a.paths.save_interval,
        "save_initial_state": a.paths.save_initial_state,
        "log_interval": a.logging.log_interval,
        "train_steps": a.training.train_steps,
        "micro_batch_size": a.training.micro_batch_size,
        "grad_accum_steps": a.training.grad_accum_steps,
        "weight_decay": a.training.weight_decay,
        "grad_clip": a.training.grad_clip or None,
        "learning_rate": a.training.learning_rate,
        "min_lr": a.training.min_lr,
        "warmup_steps": a.training.warmup_steps,
        "lr_decay_style": a.training.lr_decay_style,
    }
    for flag, value in values.items():
        _set(config, FLAG_PATHS[flag], value)
    _set(config, ("general", "run"), a.run_name)
    _set(config, ("model", "model_config", "max_position_embeddings"), a.model.max_seq_len)
    _set(config, ("checkpoints", "checkpoints_path"), checkpoints_dir)
    _set(config, ("optimizer", "learning_rate_scheduler", "lr_warmup_style"), "linear")
    if a.data.dataset is None:
        _set(config, ("data", "dataset"), None)
    else:
        _set(config, FLAG_PATHS["dataset"], a.data.dataset)
        _set(config, FLAG_PATHS["text_column"], a.data.text_column)
    if a.logging.profiler_export_path:  # else the base's (or --config's) profiler section stands
        config["profiler"] = {"profiler_export_path": a.logging.profiler_export_path}
    return config


def dump(config: dict) -> str:
    """The YAML text of a config (stable key order as built)."""
    return yaml.dump(config, Dumper=YAML_DUMPER, sort_keys=False, default_flow_style=False)


def _require(tree: dict, path: tuple[str, ...], default: Any = None) -> Any:
    value = _get(tree, path)
    return default if value is None else value


def train_split(config: dict) -> str:
    """The split training reads. nanotron 0.4 accepts a list (it loads each, then trains on "train")."""
    splits = _get(config, ("data", "dataset", "hf_dataset_splits"))
    if isinstance(splits, list):
        return "train" if "train" in splits or not splits else str(splits[0])
    return splits or "train"


def to_train_config(config: dict) -> TrainConfig:
    """A nanotron 0.4 config dict as the engine's TrainConfig (missing optional values get nanotron's defaults)."""
    mc = config["model"]["model_config"]
    lrs = config["optimizer"]["learning_rate_scheduler"]
    tokens = config["tokens"]
    warmup = lrs.get("lr_warmup_steps") or 0
    decay_start = lrs.get("lr_decay_starting_step")
    decay_steps = lrs.get("lr_decay_steps")
    if decay_steps is None:
        decay_steps = tokens["train_steps"] - warmup - (decay_start or 0)
    dataset = _get(config, ("data", "dataset"))
    heads = mc["num_attention_heads"]
    return TrainConfig(
        project=config["general"]["project"],
        run_name=config["general"].get("run") or "run",
        seed=_require(config, ("general", "seed"), 42),
        model=ModelShape(
            hidden_size=mc["hidden_size"],
            intermediate_size=mc["intermediate_size"],
            num_hidden_layers=mc["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=mc.get("num_key_value_heads") or heads,
            vocab_size=mc["vocab_size"],
            max_position_embeddings=mc.get("max_position_embeddings", 2048),
            rms_norm_eps=mc.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=mc.get("tie_word_embeddings", False),
            hidden_act=mc.get("hidden_act", "silu"),
            rope_theta=ROPE_THETA,
            bos_token_id=mc.get("bos_token_id", 1),
            eos_token_id=mc.get("eos_token_id", 2),
        ),
        init_std=_require(config, ("model", "init_method", "std"), 0.02),
        dtype=_require(config, ("model", "dtype"), "bfloat16"),
        dp=config["parallelism"]["dp"],
        tp=config["parallelism"]["tp"],
        pp=config["parallelism"]["pp"],
        sequence_length=tokens["sequence_length"],
        micro_batch_size=tokens["micro_batch_size"],
        grad_accum_steps=tokens["batch_accumulation_per_replica"],
        train_steps=tokens["train_steps"],
        lr=LRSchedule(
            learning_rate=lrs["learning_rate"],
            min_decay_lr=lrs["learning_rate"] if lrs.get("min_decay_lr") is None else lrs["min_decay_lr"],
            warmup_steps=warmup,
            warmup_style=lrs.get("lr_warmup_style") or "linear",
            decay_style=lrs.get("lr_decay_style") or "linear",
            decay_steps=decay_steps,
            decay_starting_step=warmup if decay_start is None else decay_start,
        ),
        weight_decay=config["optimizer"]["weight_decay"],
        adam_beta1=config["optimizer"]["adam_beta1"],
        adam_beta2=config["optimizer"]["adam_beta2"],
        adam_eps=config["optimizer"]["adam_eps"],
        clip_grad=config["optimizer"].get("clip_grad"),
        dataset=dataset["hf_dataset_or_datasets"] if dataset else None,
        dataset_split=train_split(config),
        dataset_config_name=(dataset or {}).get("hf_dataset_config_name"),
        text_column=(dataset or {}).get("text_column_name") or "text",
        tokenizer=_get(config, ("tokenizer", "tokenizer_name_or_path")),
        data_seed=_require(config, ("data", "seed"), 42),
        num_loading_workers=_require(config, ("data", "num_loading_workers"), 1),
        checkpoints_path=str(config["checkpoints"]["checkpoints_path"]),
        checkpoint_interval=config["checkpoints"]["checkpoint_interval"],
        save_initial_state=bool(config["checkpoints"].get("save_initial_state")),
        resume_checkpoint_path=config["checkpoints"].get("resume_checkpoint_path"),
        log_interval=_require(config, ("logging", "iteration_step_info_interval"), 1),
        init_path=_get(config, ("model", "init_method", "path")),
    )


def load_train_config(path: str) -> TrainConfig:
    """Read a nanotron YAML file into a TrainConfig."""
    with open(path, encoding="utf-8") as f:
        return to_train_config(yaml.safe_load(f))
