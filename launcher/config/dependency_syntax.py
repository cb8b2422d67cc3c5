"""--dependency's syntax (Slurm's `--dependency`, as slurmctld reads it): read once (`read`) into a typed
`Dependency` that the resolved run carries, or a problem.

The jobs it names are judged by their states in the cluster's checks (`launcher.slurm.awaited_jobs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.problems import Problem

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


@dataclass(frozen=True)
class Item:
    kind: str  # one of KINDS, or "singleton"
    job_ids: tuple[str, ...]  # without +delay


@dataclass(frozen=True)
class Dependency:
    """A --dependency, read: its items, and whether any one suffices ('?') or all must hold (',')."""

    items: tuple[Item, ...]
    any_of: bool

    @property
    def job_ids(self) -> list[str]:
        """Every job it names, in order."""
        return [job_id for item in self.items for job_id in item.job_ids]


def parse(text: str) -> Dependency | None:
    """A dependency's items and whether any one suffices ('?'), or None if it is not Slurm's syntax."""
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
    return Dependency(tuple(items), "?" in text)


def read(text: str | None) -> tuple[Dependency | None, list[Problem]]:
    """--dependency, read once: the typed dependency (None without one), or the problem with its syntax."""
    if text is None:
        return None, []
    parsed = parse(text)
    if parsed is None:
        return None, [Problem("dependency", f"{text!r} is not a Slurm dependency{_near_miss(text)}", EXAMPLES)]
    return parsed, []


def _near_miss(text: str) -> str:
    """What in a refused dependency Slurm reads otherwise, or does not take either, when it can be told."""
    if "," in text and "?" in text:
        return " (Slurm takes one kind of separator: all ',' or all '?')"
    if "_[" in text:
        return " (task ranges like 12345_[1-3] are not taken here: name the tasks, afterok:12345_1:12345_2)"
    return ""
