"""Dataset mixtures: `--dataset a:0.7,b:0.3` written as nanotron's `hf_dataset_or_datasets: {a: 0.7, b: 0.3}` in
each dialect (judged by that dialect's own parser), read back by --config, refused with every problem at once, and
trained by the torch engine as nanotron reads it: the first int(weight x rows) rows of each dataset, so each
dataset's share of the windows is its weight times its size over the total (counted, with a fixed seed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml
from conftest import tiny_config
from launcher_helpers import all_problems, config_of, spec_for
from nanotron_main import judge

from launcher.nanotron_config import schema
from launcher.perf.sizes import derived
from launcher.report.summary import _data_note
from launcher.train import packcache
from launcher.train.data import PackedWindows, build_windows, load_split, pack, part_windows, tokenize
from launcher.train.nanotron_engine.compat import import_nanotron_config
from launcher.train.settings import to_train_config


def _flags(demo_data, second: Path, mix: str, *more: str) -> list[str]:
    return ["--dataset", mix, "--tokenizer", str(demo_data.tokenizer), "--vocab_size", "256", *more]


def test_a_mixture_is_written_in_each_dialect_as_its_parser_reads_it_and_read_back(demo_data, second_dataset, tmp_path):
    a, b = str(demo_data.dataset), str(second_dataset)
    written = {}
    for dialect in ("0.4", "main"):
        spec, problems = spec_for(*_flags(demo_data, second_dataset, f"{a}:0.7,{b}:0.3"), "--nanotron_dialect", dialect)
        assert all_problems(spec, problems) == []
        written[dialect] = tmp_path / f"{dialect}.yaml"
        written[dialect].write_text(schema.dump(config_of(spec, str(tmp_path / "ckpt"))))
    config = import_nanotron_config().get_config_from_file(str(written["0.4"]))  # PyPI's 0.4
    assert config.data.dataset.hf_dataset_or_datasets == {a: 0.7, b: 0.3}
    (seen,) = judge(written["main"])  # main's own parser, vendored
    assert seen["stages"] == [{"name": "stable", "start": 1, "dataset": {a: 0.7, b: 0.3}}]
    for dialect, path in written.items():  # --config reads either back, the mixture whole
        spec, problems = spec_for("--config", str(path), "--nanotron_dialect", dialect)
        assert all_problems(spec, problems) == [] and spec.args.data.dataset == f"{a}:0.7,{b}:0.3"
        assert to_train_config(config_of(spec, "/c")).mixture == ((a, 0.7), (b, 0.3))


def test_one_dataset_is_written_as_before(demo_data, tmp_path):
    flags = ("--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer))
    spec, problems = spec_for(*flags, "--nanotron_dialect", "main")
    assert all_problems(spec, problems) == []
    stage = config_of(spec, "/c")["data_stages"][0]
    assert stage["data"]["dataset"]["hf_dataset_or_datasets"] == str(demo_data.dataset)
    assert "dataset_mixture" not in derived(spec)


def test_every_problem_of_a_mixture_is_named_at_once(demo_data, second_dataset, tmp_path):
    missing = tmp_path / "nowhere"
    mix = f"{demo_data.dataset}:0,{second_dataset},{missing}:0.5,none:0.2,{demo_data.dataset}:1.5,:1,{tmp_path}:0.1"
    spec, problems = spec_for(*_flags(demo_data, second_dataset, mix))
    said = [str(p) for p in all_problems(spec, problems) if p.flag == "dataset"]
    assert sum("so a weight lies in (0, 1]" in p for p in said) == 2, said  # 0 and 1.5
    assert any(f"{second_dataset} has no weight (name:weight)" in p for p in said)
    assert any(f"local path {missing} does not exist" in p for p in said)
    assert any("'none' (random tokens) cannot be part of a mixture" in p for p in said)
    assert any(f"{demo_data.dataset} is named twice" in p for p in said)
    assert any("has an entry without a dataset" in p for p in said)
    assert any(f"{tmp_path} is a directory but not a dataset saved by save_to_disk" in p for p in said)
    bad = tmp_path / "list.yaml"  # a list: nanotron's get_datasets raises on it, so the launcher refuses it
    bad.write_text(yaml.safe_dump({"data": {"dataset": {"hf_dataset_or_datasets": ["x/a", "x/b"]}}}))
    spec, problems = spec_for("--config", str(bad))
    assert any("a mixture {name: weight}: --dataset a:0.7,b:0.3" in str(p) for p in problems), problems


def test_the_summary_and_manifest_show_the_mixture_and_its_shares(demo_data, second_dataset):
    spec, _ = spec_for(*_flags(demo_data, second_dataset, f"{demo_data.dataset}:0.7,{second_dataset}:0.3"))
    figures = derived(spec)  # what the manifest stores
    mix = figures["dataset_mixture"]
    assert [part["weight"] for part in mix.values()] == [0.7, 0.3] and all(p["tokens"] > 0 for p in mix.values())
    a, b = (part["tokens"] for part in mix.values())
    assert figures["dataset_tokens"] == int(0.7 * a + 0.3 * b)
    note = _data_note(spec, figures)
    share = round(100 * 0.7 * a / (0.7 * a + 0.3 * b))
    assert f"{demo_data.dataset} (0.7 of its rows, ~{share}% of the mix)" in note, note
    assert "what nanotron keeps of them holds" in note


def _windows_of(demo_data, path: Path, rows: int, length: int) -> int:
    """Windows nanotron's mix gives a dataset, computed apart from the engine: its first `rows` texts, packed."""
    texts = [t for t in datasets.load_from_disk(str(path))["text"][:rows] if t]
    cfg = to_train_config(tiny_config(demo_data, Path("/unused")))
    token_lists, eos = tokenize(cfg, texts)
    return len(pack(token_lists, eos, length))


