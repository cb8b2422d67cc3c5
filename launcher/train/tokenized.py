"""The torch engine's windows over tokenized folders (nanotron main's Nanosets): each token file memory-mapped and
cut into windows of sequence_length + 1 tokens that overlap by one (as the engine's packing of text cuts them, and
nanotron's `clm_process`), read only as a batch asks for them: start-up maps files and reads no token, so it does
not grow with the corpus.

Not datatrove's `DatatroveFolderDataset` (0.10; what nanotron main's Nanoset reads folders with): its windows do
not overlap (window k is tokens k(s+1) .. k(s+1)+s, a file's count tokens // (s+1)), so it gives other windows,
fewer of them, and the pair of tokens where two windows meet is never trained; and it reads one folder, where a
mixture's weighing is this module's either way. Its speed is no reason either way (bench/bench_folder_windows.py,
200M tokens in 8 files, s = 2048: 11 us a shuffled window against 5 here, the folder opened in 4 ms against 2;
importing it takes torch, 1.2 s, which the job has anyway).

A folder's `dataset_max_tokens` (nanotron main's NanosetDatasetsArgs field; `--eval_heldout tail:N` writes it) caps
what is read of it: no window holds a token at or past that offset of the folder (its files in sorted order), so the
tokens after it are never trained (the held-out tail). main's own reader counts its cap in whole windows read.

A mixture is weighed as nanotron main weighs it (weights normalised by their sum): an epoch holds as many windows
as the folders together, each folder's share its weight's, a folder drawn past its end starting again. Each file's
windows stay within it, in the files' sorted order (`nanoset.inspect`'s), as datatrove's reader lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from launcher.errors import TrainError
from launcher.nanotron_config import nanoset

DTYPES: dict[int, str] = {2: "<u2", 4: "<u4"}


class FolderWindows:
    """Windows over token files, indexed like the engine's packed array (`len`, `shape`, `windows[rows]`)."""

    def __init__(self, folders: list[tuple[str, float]], sequence_length: int, caps: Sequence[int | None] = ()) -> None:
        self.sequence_length = sequence_length
        self._files: list[np.ndarray] = []
        starts: list[tuple[int, int, int]] = []
        per_folder: list[int] = []
        for n, (name, _) in enumerate(folders):
            cap = (caps[n] if n < len(caps) else None) or None  # (0 is no cap, as nanotron main reads it)
            folder, problems = nanoset.inspect(name, "dataset")
            if folder is None:
                raise TrainError("; ".join(f"{p.message} ({p.fix})" for p in problems))
            first = sum(per_folder)
            count, offset = 0, 0
            for token_file in folder.files:
                usable = token_file.tokens if cap is None else min(token_file.tokens, max(cap - offset, 0))
                offset += token_file.tokens
                windows = max((usable - 1) // sequence_length, 0)
                if windows:
                    mapped = np.memmap(token_file.path, dtype=DTYPES[folder.token_size], mode="r")
                    self._files.append(mapped)
                    starts.append((first + count, windows, len(self._files) - 1))
                    count += windows
            per_folder.append(count)
        self._starts = starts  # (first window, windows, file) in order
        self._first = np.array([s[0] for s in starts], dtype=np.int64)
        self.index = _weighted(per_folder, [w for _, w in folders])

    def __len__(self) -> int:
        return len(self.index)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), self.sequence_length + 1

    def __getitem__(self, rows: list[int]) -> np.ndarray:
        out = np.empty((len(rows), self.sequence_length + 1), dtype=np.int64)
        for n, row in enumerate(rows):
            window = int(self.index[row])
            at = int(np.searchsorted(self._first, window, side="right")) - 1
            first, _, file = self._starts[at]
            offset = (window - first) * self.sequence_length
            out[n] = self._files[file][offset : offset + self.sequence_length + 1]
        return out


def _weighted(per_folder: list[int], weights: list[float]) -> np.ndarray:
    """The windows of an epoch, by global window id: every window of one folder; for a mixture, as many windows as
    the folders hold together, each folder's share its normalised weight (a folder's own windows in order, again
    from its first where its share is larger than what it holds)."""
    total = sum(per_folder)
    if len(per_folder) == 1 or total == 0:
        return np.arange(total, dtype=np.int64)
    shares = np.asarray(weights, dtype=np.float64) / float(sum(weights))
    parts, first = [], 0
    for held, share in zip(per_folder, shares, strict=True):
        wanted = int(round(share * total))
        if wanted and not held:
            raise TrainError("a folder of the mixture holds no whole window: use a shorter sequence length")
        parts.append(first + (np.arange(wanted, dtype=np.int64) % max(held, 1)))
        first += held
    return np.concatenate(parts)
