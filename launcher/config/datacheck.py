"""What a local dataset or tokenizer holds, read before the queue from its own small files (no `datasets`, no
`transformers` import): a wrong --text_column, a directory that is not a dataset, a missing split or a tokenizer
directory without a vocabulary would otherwise stop the job only once it runs.

Each check answers with problems only when the files say so for certain; what cannot be read cheaply (a .json
file that is one big array, a line over 1 MiB, a hub name) is left to the job.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
from pathlib import Path

from launcher.nanotron_config.datasource import DATA_FILE_BUILDERS
from launcher.problems import Problem

STRING_TYPES = ("string", "large_string")  # the Value dtypes of a text column (datasets and arrow names)
# Files AutoTokenizer builds a tokenizer from: a fast tokenizer, or a slow one's vocabulary or model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
SUFFIXES = ", ".join(DATA_FILE_BUILDERS)
JSON_CHUNK = 10 << 20  # the json builder infers a file's columns from its first chunk (datasets' JsonConfig.chunksize)
MAX_JSON_LINE = 1 << 20  # a longer JSON line is left to the job
COLUMN_SAMPLE = 100  # JSON records read whole for their columns; later lines only for the text column


def _fix_column(columns: dict[str, str], path: Path) -> str:
    texts = [name for name, kind in columns.items() if kind in STRING_TYPES or not kind]  # untyped: a csv header
    if len(texts) == 1:
        return f"use --text_column {texts[0]}"
    if texts:
        return f"use --text_column with one of its text columns: {', '.join(texts)}"
    return f"{path} has no text column: give a dataset with one"


def column_problems(columns: dict[str, str], text_column: str, path: Path) -> list[Problem]:
    """The text column against a dataset's columns (name -> type, "" where the type is unknown)."""
    if text_column not in columns:
        listed = ", ".join(columns) or "none"
        return [
            Problem(
                "text_column", f"{path} has no column {text_column!r} (columns: {listed})", _fix_column(columns, path)
            )
        ]
    kind = columns[text_column]
    if kind and kind not in STRING_TYPES:
        return [
            Problem(
                "text_column", f"column {text_column!r} of {path} holds {kind}, not text", _fix_column(columns, path)
            )
        ]
    return []


def _feature_kind(feature: object) -> str:
    """A dataset_info.json feature's type as a column type: its dtype for a Value, "" where it may hold text."""
    if isinstance(feature, list):
        return "list"  # the older form of a list feature
    if not isinstance(feature, dict) or feature.get("_type") == "Json":  # Json: any JSON value per row
        return ""
    kind = feature.get("dtype") if feature.get("_type") == "Value" else feature.get("_type")
    return kind if isinstance(kind, str) else ""


def _features(info_file: Path) -> dict[str, str] | None:
    """Column name -> type from a saved dataset's dataset_info.json; None where it names no features (the job then
    takes them from the arrow files)."""
    features = json.loads(info_file.read_text(encoding="utf-8"))
    features = features.get("features") if isinstance(features, dict) else None
    if not isinstance(features, dict):
        return None
    return {name: _feature_kind(feature) for name, feature in features.items()}


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() and (path / "state.json").is_file()


def _saved_dataset(path: Path, split: str) -> tuple[dict[str, str] | None, list[Problem]]:
    """A save_to_disk directory's columns, or the problem that it is none (or lacks the split). Like the job's
    load_from_disk, a Dataset (dataset_info.json and state.json) first, whatever else the directory holds."""
    if _is_saved_dataset(path):
        return _features(path / "dataset_info.json"), []
    if (path / "dataset_dict.json").is_file():
        return _saved_split(path, split)
    files = sorted(p.name for p in path.iterdir() if p.suffix in DATA_FILE_BUILDERS)
    hint = f" (it holds {', '.join(files[:3])}{', ...' if len(files) > 3 else ''}: give one file)" if files else ""
    return None, [
        Problem(
            "dataset",
            f"{path} is a directory but not a dataset saved by save_to_disk (no dataset_info.json and state.json, "
            f"nor dataset_dict.json), nor a tokenized folder (no *.ds token files){hint}",
            f"give a save_to_disk directory, one data file ({SUFFIXES}), or a folder made by `python -m launcher.data "
            "tokenize` (docs/data.md)",
        )
    ]


