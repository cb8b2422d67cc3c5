"""A run's evaluations as records (docs/evals.md), standard library only (the supervisor, the eval job and the
launcher's reports read them):

- the record by step under the run's checkpoints (`.evals/<step>.json`), which names each step's eval job and the
  bundle it writes into, across the run's launches: claimed, submitted, running, done, failed (evals/submit.py);
- the bundle's evals.jsonl (a JSON object per evaluated step: its scores, or its failure and cause; a line cut by a
  kill is skipped, a step's last line counts) and evals/step-N.json (lm-eval's whole results), written by the eval job
  (launcher/evals/evaljob.py). Read by `jobs evals`, --show_logs, --rank_by, `jobs diff` and the ledger."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher import atomic
from launcher import protocol as P

# -- the record by step, under the checkpoints folder


def record_path(root: Path, step: int) -> Path:
    return root / P.EVALS_SUBMITTED / f"{step}.json"


def read_record(root: Path, step: int) -> dict | None:
    """The step's record; None where there is none (a record cut short reads as a claim: "submitting")."""
    path = record_path(root, step)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        row = json.loads(text)
    except ValueError:
        return {"step": step, "state": "submitting"}
    return row if isinstance(row, dict) else {"step": step, "state": "submitting"}


def records(root: Path) -> dict[int, dict]:
    """Every step's record: step -> record."""
    try:
        names = os.listdir(root / P.EVALS_SUBMITTED)
    except OSError:
        return {}
    found = {}
    for name in names:
        stem = name.removesuffix(".json")
        if name.endswith(".json") and stem.isdigit() and (row := read_record(root, int(stem))) is not None:
            found[int(stem)] = row
    return found


def write_record(root: Path, step: int, **fields: object) -> dict:
    """The step's record replaced whole (written beside, then renamed): its fields laid onto what it held."""
    path = record_path(root, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {**(read_record(root, step) or {}), "step": step, **fields, "time": round(time.time(), 3)}
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    tmp.write_text(json.dumps(row) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return row


def claim(root: Path, step: int, **fields: object) -> bool:
    """The step claimed for submission (its record created, exclusively); False where it has a record already."""
    path = record_path(root, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"step": step, "state": "submitting", **fields, "time": round(time.time(), 3)}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


# The metric a task is ranked and drawn by, where none is named: the first of these it has.
MAIN_METRICS = ("acc_norm", "acc", "exact_match", "bits_per_byte", "word_perplexity", "byte_perplexity", "f1")
LOWER_IS_BETTER = frozenset({"bits_per_byte", "word_perplexity", "byte_perplexity", "perplexity", "loss"})


def append(bundle: Path, row: dict) -> None:
    """One line of evals.jsonl, in one write (appends of two eval jobs do not interleave)."""
    line = (json.dumps(row, default=str) + "\n").encode("utf-8")
    fd = os.open(bundle / P.EVALS_RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def write_step(bundle: Path, step: int, data: dict) -> Path:
    """evals/step-N.json, replaced whole."""
    path = bundle / P.EVALS_DIR / f"step-{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.replace(path, json.dumps(data, indent=2, default=str) + "\n")
    return path


def rows(bundle: Path) -> dict[int, dict]:
    """The bundle's evaluated steps: step -> its last line."""
    try:
        text = (bundle / P.EVALS_RECORD).read_text(encoding="utf-8")
    except OSError:
        return {}
    found: dict[int, dict] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            found[row["step"]] = row
    return found


def main_metric(metrics: dict[str, float], asked: str | None = None) -> str | None:
    """The metric a task's score is: `asked` where it has it, else the first of MAIN_METRICS it has."""
    if asked:
        return asked if asked in metrics else None
    return next((m for m in MAIN_METRICS if m in metrics), next((m for m in metrics if "stderr" not in m), None))


def better(metric: str, a: float, b: float) -> bool:
    return a < b if metric in LOWER_IS_BETTER else a > b


@dataclass
class RunEvals:
    """A run's evaluations: every evaluated step's row (from whichever launch's bundle evaluated it), and the steps
    whose eval job has no result yet or none at all (their record: submitted, running, refused, interrupted...)."""

    done: dict[int, dict] = field(default_factory=dict)  # step -> its row (state "done")
    failed: dict[int, dict] = field(default_factory=dict)  # step -> its row or record (state "failed", a cause)
    open: dict[int, dict] = field(default_factory=dict)  # step -> its record (submitted, running, ...)

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
        return sum(float(r.get("gpu_hours") or 0) for r in [*self.done.values(), *self.failed.values()])


def of_run(bundle: Path, checkpoints: Path | None) -> RunEvals:
    """Every evaluated step of the run: the rows of this bundle and of the bundles its checkpoints' record names (the
    run's other launches), and the records of the steps with no row."""
    found = RunEvals()
    by_step = records(checkpoints) if checkpoints is not None else {}
    bundles = dict.fromkeys([bundle, *(Path(r["bundle"]) for r in by_step.values() if r.get("bundle"))])
    for where in bundles:
        for step, row in rows(where).items():
            target = found.done if row.get("state") == "done" else found.failed
            if step not in found.done:
                target[step] = row
                if target is found.done:
                    found.failed.pop(step, None)
    for step, record in by_step.items():
        if step in found.done or step in found.failed:
            continue
        if record.get("state") in ("failed", "refused"):
            found.failed[step] = record
        else:
            found.open[step] = record
    return found
