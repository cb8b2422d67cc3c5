"""A run's evaluations as records (docs/evals.md). Two records per evaluated step and key (what is scored:
`EvalSettings.key`), each with one writer, read only through here; standard library only (the supervisor, the eval
job, `jobs evaluate` and the launcher's reports all read them):

- the **submission**, under the run's checkpoints (checkpoint_layout.eval_submission: `.evals/<step>-<key>.json`),
  which every job and every launch of the run shares, so that a step is evaluated once across requeues, restarts,
  relaunches and `jobs evaluate`. Its writer is the submitter (the run's supervisor, or `jobs evaluate`): created
  exclusively before sbatch ("submitting": a claim), then "submitted" (the eval job, the bundle its result goes to,
  its log), "refused" (sbatch's words) or "lost" (Slurm says the job ended, and it wrote no result). It holds the
  settings the eval job scores by.
- the **result**, in the bundle the submission names (`evals/step-<step>-<key>.json`). Its writer is the eval job:
  "running", then "done" (each task's metrics, the held-out figures, lm-eval's whole results, the job's seconds and
  GPU-hours), "failed" (the cause) or "interrupted" (a SIGTERM: Slurm requeues it and it runs again).

An eval is *settled* once its result is done or failed, or its submission refused or lost. Until then its step is
owed the eval (`owed`): checkpoint retention keeps it (launcher/retention/rules.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher import atomic
from launcher import checkpoint_layout as ckpt
from launcher import protocol as P

SETTLED_RESULTS = ("done", "failed")
SETTLED_SUBMISSIONS = ("refused", "lost")
# The metric a task is ranked and drawn by, where none is named: the first of these it has.
MAIN_METRICS = ("acc_norm", "acc", "exact_match", "bits_per_byte", "word_perplexity", "byte_perplexity", "f1")
LOWER_IS_BETTER = frozenset({"bits_per_byte", "word_perplexity", "byte_perplexity", "perplexity", "loss", "gold_bpb"})


def _read(path: Path) -> dict | None:
    try:
        row = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) else None


# -- the submission (its writer: the submitter)


def submission(root: Path, step: int, key: str) -> dict | None:
    """The step's submission for `key`; None where there is none (a record cut short reads as a claim)."""
    path = ckpt.eval_submission(root, step, key)
    if not path.exists():
        return None
    return _read(path) or {"step": step, "key": key, "state": "submitting"}


def submissions(root: Path) -> dict[tuple[int, str], dict]:
    """Every submission of the run: (step, key) -> its record."""
    return {(step, key): _read(path) or {"step": step, "key": key, "state": "submitting"}
            for step, key, path in ckpt.eval_submissions(root)}  # fmt: skip


