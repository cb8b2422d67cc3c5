"""Tokenized folders (nanotron main's Nanosets) as a run's data: which of its datasets are ones, each read whole
once (`read`: resolution), and what the run cannot be with them (`problems`: validation), every problem naming the
flag that gave the folder: --dataset, --data_stages, or --config's stages.

A folder is read from its own small files (`launcher.nanotron_config.nanoset`: sizes, indexes' last entries,
metadata), never its tokens: a 10 TB folder costs a directory walk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from launcher.config.spec import RunSpec
from launcher.nanotron_config import dialect, mixture, nanoset, nanoset_yaml
from launcher.nanotron_config.nanoset import TokenizedFolder
from launcher.nanotron_config.stages import Stage
from launcher.problems import Problem

FOLDER_FLAGS = ("dataset", "data_stages", "config")
NO_NANOSET_04 = (
    "nanotron 0.4 (the PyPI release) has no Nanoset (NanosetDatasetsArgs came after it): its config cannot name a "
    "tokenized folder"
)


def predicate(declared: set[str]) -> Callable[[str], bool]:
    """Whether a dataset name (absolute where local) is a tokenized folder: one on disk, or one a --config's
    Nanoset section names (`declared`, existing or not)."""
    return lambda name: name in declared or nanoset.is_tokenized(name)


def names(datasets: mixture.Datasets, later: Sequence[Stage], base: dict, tokenized: Callable[[str], bool]) -> dict:
    """{folder: the flag that gave it} for every tokenized folder the run's stages read, in order."""
    out: dict[str, str] = {}
    first = first_flag(datasets, base)
    given = [(first, n) for n in mixture.names(datasets)] + [("data_stages", n) for s in later for n in
                                                              mixture.names(s.dataset)]  # fmt: skip
    if not later:  # a --config's later stages stand
        for stage in dialect.stages_of(base)[1:]:
            section = (stage.get("data") or {}).get("dataset")
            if isinstance(section, dict):
                given += [("config", n) for n in mixture.names(nanoset_yaml.datasets_of(section))]
    for flag, name in given:
        if isinstance(name, str) and tokenized(name):
            out.setdefault(name, flag)
    return out


def first_flag(datasets: mixture.Datasets, base: dict) -> str:
    """The flag that gave the first stage's folders: --config where its Nanoset section names them, else --dataset."""
    section = (base.get("data") or {}).get("dataset")
    if not isinstance(section, dict) or not nanoset_yaml.is_section(section):
        return "dataset"
    return "config" if mixture.names(nanoset_yaml.datasets_of(section)) == mixture.names(datasets) else "dataset"


def read(found: dict[str, str], vocab_size: int | None) -> tuple[dict[str, TokenizedFolder | None], list[Problem]]:
    """Each folder read whole (`nanoset.inspect`; its token size against `vocab_size`, the tokenizer's where known),
    None where it did not read, with every problem."""
    folders: dict[str, TokenizedFolder | None] = {}
    problems: list[Problem] = []
    for name, flag in found.items():
        folders[name], said = nanoset.inspect(name, flag, vocab_size)
        problems += said
    return folders, problems


def problems(spec: RunSpec) -> list[Problem]:
    """What the run cannot be with its tokenized folders: written for nanotron 0.4; made with a tokenizer that is not
    --tokenizer; a stage mixing tokenizations."""
    if not spec.nanosets:
        return []
    out = []
    tokenizer = spec.args.data.tokenizer
    flags = _flags(spec)
    if spec.dialect.dialect == "0.4":
        flag = flags[next(iter(spec.nanosets))]
        fix = ("install nanotron from git on the nodes and give --nanotron_dialect main (docs/data.md), or train on "
               "the text (--dataset naming the dataset, tokenized as the job starts)")  # fmt: skip
        out.append(Problem(flag, f"{', '.join(spec.nanosets)}: {NO_NANOSET_04}", fix))
    for name, folder in spec.nanosets.items():
        if folder is not None and not nanoset.same_tokenizer(folder.tokenizer, tokenizer):
            out.append(
                Problem(
                    flags[name],
                    f"{name} was tokenized with {folder.tokenizer}, not the run's --tokenizer {tokenizer}: the ids "
                    "would mean other tokens",
                    f"give --tokenizer {folder.tokenizer}, or tokenize again with --tokenizer {tokenizer}",
                )
            )
    for stage in _stages(spec):
        read = [spec.nanosets[n] for n in stage if n in spec.nanosets]
        kinds = {(f.tokenizer, f.token_size) for f in read if f is not None}
        if len(kinds) > 1:
            made = "; ".join(f"{f.path} by {f.tokenizer} ({f.token_size}-byte tokens)" for f in read if f)
            fix = "tokenize every folder of a mixture with the run's --tokenizer"
            out.append(Problem(flags[stage[0]], f"one mixture holds folders tokenized differently: {made}", fix))
    return out


def _flags(spec: RunSpec) -> dict[str, str]:
    tokenized = predicate(set(spec.nanosets))
    return names(spec.datasets, spec.stages, spec.base_config, tokenized)


def _stages(spec: RunSpec) -> list[list[str]]:
    """Each stage's dataset names (the first, then the later ones: the flag's, else the --config's)."""
    out = [mixture.names(spec.datasets)] + [mixture.names(s.dataset) for s in spec.stages]
    if not spec.stages:
        for stage in dialect.stages_of(spec.base_config)[1:]:
            section = (stage.get("data") or {}).get("dataset")
            if isinstance(section, dict):
                out.append(mixture.names(nanoset_yaml.datasets_of(section)))
    return [names_ for names_ in out if names_]
