"""The checks before the queue that need more than the flags (theirs: launcher/evals/checks.py): what the job's Python
makes of the tasks (`python -m launcher.evals.tasks`, a child process: the launcher imports neither lm-eval nor
torch), --rank_by's metric against what its task computes, nanotron main's `lighteval:` section's tasks, and Slurm's
word on the eval job's partition and GPUs (`sbatch --test-only` of its script, one question). Each problem names its
flag and the fix."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

from launcher.bundle import files, render
from launcher.config.flags import EvalArgs
from launcher.config.spec import RunSpec
from launcher.errors import QueueFull, SlurmUnavailable, SubmissionError
from launcher.evals import checks as eval_checks
from launcher.evals import lighteval
from launcher.evals import script as eval_script
from launcher.evals.record import LOWER_IS_BETTER, MAIN_METRICS
from launcher.problems import Problem
from launcher.slurm import client

TASKS_TIMEOUT_S = 300  # lm-eval's own index of every task, where the quick scan does not find a name: ~20 s
INSTALL = "install the project's eval extra into it: pip install 'nanotron-slurm-launcher[eval]' (lm-eval[hf]==0.4.13)"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # as the eval job runs (its --extra_env may differ)
CACHE_FIX = ("download it once where there is network into a cache the nodes share (HF_HOME, e.g. --extra_env "
             "HF_HOME=/shared/hf): docs/evals.md")  # fmt: skip


def problems(spec: RunSpec, earlier: list[Problem], ask_slurm: bool) -> list[Problem]:
    """Every problem the job's Python and Slurm find with the run's evaluation (none without --eval_tasks, or where
    the eval flags' own checks found some), and a --config's `lighteval:` section refused."""
    out = _lighteval(spec)
    found, _ = eval_checks.tasks_of(spec.args.evals)
    if found is None or any(p.flag.startswith("eval_") for p in earlier):
        return out
    said = answer_of(spec, found)
    out += said if isinstance(said, list) else _from_answer(said, render.job_python(spec), found)
    if ask_slurm and not any(p.flag == "eval_partition" for p in earlier):
        out += _slurm_problems(spec)
    return out


def answer_of(spec: RunSpec, found: eval_checks.EvalTasks, names: tuple[str, ...] = ()) -> dict | list[Problem]:
    """The job's Python's answer on `found`'s tasks (and on `names`), or the problems of asking it ([] where that
    Python cannot run here: the job's own checks say so)."""
    python = render.job_python(spec)
    if not (os.access(python, os.X_OK) or os.sep not in python):
        return []
    env = tuple(sorted({**OFFLINE, **spec.extra_env}.items()))
    return ask(python, found.tasks, found.include, env, tuple(eval_checks.preset_names()), names)


@functools.lru_cache(maxsize=8)  # a sweep's points ask once
def ask(python: str, tasks: tuple[str, ...], include: tuple[str, ...], env: tuple[tuple[str, str], ...],
        presets: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> dict | list:  # fmt: skip
    """The job's Python's answer (launcher/evals/tasks.py), or the problems of asking it."""
    where = {**os.environ, **dict(env), "PYTHONPATH": os.pathsep.join([str(render.PROJECT), os.environ.get(
        "PYTHONPATH", "")]).rstrip(os.pathsep)}  # fmt: skip
    asked = json.dumps({"tasks": list(tasks), "include": list(include), "presets": list(presets), "ask": list(names)})
    fix = "check --python, or run it by hand: python -m launcher.evals.tasks <<< '" + asked + "'"
    try:
        out = subprocess.run([python, "-m", "launcher.evals.tasks"], input=asked, capture_output=True, text=True,
                             timeout=TASKS_TIMEOUT_S, env=where)  # fmt: skip
    except subprocess.TimeoutExpired:
        why = f"{python} did not say in {TASKS_TIMEOUT_S} s which tasks its lm-eval knows"
        return [Problem("eval_tasks", why, fix)]
    except OSError as e:
        return [Problem("eval_tasks", f"{python} cannot run here to check the tasks: {e.strerror or e}", fix)]
    lines = out.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if out.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        last = (out.stderr.strip().splitlines() or ["no answer"])[-1][:300]
        return [Problem("eval_tasks", f"{python} could not check the tasks: {last}", fix)]
    return answer


def _from_answer(answer: dict, python: str, found: eval_checks.EvalTasks) -> list[Problem]:
    if not answer.get("lm_eval"):
        return [Problem("eval_tasks", f"lm-eval is not installed in the job's Python ({python})", INSTALL)]
    out = []
    for task, close in (answer.get("unknown") or {}).items():
        where = " lm-eval " + answer["lm_eval"] + (" nor --eval_include" if found.include else "")
        fix = f"did you mean {', '.join(close)}?" if close else "see `lm_eval ls tasks`, or define it in --eval_include"
        out.append(Problem("eval_tasks", f"{task!r} is not a task, group, tag or preset{where} knows", fix))
    for why in answer.get("broken") or []:
        out.append(Problem("eval_include", why, "fix the YAML (lm-eval's task guide: docs/evals.md)"))
    for task, paths in (answer.get("twice") or {}).items():
        why = f"{task} is defined by {' and '.join(paths)}: lm-eval would take the first and leave the others"
        out.append(Problem("eval_include", why, "give each task a name of its own, or remove the copies"))
    for why in answer.get("overlap") or []:
        out.append(Problem("eval_tasks", why, "name the group or its tasks, not both"))
    for flag, why in answer.get("yaml") or []:
        out.append(Problem(flag, why, "fix the task's YAML (lm-eval's task guide: docs/evals.md)"))
    for why in answer.get("data") or []:
        out.append(Problem("eval_tasks", why, CACHE_FIX if "Hub dataset" in why else "fix the task's data"))
    return out


def rank_by_problems(spec: RunSpec, rank_by: str) -> list[Problem]:
    """--rank_by TASK[:METRIC] against what lm-eval says TASK's score holds (the point's own question, asked once);
    nothing where the flags' checks (launcher/evals/checks.py) or the tasks' own say what is wrong."""
    found, _ = eval_checks.tasks_of(spec.args.evals)
    task, _, metric = rank_by.partition(":")
    if found is None or task not in found.tasks:
        return []
    answer = answer_of(spec, found)
    held = answer.get("metrics", {}).get(task) if isinstance(answer, dict) else None
    if held is None:
        return []  # (not asked, or the tasks' problems are said)
    scores = [m for m in held if "_stderr" not in m]
    if not scores:
        return [Problem("rank_by", f"{task} has no score of its own in lm-eval's results (a tag, or a group that does "
                        "not aggregate its tasks)", "rank by one of its tasks (and evaluate it)")]  # fmt: skip
    if metric and metric not in held:
        best = next((m for m in MAIN_METRICS if m in scores), scores[0])
        return [
            Problem(
                "rank_by",
                f"{task} does not compute {metric!r} (it computes {', '.join(scores)})",
                f"e.g. --rank_by {task}:{best}" + (" (lowest first)" if best in LOWER_IS_BETTER else ""),
            )
        ]
    return []


def _lighteval(spec: RunSpec) -> list[Problem]:
    """A --config's `lighteval:` section, refused, with which of its tasks lm-eval has (its answer)."""
    section = spec.base_config.get("lighteval")
    if section is None:
        return []
    asked = tuple(dict.fromkeys(t for _, t in lighteval.names(section)))
    every = eval_checks.tasks_of(EvalArgs(eval_tasks=",".join(eval_checks.preset_names())))[0]
    said = answer_of(spec, eval_checks.EvalTasks((), every.include if every else ()), asked) if asked else {}
    known = said.get("known") if isinstance(said, dict) and said.get("lm_eval") else None
    why = "lm-eval is not installed in the job's Python" if isinstance(said, dict) else "the job's Python cannot say"
    refused = lighteval.problem(section, Path(spec.base_config_path), known if asked else {}, why)
    return [refused] if refused else []


def _slurm_problems(spec: RunSpec) -> list[Problem]:
    """Slurm's word on an eval job's script (its partition, its GPUs, its time limit), submitting nothing."""
    a = spec.args
    paths = files.paths_for(a.run_name, "check", Path(a.paths.configs_path), Path(a.paths.slurm_scripts_dir),
                            Path(a.paths.slurm_logs_path), spec.checkpoints_dir)  # fmt: skip
    try:
        client.check_submission(eval_script.text(spec, paths))
    except (QueueFull, SlurmUnavailable):
        return []  # the cluster's state now (said by the run's own verdict, which asks next)
    except SubmissionError as e:
        where = a.evals.eval_partition or a.slurm.partition or "the default partition"
        gpus = f" with {a.evals.eval_gpus} GPU(s)" if a.evals.eval_gpus else " on CPUs"
        said = " ".join(str(e).split())
        return [Problem("eval_partition", f"Slurm would not run an eval job on {where}{gpus}: {said}",
                        "give --eval_partition (a partition that has such nodes) or --eval_gpus")]  # fmt: skip
    return []
