"""`jobs diff A B`: what differs between two runs, from their bundles alone, grouped as a reader asks: the flags, the
resolved layout, the nanotron config, the environment and versions, the data, the outcome; and where both logged
steps, their losses side by side and the first step where they part by more than a tolerance. Pure: the two
manifests (with what the job recorded beside them) in, a `Diff` out, as text for a terminal or a dict for JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launcher import jsonl
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.evals import record as eval_record
from launcher.report import environment as env

TOLERANCE = 1e-6  # losses part where |a - b| > TOLERANCE x max(1, |a|, |b|)
# The config's keys that name the run and place it: they differ between any two runs, and are said apart.
PLACE_KEYS = ("general.run", "checkpoints.checkpoints_path")
GROUPS = ("flags", "layout", "config", "environment", "data", "outcome")
TITLES = {"flags": "flags", "layout": "resolved layout", "config": "nanotron config",
          "environment": "environment and versions", "data": "data", "outcome": "outcome"}  # fmt: skip
SHOWN_STEPS = 3  # losses: the first steps both logged, those around the parting, the last


@dataclass(frozen=True)
class Row:
    name: str
    a: str
    b: str


@dataclass
class Diff:
    a: str  # the runs, as the user named them (bundle and job)
    b: str
    groups: dict[str, list[Row]] = field(default_factory=dict)  # group -> what differs
    same: dict[str, int] = field(default_factory=dict)  # group -> how many things agree
    unconfirmed: list[Row] = field(default_factory=list)  # (facet, why, "") what one run lacks or cannot tell
    notes: list[str] = field(default_factory=list)  # what differs by nature (the runs' names and places)
    losses: dict[str, Any] = field(default_factory=dict)  # common, tolerance, parted_at, rows [(step, a, b)]
    evals: dict[str, Any] = field(default_factory=dict)  # task -> metric, rows [(step, a, b)] (--eval_tasks)

    def record(self) -> dict:
        return asdict(self)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return "-" if value is None else str(value)


def rows_of(a: dict, b: dict, skip: tuple[str, ...] = ()) -> tuple[list[Row], int]:
    """Keys whose values differ (in A's order, then B's own), and how many agree."""
    rows, agree = [], 0
    for key in list(a) + [k for k in b if k not in a]:
        if key in skip:
            continue
        if key in a and key in b and a[key] == b[key]:
            agree += 1
        else:
            rows.append(Row(key, _text(a.get(key, "(absent)")), _text(b.get(key, "(absent)"))))
    return rows, agree


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A YAML tree as dotted keys (lists are values)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_of(run: manifest.Manifest) -> dict:
    try:
        loaded = yaml.safe_load((run.bundle_dir / P.CONFIG).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return flatten(loaded) if isinstance(loaded, dict) else {}


def layout_of(run: manifest.Manifest) -> dict[str, Any]:
    """What resolution and the figures made of the flags: the layout, the batch, the model's size, the memory."""
    d, f = run.data.get("derived") or {}, run.flags
    lay = d.get("layout") or {}
    memory = run.memory or {}
    return {
        "layout": " x ".join(f"{k} {lay[k]}" for k in ("dp", "tp", "pp", "cp") if k in lay) or None,
        "nodes x gpus": f"{f.get('nodes')} x {f.get('gpus_per_node')}",
        "cpus per node": f.get("cpus_per_node"),
        "global batch (sequences)": d.get("global_batch_sequences"),
        "global batch (tokens)": d.get("global_batch_tokens"),
        "parameters": d.get("parameters"),
        "padded vocabulary": d.get("padded_vocab"),
        "config dialect": (d.get("nanotron_dialect") or {}).get("dialect"),
        "memory estimate (GiB)": round(memory["estimate_bytes"] / 2**30, 2) if "estimate_bytes" in memory else None,
    }


