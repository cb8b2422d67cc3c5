"""The GPUs the launcher knows (configs/gpus.yaml: data) and the one a run is planned for.

Where the GPU comes from, first found: `--gpu_memory_gb` or `--gpu_type`; the cluster's GRES type (`sinfo`, asked by
`launcher.slurm.facts` when the run is to be submitted); else an H100 80GB, which nanotron's own launcher
assumes. The summary says which.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import yaml

from launcher.nanotron_config.presets import CONFIGS_DIR, YAML_LOADER
from launcher.problems import Problem

GPUS_FILE = CONFIGS_DIR / "gpus.yaml"
DEFAULT = "h100"
GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    key: str  # its name in configs/gpus.yaml
    name: str  # as people say it: "H100 80GB SXM"
    memory_gib: float  # what the driver reports
    tflops: float  # peak dense bf16
    hbm_tbps: float
    nvlink_gbps: float  # bus bandwidth of a collective inside a node
    note: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


@dataclass(frozen=True)
class GpuChoice:
    gpu: Gpu
    origin: str  # where it came from, as the summary says it: "the default", "--gpu_type a100", "the cluster (...)"

    @property
    def is_default(self) -> bool:
        return self.origin == DEFAULT_ORIGIN


DEFAULT_ORIGIN = "the default, as nanotron's launcher assumes: --gpu_type or --gpu_memory_gb to change it"


@functools.lru_cache(maxsize=1)
def _load() -> tuple[dict[str, Gpu], dict[str, str], dict[str, str]]:
    """The GPUs by key; keys by normalised alias; keys by the device name torch reports."""
    with open(GPUS_FILE, encoding="utf-8") as f:
        data = yaml.load(f, Loader=YAML_LOADER)
    gpus, aliases, devices = {}, {}, {}
    for key, v in data.items():
        gpus[key] = Gpu(
            key,
            str(v["name"]),
            float(v["memory_gib"]),
            float(v["tflops"]),
            float(v["hbm_tbps"]),
            float(v["nvlink_gbps"]),
            str(v.get("note", "")),
        )
        aliases.update({normalise(str(alias)): key for alias in [key, *v.get("gres", [])]})
        devices.update({str(name): key for name in v.get("device_names", [])})
    return gpus, aliases, devices


def table() -> dict[str, Gpu]:
    """Every known GPU by its key in configs/gpus.yaml."""
    return _load()[0]


def normalise(name: str) -> str:
    """A GRES type or --gpu_type as compared: lower case, '-' as '_', without a leading "nvidia_" or "tesla_"."""
    text = name.strip().lower().replace("-", "_").replace(" ", "_")
    for prefix in ("nvidia_", "tesla_"):
        text = text.removeprefix(prefix)
    return text


def lookup(name: str) -> Gpu | None:
    """The GPU a --gpu_type or a GRES type names, or None when configs/gpus.yaml does not know it."""
    key = _load()[1].get(normalise(name))
    return table()[key] if key else None


def from_device_name(name: str) -> Gpu | None:
    """The GPU whose whole name torch.cuda.get_device_name reports ("NVIDIA H100 PCIe"), or None when
    configs/gpus.yaml does not list it: a name is never matched by a part of it (the PCIe card is not the SXM)."""
    key = _load()[2].get(name.strip())
    return table()[key] if key else None


def default_choice() -> GpuChoice:
    return GpuChoice(table()[DEFAULT], DEFAULT_ORIGIN)


def from_flags(gpu_type: str | None, gpu_memory_gb: float | None) -> tuple[GpuChoice, list[Problem]]:
    """The GPU the flags name (the default when they name none), and the problems with them."""
    choice, problems = default_choice(), []
    if gpu_type is not None:
        gpu = lookup(gpu_type)
        if gpu is None:
            known = ", ".join(table())
            problems.append(Problem("gpu_type", f"unknown GPU {gpu_type!r}", f"use one of {known}, or --gpu_memory_gb"))
        else:
            choice = GpuChoice(gpu, f"--gpu_type {gpu_type}")
    if gpu_memory_gb is not None:
        if not 0 < gpu_memory_gb < 10_000:
            problems.append(
                Problem("gpu_memory_gb", f"must be a positive size in GB, got {gpu_memory_gb:g}", "e.g. 80")
            )
        else:
            like = choice.gpu  # its speeds: the named GPU's, else the default's
            gpu = replace(like, memory_gib=gpu_memory_gb, name=f"{like.name.split(' ')[0]} with {gpu_memory_gb:g} GB")
            origin = f"--gpu_memory_gb {gpu_memory_gb:g}" + (f", --gpu_type {gpu_type}" if gpu_type else "")
            choice = GpuChoice(gpu, origin)
    return choice, problems


def from_gres(types: list[str | None]) -> GpuChoice | None:
    """The GPU of the GRES types a partition's nodes have (`sinfo`): the one with the least memory where they
    differ; None when no node names a type this table knows (a bare `gpu:8` names none)."""
    known = [(t, lookup(t)) for t in types if t]
    found = [(t, g) for t, g in known if g is not None]
    if not found:
        return None
    gres, gpu = min(found, key=lambda tg: tg[1].memory_gib)
    others = sorted({t for t, _ in known if t != gres})
    smallest = f" (the smallest of {gres}, {', '.join(others)})" if others else ""
    origin = f"the cluster: sinfo says gpu:{gres}{smallest}"
    return GpuChoice(gpu, origin)
