"""Every config the launcher writes is judged by nanotron's own parser (through the compatibility shim)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from launcher_helpers import config_of, spec_for

from launcher.config.validate import validate
from launcher.nanotron_config import schema
from launcher.nanotron_config.presets import preset_names
from launcher.train import settings as train_config
from launcher.train.nanotron_engine.compat import import_nanotron_config

PRESET_JOBS = {"70b": ("--nodes", "4"), "13b": ("--nodes", "1"), "7b": ("--nodes", "1"), "8b": ("--nodes", "1")}


@pytest.fixture(scope="module")
def nanotron_config():
    return import_nanotron_config()


def write(spec, tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(schema.dump(config_of(spec, str(tmp_path / "ckpt"))))
    return path


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_passes_nanotrons_parser(preset: str, tmp_path: Path, nanotron_config):
    spec, problems = spec_for("--model_size", preset, *PRESET_JOBS.get(preset, ()))
    assert problems == []
    config = nanotron_config.get_config_from_file(str(write(spec, tmp_path)))
    m = spec.args.model
    assert config.model.model_config.hidden_size == m.hidden_size
    assert config.model.model_config.num_key_value_heads == m.num_kv_heads
    p = config.parallelism
    assert p.dp * p.tp * p.pp == spec.world_size
    assert config.tokens.sequence_length == m.max_seq_len
    assert config.optimizer.learning_rate_scheduler.lr_warmup_style == "linear"
    assert str(config.checkpoints.checkpoints_path) == str(tmp_path / "ckpt")


def test_round_trip_to_train_config(tmp_path: Path):
    spec, _ = spec_for(
        "--nodes",
        "1",
        "--gpus_per_node",
        "4",
        "--tp",
        "2",
        "--train_steps",
        "50",
        "--warmup_steps",
        "5",
        "--dataset",
        "none",
    )
    cfg = train_config.load_train_config(str(write(spec, tmp_path)))
    assert (cfg.dp, cfg.tp, cfg.pp) == (2, 2, 1)
    assert cfg.dataset is None and cfg.train_steps == 50
    assert cfg.lr.decay_steps == 45 and cfg.lr.decay_starting_step == 5
    assert cfg.global_batch_size == 2 * 8 * 2


@pytest.mark.parametrize(
    ("splits", "trained"), [(None, "train"), ("validation", "validation"), (["test", "train"], "train"), (["x"], "x")]
)
def test_the_split_training_reads(splits: object, trained: str, tmp_path: Path):
    """nanotron 0.4 takes hf_dataset_splits as a name or a list (then it trains on "train")."""
    spec, _ = spec_for("--dataset", "some/hub-dataset")
    config = yaml.safe_load(write(spec, tmp_path).read_text())
    config["data"]["dataset"]["hf_dataset_splits"] = splits
    assert train_config.to_train_config(config).dataset_split == trained


def test_config_flag_starts_from_a_yaml_and_flags_win(tmp_path: Path, nanotron_config):
    spec, _ = spec_for("--model_size", "small", "--nodes", "1", "--learning_rate", "1e-3")
    first = write(spec, tmp_path)
    spec2, problems = spec_for("--config", str(first), "--nodes", "2", "--train_steps", "77")
    assert problems == []
    assert spec2.args.model.hidden_size == 768  # from the YAML, not the default tiny preset
    assert spec2.args.training.learning_rate == 1e-3
    assert spec2.args.training.train_steps == 77
    assert spec2.args.parallelism.dp == 16  # re-derived for the new job size
    (tmp_path / "second").mkdir()
    config = nanotron_config.get_config_from_file(str(write(spec2, tmp_path / "second")))
    assert config.parallelism.dp == 16 and config.tokens.train_steps == 77


def test_unreadable_config_is_a_problem(tmp_path: Path):
    _, problems = spec_for("--config", str(tmp_path / "nope.yaml"))
    assert [p.flag for p in problems] == ["config"]


def test_nanotron_engine_resumes_from_the_runs_own_checkpoints(tmp_path: Path, nanotron_config):
    """nanotron 0.4 resumes only from resume_checkpoint_path, which a generated config leaves empty: once the run
    has a checkpoint (nanotron's latest.txt), the engine hands nanotron a copy that points there."""
    from launcher.train.environment import JobEnvironment
    from launcher.train.nanotron_engine.engine import resumable_config

    spec, _ = spec_for("--model_size", "tiny")
    original = write(spec, tmp_path)
    job = JobEnvironment(tmp_dir=str(tmp_path))
    assert resumable_config(str(original), job) == str(original)  # nothing saved yet: a fresh start

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest.txt").write_text("120")
    derived = resumable_config(str(original), job)
    assert derived != str(original) and original.read_text() == write_text_of(spec, tmp_path)  # bundle untouched
    config = nanotron_config.get_config_from_file(derived)
    assert str(config.checkpoints.resume_checkpoint_path) == str(tmp_path / "ckpt")
    before, after = yaml.safe_load(original.read_text()), yaml.safe_load(Path(derived).read_text())
    before["checkpoints"]["resume_checkpoint_path"] = str(tmp_path / "ckpt")
    assert before == after  # nothing else differs

    # a config that starts from a given checkpoint (fine-tuning): the run's own checkpoints win once they exist,
    # so a requeue continues rather than starting over from the given one
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(original.read_text().replace("resume_checkpoint_path: null", "resume_checkpoint_path: /x/50"))
    derived = resumable_config(str(pinned), job)
    assert yaml.safe_load(Path(derived).read_text())["checkpoints"]["resume_checkpoint_path"] == str(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "latest.txt").unlink()
    assert resumable_config(str(pinned), job) == str(pinned)  # before that, the given one stands


def write_text_of(spec, tmp_path: Path) -> str:
    return schema.dump(config_of(spec, str(tmp_path / "ckpt")))


def test_partial_config_is_completed_from_the_base(tmp_path: Path, nanotron_config):
    partial = tmp_path / "partial.yaml"
    partial.write_text(
        "tokens:\n  train_steps: 123\noptimizer:\n  learning_rate_scheduler:\n    learning_rate: 0.001\n"
    )
    spec, problems = spec_for("--config", str(partial), "--dataset", "none")
    assert problems == []
    assert spec.args.training.train_steps == 123 and spec.args.training.learning_rate == 0.001
    assert spec.args.training.grad_clip == 1.0  # absent from the YAML: the base's, not "no clipping"
    (tmp_path / "out").mkdir()
    config = nanotron_config.get_config_from_file(str(write(spec, tmp_path / "out")))
    assert config.tokens.train_steps == 123 and config.optimizer.clip_grad == 1.0


def test_ill_typed_config_is_reported_not_raised(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model:\n  model_config:\n    hidden_size: big\n"
        "optimizer:\n  learning_rate_scheduler:\n    learning_rate: 3e-4\n"  # PyYAML: text, not a number
        "datas: []\n"  # a section of no nanotron
        "data:\n  dataset:\n    hf_dataset_or_datasets: [a, b]\n"  # a list: nanotron's get_datasets raises on it
    )
    spec, problems = spec_for("--config", str(bad))
    problems += validate(spec)
    text = "\n".join(map(str, problems))
    assert {p.flag for p in problems} == {"config"}, text
    assert "model.model_config.hidden_size is 'big'" in text and "write 3.0e-4" in text
    # the shape check and the type check both find these values: each is said once (Problem.key)
    assert text.count("model.model_config.hidden_size is") == 1 and text.count("learning_rate is") == 1, text
    assert "datas is a section of neither" in text and "or a mixture {name: weight}" in text
    # a flag replaces the YAML's value, so that value is no longer a problem
    spec, problems = spec_for("--config", str(bad), "--hidden_size", "128", "--learning_rate", "1e-3")
    assert "hidden_size" not in "\n".join(map(str, problems)) and "3.0e-4" not in "\n".join(map(str, problems))


def test_config_dataset_null_means_random_tokens(tmp_path: Path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("data:\n  dataset: null\n  seed: 1\n")
    spec, problems = spec_for("--config", str(yaml_file))
    assert problems == [] and spec.args.data.dataset is None


def test_a_typed_preset_wins_over_the_configs_shape(tmp_path: Path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("model:\n  model_config:\n    hidden_size: 128\n    num_hidden_layers: 3\n")
    spec, _ = spec_for("--config", str(yaml_file), "--dataset", "none")
    assert (spec.args.model.hidden_size, spec.args.model.num_layers) == (128, 3)  # the YAML over the default preset
    spec, _ = spec_for("--config", str(yaml_file), "--dataset", "none", "--model_size", "small")
    assert (spec.args.model.hidden_size, spec.args.model.num_layers) == (768, 12)  # the preset you typed


def test_config_sections_nanotron_types_as_unions_or_nulls(tmp_path: Path, nanotron_config):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(
        "model:\n  init_method:\n    path: /ckpt/pretrained\n"  # {path} replaces the base's {std}, never both
        "optimizer: null\n"  # a null section keeps the base's: the launcher writes into it
        "parallelism:\n  tp: 2\n"
        "profiler:\n  profiler_export_path: /tmp/prof\n"
    )
    flags = ("--config", str(yaml_file), "--dataset", "none", "--model_size", "small", "--nodes", "1")
    spec, problems = spec_for(*flags)
    assert [p.flag for p in problems + validate(spec)] == ["config"]  # nanotron profiles fewer than 10 steps
    spec, problems = spec_for(*flags, "--train_steps", "5", "--warmup_steps", "1")
    assert problems + validate(spec) == []
    assert spec.args.parallelism.tp == 2  # a typed preset replaces the YAML's shape, not its parallelism
    (tmp_path / "out").mkdir()
    config = nanotron_config.get_config_from_file(str(write(spec, tmp_path / "out")))
    assert str(config.model.init_method.path) == "/ckpt/pretrained"
    assert config.optimizer.zero_stage == 0 and str(config.profiler.profiler_export_path) == "/tmp/prof"
    # the torch engine cannot start from nanotron weights: it says so instead of training from random ones
    cfg = train_config.load_train_config(str(tmp_path / "out" / "config.yaml"))
    assert cfg.init_path == "/ckpt/pretrained"


def test_config_data_null_means_random_tokens(tmp_path: Path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("data: null\n")
    spec, problems = spec_for("--config", str(yaml_file))
    assert problems == [] and spec.args.data.dataset is None
