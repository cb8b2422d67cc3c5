"""Data stages from flags: `--data_stages "anneal@900=/data/hq"` written as nanotron main's `data_stages` (its own
parser judges them), refused by name for nanotron 0.4, every problem named at once, listed by the summary and the
manifest, and switched by the torch engine at the stage's first step, exactly across a resume."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import bundle_of, tiny_config, write_config
from launcher_helpers import all_problems, config_of, spec_for
from nanotron_main import judge
from test_train_engine import door, metrics

from launcher import protocol as P
from launcher.nanotron_config import dialect, schema, stages
from launcher.perf.sizes import derived
from launcher.report.summary import _data_note
from launcher.train.data import StagedBatches, build_micro_batches
from launcher.train.settings import to_train_config


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for name in ("LAUNCHER_BUNDLE", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _flags(demo_data, *more: str) -> list[str]:
    flags = ["--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--vocab_size", "256"]
    return [*flags, "--train_steps", "1000", *more]


def test_stages_are_written_as_mains_parser_reads_them_and_read_back(demo_data, second_dataset, tmp_path):
    a, b = str(demo_data.dataset), str(second_dataset)
    later = f"decay@600={b};anneal@900={a}:0.5,{b}:1.0"
    spec, problems = spec_for(*_flags(demo_data, "--data_stages", later, "--nanotron_dialect", "main"))
    assert all_problems(spec, problems) == []
    written = tmp_path / "main.yaml"
    written.write_text(schema.dump(config_of(spec, str(tmp_path / "ckpt"))))
    spec, problems = spec_for("--config", str(written), "--nanotron_dialect", "main")  # --config keeps them
    assert all_problems(spec, problems) == []
    seen, again = judge(written, write_to(tmp_path / "again.yaml", spec))  # main's own parser, one process
    expected = [
        {"name": "stable", "start": 1, "dataset": a},
        {"name": "decay", "start": 600, "dataset": b},
        {"name": "anneal", "start": 900, "dataset": {a: 0.5, b: 1.0}},
    ]
    assert seen["stages"] == expected and again["stages"] == expected
    listed = derived(spec)["data_stages"]  # the manifest's, and the summary's
    assert [(s["name"], s["start"], s["dataset"]) for s in listed][2] == ("anneal", 900, f"{a}:0.5,{b}:1.0")
    assert f"data stages: stable from step 1: {a}; decay from step 600: {b}; anneal" in _data_note(spec, derived(spec))


def write_to(path: Path, spec) -> Path:
    path.write_text(schema.dump(config_of(spec, str(path.parent / "ckpt"))))
    return path


def test_04_refuses_stages_by_name(demo_data, second_dataset):
    spec, problems = spec_for(*_flags(demo_data, "--data_stages", f"anneal@900={second_dataset}"))
    said = [str(p) for p in all_problems(spec, problems) if p.flag == "data_stages"]
    assert spec.dialect.dialect == "0.4" and len(said) == 1, said  # this Python has PyPI's 0.4
    assert "which has no data stages" in said[0] and "--nanotron_dialect main" in said[0]


def test_every_problem_of_the_stages_is_named_at_once(demo_data, tmp_path):
    missing = tmp_path / "nowhere"
    text = f"stable@5=x/y;a@1=x/y;b@7=x/y;c@7=x/y;d@9={missing};e@11=x/y:2;nonsense;f g@12=x/y"
    spec, problems = spec_for(*_flags(demo_data, "--data_stages", text, "--nanotron_dialect", "main"))
    said = [str(p) for p in all_problems(spec, problems) if p.flag == "data_stages"]
    for words in (
        "stage name stable is used twice",
        "stage a starts at step 1",
        "two stages start at step 7",
        f"local path {missing} does not exist",
        "stage e: x/y:2: nanotron keeps that fraction",
        "'nonsense' is not NAME@STEP=DATASET",
        "stage name 'f g' is not a plain name",
    ):
        assert sum(words in p for p in said) == 1, (words, said)


def _staged_config(demo_data, second: Path, checkpoints: Path, **overrides) -> dict:
    """A main-dialect config of the tiny Llama: the demo data, then `second` from step 4 (2 micro-batches a step)."""
    config = tiny_config(demo_data, checkpoints, **overrides)
    later = [stages.Stage("anneal", 4, str(second))]
    config["data_stages"] = [{"name": "stable", "start_training_step": 1}, *stages.to_yaml(later, config["data"])]
    return dialect.to_main(config)


def test_the_torch_engine_switches_at_the_stages_first_step(demo_data, second_dataset, tmp_path):
    cfg = to_train_config(_staged_config(demo_data, second_dataset, tmp_path))
    assert [(s.name, s.start, s.data.dataset) for s in cfg.stages] == [("anneal", 4, str(second_dataset))]
    first, anneal = build_micro_batches(cfg, 0, 1), build_micro_batches(cfg.stages[0].data, 0, 1)
    staged = StagedBatches(first, [("anneal", 6, anneal)])  # step 4 begins at micro-batch (4 - 1) x 2
    for index in range(12):
        want = first.micro_batch(index) if index < 6 else anneal.micro_batch(index - 6)
        assert torch.equal(staged.micro_batch(index), want), index
    assert [staged.begins(i) for i in range(8)] == [None] * 6 + ["anneal", None]
    assert not torch.equal(first.micro_batch(6), anneal.micro_batch(0))  # the two streams differ: a real switch


def test_a_resume_across_the_stage_switch_is_exact(demo_data, second_dataset, tmp_path, monkeypatch, capsys):
    def leg(name: str, ckpt: str, steps: int) -> str:
        config = _staged_config(demo_data, second_dataset, tmp_path / ckpt, **{"tokens.train_steps": steps})
        monkeypatch.setenv("LAUNCHER_BUNDLE", str(bundle_of(tmp_path, ckpt)))
        code, out, err = door(write_config(tmp_path / f"{name}.yaml", copy.deepcopy(config)), capsys)
        assert code == 0, err
        return out

    out = leg("straight", "a", 7)
    assert "data: stage anneal begins at step 4" in out
    leg("first", "b", 3)  # stops before the switch
    out = leg("second", "b", 7)
    assert "resumed from checkpoint step 3" in out and "data: stage anneal begins at step 4" in out
    straight, resumed = metrics(bundle_of(tmp_path, "a") / P.METRICS), metrics(bundle_of(tmp_path, "b") / P.METRICS)
    assert sorted(straight) == sorted(resumed) == list(range(1, 8))
    assert [straight[s]["loss"] for s in range(1, 8)] == [resumed[s]["loss"] for s in range(1, 8)]


def test_a_configs_own_stages_are_checked_too(demo_data, tmp_path):
    missing = tmp_path / "nowhere"
    config = _staged_config(demo_data, missing, tmp_path / "ckpt")
    config["data_stages"][1]["sequence_length"] = 32  # the run's is 64
    given = write_config(tmp_path / "staged.yaml", config)
    spec, problems = spec_for("--config", str(given), "--nanotron_dialect", "main")
    said = [str(p) for p in all_problems(spec, problems)]
    assert any(p.startswith(f"--config: local path {missing} does not exist") for p in said), said
    assert any("data_stages.anneal.sequence_length is 32, not the run's 64" in p for p in said), said
