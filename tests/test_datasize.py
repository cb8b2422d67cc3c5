"""The data-volume note: a local dataset's tokens, estimated from a sample, against an exact count."""

from __future__ import annotations

import json
import random
from pathlib import Path

import datasets
import pytest
from conftest import DemoData
from launcher_helpers import run_launcher
from tokenizers import Tokenizer

from launcher.perf import datasize

WORDS = "the cat dog child farmer baker sailor chases watches reads draws bakes sells mends ball bird book map".split()


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 80))) for _ in range(count)]


def exact_tokens(texts: list[str], tokenizer: Path) -> int:
    """What the job's packing holds: every document's tokens and one eos each."""
    encoded = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).encode_batch(texts, add_special_tokens=False)
    return sum(len(e.ids) for e in encoded) + len(texts)


FORMS = {
    "jsonl": lambda d, t: (d / "c.jsonl").write_text("".join(json.dumps({"id": 1, "text": x}) + "\n" for x in t)),
    "csv": lambda d, t: datasets.Dataset.from_dict({"text": t, "n": list(range(len(t)))}).to_csv(str(d / "c.csv")),
    "txt": lambda d, t: (d / "c.txt").write_text("\n".join(t) + "\n"),
    "parquet": lambda d, t: datasets.Dataset.from_dict({"text": t}).to_parquet(str(d / "c.parquet")),
    "saved": lambda d, t: datasets.Dataset.from_dict({"text": t}).save_to_disk(str(d / "c")),
    "saved-dict": lambda d, t: datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": t})}).save_to_disk(
        str(d / "c")
    ),
}  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
def test_the_estimate_is_within_five_percent_beyond_the_sample(form: str, tmp_path: Path, demo_data: DemoData):
    texts = documents(12_000)  # ~2.5 MB of text: more than the 1 MB sample
    FORMS[form](tmp_path, texts)
    (path,) = [p for p in tmp_path.iterdir() if p.name.startswith("c")]
    size = datasize.estimate(str(path), "text", "train", str(demo_data.tokenizer))
    exact = exact_tokens(texts, demo_data.tokenizer)
    assert size is not None and "the tokenizer on a" in size.how
    assert abs(size.tokens - exact) / exact < 0.05, (size.tokens, exact)


def test_without_a_tokenizer_json_bytes_make_the_estimate(tmp_path: Path):
    texts = documents(500)
    FORMS["jsonl"](tmp_path, texts)
    size = datasize.estimate(str(tmp_path / "c.jsonl"), "text", "train", None)
    text_bytes = sum(len(t.encode()) for t in texts)
    assert size is not None and size.how == "~4 bytes a token"
    assert size.tokens == pytest.approx(text_bytes / 4 + len(texts), rel=1e-6)


def test_what_cannot_be_read_cheaply_gives_no_estimate(tmp_path: Path):
    (tmp_path / "array.json").write_text(json.dumps([{"text": "a b"}]))
    assert datasize.estimate(str(tmp_path / "array.json"), "text", "train", None) is None
    assert datasize.estimate("org/hub-dataset", "text", "train", None) is None
    assert datasize.estimate(None, "text", "train", None) is None


def test_the_summary_says_how_often_the_run_reads_the_data(tmp_path: Path, demo_data: DemoData):
    out = run_launcher("--run_name", "v", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer),
                       "--train_steps", "100", "--warmup_steps", "10", "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("data "))
    assert "the run reads 3.28M tokens; the dataset holds ~" in line and "epochs" in line, line
    manifest = json.loads(next((tmp_path / "logs/configs/v").glob("*/manifest.json")).read_text())
    assert manifest["derived"]["epochs"] == pytest.approx(3_276_800 / manifest["derived"]["dataset_tokens"])
