"""Checkpoint retention (docs/checkpoints.md): which of a run's checkpoints stay on disk, and why, as a pure function
of the folder at one look (launcher/checkpoint_layout.py's `Folder`), the readers' leases that hold, and the rules.

The rules (`Rules`, the launcher's --keep_last N and --keep_every K; neither: every checkpoint stays, and nothing is
ever removed): the N newest complete checkpoints, and every step that is a multiple of K, for good. Whatever the
rules, never removed:

- the step the pointer names (where a resume starts), and the newest complete step (a save between its last file
  and the pointer's move);
- a save in progress (a partial step newer than the newest complete one, or than the pointer);
- a step a reader holds (an export, an eval: its lease, while its job or process lives);
- a step owed an eval (--eval_every names it, or `jobs evaluate` asked for it, and its eval has not ended: the
  eval records say so, launcher/evals/record.py's `owed`): a rule of the judgement, whatever the eval submissions'
  timing; and a step not yet in the bucket (--checkpoints_remote: launcher/remote/upload.py's `owed`): the only copy
  is never removed. Both come in as one `owed` mapping, step -> why it must stay (`owed_merged`);
- a step the launcher's engines did not record as theirs (`saves`): a folder of steps from elsewhere is left alone.

A partial step (a save cut short) goes only once a newer complete step exists and the pointer names one past it.
What an interrupted purge left (`.purging-*`) always goes. Standard library only (an import contract holds it so): the
job's supervisor purges by it (launcher/retention/purge.py), `python -m launcher.jobs checkpoints` explains by it
(retention/report.py), and the launcher's forecast counts by it (`most_kept`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from launcher.checkpoint_layout import Folder

OWED_AN_EVAL = "owed an eval ({why})"
NOT_IN_BUCKET = "not yet in the bucket"  # (the uploader's: launcher/remote/upload.py)
UNTIL = {"owed an eval": "its eval has ended", NOT_IN_BUCKET: "it is in the bucket"}  # a reason's start -> its end


def owed_an_eval(owed: Mapping[int, str]) -> dict[int, str]:
    """The eval records' steps still owed an eval (launcher/evals/record.py's `owed`: step -> the eval's state), as
    reasons to stay."""
    return {step: OWED_AN_EVAL.format(why=why) for step, why in owed.items()}


def owed_merged(*owed: Mapping[int, str]) -> dict[int, str]:
    """Several `owed` mappings as one: each step's reasons, in order, joined."""
    out: dict[int, str] = {}
    for mapping in owed:
        for step, why in mapping.items():
            out[step] = f"{out[step]}; {why}" if step in out else why
    return out


