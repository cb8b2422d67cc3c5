"""How many tokens a local dataset holds, estimated before the queue from a sample, so that the summary can say
how many times the run goes over it ("the run reads 10.5B tokens; the dataset holds ~31M: 340 epochs").

An estimate, never a refusal: the text bytes of the training split's text column (from the file sizes and the
share of text in a sample, so a 100 GB dataset costs one sample's reading), times the tokens per byte of that
sample as the run's own tokenizer cuts it (`tokenizers`, from tokenizer.json; without one, ~4 bytes a token), plus
one end-of-text token a document, as the job's packing adds. Forms it cannot read cheaply (a JSON array, a hub
name) give None.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from launcher.nanotron_config.datasource import is_local_path

SAMPLE_BYTES = 1 << 20  # of text, tokenized
BYTES_PER_TOKEN = 4.0  # without a tokenizer.json: English text under BPE vocabularies of 32k-128k


@dataclass(frozen=True)
class DataSize:
    tokens: int  # estimated tokens in the training split, eos tokens included
    how: str  # how it was estimated, for the summary


@dataclass(frozen=True)
class _Sample:
    texts: list[str]  # the first documents, up to SAMPLE_BYTES of text
    sample_bytes: int  # bytes of the data that held them (records, not only text)
    total_bytes: int  # bytes of all the data of the split


def _from_arrow_files(directory: Path, column: str) -> _Sample | None:
    import pyarrow as pa  # only for a saved dataset (~0.2 s)

    state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
    files = [directory / f["filename"] for f in state.get("_data_files", [])]
    if not files:
        return None
    texts: list[str] = []
    sample_bytes = 0
    with pa.memory_map(str(files[0])) as source:
        for batch in pa.ipc.open_stream(source):
            if column not in batch.schema.names:
                return None
            texts += [t for t in batch.column(column).to_pylist() if isinstance(t, str)]
            sample_bytes += batch.nbytes
            if sum(map(len, texts)) >= SAMPLE_BYTES:  # once a batch (of ~1000 rows)
                break
    return _Sample(texts, sample_bytes, sum(f.stat().st_size for f in files))


def _saved(path: Path, column: str, split: str) -> _Sample | None:
    if (path / "state.json").is_file():
        return _from_arrow_files(path, column)
    if (path / split / "state.json").is_file():
        return _from_arrow_files(path / split, column)
    return None


def _from_lines(path: Path, column: str) -> _Sample | None:
    """A sample of a JSON lines, CSV or text file: its first whole lines, up to SAMPLE_BYTES of text."""
    lines: list[str] = []
    text = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            lines.append(line)
            text += len(line)
            if text >= SAMPLE_BYTES:
                break
    if lines and not lines[-1].endswith("\n") and len(lines) > 1:
        lines.pop()  # cut by the end of a partial read
    read = sum(len(line.encode()) for line in lines)
    if path.suffix == ".csv":
        texts = [row.get(column) or "" for row in csv.DictReader(line for line in lines if line.strip())]
    elif path.suffix == ".txt":
        texts = [line.rstrip("\n") for line in lines]
    else:
        records = [json.loads(line) for line in lines if line.strip()]
        if not all(isinstance(r, dict) for r in records):
            return None  # a JSON array file: left to the job
        texts = [r[column] if isinstance(r.get(column), str) else "" for r in records]
    return _Sample([t for t in texts if t], read, path.stat().st_size)


def _from_parquet(path: Path, column: str) -> _Sample | None:
    import pyarrow.parquet as pq  # only for a parquet file

    meta = pq.ParquetFile(path)
    if meta.metadata.num_row_groups == 0 or column not in meta.schema_arrow.names:
        return None
    j = meta.schema_arrow.names.index(column)
    sizes = [meta.metadata.row_group(i).column(j).total_uncompressed_size for i in range(meta.metadata.num_row_groups)]
    texts = [t for t in meta.read_row_group(0, columns=[column]).column(0).to_pylist() if isinstance(t, str)]
    return _Sample(texts, sizes[0], sum(sizes))


def _tokens_per_byte(tokenizer: str | None, texts: list[str]) -> tuple[float, str]:
    tokenizer_json = Path(os.path.expanduser(tokenizer)) / "tokenizer.json" if tokenizer else None
    if tokenizer_json is not None and tokenizer_json.is_file():
        from tokenizers import Tokenizer  # Rust, imports in ~10 ms; no transformers

        encoded = Tokenizer.from_file(str(tokenizer_json)).encode_batch(texts, add_special_tokens=False)
        text_bytes = sum(len(t.encode()) for t in texts)
        return sum(len(e.ids) for e in encoded) / max(text_bytes, 1), f"the tokenizer on a {_mb(text_bytes)} sample"
    return 1 / BYTES_PER_TOKEN, f"~{BYTES_PER_TOKEN:g} bytes a token"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.0f} KB"


def estimate(dataset: str | None, text_column: str, split: str, tokenizer: str | None) -> DataSize | None:
    """The training split's size in tokens, estimated; None for no dataset, a hub name, or a form left to the job."""
    if dataset is None or not is_local_path(dataset):
        return None
    path = Path(os.path.expanduser(dataset))
    try:
        if path.is_dir():
            sample = _saved(path, text_column, split)
        elif path.suffix == ".parquet":
            sample = _from_parquet(path, text_column)
        elif path.suffix in (".json", ".jsonl", ".csv", ".txt"):
            sample = _from_lines(path, text_column)
        else:
            sample = None
        if sample is None or not sample.texts or sample.sample_bytes <= 0:
            return None
        per_byte, how = _tokens_per_byte(tokenizer, sample.texts)
    except Exception:  # noqa: BLE001  an estimate: what cannot be read cheaply is the job's to read, datacheck's to judge
        return None
    scale = sample.total_bytes / sample.sample_bytes
    text_bytes = sum(len(t.encode()) for t in sample.texts) * scale
    documents = len(sample.texts) * scale
    return DataSize(int(text_bytes * per_byte + documents), how)
