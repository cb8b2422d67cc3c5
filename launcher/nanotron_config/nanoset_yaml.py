"""A stage's Nanoset section in nanotron main's YAML (`NanosetDatasetsArgs`), read from a --config and written for a
run: never merged with a hub dataset's section (nanotron's union takes one or the other, and a merge matches
neither: `UnionMatchError`).

- `normalize(config, absolute)`: a --config's Nanoset sections as main reads them today: the dict form
  `dataset_folder: {path: weight}` (main's own examples/config_nanoset.yaml; no longer parsed since PR #228)
  rewritten as `dataset_folder` + `dataset_weights`, each folder made an absolute path as --dataset's are.
- `datasets_of(section)`: a section's folders and weights in --dataset's typed form (a name, or {name: weight}).
- `section(...)`: the section a stage is written with: a Nanoset's with every field that must agree with the files
  from the checked folders (`nanoset.datasets_args`), or a hub dataset's, the other kind's keys dropped.

Pure: the folders are read by `nanoset.inspect` (the resolved run carries what it read).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from launcher.nanotron_config import mixture, nanoset
from launcher.nanotron_config.nanoset import TokenizedFolder

# NanosetDatasetsArgs' fields (nanotron main, config.py); those the launcher writes from the files and the run:
FIELDS = frozenset(
    ("dataset_folder", "dataset_weights", "dataset_read_path", "tokenizer_name", "vocab_size", "token_size_in_bytes")
    + ("return_positions", "skip_in_stream", "pad_samples_to_global_batch_size", "dataset_max_tokens")
    + ("shuffle_files", "use_old_brrr_dataloader")
)
MUST_AGREE = ("dataset_folder", "dataset_weights", "tokenizer_name", "vocab_size", "token_size_in_bytes")
HUB_DATASET = "hf_dataset_or_datasets"


def is_section(section: Any) -> bool:
    """Whether a `data.dataset` section is a Nanoset's."""
    return isinstance(section, dict) and "dataset_folder" in section and HUB_DATASET not in section


def datasets_of(section: dict) -> mixture.Datasets:
    """A section's dataset in --dataset's typed form: a hub section's `hf_dataset_or_datasets`; a Nanoset's one
    folder, or {folder: weight} (no weights: 1 each, as main's tokenized_bytes reads them)."""
    if HUB_DATASET in section:
        return section[HUB_DATASET]
    folders = section.get("dataset_folder")
    if isinstance(folders, dict):
        return {str(k): float(v) for k, v in folders.items()}
    if isinstance(folders, str):
        return folders
    folders = [str(f) for f in folders or []]
    weights = section.get("dataset_weights") or [1.0] * len(folders)
    if len(folders) == 1 and float(weights[0]) > 0:
        return folders[0]
    return {f: float(w) for f, w in zip(folders, weights, strict=False)}


def _sections(config: dict) -> list[tuple[str, dict]]:
    """(where, its data section) for `data` and every data stage's."""
    out = [("data", config["data"])] if isinstance(config.get("data"), dict) else []
    for n, stage in enumerate(config.get("data_stages") or []):
        if isinstance(stage, dict) and isinstance(stage.get("data"), dict):
            out.append((f"data_stages[{n}] ({stage.get('name')})", stage["data"]))
    return out


