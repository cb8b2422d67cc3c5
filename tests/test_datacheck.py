"""Local data checked before the queue: the launcher refuses exactly the datasets the job's loader cannot read."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import datasets
import datasets.exceptions
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_config, write_config
from launcher_helpers import config_of, run_launcher, spec_for

from launcher.config.datacheck import JSON_CHUNK, dataset_problems, tokenizer_problems
from launcher.config.validate import validate
from launcher.errors import TrainError
from launcher.train.data import load_texts, load_tokenizer
from launcher.train.settings import TrainConfig, load_train_config

ROWS = {"body": ["the cat", "the dog"], "n": [1, 2]}


def _saved(d: Path) -> Path:
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(d / "ds"))
    return d / "ds"


def _dict(split: str) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        datasets.DatasetDict({split: datasets.Dataset.from_dict(ROWS)}).save_to_disk(str(d / "dd"))
        return d / "dd"

    return make


def _saved_with(info: Callable[[dict], object] | None = None, **files: object) -> Callable[[Path], Path]:
    """A save_to_disk directory, its dataset_info.json rewritten by `info`, with more JSON files written in it."""

    def make(d: Path) -> Path:
        ds = _saved(d)
        if info is not None:
            (ds / "dataset_info.json").write_text(json.dumps(info(json.loads((ds / "dataset_info.json").read_text()))))
        for name, content in files.items():
            (ds / f"{name}.json").write_text(json.dumps(content))
        return ds

    return make


def _dict_listing(splits: object, drop: str | None = None) -> Callable[[Path], Path]:
    """A saved DatasetDict (train and validation) whose dataset_dict.json lists `splits`, less the split `drop`."""

    def make(d: Path) -> Path:
        rows = datasets.Dataset.from_dict(ROWS)
        datasets.DatasetDict({"train": rows, "validation": rows}).save_to_disk(str(d / "dd"))
        (d / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": splits}))
        if drop:
            shutil.rmtree(d / "dd" / drop)
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


def _parquet_dictionary(d: Path) -> Path:
    pq.write_table(pa.table({"body": pa.array(ROWS["body"]).dictionary_encode(), "n": ROWS["n"]}), d / "d.parquet")
    return d / "d.parquet"


def _files_in_a_directory(d: Path) -> Path:
    (d / "shards").mkdir()
    for i in range(4):
        (d / "shards" / f"part{i}.jsonl").write_text('{"body": "x"}\n')
    return d / "shards"


RECORDS = [{"body": b, "n": n} for b, n in zip(ROWS["body"], ROWS["n"], strict=True)]
JSONL = "".join(json.dumps(r) + "\n" for r in RECORDS)


def _column_after_first_chunk(d: Path) -> Path:
    """JSON lines whose text column first appears after the 10 MiB the json builder infers the columns from."""
    filler = (json.dumps({"n": 0, "pad": "x" * 1000}) + "\n").encode()
    with open(d / "late.jsonl", "wb") as f:
        f.write(filler * (JSON_CHUNK // len(filler) + 2) + JSONL.encode())
    return d / "late.jsonl"


FORMS: dict[str, Callable[[Path], Path]] = {
    "save_to_disk": _saved,
    "DatasetDict": _dict("train"),
    "DatasetDict without train": _dict("validation"),
    "save_to_disk, features null": _saved_with(lambda info: {**info, "features": None}),
    "save_to_disk, no features": _saved_with(lambda info: {k: v for k, v in info.items() if k != "features"}),
    "save_to_disk and a stray dataset_dict.json": _saved_with(dataset_dict={"splits": ["validation"]}),
    "DatasetDict, splits a string": _dict_listing("pretrain"),  # 'train' in 'pretrain', but no such split
    "DatasetDict, a listed split missing": _dict_listing(["train", "validation"], drop="validation"),
    "jsonl": _file("d.jsonl", "\n" + JSONL),
    "json lines in .json": _file("d.json", JSONL),
    "jsonl with a BOM": _file("d.jsonl", "\ufeff" + JSONL),
    "JSON array in .jsonl": _file("d.jsonl", json.dumps(RECORDS)),  # the builder reads an array whole
    "pretty-printed JSON in .json": _file("d.json", json.dumps(ROWS, indent=2)),  # read whole, by pandas
    "jsonl, text column first in a later record": _file("d.jsonl", '{"n": 0}\n' + JSONL),  # null in row 0
    "jsonl, text column after the first chunk": _column_after_first_chunk,
    "jsonl, escaped text column after 100 records": _file(  # past the records read whole: found by its escape
        "d.jsonl", '{"n": 0}\n' * 150 + '{"\\u0062ody": "the cat"}\n'
    ),
    "jsonl, first line over 1 MiB": _file("d.jsonl", json.dumps({"n": 0, "pad": "x" * (1 << 20)}) + "\n" + JSONL),
    "jsonl of JSON strings": _file("d.jsonl", "".join(json.dumps(b) + "\n" for b in ROWS["body"])),
    "jsonl of blank lines": _file("d.jsonl", "\n  \n\n"),
    "csv": _file("d.csv", "body,n\nthe cat,1\nthe dog,2\n"),
    "csv with a BOM": _file("d.csv", "\ufeffbody,n\nthe cat,1\nthe dog,2\n"),  # as Excel writes it
    "csv after blank lines": _file("d.csv", "\n  \n\nbody,n\nthe cat,1\nthe dog,2\n"),  # pandas skips them
    "csv of blank lines": _file("d.csv", "\n  \n\n"),
    "txt": _file("d.txt", "the cat\nthe dog\n"),
    "parquet": _parquet,
    "parquet, dictionary-encoded text": _parquet_dictionary,
    "parquet that is not parquet": _file("d.parquet", "the cat\n"),
    "tsv": _file("d.tsv", "body\tn\n"),
    "empty jsonl": _file("d.jsonl", ""),
    "jsonl that is not JSON": _file("d.jsonl", "the cat\n"),
    "directory of jsonl files": _files_in_a_directory,
}
LEFT_TO_JOB = "job"  # the launcher cannot tell cheaply, so it accepts; the job fails
# (form, text column) -> the flag the launcher names, None: accepted (and the job loads it), or LEFT_TO_JOB
EXPECTED = {
    ("save_to_disk", "body"): None,
    ("save_to_disk", "text"): "text_column",
    ("save_to_disk", "n"): "text_column",
    ("DatasetDict", "body"): None,
    ("DatasetDict without train", "body"): "dataset",
    ("save_to_disk, features null", "body"): None,
    ("save_to_disk, features null", "text"): LEFT_TO_JOB,
    ("save_to_disk, no features", "body"): None,
    ("save_to_disk and a stray dataset_dict.json", "body"): None,
    ("save_to_disk and a stray dataset_dict.json", "text"): "text_column",
    ("DatasetDict, splits a string", "body"): "dataset",
    ("DatasetDict, a listed split missing", "body"): "dataset",
    ("jsonl", "body"): None,
    ("jsonl", "text"): "text_column",
    ("json lines in .json", "body"): None,
    ("json lines in .json", "text"): "text_column",
    ("jsonl with a BOM", "body"): None,
    ("jsonl with a BOM", "text"): "text_column",
    ("JSON array in .jsonl", "body"): None,
    ("JSON array in .jsonl", "text"): LEFT_TO_JOB,
    ("pretty-printed JSON in .json", "body"): None,
    ("jsonl, text column first in a later record", "body"): None,
    ("jsonl, text column first in a later record", "text"): "text_column",
    ("jsonl, text column after the first chunk", "body"): "text_column",
    ("jsonl, escaped text column after 100 records", "body"): None,
    ("jsonl, escaped text column after 100 records", "text"): "text_column",
    ("jsonl, first line over 1 MiB", "body"): None,
    ("jsonl, first line over 1 MiB", "text"): LEFT_TO_JOB,
    ("jsonl of JSON strings", "body"): "dataset",
    ("jsonl of blank lines", "body"): "dataset",
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
    ("parquet, dictionary-encoded text", "body"): None,
    ("parquet, dictionary-encoded text", "n"): "text_column",
    ("parquet that is not parquet", "body"): "dataset",
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

    expected = EXPECTED[form, column]
    assert [p.flag for p in problems] == ([] if expected in (None, LEFT_TO_JOB) else [expected])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    cfg = load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))
    cfg = dataclasses.replace(cfg, dataset=str(target), text_column=column)
    assert _job_fails(cfg) == (expected is not None), problems


# How the job fails on data it cannot use; any other error is a bug (in the job or this test) and fails the test.
JOB_ERRORS = (
    TrainError,  # the job's own checks: no such column, split or dataset directory
    datasets.exceptions.DatasetGenerationError,  # a builder that cannot parse the file (not JSON, no CSV header)
    pa.ArrowException,  # pyarrow reading a file that is not parquet
    StopIteration,  # datasets' json builder on an empty file
)
JOB_VALUE_ERRORS = (
    "text input must be of type `str`",  # the tokenizer, given a column of numbers
    'Instruction "train" corresponds to no data',  # datasets, given a file with no record
)


def _job_fails(cfg: TrainConfig) -> bool:
    """Whether what the job does first with its data fails, and fails the way a job fails on bad data."""
    try:
        load_tokenizer(cfg)(load_texts(cfg), add_special_tokens=False)
    except JOB_ERRORS:
        return True
    except ValueError as e:
        if not any(message in str(e) for message in JOB_VALUE_ERRORS):
            raise
        return True
    return False


def test_the_json_chunk_is_the_builders() -> None:
    """The launcher's JSON_CHUNK is where the job's json builder stops inferring columns."""
    from datasets.packaged_modules.json.json import JsonConfig

    assert JsonConfig().chunksize == JSON_CHUNK


def test_json_nested_deeper_than_python_parses_is_left_to_the_job(tmp_path: Path) -> None:
    """Not a traceback (json.loads raises RecursionError). Not in FORMS: datasets itself dies of it, after ~20 s."""
    deep = _file("d.jsonl", '{"a": ' * 5000 + "1" + "}" * 5000 + "\n")(tmp_path)
    assert dataset_problems(str(deep), "text", "train") == []


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


def _tokenizer_dir(**files: object) -> Callable[[Path], Path]:
    """A directory holding these JSON files (name without .json -> content)."""

    def make(d: Path) -> Path:
        (d / "tok").mkdir()
        for name, content in files.items():
            (d / "tok" / f"{name}.json").write_text(json.dumps(content))
        return d / "tok"

    return make


def _byt5(d: Path) -> Path:
    from transformers import ByT5Tokenizer  # bytes: no vocabulary file, nothing downloaded

    ByT5Tokenizer().save_pretrained(str(d / "byt5"))  # tokenizer_config.json and added_tokens.json only
    return d / "byt5"


# form -> True: accepted (and the job's load_tokenizer loads it), False: refused, or LEFT_TO_JOB
TOKENIZERS: dict[str, tuple[Callable[[Path], Path], bool | str]] = {
    "ByT5, its class named in tokenizer_config.json": (_byt5, True),
    "a class transformers does not have": (_tokenizer_dir(tokenizer_config={"tokenizer_class": "Nope"}), LEFT_TO_JOB),
    "tokenizer_config.json without a class": (_tokenizer_dir(tokenizer_config={}), False),
    "tokenizer_config.json, class null": (_tokenizer_dir(tokenizer_config={"tokenizer_class": None}), False),
    "empty directory": (_tokenizer_dir(), False),
}


@pytest.mark.parametrize("form", list(TOKENIZERS))
def test_launcher_refuses_exactly_the_tokenizers_the_job_cannot_load(
    form: str, tmp_path: Path, demo_data, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, expected = TOKENIZERS[form]
    target = make(tmp_path)
    problems = tokenizer_problems(str(target))

    assert [p.flag for p in problems] == ([] if expected else ["tokenizer"])
    assert expected or "holds no tokenizer" in problems[0].message
    cfg = load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))
    cfg = dataclasses.replace(cfg, tokenizer=str(target), model=dataclasses.replace(cfg.model, vocab_size=1024))
    try:
        load_tokenizer(cfg)
        job_loads = True
    except TrainError:
        job_loads = False
    assert job_loads == (expected is True)


def test_tokenizer_directory_must_hold_a_tokenizer(demo_data, tmp_path: Path) -> None:
    assert tokenizer_problems(str(demo_data.tokenizer)) == []
    (as_file,) = tokenizer_problems(str(demo_data.tokenizer / "tokenizer.json"))
    assert as_file.fix == f"use --tokenizer {demo_data.tokenizer}"


def test_an_unreadable_tokenizer_directory_is_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a traceback: the launcher reports what the OS said (tests run as root, so its refusal is simulated)."""
    (tmp_path / "tok").mkdir()
    is_file = Path.is_file

    def no_access(self: Path) -> bool:
        if self.parent == tmp_path / "tok":  # what stat says of a name in a directory one may not search
            raise PermissionError(13, "Permission denied", str(self))
        return is_file(self)

    monkeypatch.setattr(Path, "is_file", no_access)
    (problem,) = tokenizer_problems(str(tmp_path / "tok"))
    assert problem.flag == "tokenizer" and problem.message == f"cannot read {tmp_path / 'tok'} (Permission denied)"
    (too_long,) = tokenizer_problems(str(tmp_path / ("x" * 300)))  # a name the OS refuses outright
    assert too_long.flag == "tokenizer" and "File name too long" in too_long.message


