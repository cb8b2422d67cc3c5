"""Per-item results of an eval (issue 52): for every (step, key, task) one row per item, from lm-eval's own per-sample
output (`log_samples`), kept beside the step's result in the bundle as one compressed numpy file,
`evals/step-<step>-<key>.items.npz`, written by the eval job (launcher/evals/evaljob.py) and read by `jobs verdict`.
lm-eval's raw samples (each document, its prompts, every response) are never kept.

Columns, each an array named `<task>|<column>`, one value per item in lm-eval's document order:

- `doc_id` (lm-eval's position of the document in the task's data) and `doc_hash` (the first 16 hex digits of
  lm-eval's sha256 of the document): an item's id is its doc_hash, with `~k` for its k-th repeat (k >= 2: a
  document that appears twice), not its doc_id: the hash names the content, so two runs pair the same documents
  whatever their order, and data that changed under a run is seen (its items differ) rather than paired by
  position;
- each per-item metric lm-eval gives as a number (`acc`, `acc_norm`, `exact_match`, ... as uint8 where 0/1, else
  float64; `METRIC,FILTER` for a filter other than "none");
- multiple choice: `gold_ll`, the gold continuation's log-likelihood (lm-eval's own, the gold choice's), and
  `gold_bytes`, that continuation's UTF-8 length as lm-eval scores it: the target delimiter (a space) counted,
  since its token is part of the log-likelihood. `gold_bpb` = -gold_ll / (ln 2 * gold_bytes) (`gold_bpb`);
- a perplexity task (loglikelihood_rolling): the document's summed log-likelihood `ll`, its UTF-8 `bytes` and
  `words` (lm-eval's counts), so its bits per byte is sum(-ll) / (ln 2 * sum(bytes)) over documents;
- a held-out domain of --eval_heldout (`heldout:NAME`, launcher/train/domains.py): each document's `ll` (minus its
  summed cross-entropy), `tokens` predicted and UTF-8 `bytes`: its `loss` is sum(-ll) / sum(tokens), its
  `bits_per_byte` sum(-ll) / (ln 2 * sum(bytes)).

numpy only (the eval job's Python has it with lm-eval; `jobs verdict` imports this module where it reads them).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from launcher import atomic
from launcher import protocol as P

SUFFIX = ".items.npz"
HASH_DIGITS = 16  # 64 bits of lm-eval's sha256: no two items of a task's 10^6 collide but once in ~10^7 tasks
ROLLING = {"word_perplexity": "words", "byte_perplexity": "bytes", "bits_per_byte": "bytes"}  # (ll, count) tuples
CONTINUOUS = "gold_bpb"  # the continuous metric's name (derived: -gold_ll / (ln 2 * gold_bytes))
HELDOUT = "heldout:"  # a held-out domain's rows: `heldout:NAME` (`jobs verdict --task heldout:NAME`)
KEPT = ("doc_id", "doc_hash", "gold_ll", "gold_bytes", "ll", "bytes", "words", "tokens")  # columns that are not metrics
Table = dict[str, npt.NDArray[Any]]


def path(bundle: Path, step: int, key: str) -> Path:
    return bundle / P.EVALS_DIR / f"step-{step}-{key}{SUFFIX}"


def _number(value: object) -> bool:
    return isinstance(value, (bool, int, float, np.integer, np.floating))


def _gold(sample: Mapping[str, Any]) -> int | None:
    """The gold choice's index of a multiple-choice sample (None: several golds, or none found)."""
    target, arguments = sample.get("target"), sample.get("arguments") or []
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        return int(target) if 0 <= int(target) < len(arguments) else None
    if isinstance(target, str):
        matches = [i for i, a in enumerate(arguments) if str(a[1]).strip() == target.strip()]
        return matches[0] if len(matches) == 1 else None
    return None


def _multiple_choice(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Each request a (log-likelihood, is-greedy) pair of a choice: lm-eval's multiple_choice."""

    def pairs(row: Mapping[str, Any]) -> bool:
        resps = row.get("filtered_resps") or []
        return len(resps) >= 2 and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in resps)

    return all(pairs(r) for r in rows)


