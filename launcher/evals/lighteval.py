"""nanotron main's `lighteval:` section of a --config (null is no section), refused: it makes training's rank 0 upload
each checkpoint and sbatch a lighteval job on GPUs itself, where the launcher evaluates checkpoints with lm-eval in
jobs of its own. The refusal names the flags that do it here and which of the section's tasks lm-eval has: lm-eval
itself is asked (launcher/evals/probe.py, the job's Python); configs/evals/lighteval.yaml holds only the names that
differ between lighteval and lm-eval (a test holds each to lm-eval)."""

from __future__ import annotations

from pathlib import Path

import yaml

from launcher.evals.checks import LIGHTEVAL_NAMES, preset_names
from launcher.problems import Problem


def table() -> dict[str, str]:
    """lighteval's name -> lm-eval's (or a preset's), where they differ."""
    return {str(k): str(v) for k, v in yaml.safe_load(LIGHTEVAL_NAMES.read_text(encoding="utf-8"))["names"].items()}


def names(section: object) -> list[tuple[str, str]]:
    """The section's tasks (`SUITE|TASK|FEW_SHOTS|TRUNCATE`, comma-separated): (lighteval's name, the name lm-eval is
    asked about: the table's, else the same)."""
    text = ""
    if isinstance(section, dict) and isinstance(section.get("tasks"), dict):
        text = str(section["tasks"].get("tasks") or "")
    named = table()
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        parts = item.split("|")
        name = parts[1] if len(parts) > 1 else parts[0]
        out.append((name, named.get(name) or named.get(name.split(":")[0] if name.startswith("mmlu") else "") or name))
    return list(dict.fromkeys(out))


def problem(section: object, path: Path, known: dict[str, bool] | None, why_unknown: str = "") -> Problem | None:
    """The refusal of a `lighteval:` section (None for null), with which of its tasks lm-eval has (`known`: lm-eval's
    answer by name; None where it could not be asked, `why_unknown`)."""
    if section is None:
        return None
    pairs = names(section)
    has = [(n, t) for n, t in pairs if t in preset_names() or (known or {}).get(t)]
    said = [f"{n} is {'the preset' if t in preset_names() else 'lm-eval' + chr(39) + 's'} {t}" for n, t in has]
    if known is not None:
        said += [f"{n} has no lm-eval task of that name" for n, t in pairs if (n, t) not in has]
    elif pairs:
        said.append(f"which of its tasks lm-eval has is not known: {why_unknown or 'lm-eval could not be asked'}")
    every = section.get("eval_interval") if isinstance(section, dict) else None
    flags = "--eval_tasks " + (",".join(dict.fromkeys(t for _, t in has)) if has else "TASKS")
    flags += f" --eval_every {every}" if isinstance(every, int) and every > 0 else ""
    return Problem(
        "config",
        f"{path} has nanotron main's lighteval: section, which makes training's rank 0 upload each checkpoint and "
        "sbatch a lighteval job on GPUs itself; the launcher evaluates checkpoints with lm-eval in jobs of its own"
        + (f" ({'; '.join(said)})" if said else ""),
        f"remove the section (or set lighteval: null) and give {flags} (docs/evals.md)",
        key="lighteval",
    )