def steps_of(run: manifest.Manifest) -> dict[int, float]:
    """Each logged step's loss (a step logged twice, before a crash and after a resume: its last line)."""
    try:
        rows = jsonl.read(run.metrics)
    except OSError:
        return {}
    return {int(r["step"]): float(r["loss"]) for r in rows if "step" in r and isinstance(r.get("loss"), (int, float))}


def outcome_of(run: manifest.Manifest, steps: dict[int, float]) -> dict[str, Any]:
    ended, verdict = run.data.get("ended") or {}, run.verdict or {}
    hours = ((run.data.get("ledger") or {}).get("gpu_hours") or {}).get("allocated")
    last = max(steps) if steps else None
    return {
        "job": run.job_id or f"not submitted ({run.not_submitted})",
        "state": ended.get("state", "not recorded"),
        "exit code": ended.get("exit_code"),
        "requeues": ended.get("restarts"),
        "cause": verdict.get("cause"),
        "attempts recorded": len(run.runtime),
        "last step logged": last,
        "its loss": steps[last] if last is not None else None,
        "gpu-hours": round(hours, 4) if isinstance(hours, (int, float)) else None,
    }


def parts(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return not (math.isnan(a) and math.isnan(b))
    return abs(a - b) > tolerance * max(1.0, abs(a), abs(b))


def losses(a: dict[int, float], b: dict[int, float], tolerance: float) -> dict[str, Any]:
    """The steps both logged, the first where the losses part, and a few rows to show (the first steps, the
    parting and the steps around it, the last)."""
    common = sorted(set(a) & set(b))
    parted = next((s for s in common if parts(a[s], b[s], tolerance)), None)
    shown = set(common[:SHOWN_STEPS]) | set(common[-1:])
    if parted is not None:
        at = common.index(parted)
        shown |= set(common[max(at - 1, 0) : at + 2])
    rows = [(s, a[s], b[s]) for s in sorted(shown)]
    return {"common": len(common), "tolerance": tolerance, "parted_at": parted, "rows": rows}


def diff(a: manifest.Manifest, b: manifest.Manifest, names: tuple[str, str], tolerance: float = TOLERANCE) -> Diff:
    out = Diff(*names)
    flat_a, flat_b = config_of(a), config_of(b)
    compared = env.compare(env.of_run(a), env.of_run(b))
    steps_a, steps_b = steps_of(a), steps_of(b)
    found = {
        "flags": rows_of(a.flags, b.flags),
        "layout": rows_of(layout_of(a), layout_of(b)),
        "config": rows_of(flat_a, flat_b, PLACE_KEYS),
        "outcome": rows_of(outcome_of(a, steps_a), outcome_of(b, steps_b)),
    }
    for group in GROUPS:
        if group in found:
            out.groups[group], out.same[group] = found[group]
            continue
        wanted = env.is_data if group == "data" else (lambda n: not env.is_data(n))
        out.groups[group] = [Row(n, x, y) for n, x, y in compared.differ if wanted(n)]
        out.same[group] = sum(1 for n in compared.agree if wanted(n))
        out.unconfirmed += [Row(n, why, "") for n, why in compared.unconfirmed if wanted(n)]
    moved = [k for k in PLACE_KEYS if flat_a.get(k) != flat_b.get(k)]
    if moved:
        out.notes.append("the runs' names and places differ too (nanotron config: " + ", ".join(moved) + ")")
    if steps_a and steps_b:
        out.losses = losses(steps_a, steps_b, tolerance)
    out.evals = evals_of(a, b)
    return out


def evals_of(a: manifest.Manifest, b: manifest.Manifest) -> dict[str, Any]:
    """Each task both runs were evaluated on: its metric (A's main one), and both scores at every step both have."""
    found_a = eval_record.of_run(a.bundle_dir, a.checkpoints)
    found_b = eval_record.of_run(b.bundle_dir, b.checkpoints)
    out: dict[str, Any] = {}
    for task in (t for t in found_a.tasks if t in found_b.tasks):
        metric, series_a = found_a.series(task)
        _, series_b = found_b.series(task, metric)
        at_b = {step: value for step, _, value in series_b}
        out[task] = {"metric": metric, "rows": [(step, value, at_b[step]) for step, _, value in series_a
                                                if step in at_b]}  # fmt: skip
    only = sorted(set(found_a.tasks) ^ set(found_b.tasks))
    if only:
        out["_unshared"] = {"metric": "", "rows": [], "tasks": only}
    return out


def _table(rows: list[Row], indent: str = "  ") -> list[str]:
    width = min(max(len(r.name) for r in rows), 48)
    value_width = min(max(len(r.a) for r in rows), 40)
    return [f"{indent}{r.name:<{width}}  {_cut(r.a):<{value_width}}  {_cut(r.b)}".rstrip() for r in rows]


def _cut(text: str, most: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= most else text[: most - 3] + "..."


def render(d: Diff) -> str:
    """The diff for a terminal: each group's differences (or that it agrees), then the losses."""
    lines = [f"A: {d.a}", f"B: {d.b}", ""]
    for group in GROUPS:
        rows, agree = d.groups.get(group, []), d.same.get(group, 0)
        if not rows:
            said = f"the same ({agree} compared)" if agree else "recorded by neither run"
            lines.append(f"{TITLES[group]}: {said}")
            continue
        lines.append(f"{TITLES[group]}: {len(rows)} differ{'s' if len(rows) == 1 else ''}, {agree} the same")
        lines += _table([Row("", "A", "B"), *rows])
    lines += [f"  {note}" for note in d.notes]
    if d.unconfirmed:
        lines.append("not confirmed:")
        lines += [f"  {r.name}: {r.a}" for r in d.unconfirmed]
    lines.append("")
    lines += _loss_lines(d.losses)
    lines += _eval_lines(d.evals)
    return "\n".join(lines)


def _eval_lines(found: dict[str, Any]) -> list[str]:
    """--eval_tasks: each shared task's scores at the steps both runs were evaluated at (nothing where neither was)."""
    if not found:
        return []
    lines = ["evals: the scores at the steps both runs were evaluated at"]
    for task, seen in found.items():
        if task == "_unshared":
            lines.append(f"  evaluated by one run only: {', '.join(seen['tasks'])}")
            continue
        if not seen["rows"]:
            lines.append(f"  {task} {seen['metric']}: no step evaluated in both")
            continue
        lines.append(f"  {task} {seen['metric']}:  {'step':>6}  {'A':>10}  {'B':>10}  {'B - A':>9}")
        lines += [f"  {'':<{len(task) + len(seen['metric']) + 2}}  {step:>6}  {x:>10.4f}  {y:>10.4f}  {y - x:>+9.4f}"
                  for step, x, y in seen["rows"]]  # fmt: skip
    return lines


def _loss_lines(found: dict[str, Any]) -> list[str]:
    if not found:
        return ["losses: not compared (a run has logged no step)"]
    if not found["common"]:
        return ["losses: no step logged by both"]
    tol, at = found["tolerance"], found["parted_at"]
    verdict = f"they part at step {at}" if at is not None else "they agree at every one"
    head = f"losses: {found['common']} steps logged by both; {verdict} (tolerance {tol:g}, relative)"
    lines = [head, f"  {'step':>6}  {'A':>12}  {'B':>12}  {'|A - B|':>10}"]
    for step, x, y in found["rows"]:
        mark = "  <- part" if step == at else ""
        lines.append(f"  {step:>6}  {x:>12.6f}  {y:>12.6f}  {abs(x - y):>10.3g}{mark}")
    return lines


def name_of(run: manifest.Manifest, given: str) -> str:
    """How the diff names a run: its bundle, and its job."""
    bundle = str(run.bundle_dir) if Path(given).resolve() != run.bundle_dir.resolve() else given
    return f"{bundle} (job {run.job_id})" if run.job_id else f"{bundle} ({run.not_submitted})"
