"""The arms and seeds of `python -m launcher.jobs verdict`, their evaluated steps and the comparison point (issue 52).

- **Arms.** A sweep's points that differ only by `seed` are one arm, each point a seed (a replicate): `--sweep
  "learning_rate=1e-3,3e-3 seed=1,2,3"` is 2 arms x 3 seeds, labelled by their values less the seed. Bundles named
  one by one: each its own arm, unless they differ only by seed (their model, training, parallelism and data flags,
  and --config, compared; the seed, where the run goes and how it is queued never count), labelled by the flags in
  which the arms differ.
- **Evaluated steps.** A run's done results (launcher/evals/record.py: its own and `jobs evaluate`'s) that hold the
  task, each with its per-item rows (launcher/evals/items.py); a step evaluated twice for the task: the newest.
- **The point.** `tokens` (default): the most tokens every run reached at an evaluated step (the least of their
  last evaluated steps' tokens); `gpu_hours`: the same in the ledger's trained GPU-hours (the caller hands the
  ledger in: launcher/ledger/ stands above the eval reports); `step N`: step N, evaluated in every run; `last`:
  each run's last evaluated step. Each run's steps up to the point are its candidates; the verdict averages its
  last K of them (--last_k).

Reads the records, never writes them. Refusals are VerdictError (the CLI's exit code 2), each naming what to fix.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.bundle import manifest, sweep_record
from launcher.errors import VerdictError
from launcher.evals import record as eval_record

AT = ("tokens", "gpu_hours", "step", "last")
COMPARED = ("model", "training", "parallelism", "data")  # the flags' groups whose difference makes another arm
NOT_AN_ARM = frozenset({"seed"})  # a replicate's own flag
HoursOf = Callable[["Run"], Callable[[int], "float | None"]]


@dataclass(frozen=True, eq=False)
class Run:
    """One run (a sweep's point, or a bundle): one seed of an arm (a key by identity)."""

    name: str
    bundle: Path
    checkpoints: Path | None
    values: Mapping[str, str]  # what tells its arm from the others (a sweep's values less the seed)
    seed: str  # its seed, as its flags say it

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items()) or self.name


@dataclass(frozen=True)
class Evaluated:
    """One evaluated step of a run, for one task: its result and its per-item rows."""

    step: int
    tokens: int
    key: str
    items: Path  # the items file (launcher/evals/items.py)
    limit: int | None  # --eval_limit it was scored with
    ended: float = 0.0
    digest: str | None = None  # the items' ids' digest (items.digest; None: a file written before it was kept)


@dataclass
class ArmRuns:
    label: str
    values: Mapping[str, str]
    runs: list[Run] = field(default_factory=list)


@dataclass(frozen=True)
class Point:
    """The comparison point: how it was chosen, its value, and each run's evaluated steps up to it."""

    by: str  # tokens | gpu_hours | step | last
    value: float | int | None
    said: str  # in words, for the report
    steps: Mapping[Run, Sequence[Evaluated]]  # each run's evaluated steps up to the point, by step

    def as_json(self) -> dict[str, object] | str:
        return "last" if self.by == "last" else {self.by: self.value}


