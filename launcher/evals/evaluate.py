"""`python -m launcher.jobs evaluate BUNDLE|SWEEP --eval_tasks ... [--eval_include DIR] [--steps all|N,M,...]
[--eval_limit N] [--eval_partition P] [--eval_gpus G] [--eval_heldout ...] [--again]`: the run's eval job
(launcher/evals/evaljob.py, the bundle's eval.sbatch) on checkpoints already on disk (docs/evals.md).

- The same checks before the queue as a launch (launcher/evals/checks.py, launcher/evals/probe.py): the run's spec
  is made again from its bundle as `jobs rerun` makes it (its resolved flags and config), with these eval flags in
  place of its own; every problem of every run at once, nothing submitted while one is left.
- Each step once per what is scored (EvalSettings.key), through launcher/evals/submit.py with a Queue over the
  launcher's Slurm client: a second call submits nothing and says so; `--again` submits anew a step whose eval
  failed, was refused or lost. A step not on disk is named, with the steps that are.
- The results join the run's own: its bundle's evals/ (`jobs evals`, `jobs verdict`), its W&B run (the eval job logs
  on the eval step axis, eval/tokens).
- A bundle written before job.json's format 2 has no eval job to submit: refused with that reason.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.config import cli
from launcher.config.resolve import resolve
from launcher.config.spec import RunSpec
from launcher.errors import ConfigError
from launcher.evals import checks as eval_checks
from launcher.evals import plan, record
from launcher.evals import probe as eval_probe
from launcher.evals.settings import EvalSettings
from launcher.evals.submit import Submission, failed, submit
from launcher.node import job as job_file
from launcher.problems import Problem, report
from launcher.runs import rerun
from launcher.slurm import client, facts

BY = "jobs evaluate"
FLAGS = ("eval_tasks", "eval_include", "eval_limit", "eval_partition", "eval_gpus", "eval_heldout")


class Queue:
    """The eval submitter's Slurm, through the launcher's client (launcher/evals/submit.py's Queue)."""

    def say(self, name: str, **fields: object) -> None:
        pass  # `command` says what became of each step itself

    def sbatch(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return client.sbatch(list(argv))

    def jobs_named(self, name: str) -> list[str] | None:
        return client.jobs_named(name)

    def jobs_alive(self, jobs: Iterable[str]) -> Mapping[str, bool | None]:
        wanted = sorted(set(jobs))
        try:
            states = client.job_states_many(wanted)
        except Exception:  # noqa: BLE001  Slurm away: it cannot say
            return dict.fromkeys(wanted)
        return {job: job in states and not states[job].terminal for job in wanted}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="a run's bundle directory or job id, or a sweep's directory")
    parser.add_argument("--eval_tasks", required=True, help="lm-eval's task names, comma-separated, or a preset")
    parser.add_argument("--eval_include", help="a folder of your own task YAMLs")
    parser.add_argument("--steps", default="all", help="all (default: every complete checkpoint on disk) or N,M,...")
    parser.add_argument("--eval_limit", type=int, help="samples per task (default: every sample)")
    parser.add_argument("--eval_partition", help="the eval jobs' partition (default: the run's)")
    parser.add_argument("--eval_gpus", type=int, default=0, help="GPUs of each eval job (default 0: its node's CPUs)")
    parser.add_argument("--eval_heldout", help="held-out data for the loss and bits per byte (as at launch)")
    parser.add_argument("--again", action="store_true", help="submit anew the steps whose eval failed or was lost")


@dataclass
class Planned:
    run: manifest.Manifest
    job: job_file.Job
    settings: EvalSettings
    steps: list[int]
    options: list[str]


def spec_of(run: manifest.Manifest, args: argparse.Namespace) -> tuple[RunSpec | None, list[Problem]]:
    """The run's spec as `jobs rerun` makes it from the bundle, these eval flags in place of its own; the problems
    of these eval flags (the launch's own checks)."""
    name = str(run.data.get("run_name") or run.bundle_dir.parent.name)
    argv = [a for a in rerun.command_line(run, name, dry_run=True, resume=True, show_logs=False)
            if not a.startswith(("--eval_", "--rank_by"))]  # fmt: skip
    argv += [f"--{flag}={getattr(args, flag)}" for flag in FLAGS
             if getattr(args, flag) is not None and (flag, getattr(args, flag)) != ("eval_gpus", 0)]  # fmt: skip
    try:
        parsed_args, explicit = cli.parse(argv)
    except SystemExit:
        return None, [Problem("target", f"{run.bundle_dir}'s resolved flags no longer parse with this launcher",
                              "evaluate its checkpoints with the launcher that wrote it")]  # fmt: skip
    spec, found = resolve(parsed_args, explicit, facts.ask(parsed_args), checkpoints=run.checkpoints)
    earlier = [p for p in found if p.flag in FLAGS] + eval_checks.problems(spec)
    return spec, earlier + eval_probe.problems(spec, earlier, ask_slurm=True)


def steps_of(run: manifest.Manifest, text: str) -> tuple[list[int], list[Problem]]:
    """--steps: every complete checkpoint on disk (all), or those named, each on disk."""
    on_disk = sorted(ckpt.complete_steps(run.checkpoints))
    if text == "all":
        if not on_disk:
            return [], [Problem("steps", f"{run.checkpoints} holds no complete checkpoint", "evaluate a run that "
                                "saved some")]  # fmt: skip
        return on_disk, []
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or not all(w.isdigit() for w in words):
        return [], [Problem("steps", f"{text!r} is not all or step numbers (N,M,...)", "e.g. --steps 1000,2000")]
    asked = sorted({int(w) for w in words})
    missing = [s for s in asked if s not in on_disk]
    if missing:
        have = ", ".join(map(str, on_disk)) or "none"
        return [], [Problem("steps", f"step(s) {', '.join(map(str, missing))} not on disk in {run.checkpoints} "
                            f"(complete checkpoints there: {have})", "give steps that are there")]  # fmt: skip
    return asked, []


def plan_run(bundle: Path, args: argparse.Namespace) -> tuple[Planned | None, list[Problem]]:
    try:
        run = manifest.load(bundle)
    except (OSError, ValueError) as e:
        return None, [Problem("target", f"{bundle}: not a run's bundle ({e})", "give a bundle directory")]
    try:
        job = job_file.load(bundle)
    except job_file.JobFileError as e:
        return None, [Problem("target", f"{bundle} was written by an earlier launcher ({e}): it has no eval job "
                              "to submit", "evaluate an export of its steps by hand (`jobs export`, then lm_eval: "
                              "docs/evals.md), or rerun it with this launcher (`jobs rerun --resume`)")]  # fmt: skip
    if not job.file(P.EVAL_SCRIPT).is_file():
        return None, [Problem("target", f"{bundle} has no {P.EVAL_SCRIPT}", "rerun it with this launcher")]
    steps, problems = steps_of(run, args.steps)
    spec, found = spec_of(run, args)
    problems += found
    if spec is None or problems:
        return None, problems
    settings = plan.settings_of(spec)
    assert settings is not None, "--eval_tasks is required"
    options = [f"--time={settings.time_limit}"] + ([f"--partition={settings.partition}"] if settings.partition else [])
    options += [f"--gres=gpu:{settings.gpus}"] if settings.gpus else []
    return Planned(run, job, settings, steps, options), []


def said(s: Submission, job: job_file.Job, key: str, again: bool) -> str:
    """What became of a step, in a line."""
    if s.new and s.submitted:
        return f"step {s.step}: eval job {s.job} submitted (log {job.eval_log(s.step)})"
    if s.new:
        return f"step {s.step}: not submitted: {s.why}"
    if s.retry:
        return f"step {s.step}: not submitted now ({s.why}): run this again"
    sub = record.submission(job.checkpoints, s.step, key) or {}
    state = str((record.result_of(sub) or {}).get("state") or s.why)  # the eval job's word, else the submission's
    hint = " (--again submits it anew)" if not again and failed(sub) else ""
    return f"step {s.step}: evaluated already for these tasks (eval job {s.job or '-'}, {state}): nothing " \
        f"submitted{hint}"  # fmt: skip


def command(bundles: list[Path], args: argparse.Namespace) -> int:
    """Check every run, then submit each step's eval job once; what became of each step, said."""
    planned, problems = [], []
    for bundle in bundles:
        found, wrong = plan_run(bundle, args)
        problems += [Problem(p.flag, f"({bundle.parent.name}) {p.message}", p.fix) for p in wrong] if len(bundles) > 1 \
            else wrong  # fmt: skip
        if found is not None:
            planned.append(found)
    if problems:
        raise ConfigError(report(list(dict.fromkeys(problems))))
    queue = Queue()
    for p in planned:
        print(f"Evaluating {p.job.run_name} ({p.run.bundle_dir}) on {p.settings.said}, steps "
              f"{', '.join(map(str, p.steps))}:")  # fmt: skip
        for step in p.steps:
            done = submit(p.job, p.settings, step, BY, queue, p.options, args.again)
            print("  " + said(done, p.job, p.settings.key, args.again))
    return 0
