"""The demo dataset and tokenizer: made locally, deterministic, reusable, loadable by path."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from datasets import load_from_disk
from transformers import AutoTokenizer

from launcher.localcluster import demo_data as demo

if TYPE_CHECKING:
    from conftest import DemoData


def test_texts_are_deterministic_in_the_seed() -> None:
    assert demo.make_texts(5, seed=1) == demo.make_texts(5, seed=1)
    assert demo.make_texts(5, seed=1) != demo.make_texts(5, seed=2)


def test_demo_loads_back_by_path(demo_data: DemoData) -> None:
    dataset, tokenizer_dir = demo_data.dataset, demo_data.tokenizer
    texts = load_from_disk(str(dataset))["text"]
    assert len(texts) == 150 and all(t.endswith(" .") for t in texts)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    specials = [tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert specials == [0, 1, 2, 3]
    ids = tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids  # every word of the corpus is in the vocabulary
    assert tokenizer.decode(ids) == texts[0]
    assert len(tokenizer) < 128  # fits the tiny test model's vocab_size


def test_cli_writes_both_and_reuses_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo.main([str(tmp_path), "--num-docs", "20"])
    first = capsys.readouterr().out
    assert f"dataset: {tmp_path / 'dataset'}" in first and f"tokenizer: {tmp_path / 'tokenizer'}" in first
    vocab_line = next(line for line in first.splitlines() if line.startswith("vocab size: "))
    assert int(vocab_line.split(": ")[1]) == len(AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer")))
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}

    demo.main([str(tmp_path), "--num-docs", "50"])  # idempotent: existing files are reused, not rewritten
    assert capsys.readouterr().out == first
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == stamps
    assert len(load_from_disk(str(tmp_path / "dataset"))) == 20
