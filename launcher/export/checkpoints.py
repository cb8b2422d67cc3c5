"""Which checkpoint an export reads: the step (asked for, else the newest complete one), the engine that wrote it,
nanotron's dialect and the model's shape; refused by name where it is incomplete, missing or not a Llama.

The checkpoints folder's layout is launcher/checkpoint_layout.py's; a nanotron step's weights are
<step>/model/.../model_<param>[_pp-rank-P-of-PP_tp-rank-T-of-TP].safetensors.

Standard library and PyYAML only: a login node finds and refuses without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.errors import LauncherError
from launcher.nanotron_config import dialect as dialects
from launcher.nanotron_config.shape import ModelShape, from_model_config


class ExportError(LauncherError):
    """A checkpoint the export cannot read into a transformers Llama; nothing is written."""


class CheckpointIncomplete(ExportError):
    """The step's checkpoint is being written, or was cut short."""


class StepNotFound(ExportError):
    """No checkpoint of the run has the step asked for (or it has none)."""


class ShardsMissing(ExportError):
    """A complete-looking checkpoint lacks shards or parameters of the model."""


class UnknownModel(ExportError):
    """The checkpoint holds a model the export does not know (not a dense Llama: MoE, Qwen2, ...)."""


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint, as the export reads it."""

    directory: Path  # <checkpoints_path>/<step>
    step: int
    engine: str  # "torch" | "nanotron"
    dialect: str  # the config's: "0.4" | "main"
    config: dict  # the run's nanotron config (the step's own for nanotron, else the bundle's)
    shape: ModelShape
    rope_interleaved: bool  # whether the engine rotated q and k by interleaved pairs (GPT-J), not halves

    @property
    def tokenizer(self) -> str | None:
        return ((self.config.get("tokenizer") or {}).get("tokenizer_name_or_path")) or None

    def with_vocabulary(self, tokens: int) -> Checkpoint:
        """This checkpoint as exported with the tokenizer's `tokens` rows of the embedding (and lm_head): the rows
        beyond them, the launcher's rounding and the engine's padding, are never a token's."""
        if tokens > self.shape.vocab_size:
            raise ExportError(
                f"the run's tokenizer {self.tokenizer} has {tokens} tokens, more than the model's "
                f"{self.shape.vocab_size} rows: not the tokenizer the run trained with; point the run's config at "
                "that one"
            )
        return dataclasses.replace(self, shape=dataclasses.replace(self.shape, vocab_size=tokens))


def choose_step(root: Path, step: int | None) -> tuple[int, str]:
    """(step, engine): the step asked for, or the newest complete one; a named refusal otherwise."""
    steps = ckpt.complete_steps(root)
    if step is None:
        if not steps:
            leftover = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
            raise StepNotFound(
                f"{root} holds no complete checkpoint"
                + (f" (it holds: {', '.join(leftover[:8])})" if leftover else " (it does not exist or is empty)")
                + "; export once the run has saved one (--checkpoint_interval), or give the bundle of a run that has"
            )
        step = max(steps)
    if step not in steps:
        why = ckpt.in_progress(root, step)
        if why is not None:
            raise CheckpointIncomplete(f"checkpoint step {step} is not complete: {why}; wait for the save to end, "
                                       f"or export a complete step ({_listed(steps)})")  # fmt: skip
        raise StepNotFound(f"--step {step}: the run has no checkpoint at step {step} in {root}; its complete "
                           f"checkpoints: {_listed(steps)}")  # fmt: skip
    return step, steps[step]


def _listed(steps: dict[int, str]) -> str:
    return ", ".join(map(str, sorted(steps))) or "none"


def read_config(path: Path) -> dict:
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ExportError(f"cannot read the run's config {path}: {e}") from None
    if not isinstance(config, dict):
        raise ExportError(f"{path} is not a nanotron config (not a mapping)")
    return config


def model_of(config: dict, where: Path) -> tuple[ModelShape, dict]:
    """The config's Llama shape and its model_config; UnknownModel for anything else."""
    model_config = ((config.get("model") or {}).get("model_config")) or {}
    if not isinstance(model_config, dict) or not model_config:
        raise UnknownModel(f"{where} names no model.model_config: not a model the export knows")
    for key in ("moe_config", "is_qwen2_config", "num_experts", "moe_layers"):
        if model_config.get(key):
            raise UnknownModel(
                f"{where}: model_config.{key} is set: a mixture-of-experts or non-Llama model, which the export does "
                "not know (it writes dense Llama models only)"
            )
    try:
        return from_model_config(model_config), model_config
    except (KeyError, TypeError, ValueError) as e:
        raise UnknownModel(f"{where}: model_config lacks {e} of a Llama's shape: not a model the export knows") from e


def find(root: Path, step: int | None, run_config: Path) -> Checkpoint:
    """The checkpoint to export from `root`, with the shape and RoPE layout its engine trained."""
    chosen, engine = choose_step(root, step)
    directory = root / str(chosen)
    own = directory / P.CONFIG
    config_path = own if engine == "nanotron" and own.is_file() else run_config
    config = read_config(config_path)
    shape, model_config = model_of(config, config_path)
    if config_path != run_config and run_config.is_file():
        # nanotron saves the padded vocabulary as vocab_size (make_vocab_size_divisible_by x tp): the run's own
        # config has the tokenizer's
        vocab = model_of(read_config(run_config), run_config)[0].vocab_size
        if vocab < shape.vocab_size:
            shape = dataclasses.replace(shape, vocab_size=vocab)
    dialect = "main" if dialects.is_main(config) else "0.4"
    if engine == "nanotron":
        # 0.4's Llama always rotates interleaved pairs; main's as rope_interleaved says (default false)
        interleaved = dialect == "0.4" or bool(model_config.get("rope_interleaved", False))
    else:  # the torch engine: as its model read the config (a 0.4 config rotates halves there)
        interleaved = shape.rope_interleaved
    return Checkpoint(directory, chosen, engine, dialect, config, shape, interleaved)
