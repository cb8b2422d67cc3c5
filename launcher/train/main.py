"""The training job's entry (run_train.py calls `run`): read the config, check it, pick an engine, train."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import yaml

from launcher import atomic, checkpoint_layout
from launcher.errors import ConfigError, TrainError
from launcher.nanotron_config import dialect
from launcher.train.environment import JobEnvironment
from launcher.train.record import append as record_attempt
from launcher.train.settings import TrainConfig, check_train_config, load_train_config

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
    flash_attn its attention runs through torch SDPA (launcher.train.nanotron_engine.flash_attn_compat), and the
    reason says so."""
    from launcher.train.nanotron_engine import engine as nanotron_engine  # (lazy: a job imports the one it runs)

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


NANOSET_NANOTRON = (
    "this config names tokenized folders (Nanosets) in nanotron 0.4's dialect, and nanotron 0.4 has no Nanoset: "
    "write it in main's dialect (--nanotron_dialect main) for nanotron main's trainer, or --engine torch"
)
OTHER_NANOTRON = (
    "this config is in nanotron {config}'s dialect, but {found}; nanotron's trainer reads only its own dialect: "
    "run the job with the Python that has nanotron {config} (--python), or --engine torch"
)

COMPILE_IN_TORCH_ENGINE = (
    "compile_layers: the torch engine compiles its decoder layers on GPUs whatever --compile_layers says, and trains "
    "eager on CPUs"
)


def nanotron_mismatch(config_dialect: str) -> str | None:
    """Why this Python's nanotron cannot train a config in `config_dialect` (None: it can, or it is not known)."""
    found, what = dialect.probe(sys.executable)
    return None if found in (None, config_dialect) else OTHER_NANOTRON.format(config=config_dialect, found=what)


def settle_engine(cfg: TrainConfig, chosen: str, why: str, job: JobEnvironment) -> None:
    """One engine per run: a later attempt that would run another engine than the one whose checkpoints the run
    holds fails with the reason, instead of restarting from step 0 beside them. Rank 0 records the engine."""
    recorded = checkpoint_layout.recorded_engine(Path(cfg.checkpoints_path))
    if recorded is not None and recorded != chosen:
        where = "a CUDA GPU with nanotron" if recorded == "nanotron" else "run_train.py --engine torch"
        raise TrainError(
            f"this run's checkpoints ({cfg.checkpoints_path}) were written by the {recorded} engine, but here the "
            f"{chosen} engine would run ({why}); the engines' checkpoints differ, so it would start again from step "
            f"0: run it where the {recorded} engine works ({where}), "
            "or start afresh with --resume false"
        )
    saved, how = dialect.of_checkpoints(Path(cfg.checkpoints_path))
    if saved is not None and saved != cfg.dialect:
        raise TrainError(
            f"this run's checkpoints ({cfg.checkpoints_path}) were written from a nanotron {saved} config ({how}), "
            f"but this config is in {cfg.dialect}'s dialect; a checkpoint does not cross dialects: resume with "
            f"--nanotron_dialect {saved}, or start afresh with --resume false"
        )
    if job.is_main:
        root = Path(cfg.checkpoints_path)
        root.mkdir(parents=True, exist_ok=True)
        for name, value in ((checkpoint_layout.ENGINE_RECORD, chosen), (dialect.RECORD, cfg.dialect)):
            atomic.replace(root / name, f"{value}\n")


def run(config_file: str, engine: str = "auto", compile_layers: bool = False) -> None:
    """Train the run in `config_file` on this process (one of WORLD_SIZE started by torchrun, or alone);
    `compile_layers`: the nanotron engine compiles its decoder layers (the torch engine decides for itself)."""
    job = JobEnvironment.read()  # the job's one look at its environment
    cfg = load_checked(config_file, job.world_size)
    chosen, why = choose_engine(engine)
    nanosets = any(data.nanoset for data in (cfg, *(s.data for s in cfg.stages)))
    if chosen == "nanotron" and nanosets and cfg.dialect != "main":  # main's: fed by nanotron_engine.folders
        if engine != "auto":
            raise TrainError(NANOSET_NANOTRON)
        chosen, why = "torch", f"auto: {NANOSET_NANOTRON}"
    mismatch = nanotron_mismatch(cfg.dialect) if chosen == "nanotron" else None
    if mismatch is not None:
        if engine != "auto":
            raise TrainError(mismatch)
        chosen, why = "torch", f"auto: {mismatch}"
    if job.is_main:
        print(f"engine: {chosen} ({why})", flush=True)
    settle_engine(cfg, chosen, why, job)
    record_attempt(cfg, job, chosen)  # rank 0: what this attempt runs with, in the bundle's runtime record
    if chosen == "nanotron":
        from launcher.train.nanotron_engine import engine as nanotron_engine

        nanotron_engine.train(config_file, cfg, job, compile_layers)
    else:
        if compile_layers and job.is_main:
            print(COMPILE_IN_TORCH_ENGINE, flush=True)
        from launcher.train.torch_engine import engine as torch_engine

        torch_engine.train(cfg, job)
