"""launcher/nanotron_config/nanoset.py: a folder made by the real tokenizer (datatrove, through `launcher.data
tokenize`) reads whole; damaged copies of it are each a named problem, all at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import DemoData

from launcher.data.__main__ import main
from launcher.nanotron_config import nanoset


@pytest.fixture(scope="module")
def made(demo_data: DemoData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("nanoset") / "out"
    code = main(
        ["tokenize", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--output",
         str(output), "--tasks", "2"]
    )  # fmt: skip
    assert code == 0
    return output


@pytest.fixture
def copy(made: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(made, tmp_path / "copy"))


def _token_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.ds"))


def test_the_whole_folder_agrees_with_its_files(made: Path, demo_data: DemoData):
    folder, problems = nanoset.inspect(made, vocab_size=demo_data.vocab)
    assert problems == [] and folder is not None
    sizes = sum(p.stat().st_size for p in _token_files(made))
    assert folder.tokens * folder.token_size == sizes
    assert folder.documents * 8 == sum(Path(f"{p}.index").stat().st_size for p in _token_files(made))
    assert folder.tokenizer == str(demo_data.tokenizer)  # the directory, as nanotron main compares and loads it


def test_a_truncated_token_file(copy: Path):
    ds = _token_files(copy)[0]
    with ds.open("r+b") as f:
        f.truncate(ds.stat().st_size - 4)  # two whole tokens gone
    folder, problems = nanoset.inspect(copy, "dataset")
    assert folder is None and len(problems) == 1
    assert problems[0].flag == "dataset" and ds.name in problems[0].message and "index ends at" in problems[0].message


def test_a_file_cut_inside_a_token(copy: Path):
    ds = _token_files(copy)[1]
    with ds.open("r+b") as f:
        f.truncate(ds.stat().st_size - 1)
    _, problems = nanoset.inspect(copy)
    assert len(problems) == 1 and "not a whole number of 2-byte tokens" in problems[0].message


def test_a_missing_index_and_a_missing_metadata_are_both_named(copy: Path):
    first, second = _token_files(copy)
    Path(f"{first}.index").unlink()
    Path(f"{second}.metadata").unlink()
    folder, problems = nanoset.inspect(copy)
    assert folder is None and len(problems) == 2
    assert f"{first.name}.index" in problems[0].message and f"{second.name}.metadata" in problems[1].message


def test_a_token_size_that_cannot_hold_the_vocabulary(made: Path):
    folder, problems = nanoset.inspect(made, "dataset", vocab_size=70_000)
    assert folder is None and len(problems) == 1
    assert "2-byte tokens" in problems[0].message and "70000" in problems[0].message
    assert nanoset.inspect(made, vocab_size=65_536)[0] is not None  # ids 0..65535 fit in uint16


def test_two_tokenizations_in_one_folder(copy: Path):
    metadata = Path(f"{_token_files(copy)[1]}.metadata")
    lines = metadata.read_text().splitlines()
    metadata.write_text("\n".join(["gpt2|2", *lines[1:]]))
    _, problems = nanoset.inspect(copy)
    assert len(problems) == 1 and "mixes files of different tokenizations" in problems[0].message
    assert "gpt2" in problems[0].message


def test_a_metadata_that_is_not_datatrove_s(copy: Path):
    Path(f"{_token_files(copy)[0]}.metadata").write_text("hello\n")
    _, problems = nanoset.inspect(copy)
    assert len(problems) == 1 and "cannot read" in problems[0].message


def test_an_empty_folder_and_a_folder_of_something_else(tmp_path: Path, demo_data: DemoData):
    (tmp_path / "empty").mkdir()
    folder, problems = nanoset.inspect(tmp_path / "empty", "dataset")
    assert folder is None and len(problems) == 1 and "is empty" in problems[0].message
    assert "launcher.data tokenize" in problems[0].fix
    _, problems = nanoset.inspect(demo_data.dataset, "dataset")  # a save_to_disk dataset, not tokens
    assert len(problems) == 1 and "holds no token files" in problems[0].message
    assert "dataset_info.json" in problems[0].message
    _, problems = nanoset.inspect(tmp_path / "nowhere", "dataset")
    assert len(problems) == 1 and "does not exist" in problems[0].message
    (tmp_path / "file").write_text("x")
    _, problems = nanoset.inspect(tmp_path / "file", "dataset")
    assert len(problems) == 1 and "is not a directory" in problems[0].message


def test_the_command_refuses_a_damaged_folder_without_a_traceback(copy: Path, capsys):
    Path(f"{_token_files(copy)[0]}.index").unlink()
    assert main(["inspect", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--folder:" in err and ".ds.index" in err


def test_a_local_tokenizer_is_the_same_as_a_directory_or_its_file(demo_data: DemoData, tmp_path: Path):
    recorded = str(demo_data.tokenizer / "tokenizer.json")
    assert nanoset.same_tokenizer(recorded, str(demo_data.tokenizer))
    assert nanoset.same_tokenizer("gpt2", "gpt2")
    assert not nanoset.same_tokenizer(recorded, "gpt2")
    assert not nanoset.same_tokenizer(recorded, str(tmp_path))
