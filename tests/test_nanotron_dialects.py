"""nanotron 0.4 and nanotron main: the dialect chosen from the job's Python (by its schema, nothing of nanotron
imported), every preset's config in each dialect judged by that dialect's own parser (0.4: the installed PyPI
release; main: the vendored source, in a process of its own), both read back by --config, and what cannot be
written refused before the queue."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import tiny_config
from launcher_helpers import config_of, spec_for
from nanotron_main import judge, python_with_main, source

from launcher.config.validate import validate
from launcher.errors import TrainError
from launcher.nanotron_config import dialect, schema
from launcher.nanotron_config.presets import preset_names
from launcher.train import settings as train_config
from launcher.train.nanotron_engine.compat import import_nanotron_config

PRESET_JOBS = {"70b": ("--nodes", "4"), "13b": ("--nodes", "1"), "7b": ("--nodes", "1"), "8b": ("--nodes", "1")}
LLAMA3 = {"1b", "3b", "8b", "70b"}
# 0.4's tensor-parallel linears are written synchronous (its async backward is wrong: launcher.nanotron_config.dialect
# ASYNC_04), so their inputs are not sequence-sharded: the 70b at micro batch 2 no longer fits an H100 there
PRESET_JOBS_04 = {**PRESET_JOBS, "70b": ("--nodes", "4", "--micro_batch_size", "1", "--grad_accum_steps", "16")}


def write(spec, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "config.yaml"
    path.write_text(schema.dump(config_of(spec, str(where / "ckpt"))))
    return path


def test_every_preset_in_mains_dialect_passes_mains_parser(tmp_path: Path):
    specs, paths = {}, []
    for preset in preset_names():
        spec, problems = spec_for("--model_size", preset, "--nanotron_dialect", "main", *PRESET_JOBS.get(preset, ()))
        assert problems + validate(spec) == [], preset
        specs[preset] = spec
        paths.append(write(spec, tmp_path / preset))
    verdicts = judge(*paths)
    assert len(verdicts) == len(paths)
    for preset, seen in zip(specs, verdicts, strict=True):
        assert "error" not in seen, seen
        m, p = specs[preset].args.model, specs[preset].args.parallelism
        assert seen["model"] == "LlamaConfig" and seen["optimizer"] == "AdamWOptimizerArgs"
        assert (seen["hidden_size"], seen["num_key_value_heads"], seen["vocab_size"]) == (
            m.hidden_size, m.num_kv_heads, m.vocab_size)  # fmt: skip
        assert (seen["dp"], seen["tp"], seen["pp"], seen["cp"]) == (p.dp, p.tp, p.pp, 1)
        assert seen["dp"] * seen["tp"] * seen["pp"] == specs[preset].world_size
        assert seen["rope_theta"] == (500000.0 if preset in LLAMA3 else 10000.0)
        assert seen["rope_interleaved"] is False  # the torch engine's rotate-half, stated
        assert seen["adam"] == [1e-8, 0.9, 0.95] and seen["sequence_length"] == m.max_seq_len
        assert seen["stages"] == [{"name": "stable", "start": 1, "dataset": "stas/openwebtext-10k"}]


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_in_04s_dialect_passes_04s_parser(preset: str, tmp_path: Path):
    spec, problems = spec_for("--model_size", preset, "--nanotron_dialect", "0.4", *PRESET_JOBS_04.get(preset, ()))
    assert problems + validate(spec) == []
    text = write(spec, tmp_path).read_text()
    assert "data_stages" not in text and "optimizer_factory" not in text and "rope_theta" not in text
    config = import_nanotron_config().get_config_from_file(str(tmp_path / "config.yaml"))
    assert config.data.dataset.hf_dataset_or_datasets == "stas/openwebtext-10k"
    assert config.optimizer.adam_beta2 == 0.95
    if preset in LLAMA3:  # 0.4 cannot hold Llama 3's theta: the summary says so, nothing else changes silently
        assert "500000" in spec.adapted["rope_theta"] and spec.args.model.rope_theta == 10000.0


def test_the_dialect_comes_from_the_jobs_python(tmp_path: Path):
    main_python = python_with_main(tmp_path)
    spec, _ = spec_for("--python", str(main_python))
    assert spec.dialect.dialect == "main" and spec.dialect.found == "main"
    assert "main's schema" in spec.dialect.why and str(source()) in spec.dialect.why
    spec, _ = spec_for("--python", sys.executable)  # this Python has PyPI's nanotron 0.4
    assert spec.dialect.dialect == "0.4" and "0.4's schema" in spec.dialect.why
    bare = tmp_path / "python-bare"  # a Python without site-packages: no nanotron at all
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    spec, _ = spec_for("--python", str(bare))
    assert spec.dialect.dialect == dialect.DEFAULT and spec.dialect.found is None
    assert "has no nanotron" in spec.dialect.why and "--nanotron_dialect 0.4" in spec.dialect.why
    spec, _ = spec_for("--python", str(bare), "--nanotron_dialect", "0.4")  # the flag decides
    assert spec.dialect.dialect == "0.4" and spec.dialect.why == "--nanotron_dialect 0.4"
    spec, _ = spec_for("--python", str(main_python), "--nanotron_dialect", "0.4")
    assert spec.dialect.dialect == "0.4" and "says otherwise" in spec.dialect.why
    _, problems = spec_for("--nanotron_dialect", "0.5")
    assert [p.flag for p in problems] == ["nanotron_dialect"]


def test_mains_own_example_loads_through_config_and_is_written_in_both(tmp_path: Path, monkeypatch):
    example = source() / "examples" / "config_tiny_llama.yaml"
    flags_04 = ("--config", str(example), "--nanotron_dialect", "0.4", "--nodes", "1")
    spec, problems = spec_for(*flags_04)
    # its profiler section (0.4 profiles fewer than 10 steps, main 6 or more) and benchmark_csv_path (0.4 asserts
    # NANOTRON_BENCHMARK=1 with it, main does not)
    text = "\n".join(map(str, problems + validate(spec)))
    assert "fewer than 10 steps" in text and "NANOTRON_BENCHMARK" in text
    # the variable as the job's shell gets it (--extra_env is read once, shell-quoted), not the flag's text
    for given, said in (("NANOTRON_BENCHMARK='1'", False), ('A=2 NANOTRON_BENCHMARK="1"', False),
                        ("NANOTRON_BENCHMARK=10", True), ("X_NANOTRON_BENCHMARK=1", True)):  # fmt: skip
        spec, problems = spec_for(*flags_04, "--train_steps", "9", "--extra_env", given)
        assert ("NANOTRON_BENCHMARK" in "\n".join(map(str, problems + validate(spec)))) == said, given
    for written, steps in (("main", "2000"), ("0.4", "9")):
        flags = ("--config", str(example), "--nanotron_dialect", written, "--nodes", "1", "--train_steps", steps)
        flags += ("--extra_env", "NANOTRON_BENCHMARK=1") if written == "0.4" else ()
        spec, problems = spec_for(*flags)
        assert problems + validate(spec) == [], written
        assert (spec.args.model.hidden_size, spec.args.model.num_kv_heads) == (2048, 2)
        assert (spec.args.parallelism.tp, spec.args.training.micro_batch_size) == (2, 3)
        assert spec.args.data.dataset is None  # main's stage has `dataset: null`: random tokens
        assert spec.args.training.min_lr == 1e-5 and spec.args.training.warmup_steps == 2
        path = write(spec, tmp_path / written)
        if written == "main":
            (seen,) = judge(path)
            assert "error" not in seen and seen["tp"] == 2 and seen["adam"] == [1e-8, 0.9, 0.95]
        else:
            monkeypatch.setenv("NANOTRON_BENCHMARK", "1")  # what --extra_env gives the job
            config = import_nanotron_config().get_config_from_file(str(path))
            assert config.parallelism.tp == 2 and config.data.dataset is None


def test_04s_config_written_by_04_itself_loads_and_is_written_in_mains(tmp_path: Path):
    """nanotron 0.4's example configs are made by its own Config.save_as_yaml (examples/config_tiny_llama.py):
    a config saved by 0.4 goes through --config into main's dialect, which main's parser accepts."""
    nc = import_nanotron_config()
    spec, _ = spec_for("--nanotron_dialect", "0.4", "--dataset", "none")
    saved = tmp_path / "saved-by-04.yaml"
    nc.get_config_from_file(str(write(spec, tmp_path / "w"))).save_as_yaml(str(saved))
    again, problems = spec_for("--config", str(saved), "--nanotron_dialect", "main")
    assert problems + validate(again) == []
    (seen,) = judge(write(again, tmp_path / "main"))
    assert "error" not in seen and seen["hidden_size"] == spec.args.model.hidden_size


def test_main_and_04_configs_train_the_same(tmp_path: Path):
    """The job reads either dialect into the same TrainConfig (the torch engine trains from it)."""
    cfgs = {}
    for written in ("0.4", "main"):
        spec, _ = spec_for("--nanotron_dialect", written, "--dataset", "none", "--train_steps", "50")
        cfgs[written] = train_config.load_train_config(str(write(spec, tmp_path / written)))
    same = {"checkpoints_path": "", "dialect": ""}  # where each was written, and in which dialect
    assert dataclasses.replace(cfgs["0.4"], **same) == dataclasses.replace(cfgs["main"], **same)
    assert (cfgs["0.4"].dialect, cfgs["main"].dialect) == ("0.4", "main")
    assert cfgs["main"].adam_beta2 == 0.95 and cfgs["main"].model.rope_theta == 10000.0


def test_other_models_and_experts_are_refused_not_merged(tmp_path: Path):
    qwen_moe = source() / "examples" / "config_qwen_with_moe.yaml"
    _, problems = spec_for("--config", str(qwen_moe))
    text = "\n".join(map(str, problems))
    assert "a Qwen2 model" in text and "will not merge" in text
    llamoe = tmp_path / "llamoe.yaml"  # 0.4's examples/moe: a Llama config with moe_* keys beside it
    llamoe.write_text(
        "model:\n  model_config:\n    is_llama_config: true\n    moe_num_experts: 4\n    num_experts_per_tok: 1\n"
        "parallelism:\n  expert_parallel_size: 2\n"
    )
    _, problems = spec_for("--config", str(llamoe))
    text = "\n".join(map(str, problems))
    assert "mixture-of-experts Llama (moe_num_experts, num_experts_per_tok)" in text
    assert "expert_parallel_size is 2" in text


def test_a_vocabulary_tp_does_not_divide_is_padded_not_refused(tmp_path: Path):
    spec, problems = spec_for("--vocab_size", "50277", "--tp", "2", "--nodes", "1", "--model_size", "small")
    assert problems + validate(spec) == []
    assert spec.padded_vocab == 50278
    config = import_nanotron_config().get_config_from_file(str(write(spec, tmp_path)))
    assert config.model.model_config.vocab_size == 50277  # nanotron pads it at start-up, not the file


def test_what_04_cannot_hold_is_refused_and_cp_is_refused_with_why(tmp_path: Path):
    _, problems = [], None
    spec, problems = spec_for("--nanotron_dialect", "0.4", "--rope_theta", "500000")
    assert [p.flag for p in problems + validate(spec)] == ["rope_theta"]
    main_yaml = tmp_path / "main.yaml"
    main_yaml.write_text("model:\n  model_config:\n    rope_interleaved: false\n    z_loss_enabled: true\n")
    spec, problems = spec_for("--config", str(main_yaml), "--nanotron_dialect", "0.4")
    text = "\n".join(map(str, problems + validate(spec)))
    assert "rope_interleaved: False is nanotron main's" in text and "z_loss_enabled" in text
    spec, problems = spec_for("--config", str(main_yaml), "--nanotron_dialect", "main")
    assert problems + validate(spec) == []
    spec, problems = spec_for("--cp", "2", "--nanotron_dialect", "main", "--nodes", "1")
    found = problems + validate(spec)
    assert [p.flag for p in found] == ["cp"] and "ring attention" in found[0].message
    assert spec.args.parallelism.dp == 4  # 8 GPUs / cp 2: cp is part of the world size


def test_a_main_config_with_stages_keeps_them(tmp_path: Path):
    staged = tmp_path / "staged.yaml"
    stage = {"data": {"dataset": None, "seed": 1, "num_loading_workers": 1}}
    staged.write_text(yaml.safe_dump({"data_stages": [
        {"name": "warm", "start_training_step": 1, **stage}, {"name": "anneal", "start_training_step": 90, **stage},
    ]}))  # fmt: skip
    spec, problems = spec_for("--config", str(staged), "--nanotron_dialect", "main", "--train_steps", "100")
    assert problems + validate(spec) == []
    (seen,) = judge(write(spec, tmp_path / "out"))
    assert [(s["name"], s["start"]) for s in seen["stages"]] == [("warm", 1), ("anneal", 90)]
    spec, problems = spec_for("--config", str(staged), "--nanotron_dialect", "0.4", "--train_steps", "100")
    assert "data_stages.anneal" in "\n".join(map(str, problems + validate(spec)))


def test_a_run_does_not_resume_across_dialects(tmp_path: Path):
    """Refused before the queue where the launcher sees the checkpoints (the job's record, else nanotron's own
    checkpoint format), and by the job itself where it does not."""
    from launcher.slurm import checks
    from launcher.train.environment import JobEnvironment
    from launcher.train.main import settle_engine

    flags = ("--checkpoints_path", str(tmp_path / "ckpt"), "--dataset", "none")
    spec, _ = spec_for(*flags, "--nanotron_dialect", "main")
    run = tmp_path / "ckpt" / "t"
    assert checks.resume_problems(spec) == []  # nothing saved yet
    (run / "40").mkdir(parents=True)
    (run / "latest.txt").write_text("40")
    (run / "40" / dialect.METADATA).write_text('{"version": "1.2", "tp": 1, "dp": 1}')  # what nanotron 0.4 writes
    (problem,) = checks.resume_problems(spec)
    assert problem.flag == "nanotron_dialect" and "format 1.2" in problem.message and "0.4" in problem.fix
    spec04, _ = spec_for(*flags, "--nanotron_dialect", "0.4")
    assert checks.resume_problems(spec04) == []
    assert checks.resume_problems(spec_for(*flags, "--nanotron_dialect", "main", "--resume", "false")[0]) == []
    # the job: a main config on 0.4's checkpoints stops with the reason, before training
    cfg = train_config.load_train_config(str(write(spec, tmp_path / "bundle")))
    cfg = dataclasses.replace(cfg, checkpoints_path=str(run))
    with pytest.raises(Exception, match="does not cross dialects"):
        settle_engine(cfg, "nanotron", "requested", JobEnvironment())
    (run / dialect.RECORD).write_text("main\n")  # the record, once a job wrote it, is what counts
    assert checks.resume_problems(spec) == [] and len(checks.resume_problems(spec04)) == 1


def _train(config: dict, where: Path, monkeypatch: pytest.MonkeyPatch, engine: str = "torch") -> list[float]:
    from launcher.train.main import run

    where.mkdir()
    config = {**config, "checkpoints": {**config["checkpoints"], "checkpoints_path": str(where / "ckpt")}}
    path = where / "config.yaml"
    path.write_text(schema.dump(config))
    monkeypatch.setenv("LAUNCHER_BUNDLE", str(where))  # its metrics.jsonl
    run(str(path), engine)
    lines = (where / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_the_torch_engine_trains_either_dialect_to_the_same_losses(demo_data, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for name in ("LAUNCHER_BUNDLE", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_config(demo_data, tmp_path / "unused", **{"tokens.train_steps": 6})
    main = dialect.to_main(config)
    main["model"]["model_config"]["rope_interleaved"] = False
    losses = {"0.4": _train(config, tmp_path / "04", monkeypatch), "main": _train(main, tmp_path / "main", monkeypatch)}
    assert len(losses["0.4"]) == 6 and losses["0.4"] == losses["main"]
    with pytest.raises(TrainError, match="in nanotron main's dialect, but .* has nanotron at .* with 0.4's schema"):
        _train(main, tmp_path / "nanotron", monkeypatch, engine="nanotron")  # this Python's nanotron is 0.4
    main["model"]["model_config"]["rope_interleaved"] = True  # the field is read: another model, other losses
    assert _train(main, tmp_path / "interleaved", monkeypatch) != losses["main"]