def saved_splits(dataset: str) -> list[str] | None:
    """The splits a saved DatasetDict lists (its dataset_dict.json); None where `dataset` is no DatasetDict (or its
    list does not read: `dataset_problems` says why)."""
    path = Path(os.path.expanduser(dataset))
    try:
        if _is_saved_dataset(path) or not (path / "dataset_dict.json").is_file():
            return None
        listed = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    splits = listed.get("splits") if isinstance(listed, dict) else None
    return splits if isinstance(splits, list) and all(isinstance(s, str) for s in splits) else None


def _saved_split(path: Path, split: str) -> tuple[dict[str, str] | None, list[Problem]]:
    """The training split of a saved DatasetDict. The job's load_from_disk loads every split it lists."""
    listed = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))
    splits = listed.get("splits") if isinstance(listed, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        return None, [
            Problem(
                "dataset",
                f'{path / "dataset_dict.json"} does not list the splits (as {{"splits": ["train", ...]}})',
                "save the dataset again with DatasetDict.save_to_disk",
            )
        ]
    if split not in splits:
        return None, [
            Problem(
                "dataset",
                f"{path} has no split {split!r} (splits: {', '.join(splits) or 'none'})",
                "save the training split as 'train', or set data.dataset.hf_dataset_splits in a --config YAML",
            )
        ]
    missing = [s for s in splits if not _is_saved_dataset(path / s)]
    if missing:
        return None, [
            Problem(
                "dataset",
                f"{path} lists the split{'s' if len(missing) > 1 else ''} {', '.join(missing)} in dataset_dict.json "
                "without a saved dataset there (no dataset_info.json and state.json); the job loads every split",
                "save the dataset again with DatasetDict.save_to_disk",
            )
        ]
    return _features(path / split / "dataset_info.json"), []


def _json_kind(value: object) -> str:
    """A JSON value's type as a column type: "" where it may still be text (null, or a falsy value the job skips)."""
    if isinstance(value, str):
        return "string"
    return type(value).__name__ if value else ""


def _json_columns(path: Path, text_column: str) -> tuple[dict[str, str] | None, list[Problem]]:
    """The columns the job's json builder gives a JSON-lines file. It infers them from the records in the file's
    first chunk (a column first met after it fails the job), so lines are read until a record holds the text column
    or the chunk ends; a null where the column is missing does not stop the job. None where that is not cheap or
    not certain: one JSON array or a pretty-printed object (the builder reads those whole), a line over
    MAX_JSON_LINE, a later line that is not a JSON object."""
    columns: dict[str, str] = {}
    records = 0
    offset = 0  # where the next line starts: the builder's first chunk holds every line starting up to JSON_CHUNK
    needle = json.dumps(text_column, ensure_ascii=False).encode()  # the key as written, unless \u-escaped
    with open(path, "rb") as f:
        while offset <= JSON_CHUNK:
            raw = f.readline(MAX_JSON_LINE)
            if not raw:
                break
            if len(raw) == MAX_JSON_LINE and not raw.endswith(b"\n"):
                return None, []  # too long to read before the queue
            if records >= COLUMN_SAMPLE and needle not in raw and b"\\" not in raw:
                offset += len(raw)
                continue  # no text column in it (the columns named in a problem come from the first records)
            text = (raw.removeprefix(codecs.BOM_UTF8) if offset == 0 else raw).decode("utf-8").strip()
            offset += len(raw)
            if not text:
                continue  # the builder skips blank lines
            try:
                record = json.loads(text)
            except (json.JSONDecodeError, RecursionError):  # not JSON, or nested deeper than Python's parser goes
                record = None
            if not isinstance(record, dict):
                if records or text.startswith(("[", "{")):
                    return None, []
                return None, [
                    Problem(
                        "dataset",
                        f"{path} does not start with a JSON object or array",
                        'give JSON lines: one object per line, e.g. {"text": "..."}',
                    )
                ]
            records += 1
            for key, value in record.items():
                if not columns.get(key):
                    columns[key] = _json_kind(value)
            if record.get(text_column) is not None:
                break
    if not records:
        return None, [Problem("dataset", f"{path} holds only blank lines", 'give JSON lines, e.g. {"text": "..."}')]
    return columns, []


def _csv_header(path: Path) -> tuple[dict[str, str] | None, list[Problem]]:
    """The columns pandas (the job's csv builder) reads: the first line that is not blank, after any UTF-8 BOM."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        try:
            for row in csv.reader(f):
                if len(row) > 1 or (row and row[0].strip()):  # pandas skips empty and whitespace-only lines
                    return dict.fromkeys(row, ""), []
        except csv.Error:  # e.g. a header field over the csv module's size limit: left to the job
            return None, []
    return None, [
        Problem("dataset", f"{path} holds only blank lines", "give a CSV file whose first line names its columns")
    ]


def _parquet_columns(path: Path) -> tuple[dict[str, str] | None, list[Problem]]:
    """A parquet file's columns from its schema; a dictionary-encoded column by the type of its values."""
    import pyarrow  # only for a parquet file (~0.1 s)
    import pyarrow.parquet

    try:
        schema = pyarrow.parquet.read_schema(path)
    except pyarrow.ArrowException as e:
        return None, [Problem("dataset", f"{path} is not a parquet file pyarrow can read ({e})", "check the file")]
    return {
        field.name: str(field.type.value_type if isinstance(field.type, pyarrow.DictionaryType) else field.type)
        for field in schema
    }, []


def _file_columns(path: Path, text_column: str) -> tuple[dict[str, str] | None, list[Problem]]:
    """A data file's columns as the job's `datasets` builder will see them (None: not cheaply known)."""
    builder = DATA_FILE_BUILDERS.get(path.suffix)
    if builder is None:
        return None, [
            Problem(
                "dataset",
                f"{path} is a {path.suffix or 'suffix-less'} file, which the job cannot read",
                f"give a data file ({SUFFIXES}) or a save_to_disk directory",
            )
        ]
    if path.stat().st_size == 0:
        return None, [Problem("dataset", f"{path} is empty", "give a data file with text in it")]
    if builder == "text":
        return {"text": "string"}, []  # one row per line, in a column named text
    if builder == "csv":
        return _csv_header(path)
    if builder == "parquet":
        return _parquet_columns(path)
    return _json_columns(path, text_column)


def dataset_problems(dataset: str, text_column: str, split: str) -> list[Problem]:
    """Problems with a local dataset (an existing path) that the job would meet only once it runs."""
    path = Path(os.path.expanduser(dataset))
    try:
        columns, problems = _saved_dataset(path, split) if path.is_dir() else _file_columns(path, text_column)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:  # the job's loader fails on these too
        return [Problem("dataset", f"cannot read {path} ({type(e).__name__}: {e})", "give a readable dataset")]
    if problems or columns is None:
        return problems
    return column_problems(columns, text_column, path)


def _names_tokenizer_class(config_file: Path) -> bool:
    """Whether a tokenizer_config.json names its class: AutoTokenizer builds some (ByT5) from that alone."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False  # AutoTokenizer fails on it as well
    return (
        isinstance(config, dict) and isinstance(config.get("tokenizer_class"), str) and bool(config["tokenizer_class"])
    )


def tokenizer_problems(tokenizer: str) -> list[Problem]:
    """A local tokenizer (an existing path) must be a directory holding a tokenizer AutoTokenizer can load: a
    vocabulary or model file, or a tokenizer_config.json that names the tokenizer's class."""
    path = Path(os.path.expanduser(tokenizer))
    try:
        if path.is_file():
            return [
                Problem(
                    "tokenizer",
                    f"{path} is a file; the tokenizer is loaded from its directory",
                    f"use --tokenizer {path.parent}",
                )
            ]
        if not path.is_dir() or any((path / name).is_file() for name in TOKENIZER_FILES):
            return []
        config = path / "tokenizer_config.json"
        if config.is_file() and _names_tokenizer_class(config):
            return []
    except OSError as e:  # e.g. a directory the launching user cannot read
        return [
            Problem(
                "tokenizer",
                f"cannot read {path} ({e.strerror or type(e).__name__})",
                "give a tokenizer directory you can read",
            )
        ]
    return [
        Problem(
            "tokenizer",
            f"{path} holds no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ..., or a tokenizer_config.json naming "
            "its tokenizer_class)",
            "give the directory a tokenizer was saved to (tokenizer.save_pretrained(DIR))",
        )
    ]
