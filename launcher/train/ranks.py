"""Which node each rank runs on, and which ranks are slower than the others.

- **The rank map**: as training starts, every rank says its node (one `all_gather_object` of a name) and rank 0
  writes the bundle's `ranks` (LAUNCHER_BUNDLE's; protocol.RANKS_FORMAT, a line a node): the supervisor's restart
  decision finds the node of a failed rank there (torchrun's c10d rendezvous numbers the nodes its own way).
- **Stragglers**: in data parallel training every rank waits for the slowest at each step's gradient all-reduce, so
  a step's wall time is the same everywhere; what differs is a rank's own work before it waits (its data, its
  forward passes, the micro-batches it accumulates alone). Each rank times that part of every step; every
  `straggler_every` steps rank 0 gathers every rank's mean and its mean step time (one all_reduce of two floats a
  rank) and compares them with their median. A rank above SLOWER x the median whose excess over it is also at least
  COSTLY of a step (less is the timer's noise under a busy CPU, and costs the run little) at PERSISTENT looks in a
  row is named: in the log, once
  (`straggler: rank 3 on node2 ...`; a node all of whose ranks are named is named as the node), and at every look
  while it stays slow in the bundle's `stragglers.jsonl` (JSON lines), which the run's summary and training.png read.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from launcher import atomic, jsonl
from launcher import protocol as P
from launcher.train.environment import JobEnvironment

SLOWER = 1.2  # a rank whose own work takes this many times the median rank's is slow at one look
PERSISTENT = 3  # looks in a row: a straggler, not a hiccup (a checkpoint, a page cache miss)
COSTLY = 0.1  # and its excess over the median is this share of a step at least: below it, noise that costs little


def nodes_of_ranks(job: JobEnvironment) -> list[str]:
    """Every rank's node, by rank (a collective: every rank calls it once; ["node"] alone)."""
    mine = job.node or "?"
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    nodes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, mine)
    return [n or "?" for n in nodes]


def write_rank_map(job: JobEnvironment, nodes: list[str]) -> None:
    """Rank 0 writes which node holds which ranks (a node's ranks are consecutive: torchrun gives them so)."""
    if not job.is_main or not job.ranks_file:
        return
    lines, first = [], 0
    for rank in range(1, len(nodes) + 1):
        if rank == len(nodes) or nodes[rank] != nodes[first]:
            lines.append(P.RANKS_FORMAT.format(node=nodes[first], first=first, last=rank - 1))
            first = rank
    atomic.replace(Path(job.ranks_file), "".join(lines))


@dataclass(frozen=True)
class Straggler:
    """One look at which a rank (or a whole node) was slow, as the stragglers file keeps it."""

    step: int  # the step of the look
    rank: int | None  # None: a whole node
    node: str
    ranks: str  # "3", or "2-3" for a node
    ratio: float  # its own work per step over the median rank's
    seconds: float  # its own work per step (mean since the last look)
    median: float  # the median rank's
    looks: int  # looks in a row it has been slow
    since: int  # the first step of the looks it has been slow at
    time: float

    def words(self) -> str:
        who = f"rank {self.rank} on {self.node}" if self.rank is not None else f"{self.node} (ranks {self.ranks})"
        return (
            f"straggler: {who} is {self.ratio:.1f}x slower than the median rank at its own part of a step "
            f"({self.seconds:.3f} s against {self.median:.3f} s, {self.looks} looks in a row, to step {self.step})"
        )


def slow_ranks(seconds: list[float], step_s: float) -> tuple[float, list[int]]:
    """(the median, the ranks above SLOWER x it by COSTLY of a step of `step_s` at least) of one look's per-rank
    seconds."""
    median = statistics.median(seconds)
    return median, [r for r, s in enumerate(seconds) if median > 0 and s > SLOWER * median and
                    s - median >= COSTLY * step_s]  # fmt: skip


class StragglerWatch:
    """Every rank: `timed(seconds)` after each step with its own part of it; `look(step)` at every step (a collective
    every `every` steps)."""

    def __init__(self, job: JobEnvironment, nodes: list[str], device: torch.device):
        self.job, self.nodes, self.device = job, nodes, device
        self.every, self.total, self.step_total, self.count = job.straggler_every, 0.0, 0.0, 0
        self.streak = [0] * len(nodes)  # looks in a row each rank has been slow
        self.named: set[str] = set()

    def timed(self, seconds: float, step_s: float) -> None:
        """A step's own part of `seconds`, of a step of `step_s` (the same on every rank: all wait for the last)."""
        self.total, self.step_total, self.count = self.total + seconds, self.step_total + step_s, self.count + 1

    def look(self, step: int, now: float) -> list[Straggler]:
        """At every `every`-th step: gather every rank's mean and name the stragglers (on rank 0; [] elsewhere)."""
        if step % self.every or len(self.nodes) < 2:
            return []
        world = len(self.nodes)
        values = torch.zeros(2 * world, dtype=torch.float64, device=self.device)  # every rank's own part, step
        values[self.job.rank] = self.total / max(self.count, 1)
        values[world + self.job.rank] = self.step_total / max(self.count, 1)
        dist.all_reduce(values)
        self.total, self.step_total, self.count = 0.0, 0.0, 0
        seconds, steps = values[:world].tolist(), values[world:].tolist()
        median, slow = slow_ranks(seconds, statistics.median(steps))
        self.streak = [s + 1 if r in slow else 0 for r, s in enumerate(self.streak)]
        if not self.job.is_main:
            return []
        found = self._named(step, now, seconds, median)
        self._keep(found)
        return found

    def _named(self, step: int, now: float, seconds: list[float], median: float) -> list[Straggler]:
        lagging = [r for r, s in enumerate(self.streak) if s >= PERSISTENT]
        found = []
        for node in dict.fromkeys(self.nodes[r] for r in lagging):
            held = [r for r, n in enumerate(self.nodes) if n == node]
            mine = [r for r in lagging if self.nodes[r] == node]
            if mine == held and len(held) > 1 and len(held) < len(self.nodes):  # the whole node (not all of the run)
                mean = sum(seconds[r] for r in held) / len(held)
                looks = min(self.streak[r] for r in held)
                found.append(Straggler(step, None, node, f"{held[0]}-{held[-1]}", mean / median, mean, median, looks,
                                       self._since(step, looks), now))  # fmt: skip
                continue
            found += [Straggler(step, r, node, str(r), seconds[r] / median, seconds[r], median, self.streak[r],
                                self._since(step, self.streak[r]), now) for r in mine]  # fmt: skip
        return found

    def _since(self, step: int, looks: int) -> int:
        return max(step - looks * self.every + 1, 1)

    def _keep(self, found: list[Straggler]) -> None:
        """Print each straggler the first time it is named; record every look at it."""
        for s in found:
            if s.ranks not in self.named:
                print(s.words(), flush=True)
                self.named.add(s.ranks)
        if found and self.job.stragglers_file:
            for s in found:
                jsonl.append(self.job.stragglers_file, asdict(s))
