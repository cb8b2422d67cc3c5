"""`tokenize --dataset ORG/NAME`: a hub name read from this machine's datasets cache, offline (as the job's
`load_dataset` reads one), through datatrove's HuggingFaceDatasetReader; a name the cache lacks is refused before
anything runs. The "hub" dataset is the demo's, put in the cache here: nothing downloads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import DemoData
from test_data_tokenize import _documents, _expected, _texts

from launcher.data.__main__ import main
from launcher.data.tokenize import RECORD, RECORD_DIR
from launcher.nanotron_config import nanoset

NAME = "demo-org/demo-text"


def cache_as_hub(demo: DemoData, cache: Path, name: str) -> None:
    """The demo's texts in the datasets cache as `load_dataset(name)` finds a hub dataset loaded once before
    (<cache>/<org>___<name>/default/0.0.0/<hash>/<name>-train.arrow beside its dataset_info.json), built here by
    datasets' own json builder."""
    import datasets

    source = cache.parent / "texts.jsonl"
    datasets.Dataset.from_dict({"text": _texts(demo)}).to_json(str(source))
    built = cache.parent / "built"
    datasets.load_dataset("json", data_files=str(source), split="train", cache_dir=str(built))
    (config,) = (built / "json").iterdir()  # json's default-<hash> config
    org, short = name.split("/")
    target = cache / f"{org}___{short}" / "default"
    shutil.copytree(config, target)
    for arrow in list(target.rglob("json-train*.arrow")):
        arrow.rename(arrow.with_name(arrow.name.replace("json-", f"{short}-", 1)))


@pytest.fixture
def hub_cache(demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import datasets

    cache = tmp_path / "hf" / "datasets"
    cache_as_hub(demo_data, cache, NAME)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)  # read at its import: this process's
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # tokenize sets it: restored after the test
    return cache


def test_a_hub_name_from_the_cache_is_tokenized(hub_cache: Path, demo_data: DemoData, tmp_path: Path, capsys):
    output = tmp_path / "out"
    argv = ["tokenize", "--dataset", NAME, "--tokenizer", str(demo_data.tokenizer), "--output", str(output),
            "--tasks", "2"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    assert _documents(output) == _expected(demo_data, _texts(demo_data))  # every document, through the cache
    record = json.loads((output / RECORD_DIR / RECORD).read_text())
    assert record["inputs"]["dataset"] == NAME and record["dataset"]["hub"] == NAME
    assert record["status"] == "complete" and record["documents"] == 150
    folder, problems = nanoset.inspect(output, vocab_size=demo_data.vocab)
    assert folder is not None and problems == [] and len(folder.files) == 2


def test_a_hub_name_the_cache_lacks_is_refused_with_the_rest(
    hub_cache: Path, demo_data: DemoData, tmp_path: Path, capsys
):
    output = tmp_path / "out"
    argv = ["tokenize", "--dataset", "demo-org/not-cached", "--tokenizer", str(demo_data.tokenizer), "--output",
            str(output), "--tasks", "0"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "  - --dataset: 'demo-org/not-cached' (split 'train') is not in this machine's datasets cache" in err
    assert "  - --tasks:" in err and "Traceback" not in err
    assert not output.exists()
    argv = ["tokenize", "--dataset", NAME, "--text_column", "body", "--tokenizer", str(demo_data.tokenizer),
            "--output", str(output)]  # fmt: skip
    assert main(argv) == 2
    assert f"  - --text_column: {NAME} has no column 'body' (columns: text)" in capsys.readouterr().err
    assert not output.exists()