def table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """One task's samples (every filter's) as columns (the module's docstring)."""
    by_filter: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_filter.setdefault(str(row.get("filter", "none")), []).append(row)
    first = next(iter(by_filter.values()), [])
    out: Table = {
        "doc_id": np.array([int(r["doc_id"]) for r in first], dtype=np.int32),
        "doc_hash": np.array([str(r.get("doc_hash", ""))[:HASH_DIGITS] for r in first], dtype=f"S{HASH_DIGITS}"),
    }
    for name, part in by_filter.items():
        suffix = "" if name == "none" else f",{name}"
        for metric in part[0].get("metrics") or []:
            values = [r.get(metric) for r in part]
            if all(_number(v) for v in values):
                column = np.array(values, dtype=np.float64)
                binary = bool(np.isin(column, (0.0, 1.0)).all())
                out[metric + suffix] = column.astype(np.uint8) if binary else column
            elif metric in ROLLING and all(isinstance(v, (list, tuple)) and len(v) == 2 for v in values):
                out["ll" + suffix] = np.array([float(v[0]) for v in values])  # type: ignore[index]
                out[ROLLING[metric] + suffix] = np.array([int(v[1]) for v in values], dtype=np.int64)  # type: ignore[index]
        if "ll" + suffix in out and "bytes" + suffix not in out:
            out["bytes" + suffix] = np.array([len(str(r.get("target", "")).encode("utf-8")) for r in part])
        if name == "none" and _multiple_choice(part):
            golds = [_gold(r) for r in part]
            if all(g is not None for g in golds):
                out["gold_ll"] = np.array([float(r["filtered_resps"][g][0]) for r, g in zip(part, golds, strict=True)])
                out["gold_bytes"] = np.array([len(str(r["arguments"][g][1]).encode("utf-8"))
                                              for r, g in zip(part, golds, strict=True)], dtype=np.int32)  # fmt: skip
    return out


def documents(per_document: Mapping[str, Sequence[Any]]) -> Table:
    """A held-out domain's documents (launcher/train/domains.py's `per_document`) as a task's columns: `ll` (minus
    the summed cross-entropy, nats), `tokens` predicted, `bytes`."""
    ids = list(per_document["id"])
    return {"doc_id": np.arange(len(ids), dtype=np.int32), "doc_hash": np.array(ids, dtype=f"S{HASH_DIGITS}"),
            "ll": -np.asarray(per_document["nll"], dtype=np.float64),
            "tokens": np.asarray(per_document["tokens"], dtype=np.int64),
            "bytes": np.asarray(per_document["bytes"], dtype=np.int64)}  # fmt: skip


