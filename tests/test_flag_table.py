"""One table maps the launcher's flags to nanotron's YAML (launcher.nanotron_config.schema.FLAG_PATHS), and both
directions read it: every mapped flag, given a value that is not its default, lands at its path in the written config,
and `--config` of that config gives the flag back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from launcher_helpers import config_of, spec_for

from launcher.config.flags import LaunchArgs, flag_names
from launcher.nanotron_config import dialect, schema

# A value for every mapped flag that differs from the flag's (and the tiny preset's) default.
NON_DEFAULT = {
    "project": "proj-x",
    "seed": 7,
    "dp": 4,
    "tp": 2,
    "pp": 2,
    "zero_stage": 1,
    "pp_engine": "afab",
    "tp_mode": "ALL_REDUCE",
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_layers": 4,
    "num_heads": 8,
    "num_kv_heads": 4,
    "vocab_size": 1024,
    "max_seq_len": 256,
    "tokenizer": "org/tok",
    "save_interval": 77,
    "save_initial_state": True,
    "log_interval": 5,
    "train_steps": 1234,
    "micro_batch_size": 3,
    "grad_accum_steps": 5,
    "weight_decay": 0.05,
    "grad_clip": 0.5,
    "learning_rate": 1e-3,
    "min_lr": 1e-5,
    "warmup_steps": 17,
    "lr_decay_style": "linear",
    "dataset": "org/data",
    "text_column": "content",
    "rope_theta": 500000.0,  # nanotron main's (0.4 has no field)
    "cp": 2,  # nanotron main's
}
MAIN_ONLY = {"rope_theta", "cp"}
NOT_FLAGS = {"tie_word_embeddings"}  # in the table (read from --config), derived from the preset, not a flag
# dp is derived from the job's size on every launch, whatever job a --config YAML was written for
DERIVED_ON_LAUNCH = {"dp"}


def test_every_flag_is_mapped_or_said_to_be_elsewhere():
    mapped = set(schema.FLAG_PATHS) - NOT_FLAGS
    elsewhere = set(schema.WRITTEN_OTHERWISE) | schema.NOT_IN_CONFIG
    assert not mapped & elsewhere
    assert mapped | elsewhere == set(flag_names())  # a new flag, or a deleted row, must be placed on purpose
    assert set(NON_DEFAULT) == mapped


def _default(flag: str) -> object:
    args = LaunchArgs(run_name="t")
    return next(getattr(getattr(args, g), flag) for g in vars(args) if hasattr(getattr(args, g), flag))


@pytest.mark.parametrize("flag", sorted(NON_DEFAULT))
def test_a_flag_reaches_its_path_and_comes_back(flag: str, tmp_path: Path):
    value = NON_DEFAULT[flag]
    dialect_flags = ("--nanotron_dialect", "main") if flag in MAIN_ONLY else ()
    spec, _ = spec_for("--dataset", "org/base-data", f"--{flag}", str(value), *dialect_flags)
    assert getattr(spec.args, next(g for g in vars(spec.args) if hasattr(getattr(spec.args, g), flag))) is not None
    assert value != _default(flag) and spec.flag_values()[flag] == value
    config = config_of(spec, str(tmp_path / "ckpt"))
    assert schema.get_path(dialect.to_canonical(config), schema.FLAG_PATHS[flag]) == value
    written = tmp_path / "config.yaml"
    written.write_text(schema.dump(config))
    again, _ = spec_for("--config", str(written), *dialect_flags)
    expected = spec.world_size if flag in DERIVED_ON_LAUNCH else value  # tp = pp = cp = 1: dp fills the job
    assert again.flag_values()[flag] == expected


def test_no_clipping_and_no_dataset_are_nanotrons_nulls(tmp_path: Path):
    spec, _ = spec_for("--dataset", "none", "--grad_clip", "0")
    config = config_of(spec, str(tmp_path / "ckpt"))
    assert config["optimizer"]["clip_grad"] is None and config["data"]["dataset"] is None
    written = tmp_path / "config.yaml"
    written.write_text(yaml.safe_dump(config))
    again, _ = spec_for("--config", str(written))
    assert again.args.training.grad_clip == 0.0 and again.args.data.dataset is None
