"""Flags -> resolved run spec: presets, --config, derived parallelism and vocabulary, absolute paths.

Precedence for every field: a flag typed on the command line, then the --config YAML, then the --model_size
preset, then the flag's default. Resolution never raises for a user mistake: what it cannot resolve becomes a
`Problem`, reported together with validation's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from launcher.config import dependency_syntax, nanosetcheck, user_config
from launcher.config import dialect_rules as rules
from launcher.config import facts as cluster
from launcher.config.facts import ClusterFacts
from launcher.config.flags import GROUPS, DataArgs, LaunchArgs, LoggingArgs, PathArgs, TrainingArgs
from launcher.config.spec import RunSpec
from launcher.nanotron_config import dialect, mixture, nanoset_yaml, schema, stages
from launcher.nanotron_config.datasource import is_local_path
from launcher.nanotron_config.gpus import from_flags
from launcher.nanotron_config.presets import PROJECT_ROOT, load_preset, preset_names
from launcher.nanotron_config.stages import Stage
from launcher.problems import Problem

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PATH_FIELDS = ("configs_path", "slurm_logs_path", "checkpoints_path", "slurm_scripts_dir", "run_train_script")


G = TypeVar("G", bound="DataclassInstance")


def tokenizer_vocab_size(path: str) -> int | None:
    """Vocabulary size of a local tokenizer (tokenizer.json, without importing transformers), or None."""
    tok_file = Path(os.path.expanduser(path)) / "tokenizer.json"
    try:
        data = json.loads(tok_file.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
    ids |= {t["id"] for t in data.get("added_tokens", [])}
    return max(ids) + 1 if ids else None


UNCLOSED_QUOTE = "<unclosed quote>"


def parse_extra_env(text: str | None) -> tuple[dict[str, str], list[str]]:
    """`KEY=VALUE` items separated by spaces or lines, shell-quoted where a value has spaces (`A="x y" B=2`)
    -> (mapping, malformed items)."""
    env: dict[str, str] = {}
    bad: list[str] = []
    try:
        items = shlex.split(text or "")
    except ValueError:  # an unclosed quote (the text is not repeated: it may hold a secret)
        return {}, [UNCLOSED_QUOTE]
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key.isidentifier():
            env[key] = value
        else:
            bad.append(item if len(item) <= 12 else f"{item[:6]}...")  # a stray value may be a secret
    return env, bad


def _override(group: G, values: dict, explicit: set[str]) -> G:
    """Replace the group's fields with `values`, except those the user typed."""
    names = {f.name for f in dataclasses.fields(group)}
    changes = {k: v for k, v in values.items() if k in names and k not in explicit and v is not None}
    return dataclasses.replace(group, **changes)


def _absolute(path: str, cwd: Path) -> str:
    return user_config.absolute(path, cwd)


