"""Synthetic eval records for `jobs verdict`'s tests, written as the eval job writes them (no cluster, no model): a
run's manifest, each evaluated step's result (launcher/evals/record.py) and its per-item rows from lm-eval-shaped
samples (launcher/evals/items.py's writer), a sweep's record."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from launcher.bundle import sweep_record
from launcher.evals import items
from launcher.evals import record as eval_record

KEY = "k0"


def doc_hash(i: int) -> str:
    return hashlib.sha256(f"doc {i}".encode()).hexdigest()


def mc_samples(right: Sequence[int], gold_ll: Sequence[float], docs: Sequence[int] | None = None) -> list[dict]:
    """lm-eval's samples of a 3-choice task: item i right or not, its gold choice's log-likelihood."""
    out = []
    for j, (ok, ll) in enumerate(zip(right, gold_ll, strict=True)):
        i = docs[j] if docs is not None else j
        gold = i % 3
        lls = [ll - 1.0 if ok else ll + 1.0] * 3
        lls[gold] = ll
        out.append({"doc_id": i, "doc": {"q": i}, "target": gold, "filter": "none", "metrics": ["acc"],
                    "arguments": [(f"question {i}", f" answer {c}{'x' * (i % 5)}") for c in range(3)],
                    "resps": [[(x, False)] for x in lls], "filtered_resps": [(x, False) for x in lls],
                    "doc_hash": doc_hash(i), "acc": float(ok)})  # fmt: skip
    return out


def ppl_samples(ll: Sequence[float], size: Sequence[int]) -> list[dict]:
    return [{"doc_id": i, "target": "w " * (n // 2), "filter": "none", "metrics": ["bits_per_byte"],
             "arguments": [("w",)], "filtered_resps": [x], "doc_hash": doc_hash(10_000 + i), "bits_per_byte": (x, n)}
            for i, (x, n) in enumerate(zip(ll, size, strict=True))]  # fmt: skip


def domain_documents(nll: Sequence[float], tokens: Sequence[int], size: Sequence[int]) -> dict:
    """A held-out domain's documents as launcher/train/domains.py hands them to the eval job."""
    return {"id": [f"{i:016x}" for i in range(len(nll))], "nll": list(nll), "tokens": list(tokens),
            "bytes": list(size)}  # fmt: skip


def make_run(root: Path, name: str, flags: Mapping[str, object], evals: Mapping[int, Mapping[str, object]],
             tokens_per_step: int = 1000, limit: int | None = None, key: str = KEY) -> Path:  # fmt: skip
    """A run's bundle and checkpoints with one done result (and its items file) per step: `evals[step][task]`
    its samples. Returns the bundle."""
    bundle = root / "logs" / "configs" / name / "20261206-000000"
    checkpoints = root / "checkpoints" / name
    bundle.mkdir(parents=True)
    checkpoints.mkdir(parents=True)
    training = {"seed": 1, "learning_rate": 0.001, **{k: v for k, v in flags.items() if k != "model_size"}}
    manifest = {"run_name": name, "created": "2026-12-06T00:00:00+0000",
                "resolved": {"training": training, "model": {"model_size": flags.get("model_size", "tiny")},
                             "data": {"dataset": "/data/d"}, "execution": {"config": None}},
                "outputs": {"checkpoints": str(checkpoints), "log": str(root / f"{name}.out")}}  # fmt: skip
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    for step, asked in evals.items():
        tasks = {t: v for t, v in asked.items() if not t.startswith(items.HELDOUT)}
        domains = {t: items.documents(v) for t, v in asked.items() if t.startswith(items.HELDOUT)}  # type: ignore[arg-type]
        kept = items.write(bundle, step, key, tasks, domains)
        metrics = {}
        for task in tasks:
            table = items.read(items.path(bundle, step, key))[task]
            metrics[task] = {m: float(np.mean(table[m])) for m in items.metrics(table) if m in table}
        held = {t.removeprefix(items.HELDOUT): {"loss": float(np.sum(v["nll"]) / np.sum(v["tokens"]))}
                for t, v in asked.items() if t.startswith(items.HELDOUT)}  # fmt: skip
        row = {"state": "done", "tokens": step * tokens_per_step, "tasks": metrics, "limit": limit, "items": kept,
               "ended": 1.0e9 + step, "heldout": held or None}  # fmt: skip
        eval_record.write_result(bundle, step, key, row)
    return bundle


def make_sweep(root: Path, name: str, points: Sequence[tuple[str, dict[str, str], Path]]) -> Path:
    directory = root / "logs" / "configs" / name / "20261206-000000"
    directory.mkdir(parents=True)
    sweep_record.write(directory, "sweep", [sweep_record.SweepPoint(n, v, b, None) for n, v, b in points])
    return directory
