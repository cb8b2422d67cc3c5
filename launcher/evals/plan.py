"""--eval_tasks at launch, planned purely from the resolved spec: the eval settings the job reads (job.json's `evals`:
launcher/evals/settings.py), the eval job's time limit among them."""

from __future__ import annotations

from launcher.config.slurm_values import time_limit_seconds
from launcher.config.spec import RunSpec
from launcher.evals import checks
from launcher.evals.settings import EvalSettings

DEFAULT_TIME_LIMIT_S = 4 * 3600  # without --eval_time_limit: the run's, at most this (a week's would hold it back)


def time_limit(spec: RunSpec) -> str:
    """The eval job's time limit (HH:MM:SS): --eval_time_limit, else the run's --time_limit, at most 4 hours."""
    asked = spec.args.evals.eval_time_limit
    try:
        seconds = time_limit_seconds(asked) if asked else min(time_limit_seconds(spec.args.slurm.time_limit),
                                                               DEFAULT_TIME_LIMIT_S)  # fmt: skip
    except ValueError:  # UNLIMITED, INFINITE
        seconds = DEFAULT_TIME_LIMIT_S
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def settings_of(spec: RunSpec) -> EvalSettings | None:
    """The run's eval settings as the job reads them; None without --eval_tasks."""
    found, _ = checks.tasks_of(spec.args.evals)
    if found is None:
        return None
    e = spec.args.evals
    return EvalSettings(
        tasks=found.tasks,
        include=found.include,
        said=found.said,
        every=e.eval_every or 0,
        limit=e.eval_limit,
        gpus=e.eval_gpus,
        heldout=e.eval_heldout,
        partition=e.eval_partition or spec.args.slurm.partition or "",
        time_limit=time_limit(spec),
    )
