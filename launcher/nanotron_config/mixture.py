"""A dataset mixture: `--dataset a:0.7,b:0.3`, written as nanotron's `hf_dataset_or_datasets: {a: 0.7, b: 0.3}`.

nanotron (0.4 and main alike, `get_datasets` -> `_get_dataset_mix`) reads each weight as the fraction of that
dataset's training split it keeps: the first `int(weight x rows)` rows of each, concatenated and shuffled. So a
weight lies in (0, 1] (above 1 its `select` fails with an IndexError, on the GPU nodes), and the share of the mix a
dataset makes is its weight times its size over the total: `a:0.7,b:0.3` is 70/30 only for datasets of one size.
The launcher keeps that meaning (the same config is the same data in every engine) and its summary says the
shares it can estimate.

Pure text work: the flag's text is read once (`read`) into the YAML's value, typed (`Datasets`: one name, a
{name: weight} mixture, or None for random tokens), with the problems of a mixture's form; the resolved run
carries that value. Whether each part exists and reads is the dataset check's (`launcher.config.validate`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from launcher.nanotron_config import nanoset
from launcher.problems import Problem

EXAMPLE = "--dataset /data/web:1.0,/data/code:0.5"
# What `hf_dataset_or_datasets` holds: one dataset's name, a mixture {name: fraction of its rows kept}, or None
# (nanotron's random tokens). The typed form of a --dataset value (and of a data stage's dataset).
Datasets = str | dict[str, float] | None


def _weight(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def is_mixture(text: str | None) -> bool:
    """Whether a --dataset value names a mixture (`name:weight,...`) rather than one dataset. A value that is an
    existing path as a whole is one dataset, whatever it holds."""
    if not text or os.path.exists(os.path.expanduser(text)):
        return False
    return "," in text or (":" in text and _weight(text.rsplit(":", 1)[1]) is not None)


def parts(text: str) -> list[tuple[str, str]]:
    """The (name, weight text) pairs of a mixture, as typed (no checks)."""
    out = []
    for part in text.split(","):
        name, _, weight = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "")
        out.append((name.strip(), weight.strip()))
    return out


def parse(text: str, tokenized: Callable[[str], bool] | None = None) -> tuple[dict[str, float], list[Problem]]:
    """A mixture's {name: weight}, in the order given, and every problem with its form at once. A mixture of
    tokenized folders (`tokenized(name)`: nanotron main's Nanoset) weighs them as nanotron main does (normalised,
    `nanoset.weight_problems`), not as fractions of rows; a mixture holds tokenized folders or none."""
    mix: dict[str, float] = {}
    problems = []
    folders = [name for name, _ in parts(text) if name and tokenized is not None and tokenized(name)]
    for name, weight_text in parts(text):
        shown = f"{name}:{weight_text}" if weight_text else name or "an empty entry"
        weight = _weight(weight_text)
        if not name:
            problems.append(Problem("dataset", f"{text!r} has an entry without a dataset", f"write {EXAMPLE}"))
            continue
        if name.lower() == "none":
            problems.append(Problem("dataset", "'none' (random tokens) cannot be part of a mixture", "drop it"))
            continue
        if weight is None:
            fix = f"give every dataset its weight, e.g. {EXAMPLE}"
            problems.append(Problem("dataset", f"{shown} has no weight (name:weight)", fix))
            continue
        if not folders and not 0 < weight <= 1:
            problems.append(
                Problem(
                    "dataset",
                    f"{shown}: nanotron keeps that fraction of the dataset's rows, so a weight lies in (0, 1]",
                    "give a weight above 0 and at most 1 (to weigh a dataset up, weigh the others down)",
                )
            )
        if name in mix:
            problems.append(Problem("dataset", f"{name} is named twice in the mixture", "name each dataset once"))
        mix[name] = weight
    others = [name for name in mix if name not in folders]
    if folders and others:
        what = f"{', '.join(folders)} {'is a tokenized folder' if len(folders) == 1 else 'are tokenized folders'}"
        problems.append(Problem("dataset", f"{what} (a Nanoset), {', '.join(others)} not: nanotron reads a stage "
                                "from one or the other", "tokenize every part (python -m launcher.data tokenize), "
                                "or give hub datasets only"))  # fmt: skip
    elif folders and len(mix) == len(parts(text)):
        problems += nanoset.weight_problems(list(mix.items()))
    return mix, problems


def read(text: str | None, tokenized: Callable[[str], bool] | None = None) -> tuple[Datasets, list[Problem]]:
    """A --dataset value (or a stage's dataset), read once: the name, or {name: weight} for a mixture, with the
    problems of a mixture's form (`tokenized`: which names are tokenized folders, weighed as nanotron main does)."""
    if not is_mixture(text):
        return text, []
    return parse(text or "", tokenized)


def to_flag(value: Any) -> Any:
    """A `hf_dataset_or_datasets` value as --dataset's text (a name, or `a:0.7,b:0.3`); another form (a list,
    which nanotron's get_datasets refuses) unchanged, for the type check to name."""
    if isinstance(value, dict) and value:
        return ",".join(f"{name}:{weight}" for name, weight in value.items())
    return value


def names(value: Datasets) -> list[str]:
    """The dataset names a value holds: one, or each of a mixture's."""
    if not value:
        return []
    return list(value) if isinstance(value, dict) else [value]


def map_names(value: Datasets, change: Callable[[str], str]) -> Datasets:
    """The value with `change` applied to each name (a local path made absolute), the weights kept."""
    if isinstance(value, dict):
        return {change(name): weight for name, weight in value.items()}
    return change(value) if value else value


def describe(mix: dict[str, float], tokens: dict[str, int]) -> str:
    """The mixture as the summary says it: each dataset, the fraction nanotron keeps, and its estimated share of
    the mix where every part's size is known (`tokens`: the estimated tokens of each local dataset)."""
    kept = {name: weight * tokens[name] for name, weight in mix.items() if name in tokens}
    total = sum(kept.values())
    shares = len(kept) == len(mix) and total > 0
    out = []
    for name, weight in mix.items():
        share = f", ~{kept[name] / total:.0%} of the mix" if shares else ""
        out.append(f"{name} ({weight:g} of its rows{share})")
    return "a mixture of " + ", ".join(out)
