"""nanotron's config as the launcher sees it: one table from flags to YAML paths, read both ways, for both dialects.

- `FLAG_PATHS`: launcher flag -> its key path in the YAML, in nanotron 0.4's paths (`launcher.nanotron_config.dialect`
  moves them to main's: `data` -> `data_stages[0].data`, Adam's settings -> `optimizer.optimizer_factory`). Every
  flag is either here or in `NOT_IN_CONFIG` (a test holds the two to the flag set), so a flag cannot quietly stop
  reaching the config.
- `build_config(values, base, checkpoints_dir, datasets, later)`: a run's canonical config (0.4's paths, main's
  keys kept), from the flags' resolved values laid onto a base YAML (configs/nanotron-0.4-base.yaml or the user's
  --config); built once a launch (`RunSpec.config`). `written(config, dialect, checkpoints_dir)`: the config.yaml
  of a dialect, rendered from it.
- `flags_from_config(config)`: a nanotron YAML's values (either dialect) under the launcher's flag names.
- `shape_problems(config, reference)`: where a YAML cannot be what nanotron loads.

The training job reads a config through `launcher.train.settings`, which uses `get_path` and `train_split` from
here, on `dialect.to_canonical` of the file.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from launcher.nanotron_config import dialect, mixture, nanoset, nanoset_yaml, stages
from launcher.nanotron_config.nanoset import TokenizedFolder
from launcher.nanotron_config.stages import Stage

YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's where PyYAML has it: the same text, faster

# launcher flag -> (section path in the YAML). One table serves both directions.
FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "project": ("general", "project"),
    "seed": ("general", "seed"),
    "dp": ("parallelism", "dp"),
    "tp": ("parallelism", "tp"),
    "pp": ("parallelism", "pp"),
    "pp_engine": ("parallelism", "pp_engine"),
    "tp_mode": ("parallelism", "tp_mode"),
    "zero_stage": ("optimizer", "zero_stage"),
    "hidden_size": ("model", "model_config", "hidden_size"),
    "intermediate_size": ("model", "model_config", "intermediate_size"),
    "num_layers": ("model", "model_config", "num_hidden_layers"),
    "num_heads": ("model", "model_config", "num_attention_heads"),
    "num_kv_heads": ("model", "model_config", "num_key_value_heads"),
    "vocab_size": ("model", "model_config", "vocab_size"),
    "max_seq_len": ("tokens", "sequence_length"),
    "rope_theta": ("model", "model_config", "rope_theta"),  # main's (0.4: 10000, no field)
    "cp": ("parallelism", "context_parallel_size"),  # main's (0.4: none)
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
VOCAB_MULTIPLE = ("model", "make_vocab_size_divisible_by")
# Flags written into the config in a way of their own (build_config), not by the table.
WRITTEN_OTHERWISE = {
    "run_name": "general.run",
    "checkpoints_path": "checkpoints.checkpoints_path, as <checkpoints_path>/<run_name>",
    "profiler_export_path": "the profiler section, when given",
    "data_stages": "data_stages after the first (nanotron main's), each the first stage's data with its dataset",
}
# Flags that are not the config's: where and how the job runs (the sbatch script), where the bundle goes, what
# the launcher does. `model_size` reaches the config through the shape fields of its preset, `layout auto` through the
# values it chooses (tp, pp, dp, the batch, zero_stage, pp_engine, tp_mode).
NOT_IN_CONFIG = frozenset(
    {"nodes", "gpus_per_node", "cpus_per_node", "partition", "qos", "account", "constraint", "reservation"}
    | {"nodelist", "exclude", "exclusive", "mem", "time_limit", "dependency", "email", "tmp_dir", "export_partition"}
    | {"export_hf"}
    | {
        "pre_launch_commands",
        "extra_env",
        "python",
        "nanotron_dialect",
        "max_requeues",
        "spare_nodes",
        "max_restarts",
        "signal_grace",
        "gpu_type",
        "gpu_memory_gb",
    }
    | {"model_size", "layout"}
    | {"configs_path", "slurm_logs_path", "slurm_scripts_dir", "run_train_script", "resume", "wandb_disabled"}
    | {"keep_last", "keep_every"}  # retention: the job's supervisor's (launcher/node/retention.py)
    | {"checkpoints_remote", "s3_endpoint", "keep_last_remote"}  # the bucket: the supervisor's (launcher/remote/)
    | {"dry_run", "show_logs", "config", "sweep", "plan", "skip_memory_check"}
    | {"preflight", "hang_timeout", "startup_timeout", "hang_factor", "debug", "interactive", "engine", "rdzv_backend"}
    | {"compile_layers"}  # run_train.py's own flag (launcher/train/nanotron_engine/compiled.py)
    | {"container_image", "container_mounts", "container_workdir", "container_env", "container_writable"}
    | {"eval_tasks", "eval_include", "eval_every", "eval_limit", "eval_partition", "eval_gpus", "eval_heldout"}
    | {"eval_time_limit"}
    | {"rank_by"}
)


def get_path(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(tree.get(key), dict):
            tree[key] = {}
        tree = tree[key]
    tree[path[-1]] = value


def flags_from_config(config: dict) -> dict[str, Any]:
    """The launcher flags a nanotron YAML sets (values that are present and not null; `dataset: null`, nanotron's
    random tokens, reads as --dataset none). Either dialect."""
    config = dialect.to_canonical(config)
    values = {flag: get_path(config, path) for flag, path in FLAG_PATHS.items()}
    values["dataset"] = mixture.to_flag(values["dataset"])  # a {name: weight} mixture as --dataset's a:0.7,b:0.3
    section = get_path(config, ("data", "dataset"))
    if nanoset_yaml.is_section(section):  # tokenized folders: --dataset's form too (a, or a:0.7,b:0.3)
        values["dataset"] = mixture.to_flag(nanoset_yaml.datasets_of(section))
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
    + ("data_stages", "metrics_logging", "s3_upload")  # nanotron main's
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
        unknown = "is a section of neither nanotron 0.4's config nor nanotron main's"
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


# How a flag's resolved value is written into the YAML, where that is not the value itself.
TO_YAML: dict[str, Callable[[Any], Any]] = {
    "grad_clip": lambda clip: clip or None,  # 0 disables clipping: nanotron's null
}
# Flags that describe the dataset: with no dataset (random tokens) the whole `data.dataset` section is null.
DATASET_FLAGS = ("dataset", "text_column")
CHECKPOINTS_PATH = ("checkpoints", "checkpoints_path")
# Written where the base (or --config) leaves them out: the positions follow the sequence length; nanotron's warmup
# style has no default its own check takes (None fails it).
POSITIONS = ("model", "model_config", "max_position_embeddings")
WARMUP_STYLE = ("optimizer", "learning_rate_scheduler", "lr_warmup_style")


def build_config(
    values: dict[str, Any],
    base: dict,
    checkpoints_dir: str,
    datasets: mixture.Datasets,
    later: Sequence[Stage],
    nanosets: Mapping[str, TokenizedFolder | None] | None = None,
) -> dict:
    """The canonical nanotron config of a run: `base` (the project's base YAML, or --config laid onto it, in 0.4's
    paths) with every flag of FLAG_PATHS set from `values` (each flag's resolved value by name:
    `RunSpec.flag_values()`), --dataset's value read (`datasets`: a name, a mixture, None for random tokens), the
    later data stages (`later`: --data_stages', which replace a --config's; none keeps the config's), and the
    values that follow from them. In 0.4's paths, main's keys kept: `written` renders each dialect's file.
    `nanosets`: the tokenized folders the stages read (`nanoset.inspect`'s, None where one did not read): a stage
    reading them gets main's Nanoset section (`nanoset_yaml.section`), never merged with a hub dataset's."""
    config = copy.deepcopy(base)
    folders = nanosets or {}
    for flag, path in FLAG_PATHS.items():
        if flag not in DATASET_FLAGS:
            set_path(config, path, TO_YAML.get(flag, _same)(values[flag]))
    vocab, tokenizer = values["vocab_size"], nanoset_yaml.tokenizer_of(folders, values["tokenizer"])
    tail = None  # --eval_heldout tail:N (a malformed N is the eval checks' problem)
    with contextlib.suppress(ValueError):
        tail = nanoset.heldout_tail(values.get("eval_heldout"))
    set_path(config, FLAG_PATHS["tokenizer"], tokenizer)
    current = get_path(config, ("data", "dataset"))
    first = nanoset_yaml.section(datasets, current, folders, vocab, tokenizer, values["text_column"], tail)
    set_path(config, ("data", "dataset"), first)
    set_path(config, ("general", "run"), values["run_name"])
    for path, value in ((POSITIONS, values["max_seq_len"]), (WARMUP_STYLE, "linear")):
        if get_path(config, path) is None:  # (a --config's stands: launcher.config.user_config)
            set_path(config, path, value)
    set_path(config, CHECKPOINTS_PATH, checkpoints_dir)
    if config.get("s3_upload") is not None:  # nanotron main's own uploader (training's rank 0) is never started: the
        config["s3_upload"] = None  # section became --checkpoints_remote, the job's supervisor's (launcher/remote/)
    asked = get_path(config, ("parallelism", "tp_linear_async_communication"))
    written = "0.4" if values.get("nanotron_dialect") == "0.4" else "main"
    if not dialect.tp_async(written, values["tp"] or 1, values["tp_mode"], asked)[0]:
        set_path(config, ("parallelism", "tp_linear_async_communication"), False)
    if later:  # the later stages: the flag's replace a --config's
        head = (dialect.stages_of(config) or [{"name": dialect.STAGE_NAME, "start_training_step": 1}])[0]
        config["data_stages"] = [head, *stages.to_yaml(later, config["data"])]
    for stage in dialect.stages_of(config)[1:]:  # each later stage's section of its own kind (a --config's too)
        data = stage.get("data")
        section = data.get("dataset") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(section, dict):
            own = nanoset_yaml.datasets_of(section)
            data["dataset"] = nanoset_yaml.section(own, section, folders, vocab, tokenizer, None, tail)
    if values["profiler_export_path"]:  # else the base's (or --config's) profiler section stands
        config["profiler"] = {"profiler_export_path": values["profiler_export_path"]}
    return config


def written(config: dict, dialect_name: str, checkpoints_dir: str | None = None) -> dict:
    """The config.yaml of a canonical config (`build_config`'s) in the dialect it is written in, "0.4" or "main"
    (a copy: the canonical config is left as it is); `checkpoints_dir`, where given, is the run's checkpoints
    directory as the bundle has it (a run started afresh beside old checkpoints gets a directory of its own)."""
    if dialect_name == "main":
        out = dialect.to_main(config)
        # RoPE stated, not left to a default: rotate-half (GPT-NeoX / transformers' Llama), the torch engine's model
        out["model"]["model_config"].setdefault("rope_interleaved", False)
    else:
        out = dialect.to_04(config)[0]
    if checkpoints_dir is not None:
        set_path(out, CHECKPOINTS_PATH, checkpoints_dir)
    return out


def _same(value: Any) -> Any:
    return value


def dump(config: dict) -> str:
    """The YAML text of a config (stable key order as built)."""
    return yaml.dump(config, Dumper=YAML_DUMPER, sort_keys=False, default_flow_style=False)


def train_split(config: dict) -> str:
    """The split training reads. nanotron 0.4 accepts a list (it loads each, then trains on "train")."""
    splits = get_path(config, ("data", "dataset", "hf_dataset_splits"))
    if isinstance(splits, list):
        return "train" if "train" in splits or not splits else str(splits[0])
    return splits or "train"
