"""--eval_tasks and its flags, read and checked purely (docs/evals.md): the tasks (a preset of configs/evals is data:
its tasks and its own task YAMLs), the held-out data, and the flags' own rules; nanotron main's `lighteval:` section
of a --config, refused with the flags that do it here. What needs lm-eval itself (is a task known, do the YAMLs
load, is the data there offline) is asked of the job's Python: launcher/evals/checks.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.config import datacheck
from launcher.config.flags import EvalArgs
from launcher.config.spec import RunSpec
from launcher.nanotron_config import mixture, nanoset, nanoset_yaml
from launcher.nanotron_config.datasource import is_local_path
from launcher.nanotron_config.presets import PROJECT_ROOT
from launcher.nanotron_config.schema import get_path, train_split
from launcher.problems import Problem

PRESETS = PROJECT_ROOT / "configs" / "evals"
LIGHTEVAL_NAMES = PRESETS / "lighteval.yaml"
TASK_NAME = re.compile(r"[\w.:+-]+")  # lm-eval's task, group and tag names
HELDOUT_FILES = (".jsonl", ".json", ".txt", ".parquet", ".csv")
FLAGS = ("eval_include", "eval_every", "eval_limit", "eval_partition", "eval_heldout")  # each needs --eval_tasks


@dataclass(frozen=True)
class EvalTasks:
    """What --eval_tasks names: lm-eval's task names, the folders of task YAMLs lm-eval is to read beside its own
    (a preset's, --eval_include), and the preset's name, if one."""

    tasks: tuple[str, ...]
    include: tuple[str, ...]
    preset: str | None = None

    def record(self) -> dict:
        return {"tasks": list(self.tasks), "include": list(self.include), "preset": self.preset}

    @property
    def said(self) -> str:
        """As the summary and the job's log name them."""
        shown, more = self.tasks[:3] if len(self.tasks) > 4 else self.tasks, len(self.tasks) - 3
        names = ", ".join(shown) + (f" and {more} more" if len(self.tasks) > 4 else "")
        return f"{self.preset} ({names})" if self.preset else names


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml") if p.name != LIGHTEVAL_NAMES.name)


def _preset(name: str) -> EvalTasks:
    path = PRESETS / f"{name}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    include = [str((path.parent / data["include"]).resolve())] if data.get("include") else []
    return EvalTasks(tuple(str(t) for t in data["tasks"]), tuple(include), name)


def tasks_of(args: EvalArgs) -> tuple[EvalTasks | None, list[Problem]]:
    """--eval_tasks (and --eval_include) read: None without --eval_tasks."""
    if args.eval_tasks is None:
        return None, []
    words = [w.strip() for w in args.eval_tasks.split(",") if w.strip()]
    include = [str(Path(os.path.expanduser(args.eval_include)).resolve())] if args.eval_include else []
    if len(words) == 1 and words[0] in preset_names():
        preset = _preset(words[0])
        return EvalTasks(preset.tasks, preset.include + tuple(include), preset.preset), []
    odd = [w for w in words if not TASK_NAME.fullmatch(w)]
    problems = []
    if not words:
        problems.append(Problem("eval_tasks", "it names no task", f"e.g. --eval_tasks hellaswag,arc_easy, or a preset: "
                                f"{', '.join(preset_names())}"))  # fmt: skip
    if odd:
        problems.append(Problem("eval_tasks", f"{', '.join(map(repr, odd))} is not an lm-eval task name",
                                "names are letters, digits and _ . : + - (comma-separated)"))  # fmt: skip
    return EvalTasks(tuple(words), tuple(include)), problems


def problems(spec: RunSpec) -> list[Problem]:
    """Every problem of the eval flags that needs neither lm-eval nor Slurm."""
    e, x, paths = spec.args.evals, spec.args.execution, spec.args.paths
    found, out = tasks_of(e)
    if found is None:
        given = [f for f in FLAGS if getattr(e, f) is not None] + (["eval_gpus"] if e.eval_gpus else [])
        why = "it sets up evaluation, which --eval_tasks asks for"
        out += [Problem(f, why, f"add --eval_tasks, or leave out --{f}") for f in given]
    out += rank_by_problems(e, swept=x.sweep is not None)
    if found is None:
        return out
    if x.interactive:  # a shell's session: no supervisor to submit eval jobs
        out.append(Problem("eval_tasks", "--interactive runs no batch job whose supervisor would submit the eval jobs",
                           "leave out --eval_tasks; evaluate an export by hand (docs/evals.md)"))  # fmt: skip
    if e.eval_every is not None:
        if e.eval_every <= 0:
            out.append(Problem("eval_every", f"must be positive, got {e.eval_every}", "leave it out for the last step"))
        elif paths.save_interval > 0 and e.eval_every % paths.save_interval:
            near = max(paths.save_interval, round(e.eval_every / paths.save_interval) * paths.save_interval)
            out.append(Problem("eval_every", f"{e.eval_every} is not a multiple of --save_interval "
                               f"{paths.save_interval}: its steps would have no checkpoint to evaluate",
                               f"use --eval_every {near}"))  # fmt: skip
    if e.eval_limit is not None and e.eval_limit <= 0:
        out.append(Problem("eval_limit", f"must be positive, got {e.eval_limit}", "leave it out for every sample"))
    if e.eval_gpus < 0:
        out.append(Problem("eval_gpus", f"must be 0 (CPU) or more, got {e.eval_gpus}", "e.g. --eval_gpus 1"))
    if e.eval_include is not None:
        folder = Path(os.path.expanduser(e.eval_include))
        if not folder.is_dir():
            out.append(Problem("eval_include", f"{e.eval_include} is not a folder", "give a folder of task YAMLs"))
        elif not any(folder.rglob("*.yaml")):
            out.append(Problem("eval_include", f"{folder} holds no .yaml file", "give the folder of your task YAMLs"))
    return out + heldout_problems(spec)


def rank_by_problems(e: EvalArgs, swept: bool) -> list[Problem]:
    """--rank_by: a sweep's (`swept`: the launch's own flags; its points do not carry it), by one of its tasks."""
    if e.rank_by is None:
        return []
    found, _ = tasks_of(e)
    task = e.rank_by.split(":")[0]
    if not swept:
        return [Problem("rank_by", "it ranks a sweep's points", "add --sweep, or leave out --rank_by")]
    if found is None:
        return [Problem("rank_by", "it ranks the points by an eval score, and no task is evaluated",
                        "add --eval_tasks with its task")]  # fmt: skip
    if task not in found.tasks:
        fix = f"rank by one of {', '.join(found.tasks)} (TASK or TASK:METRIC, e.g. hellaswag:acc_norm)"
        return [Problem("rank_by", f"{task!r} is not one of --eval_tasks' tasks", fix)]
    return []


def heldout_problems(spec: RunSpec) -> list[Problem]:
    """--eval_heldout: one source, or domains NAME=SOURCE,... (names of their own, one tail at most), each source
    checked (`source_problems`, its problems naming its domain)."""
    domains = nanoset.heldout_domains(spec.args.evals.eval_heldout)
    names = [name for name, _ in domains]
    fix = "give NAME=SOURCE,NAME=SOURCE (names: letters, digits, _ . -), or one SOURCE"
    out = [Problem("eval_heldout", f"the domain name {n!r} appears twice", fix) for n in dict.fromkeys(names)
           if names.count(n) > 1]  # fmt: skip
    if len(domains) > 1 and nanoset.HELDOUT in names:
        out.append(Problem("eval_heldout", "a source without NAME= beside others", fix))
    if sum(source.startswith(nanoset.TAIL) for _, source in domains) > 1:
        out.append(Problem("eval_heldout", "two tails of the training folder", "hold out one tail:N"))
    for name, source in domains:
        out += [Problem(p.flag, f"{name}: {p.message}" if len(domains) > 1 else p.message, p.fix, p.key)
                for p in source_problems(spec, source)]  # fmt: skip
    return out


def source_problems(spec: RunSpec, text: str) -> list[Problem]:
    """One held-out source: a split of the run's local dataset other than the one it trains on, the tail of the
    tokenized folder it trains on (`tail_problems`), or a local dataset the run does not train on, readable with
    --text_column (a tokenized folder: made with the run's tokenizer)."""
    if text.startswith(nanoset.TAIL):
        return tail_problems(spec, text)
    column = spec.args.data.text_column
    trained = [str(Path(n).resolve()) for n in mixture.names(spec.datasets) if is_local_path(n)]
    trained += [str(Path(n).resolve()) for s in spec.stages for n in mixture.names(s.dataset) if is_local_path(n)]
    trained += [str(Path(n).resolve()) for n in spec.nanosets]  # (a --config's stages' folders too)
    if text.startswith("split:"):
        split, dataset = text.removeprefix("split:"), spec.args.data.dataset
        training = train_split(spec.base_config)
        if not dataset or mixture.is_mixture(dataset) or not is_local_path(dataset) or spec.stages:
            return [
                Problem(
                    "eval_heldout",
                    f"{text} names a split of the run's dataset, which is not one local saved dataset",
                    "give a local dataset the run does not train on: --eval_heldout PATH",
                )
            ]
        if split == training:
            return [
                Problem(
                    "eval_heldout",
                    f"the run trains on the split {split!r}: it is not held out",
                    "name another split (e.g. split:validation), or another dataset",
                )
            ]
        return [_heldout(p) for p in datacheck.dataset_problems(dataset, column, split)]
    path = Path(os.path.expanduser(text)).resolve()
    if not is_local_path(text):
        return [Problem("eval_heldout", f"{text} is not a local path (the eval job reads offline)",
                        "give split:NAME of the run's dataset, or a local dataset folder or file")]  # fmt: skip
    if str(path) in trained:
        return [Problem("eval_heldout", f"the run trains on {path}: it is not held out",
                        "give data the run does not train on")]  # fmt: skip
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return [Problem("eval_heldout", f"{path} is a dataset of several splits",
                        f"name one: {path}/validation (a split's folder)")]  # fmt: skip
    if path.is_file() and path.suffix not in HELDOUT_FILES:
        return [Problem("eval_heldout", f"{path} is not one of {', '.join(HELDOUT_FILES)}",
                        "give a save_to_disk folder or a .jsonl file")]  # fmt: skip
    if path.is_file() and path.suffix == ".txt":
        return []  # a line a document
    if nanoset.is_tokenized(str(path)):
        folder, problems = nanoset.inspect(path, "eval_heldout")
        if folder is not None and not nanoset.same_tokenizer(folder.tokenizer, spec.args.data.tokenizer or ""):
            return [Problem("eval_heldout", f"{path} was tokenized by {folder.tokenizer}, the run's tokenizer is "
                            f"{spec.args.data.tokenizer}", "give held-out data tokenized as the run's")]  # fmt: skip
        return problems
    return [_heldout(p) for p in datacheck.dataset_problems(str(path), column, "train")]


def tail_problems(spec: RunSpec, text: str) -> list[Problem]:
    """--eval_heldout tail:N: N tokens, at least one window of the run's sequence length + 1, at the end of the one
    tokenized folder the run trains on from its first step; what training keeps of it (the config's
    dataset_max_tokens, which keeps it off the tail: nanotron_config.nanoset_yaml.section) a window for each
    data-parallel rank at least."""
    fix = "give tail:N, the last N tokens of the run's tokenized folder (e.g. tail:100k), or held-out data: PATH"
    try:
        count = nanoset.heldout_tail(text) or 0
    except ValueError as e:
        return [Problem("eval_heldout", str(e), fix)]
    first = [str(Path(n).resolve()) for n in mixture.names(spec.datasets)]
    if len(spec.nanosets) != 1 or first != [str(Path(n).resolve()) for n in spec.nanosets]:
        what = f"{len(spec.nanosets)} tokenized folders" if len(spec.nanosets) > 1 else "no tokenized folder"
        what = "a tokenized folder in a later stage only" if len(spec.nanosets) == 1 else what
        return [Problem("eval_heldout", f"{text} holds out the end of the one tokenized folder the run trains on "
                        f"from its first step; it trains on {what}", "train on one folder, or give held-out data: "
                        "--eval_heldout PATH (or split:NAME of a local dataset)")]  # fmt: skip
    (name, folder), seq = next(iter(spec.nanosets.items())), spec.shape.max_seq_len
    if folder is None:
        return []  # (what is wrong with the folder is said by the dataset's checks)
    if count < seq + 1:
        return [Problem("eval_heldout", f"{text}: {count} tokens are less than one window of the sequence length + 1 "
                        f"({seq + 1})", f"hold out at least {seq + 1} tokens")]  # fmt: skip
    cap = nanoset_yaml.caps_of(get_path(spec.config, ("data", "dataset"))).get(name, folder.tokens - count)
    windows, dp = max((cap - 1) // seq, 0), max(spec.dims.dp, 1)
    if windows < dp:  # each data-parallel rank reads a window an epoch at least
        return [Problem("eval_heldout", f"{text}: training keeps {cap:,} tokens of {name} ({folder.tokens:,} in all), "
                        f"{windows} windows of {seq + 1} tokens, fewer than the {dp} data-parallel ranks",
                        "hold out fewer tokens, or tokenize more data")]  # fmt: skip
    return []


def _heldout(p: Problem) -> Problem:
    return Problem("eval_heldout", p.message, p.fix)


def lighteval_problem(section: object, path: Path) -> Problem | None:
    """nanotron main's `lighteval:` section (null is no section): refused, with the flags that do it here and which of
    its tasks lm-eval has (configs/evals/lighteval.yaml)."""
    if section is None:
        return None
    tasks_text = ""
    if isinstance(section, dict) and isinstance(section.get("tasks"), dict):
        tasks_text = str(section["tasks"].get("tasks") or "")
    names = yaml.safe_load(LIGHTEVAL_NAMES.read_text(encoding="utf-8"))["names"]
    mapped: list[tuple[str, str]] = []
    unmatched: list[tuple[str, str]] = []
    for item in (t.strip() for t in tasks_text.split(",") if t.strip()):
        parts = item.split("|")
        name = parts[1] if len(parts) > 1 else parts[0]
        target = names.get(name) or names.get(name.split(":")[0] if name.startswith("mmlu") else name)
        (mapped if target else unmatched).append((name, target))
    every = section.get("eval_interval") if isinstance(section, dict) else None
    flags = "--eval_tasks " + (",".join(dict.fromkeys(t for _, t in mapped)) if mapped else "TASKS")
    flags += f" --eval_every {every}" if isinstance(every, int) and every > 0 else ""
    said = "; ".join(f"{n} is lm-eval's {t}" for n, t in mapped)
    said += ("; " if said and unmatched else "") + "; ".join(f"{n} has no lm-eval task of that name" for n, _ in
                                                          unmatched)  # fmt: skip
    return Problem(
        "config",
        f"{path} has nanotron main's lighteval: section, which makes training's rank 0 upload each checkpoint and "
        "sbatch a lighteval job on GPUs itself; the launcher evaluates checkpoints with lm-eval in jobs of its own"
        + (f" ({said})" if said else ""),
        f"remove the section (or set lighteval: null) and give {flags} (docs/evals.md)",
        key="lighteval",
    )
