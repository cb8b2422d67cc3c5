"""Training data as an indexable stream of micro-batches, so a checkpoint only needs a position.

`micro_batch(k)` is a pure function of (config, dp rank, k): a resumed run that restarts at position k reads
exactly the windows an uninterrupted run would have read. Two sources:

- no dataset: random tokens, deterministic in (data seed, rank, k), like nanotron's dummy data generator;
- a dataset (a `save_to_disk` directory, a local .json/.jsonl/.parquet/.csv/.txt file, or a hub name): the text
  column is tokenized once (the torch engine's rank 0, shared through `packcache`), documents are joined with
  eos and cut into windows of sequence_length + 1 tokens (consecutive windows share one token, as nanotron's
  `clm_process` does), the windows are shuffled per epoch from the data seed, and dp rank r takes windows
  r, r + dp, ... of each epoch's order.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from launcher.errors import TrainError
from launcher.nanotron_config.datasource import DATA_FILE_BUILDERS, is_local_path
from launcher.train.settings import TrainConfig


class MicroBatches(Protocol):
    """An indexable stream of micro-batches for one dp rank."""

    def micro_batch(self, index: int) -> torch.Tensor:
        """Token windows, shape (micro_batch_size, sequence_length + 1), dtype int64."""
        ...

    def epoch(self, index: int) -> int:
        """The pass over the data that micro-batch `index` belongs to (0-based)."""
        ...


class RandomTokens:
    """Uniformly random tokens: no learnable signal, for throughput runs without a dataset."""

    def __init__(self, vocab_size: int, sequence_length: int, micro_batch_size: int, seed: int, rank: int):
        self.shape = (micro_batch_size, sequence_length + 1)
        self.vocab_size, self.seed, self.rank = vocab_size, seed, rank

    def micro_batch(self, index: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, self.rank, index])
        return torch.from_numpy(rng.integers(0, self.vocab_size, self.shape, dtype=np.int64))

    def epoch(self, index: int) -> int:
        return 0


class PackedWindows:
    """Fixed-length token windows, reshuffled every epoch, sharded round-robin over the dp ranks."""

    def __init__(self, windows: np.ndarray, micro_batch_size: int, seed: int, rank: int, dp: int):
        self.windows, self.micro_batch_size, self.seed, self.rank, self.dp = (
            windows,
            micro_batch_size,
            seed,
            rank,
            dp,
        )
        self.per_rank = len(windows) // dp  # every rank gets as many windows per epoch; the rest are dropped
        if self.per_rank == 0:
            raise TrainError(
                f"the dataset makes {len(windows)} windows of {windows.shape[1]} tokens, fewer than the {dp} "
                "data-parallel ranks: use a larger dataset or a shorter sequence length"
            )
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.windows)))
        return self._order[1]

    def micro_batch(self, index: int) -> torch.Tensor:
        rows = []
        for sample in range(index * self.micro_batch_size, (index + 1) * self.micro_batch_size):
            epoch, offset = divmod(sample, self.per_rank)
            rows.append(self._epoch_order(epoch)[self.rank + offset * self.dp])
        return torch.from_numpy(np.asarray(self.windows[rows], dtype=np.int64))  # a copy, also of a mapped file

    def epoch(self, index: int) -> int:
        return ((index + 1) * self.micro_batch_size - 1) // self.per_rank  # the epoch of its last sample


def mixture_parts(cfg: TrainConfig) -> list[tuple[TrainConfig, float]]:
    """A mixture's datasets, each as a config of its own, with the fraction of its rows nanotron keeps."""
    for name, weight in cfg.mixture:
        if not 0 < weight <= 1:
            raise TrainError(f"dataset {name} has weight {weight} in the mixture: nanotron keeps that fraction of "
                             "its rows, so it lies in (0, 1]")  # fmt: skip
    return [(dataclasses.replace(cfg, dataset=name, mixture=()), weight) for name, weight in cfg.mixture]


def _kept(split, weight: float, column: str):  # type: ignore[no-untyped-def]  # datasets.Dataset both
    """What nanotron's `_get_dataset_mix` keeps of a mixture's dataset: its first int(weight x rows) rows."""
    return split.select_columns([column]).select(range(int(weight * len(split))))


