"""The GPU-hour ledger of a run: where the GPU time of every attempt of its requeue chain went (pure).

Each attempt holds `gpus` GPUs from its start to its end (`allocated`). Its GPU time falls into four parts:

    start-up     the start to the first logged step (node checks, imports, data, the first step itself)
    trained      the first logged step to the last one
    wind-down    the last step to the end (the last checkpoint, the processes ending; for a hung attempt: the hang
                 until the watchdog fired, and the stacks dumped)
    thrown away  the part of `trained` after the checkpoint the next attempt resumed from (for a last attempt that
                 did not complete: after its last checkpoint): steps that were, or must be, done again

`useful` = trained - thrown away; `lost` = allocated - useful = start-up + wind-down + thrown away. Queue time is
no GPU time: between attempts nothing is allocated. Each lost part is charged to a cause: an attempt's
thrown-away steps and wind-down, and the next attempt's start-up, to why the attempt ended (preemption, time limit,
hang, node check, node failure, failure, cancel); an attempt that never reached a step, to why it ended; the first
start-up and a completed run's wind-down to "start-up and wind-down",
which every run pays once. docs/ledger.md says the same with examples.

An attempt that restarted training inside its allocation comes as its node steps (`Attempt.segment`), each ended
by its restart's cause (`restarted`): a restart's cost is its step's wind-down and thrown-away steps and the next
step's start-up (`restart_costs`: GPU-seconds, and the seconds from the failed step's last step to the next step).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

HOUR = 3600.0
OVERHEAD = "start-up and wind-down"
COMPLETED = "completed"
RESTARTED = " (restarted in the allocation)"  # a lost_to key: a cause of restarts, not of requeues


@dataclass(frozen=True)
class Attempt:
    """One attempt (or one node step of it, where training restarted in its allocation): when it held its GPUs, how
    many, and why it ended ("completed", "preemption", "time limit", "hang", "node check", "node failure",
    "failure", "cancel", "requeue", "running")."""

    number: int
    start: float  # unix time
    end: float  # unix time (now, for a running attempt)
    gpus: int
    ended: str
    segment: int = 0  # the node step of the attempt (0: its first; k: after its k-th restart in the allocation)
    restarted: bool = False  # it ended in a restart in the allocation, not with the attempt


@dataclass(frozen=True)
class Work:
    """What training did in one attempt, from the job's own records."""

    steps: tuple[tuple[float, int], ...] = ()  # (unix time, step) of each logged step, in order
    resumed_from: int | None = None  # the checkpoint step it resumed from (None: started afresh)
    saved: int | None = None  # the last checkpoint it wrote, where known


@dataclass(frozen=True)
class AttemptLedger:
    number: int
    segment: int
    restarted: bool
    gpus: int
    ended: str
    allocated: float  # GPU-seconds, as every figure here
    start_up: float
    trained: float
    wind_down: float
    thrown_away: float
    first_step: int | None
    last_step: int | None
    resumed_from: int | None
    steps_thrown_away: int


