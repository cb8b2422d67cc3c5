"""nanoset.datasets_args: main's NanosetDatasetsArgs from tokenized folders (made by the real tokenizer), judged by
nanotron main's own parser (vendored), and its refusals: folders tokenized differently, weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from conftest import DemoData
from launcher_helpers import all_problems, config_of, spec_for
from nanotron_main import judge

from launcher.nanotron_config import nanoset


@pytest.fixture(scope="module")
def folders(nanoset_folders: list[Path]) -> list[Path]:
    return nanoset_folders


def _read(path: Path) -> nanoset.TokenizedFolder:
    folder, problems = nanoset.inspect(path)
    assert problems == [] and folder is not None
    return folder


def test_main_s_parser_reads_a_nanoset_mixture_as_written(folders, demo_data: DemoData, tmp_path: Path):
    a, b = (_read(p) for p in folders)
    spec, problems = spec_for("--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer),
                              "--nanotron_dialect", "main")  # fmt: skip
    assert all_problems(spec, problems) == []
    config = config_of(spec, str(tmp_path / "ckpt"))
    vocab = config["model"]["model_config"]["vocab_size"]  # the model's, padded: main asserts the two agree
    args, problems = nanoset.datasets_args([(a, 0.7), (b, 0.3)], vocab)
    assert problems == [] and args is not None
    config["data_stages"][0]["data"]["dataset"] = args
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    (seen,) = judge(path)
    assert "error" not in seen, seen
    (stage,) = seen["stages"]
    assert stage["dataset_folder"] == [str(a.path), str(b.path)] and stage["dataset_weights"] == [0.7, 0.3]
    assert stage["tokenizer_name"] == str(demo_data.tokenizer)  # the metadata's and the config's, as main asserts
    assert stage["token_size_in_bytes"] == 2 and stage["vocab_size"] == vocab


def test_folders_tokenized_differently_and_weights_are_refused_at_once(folders):
    a, b = (_read(p) for p in folders)
    other = dataclasses.replace(b, tokenizer="gpt2")
    args, problems = nanoset.datasets_args([(a, -1.0), (other, float("nan"))], 128)
    assert args is None and len(problems) == 2
    assert "tokenized differently" in problems[0].message and "gpt2" in problems[0].message
    assert f"{a.path}:-1.0" in problems[1].message and f"{b.path}:nan" in problems[1].message
    # main normalises the weights by their sum: 0 for one folder, or above 1, is a weight it reads
    args, problems = nanoset.datasets_args([(a, 0.0), (b, 2.5)], 128)
    assert problems == [] and args is not None and args["dataset_weights"] == [0.0, 2.5]
    _, problems = nanoset.datasets_args([(a, 0.0), (b, 0.0)], 128)
    assert len(problems) == 1 and "sum to 0" in problems[0].message