class StagedBatches:
    """nanotron main's data stages: from a stage's first step on, its own stream read from its start (main's
    trainer gives a new stage a dataloader from zero). A pure function of the position, as each stream is: a
    resumed run continues the same order, across a switch too."""

    def __init__(self, first: MicroBatches, later: list[tuple[str, int, MicroBatches]]):
        self.parts = [("", 0, first), *sorted(later, key=lambda part: part[1])]  # (name, first index, stream)

    def _part(self, index: int) -> tuple[str, int, MicroBatches]:
        return [part for part in self.parts if part[1] <= index][-1]

    def micro_batch(self, index: int) -> torch.Tensor:
        _, begin, stream = self._part(index)
        return stream.micro_batch(index - begin)

    def epoch(self, index: int) -> int:
        _, begin, stream = self._part(index)
        return stream.epoch(index - begin)

    def begins(self, index: int) -> str | None:
        """The stage whose first micro-batch is `index`, if one is."""
        return next((name for name, begin, _ in self.parts[1:] if begin == index), None)


def load_split(cfg: TrainConfig):  # type: ignore[no-untyped-def]  # a datasets.Dataset
    """The configured dataset's split, its text column checked. Both engines read their data through it. A
    mixture's: what nanotron keeps of each dataset (`_kept`), concatenated in the config's order.

    A `save_to_disk` directory (Dataset or DatasetDict), a local .json/.jsonl/.parquet/.csv/.txt file, or a hub
    name. (nanotron 0.4's own `get_datasets` calls `load_dataset(path)`, which reads none of the local forms but a
    saved DatasetDict: a local dataset would fail on the GPU nodes, after the queue.)
    """
    import datasets

    if cfg.mixture:
        kept = [_kept(load_split(part), weight, part.text_column) for part, weight in mixture_parts(cfg)]
        try:
            return datasets.concatenate_datasets(kept)
        except ValueError as e:
            raise TrainError(f"the mixture's datasets cannot be joined: {e}") from None
    assert cfg.dataset is not None
    path = Path(os.path.expanduser(cfg.dataset))
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except FileNotFoundError as e:
            raise TrainError(f"{path} is not a dataset directory written by Dataset.save_to_disk ({e})") from None
        if isinstance(loaded, datasets.DatasetDict):
            if cfg.dataset_split not in loaded:
                raise TrainError(f"dataset {path} has no split {cfg.dataset_split!r}; it has {sorted(loaded)}")
            loaded = loaded[cfg.dataset_split]
    elif path.is_file():
        builder = DATA_FILE_BUILDERS.get(path.suffix)
        if builder is None:
            raise TrainError(f"dataset file {path}: unknown type, use one of {', '.join(DATA_FILE_BUILDERS)}")
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
    elif is_local_path(cfg.dataset):
        raise TrainError(f"dataset path {cfg.dataset} does not exist: give an existing directory or data file")
    else:
        try:
            loaded = datasets.load_dataset(cfg.dataset, cfg.dataset_config_name, split=cfg.dataset_split)
        except Exception as e:  # the hub client raises many types; all mean "not loadable here"
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise TrainError(
                f"could not load dataset {cfg.dataset!r} from the Hugging Face hub ({type(e).__name__}: "
                f"{first_line}); without network access, give a local directory or data file"
            ) from None
    if cfg.text_column not in loaded.column_names:
        raise TrainError(
            f"dataset {cfg.dataset} has no column {cfg.text_column!r} (columns: {', '.join(loaded.column_names)}): "
            "set data.dataset.text_column_name"
        )
    return loaded


def load_texts(cfg: TrainConfig) -> list[str]:
    """The non-empty texts of the configured dataset's text column."""
    return [text for text in load_split(cfg)[cfg.text_column] if text]


