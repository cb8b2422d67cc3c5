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
# Slurm's grammar as slurmctld parses it (update_job_dependency), in ASCII: `[0-9]`, as `\d` would take '١٢'.
_ID = r"0*[1-9][0-9]*(?:_(?:[0-9]+|\*))?"  # a job id (not 0), an array task (123_4) or a whole array (123_*)
_DELAY = r"\+0*[1-9][0-9]*"  # minutes, for `after` (Slurm reads it after any kind; 0 it refuses)
_TYPED = rf"(?:{'|'.join(KINDS)}):{_ID}(?:{_DELAY})?(?::{_ID}(?:{_DELAY})?)*"
_ITEM = rf"(?:{_TYPED}|singleton)"
# A bare job id means afterany. Slurm reads one only where no `kind:` item follows it (12,afterok:13 is refused),
# so bare ids end a ',' list, and one may end a '?' list.
_ALL_OF = rf"(?:{_ITEM},)*(?:{_ITEM}|{_ID}(?:,(?:{_ID}|singleton))*)"
_ANY_OF = rf"{_ITEM}(?:\?{_ITEM})*\?(?:{_ITEM}|{_ID})"
SYNTAX = re.compile(rf"{_ALL_OF}|{_ANY_OF}", re.ASCII | re.IGNORECASE)  # kinds in any case, as Slurm reads them
EXAMPLES = (
    "e.g. afterok:12345, afterany:12345:12346, afterok:12345_7 (an array task), afterok:12345_* (a whole array), "
    "12345 (afterany) or singleton (',' joins items that must all hold, '?' any)"
)
NEVER_SATISFIED = "DependencyNeverSatisfied"  # Slurm's reason for a dependency that can no longer be met


@dataclass(frozen=True)
class Item:
    kind: str  # one of KINDS, or "singleton"
    job_ids: tuple[str, ...]  # without +delay


def parse(text: str) -> tuple[list[Item], bool] | None:
    """The items of a dependency and whether any one suffices ('?'), or None if it is not Slurm's syntax."""
    if not SYNTAX.fullmatch(text):
        return None
    items = []
    for part in re.split(r"[,?]", text):
        kind, colon, ids = part.partition(":")
        if colon:
            items.append(Item(kind.lower(), tuple(i.split("+")[0] for i in ids.split(":"))))
        elif kind.lower() == "singleton":
            items.append(Item("singleton", ()))
        else:
            items.append(Item("afterany", (part,)))  # a bare job id: Slurm's default kind
    return items, "?" in text


def _near_miss(text: str) -> str:
    """What in a refused dependency Slurm reads otherwise, or does not take either, when it can be told."""
    if "," in text and "?" in text:
        return " (Slurm takes one kind of separator: all ',' or all '?')"
    if "_[" in text:
        return " (task ranges like 12345_[1-3] are not taken here: name the tasks, afterok:12345_1:12345_2)"
    return ""


def syntax_problems(text: str | None) -> list[Problem]:
    if text is None or parse(text) is not None:
        return []
    return [Problem("dependency", f"{text!r} is not a Slurm dependency{_near_miss(text)}", EXAMPLES)]


def _ended(job_id: str, states: list[JobState], which: list[JobState]) -> str:
    if len(states) == 1:
        return f"job {job_id} ended {states[0].state}"
    ended = "/".join(sorted({s.state for s in which}))
    return f"job {job_id} (an array) ended {ended} in {len(which)} of its {len(states)} tasks"


def _never(kind: str, job_id: str, states: list[JobState]) -> str | None:
    """Why `kind` on this job can never be met now, or None (as slurmctld's _test_job_dependency_common judges;
    after, afterany and afterburstbuffer are met by any end). `states`: Slurm's records for the job, one a task
    for a whole array, which Slurm judges once every task has ended."""
    # SPECIAL_EXIT is a job requeued and held: Slurm counts it as pending still, so it can yet end either way
    if not all(s.terminal and s.state != "SPECIAL_EXIT" for s in states):
        return None
    # aftercorr waits, task by task, for the corresponding task to succeed; a run that is no array waits for the
    # whole job (or array) to succeed, exactly as afterok does
    failed = [s for s in states if s.state != "COMPLETED"]
    if kind in ("afterok", "aftercorr") and failed:
        return f"{_ended(job_id, states, failed)}, so {kind} can never be met"
    if kind == "afternotok" and not failed:
        return f"{_ended(job_id, states, states)}, so afternotok can never be met"
    return None


def _unknown(job_id: str) -> Problem:
    return Problem(
        "dependency",
        f"Slurm does not know job {job_id}; it would count it as done and start this run at once",
        "check the job id (squeue --me; sacct where accounting is on)",
    )


def state_problems(text: str, job_states: Callable[[str], list[JobState]]) -> list[Problem]:
    """Problems with the jobs a (well-formed) dependency names, by their current states (`job_states`: Slurm's
    records for a job id, [] for one it does not know)."""
    parsed = parse(text)
    assert parsed is not None, "checked by syntax_problems first"
    items, any_of = parsed
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
                    problems.append(_unknown(job_id))
            never.append(_never(item.kind, job_id, states) if states else None)
    failed = [why for why in never if why is not None]
    if failed and (not any_of or len(failed) == len(never)):  # ',': every one must hold; '?': one is enough
        fix = "use afterany to start whatever their outcome, or leave --dependency out"
        problems.append(Problem("dependency", "; ".join(failed), fix))
    return problems
