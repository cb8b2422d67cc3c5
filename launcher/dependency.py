"""--dependency: start a run after other jobs (Slurm's `--dependency`), checked before anything is submitted.

Slurm itself accepts a dependency on a job it does not know and starts the run at once (a typo in a job id
silently skips the wait), and holds a run whose dependency can no longer be met (afterok on a failed job)
PENDING forever. So the syntax is checked with the other flags, and when submitting each job it names is looked
up: unknown jobs and dependencies that can never be met are problems, reported with the rest before anything is
written. The script asks Slurm to cancel the run should its dependency fail later (`--kill-on-invalid-dep=yes`),
so a followed run ends instead of waiting forever.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from launcher.problems import Problem
from launcher.slurm import JobState

KINDS = ("after", "afterany", "afterok", "afternotok", "aftercorr", "afterburstbuffer")
_JOB = r"\d+(?:_\d+)?(?:\+\d+)?"  # a job id, an array task (123_4), and for `after` a delay in minutes (+10)
_ITEM = rf"(?:(?:{'|'.join(KINDS)}):{_JOB}(?::{_JOB})*|singleton)"
SYNTAX = re.compile(rf"{_ITEM}(?:,{_ITEM})*|{_ITEM}(?:\?{_ITEM})+")
EXAMPLES = "e.g. afterok:12345, afterany:12345:12346 or singleton (',' joins items that must all hold, '?' any)"
NEVER_SATISFIED = "DependencyNeverSatisfied"  # Slurm's reason for a dependency that can no longer be met


@dataclass(frozen=True)
class Item:
    kind: str  # one of KINDS, or "singleton"
    job_ids: tuple[str, ...]  # without +delay


def parse(text: str) -> tuple[list[Item], bool] | None:
    """The items of a dependency and whether any one suffices ('?'), or None if it is not Slurm's syntax."""
    if not SYNTAX.fullmatch(text):
        return None
    any_of = "?" in text
    items = []
    for part in re.split(r"[,?]", text):
        kind, _, ids = part.partition(":")
        items.append(Item(kind, tuple(i.split("+")[0] for i in ids.split(":")) if ids else ()))
    return items, any_of


def syntax_problems(text: str | None) -> list[Problem]:
    if text is None or parse(text) is not None:
        return []
    return [Problem("dependency", f"{text!r} is not a Slurm dependency", EXAMPLES)]


def _never(kind: str, state: JobState) -> str | None:
    """Why `kind` on this job can never be met now, or None."""
    if not state.terminal:
        return None
    if kind == "afterok" and state.state != "COMPLETED":
        return f"job {state.job_id} ended {state.state}, so afterok can never be met"
    if kind == "afternotok" and state.state == "COMPLETED":
        return f"job {state.job_id} ended COMPLETED, so afternotok can never be met"
    return None


def state_problems(text: str, job_state: Callable[[str], JobState | None]) -> list[Problem]:
    """Problems with the jobs a (well-formed) dependency names, by their current states."""
    parsed = parse(text)
    assert parsed is not None, "checked by syntax_problems first"
    items, any_of = parsed
    problems = []
    # Slurm judges each (kind, job id) on its own: afterok:1:2?afterany:3 is afterok:1 OR afterok:2 OR afterany:3
    never: list[str | None] = []  # for each, why it can no longer be met (None: it can)
    for item in items:
        if not item.job_ids:
            never.append(None)  # singleton: met once the other jobs of this name end
        for job_id in item.job_ids:
            state = job_state(job_id)
            if state is None:
                problems.append(
                    Problem(
                        "dependency",
                        f"Slurm does not know job {job_id}; it would count it as done and start this run at once",
                        "check the job id (squeue --me; sacct where accounting is on)",
                    )
                )
            never.append(None if state is None else _never(item.kind, state))
    failed = [why for why in never if why is not None]
    if failed and (not any_of or len(failed) == len(never)):  # ',': every one must hold; '?': one is enough
        fix = "use afterany to start whatever their outcome, or leave --dependency out"
        problems.append(Problem("dependency", "; ".join(failed), fix))
    return problems