def test_a_path_under_home_is_local_to_launcher_and_job(
    demo_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--dataset=~/d.jsonl` (no shell expands a ~ after '='): checked, and written to the config, as the path it
    names; the job reads a ~ path (a config written by hand) the same way."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "d.jsonl").write_text(JSONL)
    shutil.copytree(demo_data.tokenizer, home / "tok")

    spec, problems = spec_for("--dataset=~/d.jsonl", "--text_column", "txt", "--tokenizer=~/tok")
    assert (spec.args.data.dataset, spec.args.data.tokenizer) == (str(home / "d.jsonl"), str(home / "tok"))
    assert spec.tokenizer_vocab == demo_data.vocab
    config = config_of(spec, str(tmp_path / "ckpt"))
    assert config["data"]["dataset"]["hf_dataset_or_datasets"] == str(home / "d.jsonl")
    assert config["tokenizer"]["tokenizer_name_or_path"] == str(home / "tok")
    (column,) = [p for p in problems + validate(spec) if p.flag in ("dataset", "text_column", "tokenizer")]
    assert column.flag == "text_column" and column.fix == "use --text_column body"
    unexpanded = dataclasses.replace(spec.args.data, dataset="~/d.jsonl", tokenizer="~/tok")  # validate alone
    (column,) = [
        p
        for p in validate(dataclasses.replace(spec, args=dataclasses.replace(spec.args, data=unexpanded)))
        if p.flag in ("dataset", "text_column", "tokenizer")
    ]
    assert column.message.startswith(f"{home / 'd.jsonl'} has no column 'txt'")

    cfg = load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))
    cfg = dataclasses.replace(cfg, dataset="~/d.jsonl", text_column="body", tokenizer="~/tok")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    assert load_texts(cfg) == ROWS["body"]
    assert len(load_tokenizer(cfg)) == demo_data.vocab


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
