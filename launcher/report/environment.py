"""A run's environment as facets that two runs (`jobs diff`) or a run and its rerun (`jobs rerun`) compare: what the
launch recorded (the launcher's commit and state, its Python's packages, the GPU it planned for) and what the job's
latest attempt recorded (nanotron's version and commit, torch, CUDA, NCCL, the GPU it ran on, the Slurm release,
the engine, each dataset's and the tokenizer's fingerprint: `launcher.train.record`).

A facet one side lacks is not a difference but something that could not be confirmed, and is said so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.bundle import manifest
from launcher.nanotron_config import provenance

DATA, TOKENIZER = "data ", "tokenizer"  # the data facets: "data NAME" for each dataset, and the tokenizer's


@dataclass(frozen=True)
class Facet:
    """One thing a run ran with: its value (compared) and how a terminal shows it."""

    value: Any
    shown: str


Facets = dict[str, Facet]


def _plain(value: Any) -> Facet:
    return Facet(value, "-" if value is None else str(value))


def launcher_facet(project: Mapping[str, Any]) -> Facet:
    commit, dirty = project.get("commit"), project.get("dirty")
    shown = "not a git checkout" if not commit else str(commit)[:12] + (" with uncommitted changes" if dirty else "")
    return Facet((commit, dirty), shown)


def nanotron_facet(found: Mapping[str, Any]) -> Facet:
    """nanotron's identity: its version, and for a source install its commit and state."""
    if not found.get("found"):
        return Facet(None, "not installed")
    version, commit, dirty = found.get("version"), found.get("commit"), found.get("dirty")
    where = f" at {str(commit)[:12]}" + (" with uncommitted changes" if dirty else "") if commit else ""
    return Facet((version, commit, dirty), f"{version or '?'}{where}")


def data_facet(fp: Mapping[str, Any]) -> Facet:
    return Facet(dict(fp), provenance.short(fp))


def launched(run: manifest.Manifest) -> Facets:
    """The facets the launch recorded (the login node's view)."""
    data = run.data
    out: Facets = {"launcher": launcher_facet(data.get("project") or {})}
    for name, version in (data.get("versions") or {}).items():
        out[f"package {name}"] = _plain(version)
    gpu = (run.memory or {}).get("gpu")
    if gpu:
        out["gpu planned for"] = _plain(gpu)
    return out


def ran(record: Mapping[str, Any]) -> Facets:
    """The facets an attempt's runtime record holds (the job's view, on its nodes)."""
    stack = record.get("torch") or {}
    out: Facets = {
        "nanotron (job)": nanotron_facet(record.get("nanotron") or {}),
        "torch (job)": _plain(stack.get("version")),
        "cuda": _plain(stack.get("cuda")),
        "nccl": _plain(stack.get("nccl")),
        "gpu": Facet(stack.get("gpu"), stack.get("gpu") or "none (CPU)"),
        "engine": _plain(record.get("engine")),
    }
    if record.get("slurm"):  # None: the node's Slurm commands did not say
        out["slurm"] = _plain(record["slurm"])
    for name, fp in (record.get("data") or {}).items():
        out[DATA + name] = data_facet(fp)
    if record.get("tokenizer"):
        out[TOKENIZER] = data_facet(record["tokenizer"])
    return out


def of_run(run: manifest.Manifest) -> Facets:
    """A run's facets: its launch's, and its latest attempt's where it has started."""
    runtime = run.runtime
    return {**launched(run), **(ran(runtime[-1]) if runtime else {})}


def is_data(name: str) -> bool:
    return name.startswith(DATA) or name == TOKENIZER


def same(name: str, a: Facet, b: Facet) -> bool | None:
    """Whether two runs' facet agrees: None where it cannot be told (a fingerprint that cannot say)."""
    if is_data(name):
        return provenance.same_data(a.value, b.value)
    if a.value == b.value and isinstance(a.value, tuple) and a.value[-1] is True:
        return None  # the same commit, changed on both sides: whether alike, no record says
    return a.value == b.value


@dataclass(frozen=True)
class Compared:
    """Two runs' facets side by side."""

    differ: list[tuple[str, str, str]]  # (facet, A's, B's)
    unconfirmed: list[tuple[str, str]]  # (facet, why it cannot be told)
    agree: list[str]  # the facets both have, alike


def compare(a: Facets, b: Facets, a_name: str = "A", b_name: str = "B") -> Compared:
    """Every facet of either run: where they differ, where they agree, and what one run lacks."""
    differ, unconfirmed, agree = [], [], []
    for name in list(a) + [n for n in b if n not in a]:
        if name not in a or name not in b:
            has, lacks = (a_name, b_name) if name in a else (b_name, a_name)
            unconfirmed.append((name, f"{has} has it, {lacks} does not"))
            continue
        verdict = same(name, a[name], b[name])
        if verdict is None and not is_data(name):
            unconfirmed.append((name, f"both {a[name].shown}: whether with the same changes, no record says"))
        elif verdict is None:
            unconfirmed.append((name, f"cannot tell: {a[name].shown} vs {b[name].shown}"))
        elif verdict:
            agree.append(name)
        else:
            differ.append((name, a[name].shown, b[name].shown))
    return Compared(differ, unconfirmed, agree)
