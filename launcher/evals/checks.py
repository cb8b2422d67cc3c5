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
LIGHTEVAL_NAMES = PRESETS / "lighteval.yaml"  # (not a preset: launcher/evals/lighteval.py's table)
TASK_NAME = re.compile(r"[\w.:+-]+")  # lm-eval's task, group and tag names
FLAGS = ("eval_include", "eval_every", "eval_limit", "eval_partition", "eval_heldout", "eval_time_limit")  # each
# needs --eval_tasks


@dataclass(frozen=True)
class EvalTasks:
    """What --eval_tasks names: lm-eval's task names (a preset's tasks in its place, each name once), the folders of
    task YAMLs lm-eval is to read beside its own (the presets', --eval_include), the preset's name, if one, and the
    names given more than once (evaluated once: lm-eval does so too)."""

    tasks: tuple[str, ...]
    include: tuple[str, ...]
    preset: str | None = None
    repeated: tuple[str, ...] = ()
    more: tuple[str, ...] = ()  # the tasks named beside the preset

    def record(self) -> dict:
        return {"tasks": list(self.tasks), "include": list(self.include), "preset": self.preset}

    @property
    def said(self) -> str:
        """As the summary and the job's log name them."""
        shown, more = self.tasks[:3] if len(self.tasks) > 4 else self.tasks, len(self.tasks) - 3
        names = ", ".join(shown) + (f" and {more} more" if len(self.tasks) > 4 else "")
        named = (
            f"{self.preset}{' and ' + ', '.join(self.more) if self.more else ''} ({names})" if self.preset else names
        )
        return named + (f"; {', '.join(self.repeated)} named twice: evaluated once" if self.repeated else "")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml") if p.name != LIGHTEVAL_NAMES.name)


def _preset(name: str) -> EvalTasks:
    path = PRESETS / f"{name}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    include = [str((path.parent / data["include"]).resolve())] if data.get("include") else []
    return EvalTasks(tuple(str(t) for t in data["tasks"]), tuple(include), name)


def tasks_of(args: EvalArgs) -> tuple[EvalTasks | None, list[Problem]]:
    """--eval_tasks (and --eval_include) read: None without --eval_tasks. A preset's name stands for its tasks (its
    folder of task YAMLs kept), beside any other names."""
    if args.eval_tasks is None:
        return None, []
    words = [w.strip() for w in args.eval_tasks.split(",") if w.strip()]
    include = [str(Path(os.path.expanduser(args.eval_include)).resolve())] if args.eval_include else []
    presets = {w: _preset(w) for w in words if w in preset_names()}
    named = [t for w in words for t in (presets[w].tasks if w in presets else [w])]
    repeated = tuple(dict.fromkeys(t for n, t in enumerate(named) if t in named[:n]))
    folders = tuple(dict.fromkeys([f for p in presets.values() for f in p.include] + include))
    in_presets = {t for p in presets.values() for t in p.tasks}
    more = tuple(dict.fromkeys(w for w in words if w not in presets and w not in in_presets))
    found = EvalTasks(tuple(dict.fromkeys(named)), folders, ", ".join(presets) or None, repeated,
                      more if presets else ())  # fmt: skip
    odd = [w for w in words if not TASK_NAME.fullmatch(w)]
    problems = []
    if not words:
        problems.append(Problem("eval_tasks", "it names no task", f"e.g. --eval_tasks hellaswag,arc_easy, or a preset: "
                                f"{', '.join(preset_names())}"))  # fmt: skip
    if odd:
        problems.append(Problem("eval_tasks", f"{', '.join(map(repr, odd))} is not an lm-eval task name",
                                "names are letters, digits and _ . : + - (comma-separated)"))  # fmt: skip
    return found, problems


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


def rank_by_problems(e: EvalArgs, swept: bool, points: list[EvalArgs] | None = None) -> list[Problem]:
    """--rank_by: a sweep's (`swept`: the launch's own flags; its points do not carry it), by a task every point
    evaluates (`points`: the points' eval flags, where a sweep sweeps them; else the launch's own), TASK or TASK:METRIC.
    Whether the task computes the metric is lm-eval's to say (launcher/evals/probe.py)."""
    if e.rank_by is None:
        return []
    task, colon, metric = e.rank_by.partition(":")
    if not swept:
        return [Problem("rank_by", "it ranks a sweep's points", "add --sweep, or leave out --rank_by")]
    if not task or (colon and not metric.strip()):
        return [Problem("rank_by", f"{e.rank_by!r} names no {'task' if not task else 'metric after the colon'}",
                        "give TASK or TASK:METRIC, e.g. hellaswag or hellaswag:acc_norm")]  # fmt: skip
    found = [f for f in (tasks_of(p)[0] for p in points or [e]) if f is not None]
    if not found:
        return [Problem("rank_by", "it ranks the points by an eval score, and no task is evaluated",
                        "add --eval_tasks with its task")]  # fmt: skip
    every = [t for t in found[0].tasks if all(t in f.tasks for f in found)]
    if len(found) < len(points or [e]) or task not in every:
        same = len(found) == len(points or [e]) and all(f.tasks == found[0].tasks for f in found)
        where = "--eval_tasks' tasks" if same else "the tasks every point evaluates"
        fix = f"rank by one of {', '.join(every)} (TASK or TASK:METRIC, e.g. {every[0]}:acc)" if every else (
            "evaluate one task in every point (--eval_tasks)")  # fmt: skip
        return [Problem("rank_by", f"{task!r} is not one of {where}", fix)]
    return []
