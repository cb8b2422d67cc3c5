"""The training job's entry (run_train.py calls `run`): read the config, check it, pick an engine, train."""

from __future__ import annotations

import os

import torch
import yaml

from launcher.errors import ConfigError, TrainError
from launcher.train.config import TrainConfig, check_train_config, load_train_config

ENGINES = ("auto", "torch", "nanotron")


def load_checked(config_file: str, world_size: int) -> TrainConfig:
    """The config file as a TrainConfig, after the launcher's own checks against the processes started."""
    try:
        cfg = load_train_config(config_file)
    except OSError as e:
        raise ConfigError(f"cannot read config file {config_file}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {config_file} is not valid YAML: {e}") from None
    except (KeyError, TypeError) as e:
        raise ConfigError(f"config file {config_file} is not a complete nanotron 0.4 config: missing {e}") from None
    problems = check_train_config(cfg, world_size)
    if problems:
        lines = [
            f"config {config_file} cannot train with {world_size} process(es):",
            *(f"  - {p}" for p in problems),
        ]
        raise ConfigError("\n".join(lines))
    return cfg


def choose_engine(requested: str) -> tuple[str, str]:
    """The engine to run and why: `auto` takes nanotron where it can run (CUDA, NCCL, nanotron); without
    flash_attn its attention runs through torch SDPA (launcher.train.flash_attn_compat), and the reason says so."""
    from launcher.train import nanotron_engine  # (lazy, as each engine below: a job imports the one it runs)

    if requested not in ENGINES:
        raise TrainError(f"unknown engine {requested!r}: use one of {', '.join(ENGINES)}")
    if requested != "auto":
        return requested, "requested"
    if not torch.cuda.is_available():  # checked first: on CPU nothing else needs importing
        return "torch", "auto: no CUDA GPU, so no nanotron"
    lacking = nanotron_engine.missing()
    if lacking:
        return "torch", f"auto: nanotron needs {', '.join(lacking)}"
    return "nanotron", f"auto; {nanotron_engine.attention_note()}"


def run(config_file: str, engine: str = "auto") -> None:
    """Train the run in `config_file` on this process (one of WORLD_SIZE started by torchrun, or alone)."""
    cfg = load_checked(config_file, int(os.environ.get("WORLD_SIZE", "1")))
    chosen, why = choose_engine(engine)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"engine: {chosen} ({why})", flush=True)
    if chosen == "nanotron":
        from launcher.train import nanotron_engine

        nanotron_engine.train(config_file, cfg)
    else:
        from launcher.train import torch_engine

        torch_engine.train(cfg)
