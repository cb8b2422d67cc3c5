"""What the training job needs to know about a run, and how it reads that from the run's nanotron YAML.

`load_train_config(path)` reads a nanotron config, in 0.4's dialect or main's (`launcher.nanotron_config.dialect`),
into a `TrainConfig`; the engines (`launcher.train.torch_engine.engine`, `launcher.train.nanotron_engine.engine`)
consume only this. `check_train_config` holds the config to the launcher's own layout rules
(`launcher.nanotron_config.parallel`) against the processes torchrun actually started.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import yaml

from launcher.nanotron_config import nanoset_yaml
from launcher.nanotron_config.dialect import is_main, stages_of, to_canonical
from launcher.nanotron_config.mixture import to_flag
from launcher.nanotron_config.parallel import ParallelDims, check_layout
from launcher.nanotron_config.schema import VOCAB_MULTIPLE, get_path, train_split
from launcher.nanotron_config.shape import ModelShape, from_model_config
from launcher.problems import Problem


@dataclass(frozen=True)
class LRSchedule:
    """nanotron's LRSchedulerArgs, resolved (no None left but the optional phases)."""

    learning_rate: float
    min_decay_lr: float
    warmup_steps: int
    warmup_style: str  # "linear" | "constant"
    decay_style: str  # "linear" | "cosine"
    decay_steps: int
    decay_starting_step: int


@dataclass(frozen=True)
class DataStage:
    """A data stage after the first (nanotron main's): from step `start` on, training reads `data`'s dataset."""

    name: str
    start: int  # nanotron's start_training_step
    data: TrainConfig  # the run's config with the stage's data fields (dataset, mixture, split, column, seed)