@dataclass
class Asked:
    """What `jobs verdict` is asked."""

    targets: list[Path]  # a sweep's directory, or bundles
    tasks: list[str]  # TASK or TASK:METRIC
    at: str = "tokens"
    step: int | None = None  # --at step N
    last_k: int = 1
    draws: int | None = None  # bootstrap draws (None: the verdict's least, 10,000)
    seed: int = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`jobs verdict`'s arguments (launcher/jobs/command.py adds the targets' resolution and --configs_path)."""
    parser.add_argument("targets", nargs="+", help="a sweep's directory, or two bundles or more (or job ids)")
    parser.add_argument("--task", action="append", required=True, metavar="TASK[:METRIC]",
                        help="the task compared (its main metric, or METRIC; gold_bpb: the gold answer's bits per "
                        "byte); again for more tasks")  # fmt: skip
    parser.add_argument("--at", nargs="+", default=["tokens"], metavar="POINT",
                        help="tokens (default: the most tokens every run reached at an evaluated step), gpu_hours "
                        "(the same in the ledger's trained GPU-hours), step N, or last")  # fmt: skip
    parser.add_argument("--last_k", type=_positive, default=1, help="average each seed's last K evaluated steps up "
                        "to the point (default: %(default)s)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="the verdict as JSON: an object, a list for several tasks")
    parser.add_argument("--draws", type=_positive, help="bootstrap draws (default and least: 10,000)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default: %(default)s)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def asked_of(targets: list[Path], args: argparse.Namespace) -> Asked:
    """The arguments checked (a VerdictError naming the flag where one is wrong)."""
    at, step = args.at[0], None
    if at not in AT or (at == "step") != (len(args.at) == 2) or len(args.at) > 2:
        raise VerdictError(f"--at {' '.join(args.at)}: tokens, gpu_hours, step N or last")
    if at == "step":
        if not args.at[1].isdigit():
            raise VerdictError(f"--at step {args.at[1]}: N is a step number")
        step = int(args.at[1])
    bad = [t for t in args.task if not split_task(t)[0] or ":" in (split_task(t)[1] or "")]
    if bad:
        raise VerdictError(f"--task {bad[0]}: TASK or TASK:METRIC (heldout:NAME or heldout:NAME:METRIC)")
    return Asked(targets, list(args.task), at, step, args.last_k, args.draws, args.seed)


def split_task(spec: str) -> tuple[str, str | None]:
    """--task TASK[:METRIC] as (task, metric or None); a held-out domain's task is `heldout:NAME`."""
    head = "heldout:" if spec.startswith("heldout:") else ""
    task, _, metric = spec.removeprefix(head).partition(":")
    return head + task if task else "", metric or None


def _manifest(bundle: Path) -> manifest.Manifest:
    try:
        return manifest.load(bundle)
    except (OSError, ValueError) as e:
        raise VerdictError(f"{bundle}: not a run's bundle ({e})") from None


def from_sweep(directory: Path) -> list[Run]:
    """A sweep's points as runs (its record, launcher/bundle/sweep_record.py)."""
    try:
        found = sweep_record.load(directory)
    except (OSError, ValueError, KeyError) as e:
        raise VerdictError(f"{directory}: its sweep record cannot be read ({e})") from None
    runs = []
    for p in found.points:
        run = _manifest(p.bundle)
        seed = p.values.get("seed") or str(run.flags.get("seed", ""))
        values = {k: v for k, v in p.values.items() if k not in NOT_AN_ARM}
        runs.append(Run(p.run_name, p.bundle, run.checkpoints, values, seed))
    return runs


def _compared(run: manifest.Manifest) -> dict[str, object]:
    resolved = run.data.get("resolved") or {}
    flags = {k: v for group in COMPARED for k, v in (resolved.get(group) or {}).items() if k not in NOT_AN_ARM}
    return {**flags, "config": (resolved.get("execution") or {}).get("config")}


def from_bundles(bundles: Sequence[Path]) -> list[Run]:
    """Bundles named one by one as runs, their values the compared flags that differ among them."""
    loaded = [_manifest(b) for b in bundles]
    flags = [_compared(m) for m in loaded]
    differ = [k for k in dict.fromkeys(k for f in flags for k in f) if len({repr(f.get(k)) for f in flags}) > 1]
    runs = []
    for bundle, run, f in zip(bundles, loaded, flags, strict=True):
        name = str(run.data.get("run_name") or bundle.parent.name)
        values = {k: str(f.get(k)) for k in differ}
        runs.append(Run(name, bundle, run.checkpoints, values, str(run.flags.get("seed", ""))))
    return runs


def group(runs: Sequence[Run]) -> list[ArmRuns]:
    """Runs with the same values are one arm (its seeds), in the order first seen."""
    arms: dict[str, ArmRuns] = {}
    for run in runs:
        label = run.label if run.values else "all"
        arms.setdefault(label, ArmRuns(label, dict(run.values))).runs.append(run)
    return list(arms.values())


def evaluated(run: Run, task: str) -> tuple[list[Evaluated], list[int]]:
    """The run's evaluated steps that hold `task` with per-item rows, by step; and the steps that hold the task
    without them (evaluated before the rows were kept)."""
    by_step: dict[int, Evaluated] = {}
    bare = []
    from launcher.evals.items import HELDOUT  # (numpy: only once a verdict is asked for)

    domain = task.removeprefix(HELDOUT) if task.startswith(HELDOUT) else None
    for step, key, bundle, row in eval_record.done(run.bundle, run.checkpoints):
        if task not in (row.get("tasks") or {}) and (domain is None or domain not in (row.get("heldout") or {})):
            continue
        kept = row.get("items") or {}
        if task not in (kept.get("items") or {}) or not kept.get("file"):
            bare.append(step)
            continue
        found = Evaluated(step, int(row.get("tokens") or 0), key, bundle / str(kept["file"]), row.get("limit"),
                          float(row.get("ended") or 0), (kept.get("digests") or {}).get(task))  # fmt: skip
        if step not in by_step or found.ended >= by_step[step].ended:
            by_step[step] = found
    return [by_step[s] for s in sorted(by_step)], sorted(set(bare) - set(by_step))