@dataclass
class Ledger:
    source: str  # "sacct" or "job records"
    attempts: list[AttemptLedger]
    lost_to: dict[str, float] = field(default_factory=dict)  # cause -> GPU-seconds
    causes: dict[str, int] = field(default_factory=dict)  # cause -> attempts it ended (not "completed")
    restarts: dict[str, int] = field(default_factory=dict)  # cause -> restarts in the allocation after it
    restart_costs: list[dict] = field(default_factory=list)  # per restart: cause, GPU-seconds, seconds to a step
    checkpoints: dict | None = None  # the checkpoints' bytes written and freed (bundle.records.checkpoint_totals)
    uploads: dict | None = None  # --checkpoints_remote: steps, bytes and seconds to and from the bucket (remote.record)

    def total(self, part: str) -> float:
        return sum(getattr(a, part) for a in self.attempts)

    @property
    def allocated(self) -> float:
        return self.total("allocated")

    @property
    def useful(self) -> float:
        return self.total("trained") - self.total("thrown_away")

    @property
    def lost(self) -> float:
        return self.allocated - self.useful

    @property
    def steps_thrown_away(self) -> int:
        return sum(a.steps_thrown_away for a in self.attempts)

    def record(self) -> dict:
        """As the manifest keeps it (GPU-hours)."""
        hours = {part: round(self.total(part) / HOUR, 6) for part in
                 ("allocated", "start_up", "trained", "wind_down", "thrown_away")}  # fmt: skip
        return {
            "source": self.source,
            "gpu_hours": {**hours, "useful": round(self.useful / HOUR, 6), "lost": round(self.lost / HOUR, 6)},
            "lost_to_gpu_hours": {k: round(v / HOUR, 6) for k, v in self.lost_to.items()},
            "causes": self.causes,
            "restarts": self.restarts,
            "lost_per_restart": [
                {
                    "cause": c["cause"],
                    "gpu_hours": round(c["gpu_seconds"] / HOUR, 6),
                    "failure_to_next_step_s": None if c["seconds"] is None else round(c["seconds"], 1),
                }
                for c in self.restart_costs
            ],  # fmt: skip
            "steps_thrown_away": self.steps_thrown_away,
            **({"checkpoints": self.checkpoints} if self.checkpoints is not None else {}),
            **({"uploads": self.uploads} if self.uploads is not None else {}),
            "attempts": [asdict(a) for a in self.attempts],
        }


def _time_at(steps: tuple[tuple[float, int], ...], step: int) -> float:
    """When `step` was done in an attempt (linear between logged steps; its first logged step if before it)."""
    numbers = [s for _, s in steps]
    i = bisect.bisect_left(numbers, step)
    if i == 0:
        return steps[0][0]
    if i == len(steps):
        return steps[-1][0]
    (t0, s0), (t1, s1) = steps[i - 1], steps[i]
    return t0 if s1 == s0 else t0 + (t1 - t0) * (step - s0) / (s1 - s0)


def _kept_until(work: Work, next_work: Work | None, ended: str, save_interval: int) -> int | None:
    """The last step of this attempt that no attempt must do again; None: all of it is kept."""
    if next_work is not None:
        return next_work.resumed_from or 0
    if ended in (COMPLETED, "running"):
        return None
    last = work.steps[-1][1]
    periodic = last - last % save_interval if save_interval > 0 else 0
    return max(periodic, work.resumed_from or 0, work.saved or 0)


def _work(works: Mapping[Any, Work], a: Attempt) -> Work:
    """What training did in `a`: `works` by (number, segment), or by number for an attempt not split."""
    return works.get((a.number, a.segment)) or (works.get(a.number) if a.segment == 0 else None) or Work()


def compute(attempts: list[Attempt], works: Mapping[Any, Work], save_interval: int, source: str) -> Ledger:
    """The ledger of a requeue chain: `attempts` in order (node steps where training restarted in an allocation),
    `works[(number, segment)]` (or `works[number]`) what training did in each."""
    rows: list[AttemptLedger] = []
    lost_to: dict[str, float] = {}
    causes, restarts = Counter[str](), Counter[str]()
    for i, a in enumerate(attempts):
        work = _work(works, a)
        nxt = _work(works, attempts[i + 1]) if i + 1 < len(attempts) else None
        allocated = max(a.end - a.start, 0.0) * a.gpus
        steps = tuple((min(max(t, a.start), a.end), s) for t, s in work.steps)
        if steps:
            first_t, last_t = steps[0][0], steps[-1][0]
            kept = _kept_until(Work(steps, work.resumed_from, work.saved), nxt, a.ended, save_interval)
            thrown_s = 0.0 if kept is None or kept >= steps[-1][1] else (last_t - _time_at(steps, kept)) * a.gpus
            thrown_steps = 0 if kept is None else max(steps[-1][1] - max(kept, work.resumed_from or 0), 0)
            row = AttemptLedger(a.number, a.segment, a.restarted, a.gpus, a.ended, allocated=allocated,
                                start_up=(first_t - a.start) * a.gpus, trained=(last_t - first_t) * a.gpus,
                                wind_down=(a.end - last_t) * a.gpus, thrown_away=thrown_s, first_step=steps[0][1],
                                last_step=steps[-1][1], resumed_from=work.resumed_from,
                                steps_thrown_away=thrown_steps)  # fmt: skip
        else:  # no step at all: all of it start-up
            row = AttemptLedger(a.number, a.segment, a.restarted, a.gpus, a.ended, allocated=allocated,
                                start_up=allocated, trained=0.0, wind_down=0.0, thrown_away=0.0, first_step=None,
                                last_step=None, resumed_from=work.resumed_from, steps_thrown_away=0)  # fmt: skip
        rows.append(row)
        if a.restarted:
            restarts[a.ended] += 1
        elif a.ended not in (COMPLETED, "running"):
            causes[a.ended] += 1
        # start-up is the cost of the previous attempt's end; an attempt that never stepped is its own end's cost
        before = _cause(a) if not steps and _cause(a) != OVERHEAD else OVERHEAD if i == 0 else _cause(attempts[i - 1])
        lost_to[before] = lost_to.get(before, 0.0) + row.start_up
        lost_to[_cause(a)] = lost_to.get(_cause(a), 0.0) + row.wind_down + row.thrown_away
    charged = {k: v for k, v in lost_to.items() if v > 0}
    return Ledger(source, rows, charged, dict(causes), dict(restarts), _restart_costs(attempts, rows, works))