@dataclass(frozen=True)
class Rules:
    """What a run keeps (the job reads it from its settings, the bundle's job.json: launcher/node/job.py)."""

    keep_last: int | None = None  # the N newest complete checkpoints (None: every one, unless keep_every is set)
    keep_every: int | None = None  # every step that is a multiple of K, for good

    @property
    def active(self) -> bool:
        """Whether anything is ever removed (a rule is set)."""
        return self.keep_last is not None or self.keep_every is not None

    @property
    def last(self) -> int:
        """How many of the newest complete steps stay: keep_last, else 1 (the newest, which always stays)."""
        return self.keep_last if self.keep_last is not None else 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Rules:
        def count(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(value)  # type: ignore[call-overload]

        return cls(count("keep_last"), count("keep_every"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Rules:
        return cls.from_dict(json.loads(text)) if text.strip() else cls()

    def describe(self) -> str:
        """The rules in words: "the last 2 and every step that is a multiple of 50"."""
        if not self.active:
            return "every checkpoint (no --keep_last or --keep_every)"
        parts = [f"the last {self.keep_last}" if self.keep_last is not None else "the newest"]
        if self.keep_every is not None:
            parts.append(f"every step that is a multiple of {self.keep_every}")
        return " and ".join(parts)


@dataclass(frozen=True)
class Judged:
    """One step on disk, judged: why it stays (`kept`), else why it goes now (`remove`); `later`: what will remove a
    step that stays, or "" where nothing will."""

    step: int
    complete: bool
    kept: tuple[str, ...] = ()
    remove: str = ""
    later: str = ""
    engine: str = ""  # the engine of a complete step; "" for a partial one
    path: str = ""  # a partial step's folder (a complete step's is <root>/<step>)


@dataclass(frozen=True)
class Plan:
    """Every step on disk judged (oldest first), and the leftovers of interrupted purges to delete."""

    steps: tuple[Judged, ...]
    leftovers: tuple[str, ...] = field(default=())

    @property
    def removed(self) -> list[Judged]:
        return [j for j in self.steps if j.remove]


def judge(folder: Folder, rules: Rules, readers: Mapping[int, str], owed: Mapping[int, str] | None = None) -> Plan:
    """Every step in `folder` judged by `rules`; `readers`: step -> who reads it (the leases that hold); `owed`: step
    -> why it must stay whatever the rules (an eval owed it, not yet in the bucket: `owed_merged`)."""
    owed = owed or {}
    leftovers = tuple(str(p) for p in folder.purging)
    complete = sorted(folder.complete)
    newest = complete[-1] if complete else None
    pointer = folder.pointer
    out = []
    for rank, step in enumerate(reversed(complete)):  # rank 0: the newest
        out.append(_complete(step, rank, folder, rules, readers, owed, newest))
    for partial in folder.partials:
        out.append(_partial(partial.step, str(partial.path), folder, rules, readers, newest, pointer))
    return Plan(tuple(sorted(out, key=lambda j: (j.step, j.complete, j.path))), leftovers)


def _complete(step: int, rank: int, folder: Folder, rules: Rules, readers: Mapping[int, str],
              owed: Mapping[int, str], newest: int | None) -> Judged:  # fmt: skip
    kept = []
    if step == folder.pointer:
        kept.append("latest (the pointer names it)")
    if step == newest and step != folder.pointer:
        kept.append("the newest complete step")
    if not rules.active:
        kept.append("every checkpoint is kept (no --keep_last or --keep_every)")
    if rules.keep_last is not None and rank < rules.keep_last:
        kept.append(f"among the last {rules.keep_last}")
    if rules.keep_every is not None and step % rules.keep_every == 0:
        kept.append(f"a multiple of {rules.keep_every} (--keep_every)")
    if step in readers:
        kept.append(f"read by {readers[step]}")
    if step in owed:
        kept.append(owed[step])
    if step not in folder.saves and rules.active:
        kept.append("not saved by this launcher's engines (no line in its saves record): left alone")
    engine = folder.complete[step]
    if not kept:
        why = f"not among the last {rules.last}" + (
            f", not a multiple of {rules.keep_every}" if rules.keep_every is not None else ""
        )
        return Judged(step, True, remove=why, engine=engine)
    later = _later(step, rank, folder, rules, readers, owed)
    return Judged(step, True, tuple(kept), later=later, engine=engine)


def _later(step: int, rank: int, folder: Folder, rules: Rules, readers: Mapping[int, str],
           owed: Mapping[int, str]) -> str:  # fmt: skip
    """What will remove a step that stays now ("" where nothing will)."""
    if not rules.active or step not in folder.saves:
        return ""
    if rules.keep_every is not None and step % rules.keep_every == 0:
        return ""
    more = max(rules.last - rank, 1)
    said = f"removed after {more} more checkpoint{'s' if more > 1 else ''}"
    if step in readers:
        said += f", once {readers[step]} ends"
    if step in owed:
        ends = [end for start, end in UNTIL.items() if start in owed[step]]
        said += ", once " + (" and ".join(ends) or "it is no longer kept for it")
    return said


def _partial(step: int, path: str, folder: Folder, rules: Rules, readers: Mapping[int, str], newest: int | None,
             pointer: int | None) -> Judged:  # fmt: skip
    if not rules.active:
        return Judged(step, False, ("every checkpoint is kept (no --keep_last or --keep_every)",), path=path)
    if newest is None or step >= newest or (pointer is not None and step >= pointer):
        return Judged(step, False, ("being written (or cut short: removed once a newer step is complete)",), path=path)
    if step in readers:
        return Judged(step, False, (f"read by {readers[step]}",), later="removed once it ends", path=path)
    if step not in folder.saves:
        return Judged(step, False, ("not saved by this launcher's engines: left alone",), path=path)
    return Judged(step, False, remove=f"a save cut short (step {newest} is complete)", path=path)


def most_kept(rules: Rules, train_steps: int, save_interval: int, save_initial_state: bool = False,
              eval_every: int | None = None) -> int | None:  # fmt: skip
    """The most checkpoints the rules keep at once over the run, one being written counted: those kept after the
    last save but one (the last N of them and the multiples of K among the older ones; the count only grows over
    the run), and the last save, being written; with --eval_every, one evaluated step more where the rules would
    not keep it (a step owed an eval stays until its eval job has ended: one at a time is counted, an eval queue
    slower than the saves keeps more). None where every checkpoint is kept."""
    if not rules.active:
        return None
    steps, every = max(train_steps, 0), rules.keep_every
    interval = save_interval if save_interval > 0 else max(steps, 1)
    saves = steps // interval + int(steps % interval != 0) + int(save_initial_state)  # [0,] interval, ..., the last
    before = max(saves - 1, 0)  # those on disk as the last is written
    last = min(rules.last, before)
    older = before - last  # the oldest: [0,] interval, 2 x interval, ... (an off-interval last step is the newest)
    multiples = 0
    if every and older:
        lcm = interval * every // math.gcd(interval, every)  # a save j x interval is a multiple of K where lcm | it
        if save_initial_state:
            multiples = 1 + (older - 1) * interval // lcm  # step 0, then interval .. (older - 1) x interval
        else:
            multiples = older * interval // lcm
    owed = int(bool(eval_every) and older > multiples and not (every and eval_every and eval_every % every == 0))
    return last + multiples + owed + 1