def resolve(
    args: LaunchArgs,
    explicit: set[str],
    facts: ClusterFacts | None = None,
    cwd: Path | None = None,
    checkpoints: Path | None = None,
    fresh: bool = False,
) -> tuple[RunSpec, list[Problem]]:
    """Resolve flags into a RunSpec, collecting the problems resolution itself finds. `facts`: the cluster's answers
    (`launcher.slurm.facts.ask`; NOT_ASKED for a dry run), which decide the GPU planned for, the CPUs of a node and the
    requeue mode where no flag does; None: none of those (a spec compared, not launched). `checkpoints`, `fresh`:
    where a rerun places its checkpoints (RunSpec's fields of those names)."""
    cwd = cwd or Path.cwd()
    read_config = user_config.read(args.execution.config, explicit, cwd)
    base, base_path, from_config, problems, notes = read_config[:5]
    if checkpoints is None and "checkpoints_path" not in explicit and read_config.checkpoints is not None:
        checkpoints = read_config.checkpoints  # --config's folder: the run's own (nanotron's checkpoints_path)
    preset, preset_problems = _preset(args.model.model_size)
    if "model_size" in explicit:  # a preset you typed is a choice: its shape wins over the --config YAML's
        from_config = {k: v for k, v in from_config.items() if k not in preset["model"]}
    chosen = explicit | set(from_config)
    groups = {}
    for name in GROUPS:
        group = _override(getattr(args, name), {**preset["model"], **preset["parallelism"]}, chosen)
        groups[name] = _override(group, from_config, explicit)
    par = groups["parallelism"]
    par = dataclasses.replace(par, tp_mode=par.tp_mode.upper(), pp_engine=par.pp_engine.lower())
    training, adapted = _adapt_warmup(groups["training"], chosen)
    tokenized = nanosetcheck.predicate(set(nanoset_yaml.folders_of(base)))
    data, read = _read_data(groups["data"], cwd, stages.first_name(base), tokenized)
    tokenizer_vocab = tokenizer_vocab_size(data.tokenizer) if is_local_path(data.tokenizer) else None
    model = groups["model"]
    if tokenizer_vocab and "vocab_size" not in chosen:
        step = math.lcm(64, par.tp or 1)
        model = dataclasses.replace(model, vocab_size=-(-tokenizer_vocab // step) * step)
    if par.dp is None and par.tp and par.pp and par.cp > 0:  # dp fills the job
        world = args.slurm.nodes * args.slurm.gpus_per_node
        par = dataclasses.replace(par, dp=max(world // (par.tp * par.pp * par.cp), 1))
    choice, dialect_problems = _dialect(groups["slurm"].nanotron_dialect, groups["slurm"].python)
    size = args.model.model_size if args.model.model_size in preset_names() else "tiny"
    model, adapted_theta = rules.rope_theta(model, choice.dialect, size, chosen)
    adapted.update(adapted_theta)
    if notes:
        adapted["config"] = "; ".join(notes)
    found = nanosetcheck.names(read.datasets, read.stages, base, tokenized)
    nanosets, nanoset_problems = nanosetcheck.read(found, tokenizer_vocab or model.vocab_size)
    asked_async = schema.get_path(base, ("parallelism", "tp_linear_async_communication"))
    _, sync_note = dialect.tp_async(choice.dialect, par.tp or 1, par.tp_mode, asked_async)
    if sync_note:
        adapted["tp_linear_async_communication"] = sync_note
    extra_env, env_problems = _extra_env(groups["slurm"].extra_env)
    dependency, dependency_problems = dependency_syntax.read(groups["slurm"].dependency)
    groups.update(
        slurm=dataclasses.replace(groups["slurm"], nanotron_dialect=choice.dialect),
        model=model,
        training=training,
        parallelism=par,
        data=data,
        paths=_absolute_paths(groups["paths"], explicit, cwd, read_config.checkpoints),
        logging=_absolute_profile(groups["logging"], cwd),
    )
    tie = from_config.get("tie_word_embeddings", preset["model"].get("tie_word_embeddings", False))
    gpu, gpu_problems = from_flags(groups["slurm"].gpu_type, groups["slurm"].gpu_memory_gb)
    problems += preset_problems + dialect_problems + env_problems + gpu_problems + nanoset_problems
    problems += dependency_problems + read.problems
    expedited = False
    if facts is not None:
        slurm = groups["slurm"]
        gpu = cluster.gpu_choice(slurm, facts, gpu)
        if slurm.cpus_per_node is None and not any(p.flag in ("gpus_per_node", "cpus_per_node") for p in problems):
            cpus, adapted["cpus_per_node"] = cluster.cpus_per_node(slurm, facts)
            groups["slurm"] = dataclasses.replace(slurm, cpus_per_node=cpus)
        expedited = facts.expedites_requeue and bool(slurm.max_requeues)
    resolved = dataclasses.replace(args, **groups)  # (the job's flags are not in a YAML: --config sets none)
    spec = RunSpec(args=resolved, tie_word_embeddings=bool(tie), extra_env=extra_env, tokenizer_vocab=tokenizer_vocab,
                   base_config=base, base_config_path=base_path, gpu=gpu, adapted=adapted, dialect=choice,
                   datasets=read.datasets, stages=read.stages, dependency=dependency, nanosets=nanosets,
                   checkpoints=checkpoints, fresh=fresh, expedited_requeue=expedited,
                   facts=facts or cluster.NOT_ASKED)  # fmt: skip
    return spec, problems


def _dialect(asked: str, python: str | None) -> tuple[dialect.Choice, list[Problem]]:
    """The nanotron config dialect to write (`--nanotron_dialect`, auto: the job's Python's nanotron)."""
    problems = []
    if asked not in ("auto", *dialect.DIALECTS):
        problems.append(
            Problem("nanotron_dialect", f"{asked!r} is not a dialect", "use --nanotron_dialect auto, 0.4 or main")
        )
    return dialect.choose(asked, python), problems


def _preset(size: str) -> tuple[dict, list[Problem]]:
    """The --model_size preset (tiny's, with a problem, for an unknown name)."""
    if size in preset_names():
        return load_preset(size), []
    fix = f"use one of {', '.join(preset_names())}"
    return load_preset("tiny"), [Problem("model_size", f"unknown preset {size!r}", fix)]


class _Data(NamedTuple):
    """--dataset and --data_stages, read once."""

    datasets: mixture.Datasets
    stages: tuple[Stage, ...]
    problems: list[Problem]


def _read_data(data: DataArgs, cwd: Path, first_stage: str, tokenized: Callable[[str], bool]) -> tuple[DataArgs, _Data]:
    """--dataset and --data_stages read once into typed values (with the problems of their form), and a local
    --dataset, stage dataset or --tokenizer (~/data included) made an absolute path, as the other path flags are:
    the job reads it from there, elsewhere, without the launcher's cwd or shell. The flags' text follows the
    values (as typed where they do not read)."""
    if data.dataset and data.dataset.lower() == "none":
        data = dataclasses.replace(data, dataset=None)

    def local(name: str) -> str:
        return _absolute(name, cwd) if is_local_path(name) else name

    def folder(name: str) -> bool:  # a tokenized folder (nanotron main's Nanoset), by its absolute path
        return tokenized(local(name))

    datasets, problems = mixture.read(data.dataset, folder)
    datasets = mixture.map_names(datasets, local)
    later, stage_problems = stages.parse(data.data_stages, first_stage, folder)
    later = [dataclasses.replace(s, dataset=mixture.map_names(s.dataset, local)) for s in later]
    if not problems:
        data = dataclasses.replace(data, dataset=mixture.to_flag(datasets))
    if not stage_problems:
        data = dataclasses.replace(data, data_stages=stages.to_flag(later) if data.data_stages else data.data_stages)
    if is_local_path(data.tokenizer):
        data = dataclasses.replace(data, tokenizer=_absolute(data.tokenizer, cwd))
    return data, _Data(datasets, tuple(later), problems + stage_problems)


def _absolute_paths(paths: PathArgs, explicit: set[str], cwd: Path, config_folder: Path | None) -> PathArgs:
    """The path flags made absolute; where --config names the run's checkpoints folder (and --checkpoints_path was
    not typed), --checkpoints_path is its parent: where the checks look for room, and a rerun's folder goes."""
    if "run_train_script" not in explicit:
        paths = dataclasses.replace(paths, run_train_script=str(PROJECT_ROOT / "run_train.py"))
    if config_folder is not None and "checkpoints_path" not in explicit:
        paths = dataclasses.replace(paths, checkpoints_path=str(config_folder.parent))
    absolute: dict[str, Any] = {f: _absolute(getattr(paths, f), cwd) for f in PATH_FIELDS}
    return dataclasses.replace(paths, **absolute)


def _absolute_profile(logging: LoggingArgs, cwd: Path) -> LoggingArgs:
    if not logging.profiler_export_path:
        return logging
    return dataclasses.replace(logging, profiler_export_path=_absolute(logging.profiler_export_path, cwd))


def _extra_env(text: str | None) -> tuple[dict[str, str], list[Problem]]:
    extra_env, bad_env = parse_extra_env(text)
    problems = []
    for item in bad_env:
        if item == UNCLOSED_QUOTE:
            problems.append(Problem("extra_env", "it has an unclosed quote", "close it, e.g. NAME='a value'"))
        else:
            problems.append(
                Problem("extra_env", f"{item!r} is not KEY=VALUE", "write NAME=value, e.g. NCCL_DEBUG=WARN")
            )
    return extra_env, problems


def _adapt_warmup(training: TrainingArgs, chosen: set[str]) -> tuple[TrainingArgs, dict[str, str]]:
    """A default warmup longer than the run becomes a tenth of it; one you chose (flag or --config) stays, and
    validation says it is out of range."""
    warmup, steps = training.warmup_steps, training.train_steps
    if "warmup_steps" in chosen or steps <= 0 or warmup <= steps:
        return training, {}
    note = f"a tenth of the run, as the default {warmup} is longer than --train_steps {steps}"
    return dataclasses.replace(training, warmup_steps=steps // 10), {"warmup_steps": note}