def trained_curve(attempts: list[Attempt], works: Mapping[Any, Work]) -> list[list[tuple[int, float]]]:
    """Per attempt (or node step), its logged steps with the trained GPU-hours spent by then, counted across the
    chain: every earlier attempt's trained time (its thrown-away steps too: they were paid for), then this one's
    from its first step. A step done twice (after a requeue or a restart) appears in two attempts: `hours_at`
    takes the last."""
    curves, spent = [], 0.0
    for a in attempts:
        steps = [(min(max(t, a.start), a.end), s) for t, s in _work(works, a).steps]
        if not steps:
            continue
        curves.append([(s, (spent + (t - steps[0][0]) * a.gpus) / HOUR) for t, s in steps])
        spent += (steps[-1][0] - steps[0][0]) * a.gpus
    return curves


def hours_at(curves: list[list[tuple[int, float]]], step: int) -> float | None:
    """The trained GPU-hours spent when the run last reached `step` (linear between logged steps); None where no
    attempt reached it."""
    for curve in reversed(curves):
        numbers = [s for s, _ in curve]
        if not numbers or step > numbers[-1] or (step < numbers[0] and curve is not curves[0]):
            continue
        i = bisect.bisect_left(numbers, step)
        if i == 0:
            return curve[0][1]
        (s0, h0), (s1, h1) = curve[i - 1], curve[i]
        return h0 if s1 == s0 else h0 + (h1 - h0) * (step - s0) / (s1 - s0)
    return None


def _restart_costs(attempts: list[Attempt], rows: list[AttemptLedger], works: Mapping[Any, Work]) -> list[dict]:
    """Each restart in an allocation: its cause, the GPU-seconds it cost (the step's wind-down and thrown-away steps,
    the next step's start-up) and the seconds from the failed step's last step to the next step's first."""
    costs = []
    for i, (a, row) in enumerate(zip(attempts, rows, strict=True)):
        if not a.restarted or i + 1 >= len(attempts):
            continue
        before, after = _work(works, a).steps, _work(works, attempts[i + 1]).steps
        seconds = after[0][0] - before[-1][0] if before and after else None
        gpu_seconds = row.wind_down + row.thrown_away + rows[i + 1].start_up
        costs.append({"cause": a.ended, "gpu_seconds": gpu_seconds, "seconds": seconds})
    return costs


def _cause(attempt: Attempt) -> str:
    if attempt.restarted:
        return attempt.ended + RESTARTED
    return attempt.ended if attempt.ended not in (COMPLETED, "running") else OVERHEAD