def test_the_torch_engine_draws_each_dataset_in_its_share(demo_data, second_dataset, tmp_path):
    a, b = str(demo_data.dataset), str(second_dataset)
    config = tiny_config(demo_data, tmp_path, **{"data.dataset.hf_dataset_or_datasets": {a: 0.7, b: 0.3}})
    cfg = to_train_config(config)
    parts = part_windows(cfg)
    expected = [_windows_of(demo_data, a, int(0.7 * 150), 64), _windows_of(demo_data, b, int(0.3 * 150), 64)]
    assert [len(p) for p in parts] == expected
    assert len(load_split(cfg)) == int(0.7 * 150) + int(0.3 * 150)  # the rows the nanotron engine packs
    windows = build_windows(cfg)
    assert np.array_equal(windows, np.concatenate(parts))
    share = expected[0] / sum(expected)
    assert share == pytest.approx(0.7, abs=0.03)  # two datasets of one size: the shares are the weights
    # what training draws: the real sampler over source labels, 2 dp ranks, a fixed seed, 40% of an epoch
    labels = np.repeat([0, 1], expected)[:, None]
    drawn = np.concatenate(
        [PackedWindows(labels, 4, cfg.data_seed, rank, 2).micro_batch(k).numpy().ravel() for rank in (0, 1)
         for k in range(int(0.4 * len(labels)) // 8)]
    )  # fmt: skip
    assert (drawn == 0).mean() == pytest.approx(share, abs=0.08)
    assert np.array_equal(drawn, np.concatenate(  # the same order again: a pure function of the seed
        [PackedWindows(labels, 4, cfg.data_seed, rank, 2).micro_batch(k).numpy().ravel() for rank in (0, 1)
         for k in range(int(0.4 * len(labels)) // 8)]))  # fmt: skip
    # fractions, not shares: all of a and half of b make ~2:1, whatever the weights' sum
    cfg = dataclasses.replace(cfg, mixture=((a, 1.0), (b, 0.5)), dataset=f"{a}:1.0,{b}:0.5")
    counts = [len(p) for p in part_windows(cfg)]
    assert counts == [_windows_of(demo_data, a, 150, 64), _windows_of(demo_data, b, 75, 64)]


def test_the_packed_cache_is_named_by_the_whole_mixture(demo_data, second_dataset, tmp_path):
    a, b = str(demo_data.dataset), str(second_dataset)
    one = to_train_config(tiny_config(demo_data, tmp_path))
    mixes = [
        to_train_config(tiny_config(demo_data, tmp_path, **{"data.dataset.hf_dataset_or_datasets": mix}))
        for mix in ({a: 0.7, b: 0.3}, {a: 0.7, b: 0.4}, {b: 0.3, a: 0.7})
    ]
    names = [packcache.key(c) for c in (one, *mixes)]
    assert None not in names and len(set(names)) == 4
    gone = to_train_config(
        tiny_config(demo_data, tmp_path, **{"data.dataset.hf_dataset_or_datasets": {a: 1, "x/y": 1}})
    )
    assert packcache.key(gone) is None  # a hub dataset in the mix: not cached, each rank loads it