def write(bundle: Path, step: int, key: str, samples: Mapping[str, Sequence[Mapping[str, Any]]],
          more: Mapping[str, Table] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every task's rows (and `more` tables: the held-out domains', `heldout:NAME`), in one file (atomic); what the
    result says of it: the file's name in the bundle, its bytes, the items per task and their ids' digests."""
    tables = {task: table(rows) for task, rows in samples.items() if rows} | dict(more or {})
    arrays = {f"{task}|{column}": values for task, columns in tables.items() for column, values in columns.items()}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # (stored, not deflated: `jobs verdict` reads thousands)
    where = path(bundle, step, key)
    where.parent.mkdir(parents=True, exist_ok=True)
    atomic.replace(where, buffer.getvalue())
    return {"file": str(where.relative_to(bundle)), "bytes": len(buffer.getvalue()),
            "items": {task: len(columns["doc_id"]) for task, columns in tables.items()},
            "digests": {task: digest(columns) for task, columns in tables.items()}}  # fmt: skip


def digest(columns: Table) -> str:
    """The items' ids as one short hash (of the doc_hash column): two tables of one digest hold the same items in
    the same order, so a reader of many files reads their ids once."""
    return hashlib.sha256(np.ascontiguousarray(columns["doc_hash"]).tobytes()).hexdigest()[:16]


def read(file: Path, wanted: Mapping[str, Iterable[str]] | None = None) -> dict[str, Table]:
    """task -> its columns, from an items file: every task's every column, or (`wanted`: task -> columns) only
    those (only they are decompressed). OSError or ValueError where it cannot be read."""
    tables: dict[str, Table] = {}
    with np.load(file, allow_pickle=False) as found:
        for name in found.files:
            owner, _, column = name.rpartition("|")
            if wanted is None or (owner in wanted and column in wanted[owner]):
                tables.setdefault(owner, {})[column] = found[name]
    return tables


def names(file: Path) -> dict[str, list[str]]:
    """task -> its columns' names, from an items file's index (nothing decompressed)."""
    found: dict[str, list[str]] = {}
    with np.load(file, allow_pickle=False) as opened:
        for name in opened.files:
            owner, _, column = name.rpartition("|")
            found.setdefault(owner, []).append(column)
    return found


def needs(metric: str) -> tuple[str, ...]:
    """The columns `values` reads for `metric` (those a table has of them)."""
    return {CONTINUOUS: ("gold_ll", "gold_bytes"), "bits_per_byte": ("bits_per_byte", "ll", "bytes"),
            "loss": ("loss", "ll", "tokens")}.get(metric, (metric,))  # fmt: skip


def kind(metric: str, columns: Iterable[str]) -> str:
    """ "ratio" (summed over items, then divided) or "mean" (a mean over items) for `metric` of such a table."""
    have = set(columns)
    return "ratio" if (metric == "bits_per_byte" and "ll" in have) or (metric == "loss" and "ll" in have) else "mean"


def ids(columns: Table) -> list[str]:
    """The items' ids: each doc_hash, `~k` added to its k-th repeat (the module's docstring)."""
    seen: dict[str, int] = {}
    out = []
    for raw in columns["doc_hash"].tolist():
        h = raw.decode("ascii") if isinstance(raw, bytes) else str(raw)
        seen[h] = seen.get(h, 0) + 1
        out.append(h if seen[h] == 1 else f"{h}~{seen[h]}")
    return out


def metrics(columns: Table) -> list[str]:
    """The per-item metrics a task's table can be judged on: its 0/1 and numeric metrics, `gold_bpb` (multiple
    choice), `bits_per_byte` (a perplexity task: NLL bits over bytes, summed over its documents)."""
    names = [c for c in columns if c.partition(",")[0] not in KEPT]
    if "gold_ll" in columns:
        names.append(CONTINUOUS)
    if "ll" in columns:
        names.append("bits_per_byte")
    if "ll" in columns and "tokens" in columns:
        names.append("loss")
    return names


def values(columns: Table, metric: str) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None, str]:
    """(per-item values, per-item denominators or None, kind "mean" or "ratio") of `metric` in a task's table:
    a 0/1 or numeric metric as is; `gold_bpb` per item (a mean); `bits_per_byte` as NLL bits over bytes summed
    over documents (a ratio); KeyError where the table lacks it."""
    if metric == CONTINUOUS:
        return -columns["gold_ll"] / (math.log(2) * columns["gold_bytes"]), None, "mean"
    if metric == "bits_per_byte" and "ll" in columns:
        return -columns["ll"] / math.log(2), columns["bytes"], "ratio"
    if metric == "loss" and "ll" in columns and "tokens" in columns:
        return -columns["ll"], columns["tokens"], "ratio"
    return columns[metric], None, "mean"


def files(bundle: Path) -> Iterable[tuple[int, str, Path]]:
    """Every items file in a bundle: (step, key, path)."""
    try:
        names = os.listdir(bundle / P.EVALS_DIR)
    except OSError:
        return []
    found = []
    for name in names:
        step, _, key = name.removeprefix("step-").removesuffix(SUFFIX).partition("-")
        if name.startswith("step-") and name.endswith(SUFFIX) and step.isdigit() and key:
            found.append((int(step), key, bundle / P.EVALS_DIR / name))
    return sorted(found)