def hours(gpu_seconds: float) -> str:
    """GPU-seconds as GPU-hours, three significant figures ("12.3", "0.0112")."""
    h = gpu_seconds / HOUR
    return "0" if h == 0 else f"{h:.3g}" if h >= 0.001 else f"{h:.2e}"


def plural(count: int, cause: str) -> str:
    words = {"preemption": "preemptions", "time limit": "time limits", "hang": "hangs", "failure": "failures",
             "cancel": "cancels", "requeue": "requeues", "node check": "node checks",
             "node failure": "node failures"}  # fmt: skip
    return f"{count} {cause if count == 1 else words.get(cause, cause)}"


def summary(ledger: Ledger) -> str:
    """One line: "12.3 GPU-hours, 11.6 trained; 0.7 lost: 0.4 to 1 preemption, 0.3 to start-up and wind-down"."""
    lost = ", ".join(f"{hours(v)} to {_to_what(ledger, k)}" for k, v in sorted(ledger.lost_to.items(),
                                                                              key=lambda kv: -kv[1]))  # fmt: skip
    steps = f" ({ledger.steps_thrown_away} steps done again)" if ledger.steps_thrown_away else ""
    return (
        f"{hours(ledger.allocated)} GPU-hours, {hours(ledger.useful)} trained; {hours(ledger.lost)} lost"
        + (f": {lost}" if lost else "")
        + steps
        + _checkpoints(ledger.checkpoints)
        + _uploads(ledger.uploads)
    )


def _checkpoints(totals: dict | None) -> str:
    """ "; checkpoints: 20 saved (35.2 MB), 15 removed (26.4 MB freed)", where the job kept the record."""
    if not totals:
        return ""
    written, freed = totals["written_bytes"] / 1e6, totals["freed_bytes"] / 1e6
    return (
        f"; checkpoints: {totals['saved']} saved ({written:.1f} MB), {totals['removed']} removed ({freed:.1f} MB freed)"
    )


def _uploads(totals: dict | None) -> str:
    """ "; bucket: 20 uploaded (35.2 MB in 12.3 s), 1 downloaded (1.8 MB in 0.4 s)", where the job kept the record."""
    if not totals:
        return ""
    said = f"; bucket: {totals['uploaded']} uploaded ({totals['uploaded_bytes'] / 1e6:.1f} MB in "
    said += f"{totals['upload_seconds']:.1f} s)"
    if totals["downloaded"]:
        said += f", {totals['downloaded']} downloaded ({totals['downloaded_bytes'] / 1e6:.1f} MB in "
        said += f"{totals['download_seconds']:.1f} s)"
    if totals["removed"]:
        said += f", {totals['removed']} removed"
    return said + (f", {totals['upload_failures']} failed pass(es)" if totals["upload_failures"] else "")


def _to_what(ledger: Ledger, key: str) -> str:
    """A lost_to key in words: "1 preemption", "2 failures (restarted in the allocation)", "start-up and wind-down"."""
    base = key.removesuffix(RESTARTED)
    counts = ledger.restarts if key.endswith(RESTARTED) else ledger.causes
    return plural(counts[base], base) + key[len(base) :] if base in counts else key


def table(ledger: Ledger) -> str:
    """Every attempt, a line each (GPU-hours), then the totals."""
    head = (f"  {'attempt':>7} {'gpus':>4}  {'ended':<12} {'steps':>11}  {'allocated':>9} {'start-up':>9} "
            f"{'trained':>9} {'wind-down':>9} {'thrown':>9}")  # fmt: skip
    lines = [head]
    for a in ledger.attempts:
        steps = "-" if a.first_step is None else f"{a.first_step}..{a.last_step}"
        number = f"{a.number}.{a.segment}" if a.segment or a.restarted else str(a.number)
        lines.append(
            f"  {number:>7} {a.gpus:>4}  {a.ended:<12} {steps:>11}  {hours(a.allocated):>9} {hours(a.start_up):>9} "
            f"{hours(a.trained):>9} {hours(a.wind_down):>9} {hours(a.thrown_away):>9}"
        )
    lines.append(f"  from {ledger.source}: {summary(ledger)}")
    return "\n".join(lines)
