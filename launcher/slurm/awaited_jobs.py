"""The jobs a --dependency names, judged by their states before anything is submitted.

Slurm 22.05 accepts a dependency on a job it does not know and starts the run at once (a typo in a job id
silently skips the wait; 23.02 and later do so for all kinds but afterok and afternotok, which they refuse at
submission), and holds a run whose dependency can no longer be met (afterok on a failed job)
PENDING forever. So when submitting, each job the dependency names is looked up: unknown jobs and dependencies
that can never be met are problems, reported with the rest before anything is written. The script asks Slurm to
cancel the run should its dependency fail later (`--kill-on-invalid-dep=yes`), so a followed run ends instead of
waiting forever.
"""

from __future__ import annotations

from collections.abc import Callable

from launcher.config.dependency_syntax import Dependency
from launcher.problems import Problem
from launcher.slurm.parse import JobState

NEVER_SATISFIED = "DependencyNeverSatisfied"  # Slurm's reason for a dependency that can no longer be met


def _ended(job_id: str, states: list[JobState], which: list[JobState]) -> str:
    if len(states) == 1:
        return f"job {job_id} ended {states[0].state}"
    ended = "/".join(sorted({s.state for s in which}))
    return f"job {job_id} (an array) ended {ended} in {len(which)} of its {len(states)} tasks"


def _never(kind: str, job_id: str, states: list[JobState]) -> str | None:
    """Why `kind` on this job can never be met now, or None (as slurmctld's _test_job_dependency_common judges;
    after, afterany and afterburstbuffer are met by any end). `states`: Slurm's records for the job, one a task
    for a whole array, which Slurm judges once every task has ended."""
    # (SPECIAL_EXIT is a job requeued and held, not terminal: Slurm counts it as pending still)
    if not all(s.terminal for s in states):
        return None
    # aftercorr waits, task by task, for the corresponding task to succeed; a run that is no array waits for the
    # whole job (or array) to succeed, exactly as afterok does
    failed = [s for s in states if s.state != "COMPLETED"]
    if kind in ("afterok", "aftercorr") and failed:
        return f"{_ended(job_id, states, failed)}, so {kind} can never be met"
    if kind == "afternotok" and not failed:
        return f"{_ended(job_id, states, states)}, so afternotok can never be met"
    return None


def _unknown(job_id: str, kind: str) -> Problem:
    """Slurm 22.05 counts a job it does not know as done; 23.02 and later refuse afterok/afternotok on one at
    submission and count it as done for the other kinds. The launcher refuses it before the queue on every release."""
    at_once = "it would count it as done and start this run at once"
    if kind in ("afterok", "afternotok"):
        at_once = f"Slurm 23.02 and later refuse {kind} on it at submission; 22.05 would count it as done and start this run at once"  # noqa: E501
    return Problem("dependency", f"Slurm does not know job {job_id}; {at_once}",
                   "check the job id (squeue --me; sacct where accounting is on)")  # fmt: skip


def state_problems(dependency: Dependency, job_states: Callable[[str], list[JobState]]) -> list[Problem]:
    """Problems with the jobs a dependency names, by their current states (`job_states`: Slurm's records for a job
    id, [] for one it does not know)."""
    items, any_of = dependency.items, dependency.any_of
    problems = []
    # Slurm judges each (kind, job id) on its own: afterok:1:2?afterany:3 is afterok:1 OR afterok:2 OR afterany:3
    never: list[str | None] = []  # for each, why it can no longer be met (None: it can)
    looked_up: dict[str, list[JobState]] = {}
    for item in items:
        if not item.job_ids:
            never.append(None)  # singleton: met once the other jobs of this name end
        for job_id in item.job_ids:
            if job_id in looked_up:
                states = looked_up[job_id]
            else:  # a whole array (1_*) is shown under its own id, a task under 1_3
                states = looked_up[job_id] = job_states(job_id.removesuffix("_*"))
                if not states:
                    problems.append(_unknown(job_id, item.kind))
            never.append(_never(item.kind, job_id, states) if states else None)
    failed = [why for why in never if why is not None]
    if failed and (not any_of or len(failed) == len(never)):  # ',': every one must hold; '?': one is enough
        fix = "use afterany to start whatever their outcome, or leave --dependency out"
        problems.append(Problem("dependency", "; ".join(failed), fix))
    return problems
