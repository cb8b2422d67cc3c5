"""Data stages after the first: `--data_stages "anneal@900=/data/hq"`, nanotron main's `data_stages`.

The first stage is `--dataset` from step 1 (named `stable`, or what a --config names it); each later stage is
`NAME@STEP=DATASET`, separated by `;`, its DATASET one name or a mixture in --dataset's form
(`anneal@900=/data/web:0.3,/data/hq:1.0`). Each stage's data is the first stage's (text column, split, seed) with
its own dataset. Only nanotron main has stages (0.4 trains one dataset: refused by name there).

Pure text work: the flag's text is read once (`parse`) into typed stages (each dataset read by
`mixture.read`) with every problem of its form; the resolved run carries them, and the config writes them
(`to_yaml`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.nanotron_config import dialect, mixture, nanoset_yaml
from launcher.problems import Problem

EXAMPLE = '--data_stages "anneal@900=/data/hq"'
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
FORM = re.compile(r"\s*(?P<name>[^@=;]*)@(?P<start>[^=;]*)=(?P<dataset>.*)")


@dataclass(frozen=True)
class Stage:
    name: str
    start: int  # nanotron's start_training_step: the first step trained on this stage's data
    dataset: mixture.Datasets  # one name or a mixture {name: weight}, read from --dataset's form


def parse(
    text: str | None, first_name: str = dialect.STAGE_NAME, tokenized: Callable[[str], bool] | None = None
) -> tuple[list[Stage], list[Problem]]:
    """The later stages a --data_stages value names, in the order given, and every problem of it but its datasets'
    existence (the dataset check's): its form, names and steps that nanotron main refuses (each unique, the first
    stage's name, `first_name`, included), the mixtures' form."""
    out: list[Stage] = []
    problems = []
    names, starts = [first_name], [1]
    for entry in (text or "").split(";"):
        if not entry.strip():
            continue
        found = FORM.fullmatch(entry)
        start = found and found["start"].strip()
        if not found or not start or not start.isdigit() or not found["dataset"].strip():
            problems.append(Problem("data_stages", f"{entry.strip()!r} is not NAME@STEP=DATASET", f"write {EXAMPLE}"))
            continue
        name = found["name"].strip()
        dataset, mixed = mixture.read(found["dataset"].strip(), tokenized)
        stage = Stage(name, int(start), dataset)
        if not NAME.fullmatch(stage.name):
            fix = "use letters, digits, '.', '_', '-'"
            problems.append(Problem("data_stages", f"stage name {stage.name!r} is not a plain name", fix))
        if stage.start < 2:
            fix = "start it at step 2 or later (--dataset is the stage from step 1)"
            problems.append(Problem("data_stages", f"stage {stage.name} starts at step {stage.start}", fix))
        if stage.name in names:
            problems.append(Problem("data_stages", f"stage name {stage.name} is used twice", "name each stage once"))
        if stage.start in starts:
            problems.append(Problem("data_stages", f"two stages start at step {stage.start}", "give each its own step"))
        names.append(stage.name)
        starts.append(stage.start)
        problems += [_as_stages(p, f"stage {stage.name}: ") for p in mixed]
        out.append(stage)
    return out, problems


def _as_stages(problem: Problem, prefix: str) -> Problem:
    """A --dataset problem of a stage's dataset, as --data_stages'."""
    return Problem("data_stages", prefix + problem.message, problem.fix)


def dataset_names(stages: Sequence[Stage]) -> list[str]:
    """Every dataset the later stages read (each of a mixture's)."""
    return [name for stage in stages for name in mixture.names(stage.dataset)]


def config_dataset_names(config: dict) -> list[str]:
    """Every dataset a config's later stages read (each of a mixture's)."""
    return [name for stage in dialect.stages_of(config)[1:] for name in mixture.names(_datasets_of(stage))]


def _datasets_of(stage: dict) -> mixture.Datasets:
    """A config stage's dataset: its `hf_dataset_or_datasets`, or a Nanoset's folders ({folder: weight})."""
    section = (stage.get("data") or {}).get("dataset")
    return nanoset_yaml.datasets_of(section) if isinstance(section, dict) else None


def seq_len_problems(config: dict, sequence_length: int) -> list[Problem]:
    """A stage of another sequence length than the run's: the torch engine trains every stage at the run's, and
    nanotron main raises NotImplementedError where it changes between stages."""
    out = []
    for stage in dialect.stages_of(config):
        length = stage.get("sequence_length")
        if length is not None and length != sequence_length:
            where = f"data_stages.{stage.get('name')}.sequence_length"
            what = f"{where} is {length}, not the run's {sequence_length}: a stage trains at the run's length"
            out.append(Problem("config", what, "remove it from --config (every stage trains at --max_seq_len)"))
    return out


def to_yaml(stages: Sequence[Stage], first: dict[str, Any]) -> list[dict[str, Any]]:
    """nanotron main's entries for the later stages: each the first stage's `data` (`first`) with its dataset."""
    out = []
    for stage in sorted(stages, key=lambda s: s.start):
        data = copy.deepcopy(first)
        if isinstance(data.get("dataset"), dict):
            data["dataset"]["hf_dataset_or_datasets"] = copy.deepcopy(stage.dataset)
        else:  # the first stage trains random tokens: a later one gets the base's dataset section
            data["dataset"] = {"hf_dataset_or_datasets": copy.deepcopy(stage.dataset), "hf_dataset_splits": "train"}
        out.append({"name": stage.name, "start_training_step": stage.start, "data": data})
    return out


def to_flag(stages: Sequence[Stage]) -> str | None:
    """Stages as --data_stages' text (NAME@STEP=DATASET;...), None for none."""
    return ";".join(f"{s.name}@{s.start}={mixture.to_flag(s.dataset)}" for s in stages) or None


def first_name(config: dict) -> str:
    """The name of the stage from step 1: a --config's, else the launcher's."""
    listed = dialect.stages_of(config)
    return str(listed[0].get("name")) if listed else dialect.STAGE_NAME


def listed(config: dict, first_dataset: str | None) -> list[dict[str, Any]]:
    """A canonical config's stages as the summary and the manifest list them (empty for one stage): name, first
    step, dataset (in --dataset's form; the first stage's is `first_dataset`, the run's --dataset)."""
    found = dialect.stages_of(config)
    if len(found) < 2:
        return []
    out = [{"name": first_name(config), "start": 1, "dataset": first_dataset or "none"}]
    for stage in found[1:]:
        dataset = _datasets_of(stage)
        out.append(
            {
                "name": stage.get("name"),
                "start": stage.get("start_training_step"),
                "dataset": mixture.to_flag(dataset) or "none",
            }
        )
    return out


def describe(stages: list[dict[str, Any]], train_steps: int) -> str:
    """The stages as the summary says them: each name, first step and dataset."""
    out = []
    for stage in stages:
        start = stage["start"]
        late = " (after the last step: not reached)" if isinstance(start, int) and start > train_steps else ""
        out.append(f"{stage['name']} from step {start}: {stage['dataset']}{late}")
    return "; ".join(out)