def claim(root: Path, step: int, key: str, **fields: object) -> bool:
    """The step claimed for submission (its record created exclusively, on disk); False where it has one already."""
    path = ckpt.eval_submission(root, step, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"step": step, "key": key, "state": "submitting", **fields, "time": round(time.time(), 3)}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def note_submission(root: Path, step: int, key: str, **fields: object) -> dict:
    """The submission replaced whole (atomic): its fields laid onto what it held."""
    path = ckpt.eval_submission(root, step, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {**(submission(root, step, key) or {}), "step": step, "key": key, **fields, "time": round(time.time(), 3)}
    atomic.replace(path, json.dumps(row) + "\n")
    return row


# -- the result (its writer: the eval job)


def result_path(bundle: Path, step: int, key: str) -> Path:
    return bundle / P.EVALS_DIR / f"step-{step}-{key}.json"


def result(bundle: Path, step: int, key: str) -> dict | None:
    return _read(result_path(bundle, step, key))


def write_result(bundle: Path, step: int, key: str, row: Mapping[str, object]) -> None:
    """The eval's result replaced whole (atomic)."""
    path = result_path(bundle, step, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.replace(path, json.dumps({**row, "step": step, "key": key}, default=str) + "\n")


def results(bundle: Path) -> dict[tuple[int, str], dict]:
    """Every result in a bundle: (step, key) -> its record."""
    found = {}
    try:
        names = os.listdir(bundle / P.EVALS_DIR)
    except OSError:
        return {}
    for name in names:
        step, _, key = name.removeprefix("step-").removesuffix(".json").partition("-")
        if name.startswith("step-") and name.endswith(".json") and step.isdigit() and key:
            if (row := _read(bundle / P.EVALS_DIR / name)) is not None:
                found[(int(step), key)] = row
    return found


def result_of(sub: Mapping) -> dict | None:
    """The result of a submission, in the bundle it names (None: none yet)."""
    bundle = sub.get("bundle")
    if not bundle or not isinstance(sub.get("step"), int):
        return None
    return result(Path(str(bundle)), int(sub["step"]), str(sub.get("key") or ""))  # type: ignore[call-overload]


def settled(sub: Mapping, res: Mapping | None) -> bool:
    """Whether an eval has ended for good: its result done or failed, or its submission refused or lost."""
    return (res is not None and res.get("state") in SETTLED_RESULTS) or sub.get("state") in SETTLED_SUBMISSIONS


def owed(root: Path, steps: Iterable[int], evaluated: Callable[[int], bool]) -> dict[int, str]:
    """step -> why an eval is still owed it, of `steps` (the complete ones): a step `evaluated` names with no
    submission yet, and every step with a submission not settled."""
    subs: dict[int, list[dict]] = {}
    for (step, _), sub in submissions(root).items():
        subs.setdefault(step, []).append(sub)
    found = {}
    for step in steps:
        mine = subs.get(step, [])
        if not mine and evaluated(step):
            found[step] = "--eval_every names it; not submitted yet"
        for sub in mine:
            res = result_of(sub)
            if not settled(sub, res):
                job = f"eval job {sub['job']}" if sub.get("job") else "its eval job"
                found[step] = f"{job} {(res or sub).get('state', 'submitting')}"
    return found


# -- a run's evaluations, read


def main_metric(metrics: Mapping[str, float], asked: str | None = None) -> str | None:
    """The metric a task's score is: `asked` where it has it, else the first of MAIN_METRICS it has."""
    if asked:
        return asked if asked in metrics else None
    return next((m for m in MAIN_METRICS if m in metrics), next((m for m in metrics if "stderr" not in m), None))


def better(metric: str, a: float, b: float) -> bool:
    return a < b if metric in LOWER_IS_BETTER else a > b


@dataclass
class RunEvals:
    """A run's evaluations by step: the results done (a step's keys merged: every task it was scored on), failed
    (a result's cause, or a submission refused or lost), and open (submitted, running, interrupted: no end yet)."""

    done: dict[int, dict] = field(default_factory=dict)  # step -> its merged row (state "done")
    failed: dict[int, dict] = field(default_factory=dict)  # step -> its result or submission (a cause)
    open: dict[int, dict] = field(default_factory=dict)  # step -> its submission (and its result's state)
    spent: float = 0.0  # the GPU-hours of every eval job that wrote a result

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(task for row in self.done.values() for task in row.get("tasks", {})))

    def series(self, task: str, metric: str | None = None) -> tuple[str | None, list[tuple[int, int, float]]]:
        """(the metric, [(step, tokens, value)] in step order) of a task."""
        chosen = metric
        points = []
        for step in sorted(self.done):
            metrics = self.done[step].get("tasks", {}).get(task) or {}
            name = main_metric(metrics, chosen)
            if name is not None:
                chosen = name
                points.append((step, int(self.done[step].get("tokens") or 0), float(metrics[name])))
        return chosen, points

    def gpu_hours(self) -> float:
        return self.spent


def _merge(into: dict | None, row: dict) -> dict:
    if into is None:
        return {**row, "tasks": dict(row.get("tasks") or {})}
    into["tasks"].update(row.get("tasks") or {})
    into["heldout"] = into.get("heldout") or row.get("heldout")
    return into


def of_run(bundle: Path, checkpoints: Path | None) -> RunEvals:
    """Every evaluation of the run: the results of this bundle and of the bundles its checkpoints' submissions name
    (the run's other launches, `jobs evaluate`), and the submissions with no settled result."""
    found = RunEvals()
    subs = submissions(checkpoints) if checkpoints is not None else {}
    seen: dict[tuple[int, str], dict] = {}
    for where in _bundles(bundle, subs):
        seen.update(results(where))
    for (step, _), row in sorted(seen.items()):
        found.spent += float(row.get("gpu_hours") or 0)
        if row.get("state") == "done":
            found.done[step] = _merge(found.done.get(step), row)
            found.failed.pop(step, None)
        elif row.get("state") == "failed" and step not in found.done:
            found.failed[step] = row
    for (step, key), sub in sorted(subs.items()):
        res = seen.get((step, key))
        if settled(sub, res):
            if (res is None or res.get("state") not in SETTLED_RESULTS) and step not in found.done:
                found.failed[step] = sub  # refused, or lost
        elif step not in found.done:
            found.open[step] = {**sub, "result": (res or {}).get("state")}
    return found


def _bundles(bundle: Path, subs: Mapping[tuple[int, str], dict]) -> list[Path]:
    """The bundle and those the run's submissions name (its other launches, `jobs evaluate`)."""
    return list(dict.fromkeys([bundle, *(Path(str(s["bundle"])) for s in subs.values() if s.get("bundle"))]))


def done(bundle: Path, checkpoints: Path | None) -> list[tuple[int, str, Path, dict]]:
    """Every done result of the run, by (step, key) unmerged: (step, key, the bundle it lies in, its record)."""
    subs = submissions(checkpoints) if checkpoints is not None else {}
    found = {}
    for where in _bundles(bundle, subs):
        for (step, key), row in results(where).items():
            if row.get("state") == "done":
                found[(step, key)] = (step, key, where, row)
    return [found[k] for k in sorted(found)]
