"""Local data checked before the queue: the launcher refuses exactly the datasets the job's loader cannot read."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import datasets
import datasets.exceptions
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_config, write_config
from launcher_helpers import run_launcher, spec_for

from launcher.datacheck import dataset_problems, tokenizer_problems
from launcher.errors import TrainError
from launcher.nanotron_schema import load_train_config
from launcher.train.config import TrainConfig
from launcher.train.data import load_texts, load_tokenizer
from launcher.validate import validate

ROWS = {"body": ["the cat", "the dog"], "n": [1, 2]}


def _saved(d: Path) -> Path:
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(d / "ds"))
    return d / "ds"


def _dict(split: str) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        datasets.DatasetDict({split: datasets.Dataset.from_dict(ROWS)}).save_to_disk(str(d / "dd"))
        return d / "dd"

    return make


def _file(name: str, text: str) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        (d / name).write_text(text)
        return d / name

    return make


def _parquet(d: Path) -> Path:
    pq.write_table(pa.table(ROWS), d / "d.parquet")
    return d / "d.parquet"


def _files_in_a_directory(d: Path) -> Path:
    (d / "shards").mkdir()
    for i in range(4):
        (d / "shards" / f"part{i}.jsonl").write_text('{"body": "x"}\n')
    return d / "shards"


JSONL = "".join(json.dumps({"body": b, "n": n}) + "\n" for b, n in zip(ROWS["body"], ROWS["n"], strict=True))
FORMS: dict[str, Callable[[Path], Path]] = {
    "save_to_disk": _saved,
    "DatasetDict": _dict("train"),
    "DatasetDict without train": _dict("validation"),
    "jsonl": _file("d.jsonl", "\n" + JSONL),
    "json lines in .json": _file("d.json", JSONL),
    "csv": _file("d.csv", "body,n\nthe cat,1\nthe dog,2\n"),
    "csv with a BOM": _file("d.csv", "\ufeffbody,n\nthe cat,1\nthe dog,2\n"),  # as Excel writes it
    "csv after blank lines": _file("d.csv", "\n  \n\nbody,n\nthe cat,1\nthe dog,2\n"),  # pandas skips them
    "csv of blank lines": _file("d.csv", "\n  \n\n"),
    "txt": _file("d.txt", "the cat\nthe dog\n"),
    "parquet": _parquet,
    "tsv": _file("d.tsv", "body\tn\n"),
    "empty jsonl": _file("d.jsonl", ""),
    "jsonl that is not JSON": _file("d.jsonl", "the cat\n"),
    "directory of jsonl files": _files_in_a_directory,
}
# (form, text column) -> the flag the launcher names, or None: accepted
EXPECTED = {
    ("save_to_disk", "body"): None,
    ("save_to_disk", "text"): "text_column",
    ("save_to_disk", "n"): "text_column",
    ("DatasetDict", "body"): None,
    ("DatasetDict without train", "body"): "dataset",
    ("jsonl", "body"): None,
    ("jsonl", "text"): "text_column",
    ("json lines in .json", "body"): None,
    ("json lines in .json", "text"): "text_column",
    ("csv", "body"): None,
    ("csv", "text"): "text_column",
    ("csv with a BOM", "body"): None,
    ("csv with a BOM", "text"): "text_column",
    ("csv after blank lines", "body"): None,
    ("csv after blank lines", "text"): "text_column",
    ("csv of blank lines", "body"): "dataset",
    ("txt", "text"): None,
    ("txt", "body"): "text_column",
    ("parquet", "body"): None,
    ("parquet", "text"): "text_column",
    ("parquet", "n"): "text_column",
    ("tsv", "body"): "dataset",
    ("empty jsonl", "body"): "dataset",
    ("jsonl that is not JSON", "body"): "dataset",
    ("directory of jsonl files", "body"): "dataset",
}


@pytest.mark.parametrize(("form", "column"), list(EXPECTED))
def test_launcher_refuses_exactly_what_the_job_cannot_load(
    form: str, column: str, tmp_path: Path, demo_data, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = FORMS[form](tmp_path)
    problems = dataset_problems(str(target), column, "train")

    assert [p.flag for p in problems] == ([] if EXPECTED[form, column] is None else [EXPECTED[form, column]])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    cfg = load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))
    cfg = dataclasses.replace(cfg, dataset=str(target), text_column=column)
    job_fails = _job_fails(cfg)
    assert bool(problems) == job_fails, (problems, job_fails)


# How the job fails on data it cannot use; any other error is a bug (in the job or this test) and fails the test.
JOB_ERRORS = (
    TrainError,  # the job's own checks: no such column, split or dataset directory
    datasets.exceptions.DatasetGenerationError,  # a builder that cannot parse the file (not JSON, no CSV header)
    pa.ArrowException,  # pyarrow reading a file that is not parquet
    StopIteration,  # datasets' json builder on an empty file
)
TOKENIZER_TYPE_ERROR = "text input must be of type `str`"  # the tokenizer, given a column of numbers


def _job_fails(cfg: TrainConfig) -> bool:
    """Whether what the job does first with its data fails, and fails the way a job fails on bad data."""
    try:
        load_tokenizer(cfg)(load_texts(cfg), add_special_tokens=False)
    except JOB_ERRORS:
        return True
    except ValueError as e:
        if TOKENIZER_TYPE_ERROR not in str(e):
            raise
        return True
    return False


def test_problems_name_the_fix(tmp_path: Path) -> None:
    (wrong_column,) = dataset_problems(str(_saved(tmp_path)), "text", "train")
    assert "has no column 'text' (columns: body, n)" in wrong_column.message
    assert wrong_column.fix == "use --text_column body"
    (numbers,) = dataset_problems(str(tmp_path / "ds"), "n", "train")
    assert "holds int64, not text" in numbers.message and numbers.fix == "use --text_column body"
    (split,) = dataset_problems(str(_dict("validation")(tmp_path)), "body", "train")
    assert "no split 'train' (splits: validation)" in split.message and "hf_dataset_splits" in split.fix
    (shards,) = dataset_problems(str(_files_in_a_directory(tmp_path)), "body", "train")
    assert "(it holds part0.jsonl, part1.jsonl, part2.jsonl, ...: give one file)" in shards.message


def test_a_split_named_in_config_is_checked(tmp_path: Path) -> None:
    dd = _dict("validation")(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  dataset:\n    hf_dataset_splits: validation\n")
    common = ("--dataset", str(dd), "--text_column", "body", "--tokenizer", "some/tokenizer")
    spec, problems = spec_for(*common)
    assert [p.flag for p in problems + validate(spec)] == ["dataset"]
    spec, problems = spec_for(*common, "--config", str(config))
    assert problems + validate(spec) == []


def test_tokenizer_directory_must_hold_a_tokenizer(demo_data, tmp_path: Path) -> None:
    assert tokenizer_problems(str(demo_data.tokenizer)) == []
    (as_file,) = tokenizer_problems(str(demo_data.tokenizer / "tokenizer.json"))
    assert as_file.fix == f"use --tokenizer {demo_data.tokenizer}"
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")  # AutoTokenizer cannot build from this alone
    (empty,) = tokenizer_problems(str(tmp_path / "tok"))
    assert empty.flag == "tokenizer" and "holds no tokenizer" in empty.message


def test_every_data_problem_at_once_and_nothing_written(demo_data, tmp_path: Path) -> None:
    hostile = tmp_path / 'it\'s "odd" $(touch pwned); x'  # a path is data: it reaches no shell
    hostile.mkdir()
    dataset = _saved(hostile)
    (tmp_path / "tok").mkdir()
    out = run_launcher(
        "--run_name", "d", "--dataset", str(dataset), "--text_column", "txt", "--tokenizer", str(tmp_path / "tok"),
        "--time_limit", "3h", "--dry_run", cwd=tmp_path,
    )  # fmt: skip

    assert out.returncode == 2, out.stderr
    assert "3 problems found, nothing was written or submitted" in out.stderr
    assert f"--text_column: {dataset} has no column 'txt'" in out.stderr
    assert "--tokenizer:" in out.stderr and "--time_limit:" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "pwned").exists()
