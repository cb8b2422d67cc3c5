"""`python -m launcher.data tokenize`: datatrove's real pipeline on the demo dataset and tokenizer (made locally),
its checks before anything runs, its record, and an interrupted tokenization continued."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import DemoData

from launcher.data.__main__ import main
from launcher.data.tokenize import RECORD, RECORD_DIR, TokenizeArgs, check
from launcher.nanotron_config import nanoset


def _texts(demo: DemoData) -> list[str]:
    from datasets import load_from_disk

    return list(load_from_disk(str(demo.dataset))["text"])


def _expected(demo: DemoData, texts: list[str]) -> Counter:
    """Every document's token ids as the tokenizer alone gives them, with the end-of-document token: a multiset."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(demo.tokenizer / "tokenizer.json"))
    eos = tokenizer.token_to_id("</s>")
    return Counter(tuple(e.ids) + (eos,) for e in tokenizer.encode_batch(texts))


def _documents(folder: Path) -> Counter:
    """Every document the token files hold, split at their indexes' end offsets."""
    docs: Counter = Counter()
    for ds in sorted(folder.glob("*.ds")):
        tokens = np.fromfile(ds, dtype="<u2")
        ends = np.fromfile(f"{ds}.index", dtype="<u8")
        for start, end in zip([0, *ends[:-1]], ends, strict=True):
            docs[tuple(int(t) for t in tokens[start:end])] += 1
    return docs


def _tokenize(demo: DemoData, output: Path, *extra: str) -> int:
    return main(
        ["tokenize", "--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer), "--output", str(output),
         "--tasks", "2", *extra]
    )  # fmt: skip


@pytest.fixture(scope="module")
def tokenized(demo_data: DemoData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("tokenized") / "out"
    assert _tokenize(demo_data, output) == 0
    return output


def test_the_files_hold_every_document_tokenized_with_its_end_token(tokenized: Path, demo_data: DemoData):
    texts = _texts(demo_data)
    assert _documents(tokenized) == _expected(demo_data, texts)
    folder, problems = nanoset.inspect(tokenized, vocab_size=demo_data.vocab)
    assert problems == [] and folder is not None
    assert len(folder.files) == 2 and folder.documents == len(texts) and folder.token_size == 2
    assert folder.tokens == sum(len(ids) * n for ids, n in _expected(demo_data, texts).items())
    assert nanoset.same_tokenizer(folder.tokenizer, str(demo_data.tokenizer))


def test_the_record_says_what_was_run_and_what_it_made(tokenized: Path, demo_data: DemoData):
    record = json.loads((tokenized / RECORD_DIR / RECORD).read_text())
    folder, _ = nanoset.inspect(tokenized)
    assert folder is not None
    assert record["status"] == "complete" and record["tokens"] == folder.tokens and record["files"] == 2
    assert "launcher.data tokenize" in record["command"] and str(demo_data.dataset) in record["command"]
    assert record["versions"]["datatrove"].startswith("0.10") and record["dataset"]["sha256"]
    assert record["eos_token"] == "</s>" and record["vocab_size"] == demo_data.vocab


def test_every_problem_is_named_at_once_and_nothing_is_written(tmp_path: Path, demo_data: DemoData, capsys):
    output = tmp_path / "out"
    code = main(
        ["tokenize", "--dataset", str(tmp_path / "missing"), "--tokenizer", str(demo_data.tokenizer), "--output",
         str(output), "--tasks", "0", "--workers", "-2", "--eos_token", "<nope>"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for flag in ("--dataset", "--tasks", "--workers", "--eos_token"):
        assert f"  - {flag}:" in err
    assert not output.exists()


def test_the_text_column_and_a_busy_output_are_refused(tmp_path: Path, demo_data: DemoData, tokenized: Path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    args = TokenizeArgs(str(demo_data.dataset), str(demo_data.tokenizer), str(tmp_path / "busy"), text_column="body")
    plan, problems = check(args)
    assert plan is None and [p.flag for p in problems] == ["text_column", "output"]
    other = TokenizeArgs(str(demo_data.dataset), str(demo_data.tokenizer), str(tokenized), tasks=3)
    plan, problems = check(other)
    assert plan is None and "--tasks 2" in problems[0].message


def test_an_interrupted_tokenization_continues_where_it_stopped(tmp_path: Path, demo_data: DemoData, tokenized: Path):
    output = tmp_path / "out"
    shutil.copytree(tokenized, output)
    # task 1 never finished: no completion record, no token files (as a killed task leaves its rank)
    (output / RECORD_DIR / "logs" / "completions" / "00001").unlink()
    for path in output.glob("00001_*"):
        path.unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in output.glob("00000_*")}
    assert kept and nanoset.inspect(output)[0] is not None  # what is left is whole, just smaller
    assert _tokenize(demo_data, output) == 0
    assert {p.name: p.stat().st_mtime_ns for p in output.glob("00000_*")} == kept  # task 0 was not run again
    assert _documents(output) == _documents(tokenized)
    record = json.loads((output / RECORD_DIR / RECORD).read_text())
    assert record["status"] == "complete" and record["documents"] == len(_texts(demo_data))


def test_a_folder_of_jsonl_files_is_read_by_datatrove_s_reader(tmp_path: Path, demo_data: DemoData):
    texts = _texts(demo_data)
    source = tmp_path / "jsonl"
    source.mkdir()
    for n, part in enumerate((texts[:100], texts[100:])):
        lines = [json.dumps({"body": t, "id": i}) for i, t in enumerate(part)]
        (source / f"part{n}.jsonl").write_text("\n".join(lines) + "\n")
    output = tmp_path / "out"
    code = main(
        ["tokenize", "--dataset", str(source), "--tokenizer", str(demo_data.tokenizer), "--output", str(output),
         "--text_column", "body", "--tasks", "2", "--no_shuffle"]
    )  # fmt: skip
    assert code == 0
    assert _documents(output) == _expected(demo_data, texts)


def test_the_same_tokenization_named_from_another_directory_continues(
    tokenized: Path, demo_data: DemoData, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(demo_data.dataset.parent)
    args = TokenizeArgs("./" + demo_data.dataset.name, str(demo_data.tokenizer), str(tokenized), tasks=2)
    plan, problems = check(args)
    assert problems == [] and plan is not None and plan.resume