@dataclass(frozen=True)
class TrainConfig:
    """Everything an engine reads from a run's config file."""

    project: str
    run_name: str
    seed: int
    model: ModelShape
    init_std: float
    dtype: str  # "bfloat16" | "float32" | "float16"
    dp: int
    tp: int
    pp: int
    sequence_length: int
    micro_batch_size: int
    grad_accum_steps: int  # nanotron: batch_accumulation_per_replica
    train_steps: int
    lr: LRSchedule
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float | None
    dataset: str | None  # a save_to_disk directory, a data file, a hub name, or a mixture's a:0.7,b:0.3; None -> random
    dataset_split: str
    dataset_config_name: str | None
    text_column: str
    tokenizer: str | None
    data_seed: int
    num_loading_workers: int
    checkpoints_path: str
    checkpoint_interval: int
    save_initial_state: bool
    resume_checkpoint_path: str | None
    log_interval: int  # nanotron: logging.iteration_step_info_interval
    init_path: str | None = None  # nanotron: model.init_method.path, weights of a nanotron checkpoint
    dialect: str = "0.4"  # the nanotron config dialect the file is written in: "0.4" or "main"
    mixture: tuple[tuple[str, float], ...] = ()  # a mixture's (dataset, fraction of its rows kept); () for one dataset
    nanoset: tuple[tuple[str, float], ...] = ()  # tokenized folders (main's Nanoset) with their weights; () for none
    nanoset_caps: tuple[int | None, ...] = ()  # each folder's dataset_max_tokens (tokens read at most); () for none
    stages: tuple[DataStage, ...] = ()  # nanotron main's data stages after the first, by start step

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step across all data-parallel replicas."""
        return self.micro_batch_size * self.grad_accum_steps * self.dp


def _require(tree: dict, path: tuple[str, ...], default: Any = None) -> Any:
    value = get_path(tree, path)
    return default if value is None else value


def padded_vocab(vocab: int, tp: int, multiple: int) -> int:
    """The vocabulary nanotron builds: padded to a multiple of tp x make_vocab_size_divisible_by."""
    step = max(tp, 1) * max(multiple, 1)
    return -(-vocab // step) * step


def to_train_config(config: dict) -> TrainConfig:
    """A nanotron config dict, 0.4's dialect or main's, as the engine's TrainConfig (missing optional values get
    nanotron's defaults)."""
    written = "main" if is_main(config) else "0.4"
    config = to_canonical(config)
    mc = config["model"]["model_config"]
    lrs = config["optimizer"]["learning_rate_scheduler"]
    tokens = config["tokens"]
    warmup = lrs.get("lr_warmup_steps") or 0
    decay_start = lrs.get("lr_decay_starting_step")
    decay_steps = lrs.get("lr_decay_steps")
    if decay_steps is None:  # nanotron's Config.__post_init__ fills it before its scheduler sees it: T - W
        decay_steps = tokens["train_steps"] - warmup
    built = TrainConfig(
        project=config["general"]["project"],
        run_name=config["general"].get("run") or "run",
        seed=_require(config, ("general", "seed"), 42),
        model=dataclasses.replace(
            from_model_config(mc),
            vocab_size=padded_vocab(mc["vocab_size"], config["parallelism"]["tp"], _require(config, VOCAB_MULTIPLE, 1)),
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
        **_data(config.get("data")),
        tokenizer=get_path(config, ("tokenizer", "tokenizer_name_or_path")),
        checkpoints_path=str(config["checkpoints"]["checkpoints_path"]),
        checkpoint_interval=config["checkpoints"]["checkpoint_interval"],
        save_initial_state=bool(config["checkpoints"].get("save_initial_state")),
        resume_checkpoint_path=config["checkpoints"].get("resume_checkpoint_path"),
        log_interval=_require(config, ("logging", "iteration_step_info_interval"), 1),
        init_path=get_path(config, ("model", "init_method", "path")),
        dialect=written,
    )
    later = tuple(
        DataStage(str(s.get("name")), int(s["start_training_step"]), dataclasses.replace(built, **_data(s.get("data"))))
        for s in stages_of(config)[1:]
    )
    return dataclasses.replace(built, stages=later)


def _data(data: dict | None) -> dict[str, Any]:
    """A `data` section's (0.4's, or a main stage's) TrainConfig fields."""
    data = data if isinstance(data, dict) else {}
    dataset = data.get("dataset")
    if isinstance(dataset, dict) and nanoset_yaml.is_section(
        dataset
    ):  # tokenized folders: their names and weights, read by either engine
        folders = nanoset_yaml.datasets_of(dataset)
        pairs = tuple(folders.items()) if isinstance(folders, dict) else ((str(folders), 1.0),)
        caps = tuple(nanoset_yaml.caps_of(dataset).get(name) for name, _ in pairs)
        dataset = {"hf_dataset_or_datasets": to_flag(folders)}
    else:
        pairs, caps = (), ()
    return {
        "nanoset": pairs,
        "nanoset_caps": caps,
        "dataset": to_flag(dataset["hf_dataset_or_datasets"]) if dataset else None,
        "mixture": () if pairs else _mixture(dataset["hf_dataset_or_datasets"] if dataset else None),
        "dataset_split": train_split({"data": data}),
        "dataset_config_name": (dataset or {}).get("hf_dataset_config_name"),
        "text_column": (dataset or {}).get("text_column_name") or "text",
        "data_seed": 42 if data.get("seed") is None else data["seed"],
        "num_loading_workers": 1 if data.get("num_loading_workers") is None else data["num_loading_workers"],
    }


def _mixture(value: Any) -> tuple[tuple[str, float], ...]:
    """nanotron's {name: fraction} mixture as pairs in the file's order; () for one dataset."""
    return tuple((str(name), float(weight)) for name, weight in value.items()) if isinstance(value, dict) else ()


def load_train_config(path: str) -> TrainConfig:
    """Read a nanotron YAML file into a TrainConfig."""
    with open(path, encoding="utf-8") as f:
        return to_train_config(yaml.safe_load(f))


def check_train_config(cfg: TrainConfig, world_size: int) -> list[Problem]:
    """The training job's start-up check: the launcher's layout rules, against the processes actually started."""
    dims = ParallelDims(world_size, cfg.dp, cfg.tp, cfg.pp, cfg.grad_accum_steps, started=True)
    return check_layout(cfg.model, dims)