def series(arms: Sequence[ArmRuns], task: str) -> dict[Run, list[Evaluated]]:
    """Every run's evaluated steps of `task`; refused where a run has none (with why)."""
    found, missing = {}, []
    for arm in arms:
        for run in arm.runs:
            steps, bare = evaluated(run, task)
            if not steps:
                why = (f"its steps {', '.join(map(str, bare))} were evaluated before per-item rows were kept"
                       if bare else f"no evaluated step holds {task}")  # fmt: skip
                missing.append(f"{run.name} ({why})")
            found[run] = steps
    if missing:
        raise VerdictError(f"{task}: no evals to compare in {'; '.join(missing)}: evaluate them with `python -m "
                           f"launcher.jobs evaluate BUNDLE --eval_tasks {task}`")  # fmt: skip
    return found


def choose(at: str, found: Mapping[Run, Sequence[Evaluated]], step: int | None = None,
           hours_of: HoursOf | None = None) -> Point:  # fmt: skip
    """The comparison point (the module's docstring) and each run's evaluated steps up to it."""
    if at == "tokens":
        value = min(s[-1].tokens for s in found.values())
        upto = {run: [e for e in steps if e.tokens <= value] for run, steps in found.items()}
        said = f"tokens {value:,}: the most tokens every run reached at an evaluated step"
        return Point("tokens", value, said, upto)
    if at == "gpu_hours":
        assert hours_of is not None, "the caller hands the ledger in"
        hours: dict[Run, list[tuple[Evaluated, float]]] = {}
        for run, steps in found.items():
            at_step = hours_of(run)
            known = [(e, h) for e in steps if (h := at_step(e.step)) is not None]
            if not known:
                raise VerdictError(f"{run.name}: the ledger has no GPU-hours at its evaluated steps (no step logged "
                                   "in its job's records): use --at tokens")  # fmt: skip
            hours[run] = known
        least = min(pairs[-1][1] for pairs in hours.values())
        upto = {run: [e for e, h in pairs if h <= least + 1e-12] for run, pairs in hours.items()}
        said = f"gpu_hours {least:.4g}: the most trained GPU-hours every run reached at an evaluated step (ledger)"
        return Point("gpu_hours", round(least, 6), said, upto)
    if at == "step":
        assert step is not None
        lacking = [f"{run.name} (evaluated at {', '.join(str(e.step) for e in steps)})"
                   for run, steps in found.items() if step not in {e.step for e in steps}]  # fmt: skip
        if lacking:
            raise VerdictError(f"--at step {step}: not evaluated in {'; '.join(lacking)}: choose a step every run "
                               "has, or --at tokens")  # fmt: skip
        return Point("step", step, f"step {step}", {run: [e for e in s if e.step <= step] for run, s in found.items()})
    if at == "last":
        lasts = sorted({s[-1].step for s in found.values()})
        said = "each run's last evaluated step (" + ", ".join(map(str, lasts)) + ")"
        return Point("last", None, said + ("" if len(lasts) == 1 else ": not equal compute"), dict(found))
    raise VerdictError(f"--at {at}: one of {', '.join(AT)}")


def check_comparable(point: Point, task: str) -> None:
    """The runs' evals at the point were scored alike: the same --eval_limit (the items themselves are checked as
    they are read)."""
    limits = {run.name: steps[-1].limit for run, steps in point.steps.items() if steps}
    if len(set(limits.values())) > 1:
        said = ", ".join(f"{name}: {'all' if limit is None else limit}" for name, limit in limits.items())
        raise VerdictError(f"{task}: the runs were evaluated with other --eval_limit ({said}): compare runs "
                           "evaluated alike (`jobs evaluate --eval_limit N` on those that differ)")  # fmt: skip
    empty = [run.name for run, steps in point.steps.items() if not steps]
    if empty:
        raise VerdictError(f"{task}: {', '.join(empty)} has no evaluated step up to {point.said}")