def load_tokenizer(cfg: TrainConfig):  # type: ignore[no-untyped-def]  # a transformers tokenizer
    """The configured tokenizer, checked against the model's vocabulary."""
    from transformers import AutoTokenizer

    if cfg.tokenizer is None:
        raise TrainError("a dataset needs a tokenizer: set tokenizer.tokenizer_name_or_path (--tokenizer)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(cfg.tokenizer))
    except (OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainError(f"could not load tokenizer {cfg.tokenizer!r}: {first_line}") from None
    _check_vocabulary(cfg, len(tokenizer))
    return tokenizer


def _check_vocabulary(cfg: TrainConfig, size: int) -> None:
    """A tokenizer of `size` tokens must fit the model's embedding."""
    if size > cfg.model.vocab_size:
        raise TrainError(
            f"tokenizer {cfg.tokenizer} has {size} tokens but the model's vocab_size is "
            f"{cfg.model.vocab_size}: use --vocab_size {size} (or larger)"
        )


def _eos_of(directory: Path) -> str | None:
    """The eos token a tokenizer directory names (tokenizer_config.json, else special_tokens_map.json)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            eos = json.loads((directory / name).read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError):
            continue
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            return eos
    return None


Encoder = Callable[[list[str]], list[list[int]]]
CHUNK = 10_000  # texts tokenized at a time: a batch's encodings and Python ints live only until packed


def encoder(cfg: TrainConfig) -> tuple[Encoder, int]:
    """The run's tokenizer as a function of texts to their token ids (no special tokens), and the eos id that joins
    them, checked against the model's vocabulary. A local directory with a tokenizer.json is read by `tokenizers`
    itself: the ids transformers' fast tokenizer gives (a test holds them equal), without the ~2 s of CPU
    transformers' import costs every rank. Anything else goes through AutoTokenizer."""
    directory = Path(os.path.expanduser(cfg.tokenizer)) if cfg.tokenizer else None
    if directory is None or not (directory / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(cfg)
        eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else cfg.model.eos_token_id
        return (lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]), eos_id
    from tokenizers import Tokenizer

    try:
        fast = Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001  the Rust library's errors: all mean "not a tokenizer it reads"
        raise TrainError(f"could not load tokenizer {cfg.tokenizer!r}: {e}") from None
    _check_vocabulary(cfg, fast.get_vocab_size(with_added_tokens=True))
    eos = _eos_of(directory)
    eos_id = fast.token_to_id(eos) if eos is not None else None

    def encode(texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in fast.encode_batch(texts, add_special_tokens=False)]

    return encode, eos_id if eos_id is not None else cfg.model.eos_token_id


def tokenize(cfg: TrainConfig, texts: list[str]) -> tuple[list[list[int]], int]:
    """Every text's token ids and the eos id that joins them (`encoder`)."""
    encode, eos_id = encoder(cfg)
    return encode(texts), eos_id


def _joined(token_lists: list[list[int]], eos_id: int) -> np.ndarray:
    return np.fromiter((t for doc in token_lists for t in (*doc, eos_id)), dtype=np.int64)


def _windows(tokens: np.ndarray, sequence_length: int) -> np.ndarray:
    count = (len(tokens) - 1) // sequence_length
    starts = np.arange(count, dtype=np.int64)[:, None] * sequence_length
    return tokens[starts + np.arange(sequence_length + 1, dtype=np.int64)]


def pack(token_lists: list[list[int]], eos_id: int, sequence_length: int) -> np.ndarray:
    """Join documents with eos and cut windows of sequence_length + 1 tokens that overlap by one token."""
    return _windows(_joined(token_lists, eos_id), sequence_length)


def tokenize_and_pack(cfg: TrainConfig, texts: list[str], chunk: int = CHUNK) -> np.ndarray:
    """`pack(*tokenize(cfg, texts), ...)`, the same windows, tokenized `chunk` texts at a time: a corpus's memory is
    its tokens (twice while the chunks are joined) and its windows, 8 bytes a token each, never every text's encoding
    at once (1.04 GB of text, 215M tokens, took over 24 GB that way and was killed; docs/performance.md)."""
    encode, eos_id = encoder(cfg)
    parts = [_joined(encode(texts[start : start + chunk]), eos_id) for start in range(0, len(texts), chunk)]
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    del parts
    return _windows(tokens, cfg.sequence_length)


def build_windows(cfg: TrainConfig) -> np.ndarray:
    """The configured dataset, tokenized and packed into windows (`tokenize_and_pack`); a mixture's, each dataset
    packed on its own (`part_windows`) and the windows joined in the config's order."""
    if cfg.mixture:
        return np.concatenate(part_windows(cfg))
    return tokenize_and_pack(cfg, load_texts(cfg))


def part_windows(cfg: TrainConfig) -> list[np.ndarray]:
    """A mixture's windows, dataset by dataset: what nanotron keeps of each (`_kept`), tokenized and packed. Each
    window comes from one dataset, so a dataset's share of the windows is its share of the kept tokens."""
    out = []
    for part, weight in mixture_parts(cfg):
        texts = [text for text in _kept(load_split(part), weight, part.text_column)[part.text_column] if text]
        out.append(tokenize_and_pack(part, texts))  # (the part's config is the run's, its dataset one of them)
    return out


def build_micro_batches(cfg: TrainConfig, rank: int, dp: int, windows: np.ndarray | None = None) -> MicroBatches:
    """This dp rank's micro-batch stream for the run; `windows`: the dataset's packed windows where the caller has
    them already (the engine's shared cache, `packcache`), else they are built here."""
    if cfg.dataset is None:
        return RandomTokens(cfg.model.vocab_size, cfg.sequence_length, cfg.micro_batch_size, cfg.data_seed, rank)
    if cfg.nanoset:  # tokenized folders: their files mapped, each window read as a batch asks for it
        from launcher.train.tokenized import FolderWindows

        windows = FolderWindows(list(cfg.nanoset), cfg.sequence_length, cfg.nanoset_caps)  # type: ignore[assignment]
    windows = build_windows(cfg) if windows is None else windows
    return PackedWindows(windows, cfg.micro_batch_size, cfg.data_seed, rank, dp)
