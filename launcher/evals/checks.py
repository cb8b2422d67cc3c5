"""--eval_tasks and its flags, read and checked purely (docs/evals.md): the tasks (a preset of configs/evals is data:
its tasks and its own task YAMLs), the flags' own rules (the held-out data's: launcher/evals/heldout.py); nanotron
main's `lighteval:` section of a --config, refused with the flags that do it here. What needs lm-eval itself (is a
task known, do the YAMLs load, is the data there offline) is asked of the job's Python: launcher/evals/probe.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.config import ranges
from launcher.config.flags import EvalArgs
from launcher.config.slurm_values import NO_TIME_LIMIT, TIME_LIMIT
from launcher.config.spec import RunSpec
from launcher.evals import heldout
from launcher.nanotron_config.presets import PROJECT_ROOT
from launcher.problems import Problem

PRESETS = PROJECT_ROOT / "configs" / "evals"
LIGHTEVAL_NAMES = PRESETS / "lighteval.yaml"
TASK_NAME = re.compile(r"[\w.:+-]+")  # lm-eval's task, group and tag names
FLAGS = ("eval_include", "eval_every", "eval_limit", "eval_partition", "eval_heldout", "eval_time_limit")  # each
# needs --eval_tasks


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
    if (
        e.eval_time_limit is not None
        and e.eval_time_limit.upper() not in NO_TIME_LIMIT
        and not TIME_LIMIT.fullmatch(e.eval_time_limit)
    ):
        fix = "use HH:MM:SS, e.g. 2:00:00 (or D-HH:MM:SS, minutes); leave it out for the run's, at most 4 hours"
        out.append(Problem("eval_time_limit", f"{e.eval_time_limit!r} is not a Slurm time", fix))
    if e.eval_gpus < 0:
        out.append(Problem("eval_gpus", f"must be 0 (CPU) or more, got {e.eval_gpus}", "e.g. --eval_gpus 1"))
    if e.eval_include is not None and not ranges.unusable_path("eval_include", e.eval_include):  # (said by ranges)
        folder = Path(os.path.expanduser(e.eval_include))
        if not folder.is_dir():
            out.append(Problem("eval_include", f"{e.eval_include} is not a folder", "give a folder of task YAMLs"))
        elif not any(folder.rglob("*.yaml")):
            out.append(Problem("eval_include", f"{folder} holds no .yaml file", "give the folder of your task YAMLs"))
    return out + heldout.problems(spec)


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