def normalize(config: dict, absolute: Callable[[str], str]) -> tuple[dict, list[str], list[tuple[str, str]]]:
    """A --config with its Nanoset sections as main reads them (a copy): (config, notes of what was rewritten,
    (where, what) that cannot be read: weights of another number than the folders, weights that are no numbers)."""
    out = copy.deepcopy(config)
    notes: list[str] = []
    bad: list[tuple[str, str]] = []
    for where, data in _sections(out):
        section = data.get("dataset")
        if not isinstance(section, dict) or not is_section(section):
            continue
        given, weights = section["dataset_folder"], section.get("dataset_weights")
        if isinstance(given, dict):
            notes.append(f"{where}: dataset_folder {{path: weight}} (no longer read by nanotron main, PR #228) "
                         "written as dataset_folder + dataset_weights")  # fmt: skip
            weights = list(given.values())
            given = list(given)
        folders = [given] if isinstance(given, str) else list(given or [])
        if weights is not None and (not isinstance(weights, list) or len(weights) != len(folders)):
            bad.append((where, f"dataset_weights {weights!r} is not one number per folder ({len(folders)})"))
            continue
        if weights is not None and not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights):
            bad.append((where, f"dataset_weights {weights!r} are not all numbers"))
            continue
        caps = section.get("dataset_max_tokens")
        whole = isinstance(caps, list) and len(caps) == len(folders) and all(_count(c) for c in caps)
        if caps is not None and not whole:
            bad.append((where, f"dataset_max_tokens {caps!r} is not one whole number of tokens >= 0 per folder "
                               f"({len(folders)})"))  # fmt: skip
            continue
        section["dataset_folder"] = [absolute(str(f)) for f in folders]
        section["dataset_weights"] = [float(w) for w in weights] if weights is not None else None
        if section["dataset_weights"] is None:
            section.pop("dataset_weights")
    return out, notes, bad


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def caps_of(section: Any) -> dict[str, int]:
    """A Nanoset section's caps by folder: its `dataset_max_tokens` (the tokens of a folder, its files in sorted
    order, that training reads at most; 0, or none, is no cap, as nanotron main reads it)."""
    if not is_section(section):
        return {}
    folders = section["dataset_folder"]
    folders = [folders] if isinstance(folders, str) else list(folders)
    caps = section.get("dataset_max_tokens") or []
    return {str(f): int(c) for f, c in zip(folders, caps, strict=False) if _count(c) and c > 0}


def folders_of(config: dict) -> list[str]:
    """Every folder a config's Nanoset sections name (after `normalize`)."""
    out = []
    for _, data in _sections(config):
        if is_section(data.get("dataset")):
            out += mixture.names(datasets_of(data["dataset"]))
    return out


def section(
    datasets: mixture.Datasets,
    current: dict | None,
    folders: Mapping[str, TokenizedFolder | None],
    vocab_size: int,
    tokenizer: str,
    text_column: str | None,
    tail: int | None = None,
) -> dict | None:
    """The `data.dataset` section a stage reading `datasets` is written with (`current`: the section it had).
    Tokenized folders (all of its names in `folders`, each as `nanoset.inspect` read it, None where it did not):
    main's NanosetDatasetsArgs, the section's other Nanoset fields kept; else a hub dataset's (`text_column`: the
    column to write, None to keep the section's). None: random tokens. `tail` (--eval_heldout tail:N) on one folder:
    its last `tail` tokens kept out of training by `dataset_max_tokens` (the section's own cap where lower)."""
    if datasets is None:
        return None
    names = mixture.names(datasets)
    current = current or {}
    if names and all(name in folders for name in names):
        weights = datasets if isinstance(datasets, dict) else {names[0]: 1.0}
        read = [f for f in (folders[n] for n in names) if f is not None]
        kept = {k: v for k, v in current.items() if k in FIELDS and k not in MUST_AGREE}
        if current.get("dataset_folder") != names:  # a cap is its folders': not another folder's, nor another order
            kept.pop("dataset_max_tokens", None)
        first = read[0] if read else None
        written = {
            "dataset_folder": names,
            "dataset_weights": [float(weights[n]) for n in names],
            "tokenizer_name": first.tokenizer if first else tokenizer,
            "vocab_size": vocab_size,
            "token_size_in_bytes": first.token_size if first else nanoset.token_size_for(vocab_size),
            **kept,
        }
        if tail and len(names) == 1 and first is not None and first.tokens > tail:
            own = caps_of(written).get(names[0])
            written["dataset_max_tokens"] = [min(first.tokens - tail, own or first.tokens)]
        return written
    out = {k: v for k, v in current.items() if k not in FIELDS}
    if not current or "dataset_folder" in current:
        out.setdefault("hf_dataset_splits", "train")
    out[HUB_DATASET] = copy.deepcopy(datasets)
    if text_column is not None:
        out["text_column_name"] = text_column
    return out


def tokenizer_of(folders: Mapping[str, TokenizedFolder | None], tokenizer: str) -> str:
    """The config's tokenizer: main asserts it equals (as a string) the folders' recorded one; where the folders
    were made with the run's --tokenizer under another spelling (`nanoset.same_tokenizer`), their spelling."""
    for folder in folders.values():
        if folder is not None and nanoset.same_tokenizer(folder.tokenizer, tokenizer):
            return folder.tokenizer
    return tokenizer
