"""Slurm hostlists (`gpu[01-04,07],login1`), expanded in pure Python, and --nodelist judged against --nodes.

Slurm releases disagree on `--nodes 1 --nodelist node[1-2]`: 22.05 refuses it, 24.11 accepts it and runs on one
node of the list. The launcher does not rely on either (nor on `sbatch --test-only`): a list naming more nodes
than --nodes is a problem, said the same way on every release.
"""

from __future__ import annotations

import itertools
import math
import re

from launcher.problems import Problem

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)
MAX_NODES = 100_000  # a list that expands to more is not a node list anyone means (and not worth expanding)


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _numbers(inside: str) -> list[str] | None:
    """The values of one bracket, `01-03,7` -> ['01', '02', '03', '7'] (the width of a range's first bound kept)."""
    values: list[str] = []
    for item in inside.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            return None
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low) or int(high) - int(low) >= MAX_NODES:
            return None
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return values


def expand(text: str) -> list[str] | None:
    """The node names a hostlist names, in order, each once; None if it is not a hostlist Slurm reads."""
    names: list[str] = []
    for part in _split_top(text):
        pieces = re.split(r"\[([^\[\]]*)\]", part)  # text, bracket, text, bracket, ..., text
        if not part or "[" in "".join(pieces[::2]) or "]" in "".join(pieces[::2]):
            return None
        choices: list[list[str]] = []
        for k, piece in enumerate(pieces):
            values = [piece] if k % 2 == 0 else _numbers(piece)
            if values is None:
                return None
            choices.append(values)
        if len(names) + math.prod(len(c) for c in choices) > MAX_NODES:
            return None
        names += ["".join(combo) for combo in itertools.product(*choices)]
    return list(dict.fromkeys(names))


def nodelist_problems(nodelist: str | None, exclude: str | None, nodes: int, spares: int = 0) -> list[Problem]:
    """--nodelist against --nodes and --spare_nodes (and --exclude): each node a job's --nodelist names is one of
    its nodes."""
    named = expand(nodelist) if nodelist else None
    if named is None:
        return []  # no list, or one whose form the alphabet check already reports (or Slurm judges)
    problems = []
    most = nodes + spares
    if len(named) > most:
        job = f"--nodes {nodes}" if not spares else f"the job's {most} (--nodes {nodes} + --spare_nodes {spares})"
        more = f"use --nodes {len(named)}" if not spares else f"raise --spare_nodes to {len(named) - nodes}"
        problems.append(
            Problem(
                "nodelist",
                f"{nodelist} names {len(named)} nodes, more than {job} (a job runs on every node its --nodelist names)",
                f"{more}, or name at most {most} node{'s' if most > 1 else ''} in --nodelist",
            )
        )
    both = sorted(set(named) & set(expand(exclude) or [])) if exclude else []
    if both:
        problems.append(
            Problem("exclude", f"{', '.join(both)} is in both --nodelist and --exclude", "name it in one of them")
        )
    return problems
