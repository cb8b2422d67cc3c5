"""The torch engine's packed windows, tokenized once per run and shared: rank 0 tokenizes and packs the dataset
and writes the windows as one .npy file under `<checkpoints_path>/.data-cache/`; every rank then maps that file
(the page cache holds one copy a node, however many ranks read it), and a requeued attempt reads it back instead
of tokenizing again. Without it every rank of every node imported `datasets`, read the whole corpus and tokenized
it, each into its own memory.

The file is named by a key that needs no `datasets` import (that import alone costs every rank ~0.6 s of CPU):
the dataset's and the tokenizer's files (path, size, modification time), the text column, the split and the
sequence length. A dataset or tokenizer changed in place gets a new key. A hub dataset or tokenizer name is not
local, so it is not cached (each rank loads it, as before). Pure file work, no torch: the engine coordinates the
ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from launcher import atomic
from launcher import protocol as P
from launcher.train.settings import TrainConfig

CACHE_DIR = P.DATA_CACHE  # under checkpoints_path; the nanotron engine's packed datasets go there too
VERSION = 1  # of the packing (data.pack): a change to it must change the key


def _files(path: Path) -> list[tuple[str, int, int]]:
    """(relative name, size, mtime in ns) of a file, or of every file below a directory, in name order."""
    if path.is_file():
        stat = path.stat()
        return [(path.name, stat.st_size, stat.st_mtime_ns)]
    found = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            stat = (Path(root) / name).stat()
            found.append((str((Path(root) / name).relative_to(path)), stat.st_size, stat.st_mtime_ns))
    return found


def key(cfg: TrainConfig) -> str | None:
    """The packed windows' name for this config's data, or None where they are not cached (no dataset, or a
    dataset or tokenizer that is not a local path)."""
    if cfg.dataset is None or cfg.tokenizer is None:
        return None
    names = [name for name, _ in cfg.mixture] or [cfg.dataset]
    datasets, tokenizer = [Path(os.path.expanduser(p)) for p in names], Path(os.path.expanduser(cfg.tokenizer))
    if not all(p.exists() for p in (*datasets, tokenizer)):
        return None
    try:
        described = {
            "version": VERSION,
            **_datasets(datasets, [weight for _, weight in cfg.mixture]),
            "tokenizer": [str(tokenizer.resolve()), _files(tokenizer)],
            "split": cfg.dataset_split,
            "text_column": cfg.text_column,
            "sequence_length": cfg.sequence_length,
            "vocab_size": cfg.model.vocab_size,
            "eos_token_id": cfg.model.eos_token_id,
        }
    except OSError:
        return None
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


def _datasets(paths: list[Path], weights: list[float]) -> dict:
    """The data's part of the key: one dataset as it always was (its caches stay valid), a mixture's every
    dataset with the fraction kept of it."""
    if not weights:
        return {"dataset": [str(paths[0].resolve()), _files(paths[0])]}
    return {"mixture": [[str(p.resolve()), _files(p), w] for p, w in zip(paths, weights, strict=True)]}


def path_for(cfg: TrainConfig) -> Path | None:
    """Where this config's packed windows are (or will be) cached; None where they are not cached."""
    name = key(cfg)
    return None if name is None else Path(cfg.checkpoints_path) / CACHE_DIR / f"windows-{name}.npy"


def save(path: Path, windows: np.ndarray) -> None:
    """Write the windows whole or not at all: a temporary file beside it, renamed into place. Token ids are kept
    as int32 (4 bytes a token; any vocabulary fits), the batches are made int64 as they are read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(".tmp-*-windows-*.npy"):  # of a save a kill interrupted (one writer: rank 0)
        leftover.unlink(missing_ok=True)
    narrow = windows.size == 0 or windows.max() < 2**31
    atomic.replace(path, lambda f: np.save(f, windows.astype(np.int32) if narrow else windows), durable=True)


def load(path: Path) -> np.ndarray | None:
    """The cached windows, mapped read-only; None if the file is missing or not a 2-D token array."""
    try:
        windows = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if windows.ndim != 2 or windows.dtype not in (np.int32, np.int64):
        return None
    return windows
