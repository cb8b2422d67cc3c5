"""A run's checkpoints folder, read: the one place that knows its layout (standard library only: the launcher, the
job's supervisor, training and the export all read it through here).

Both engines write under the run's `checkpoints_path`:

    torch:     <step>/state.pt, <step>/meta.json; the pointer `latest`; a save in progress is `.tmp-<step>-<random>`
               (renamed to <step> once whole)
    nanotron:  <step>/model/..., <step>/config.yaml, <step>/checkpoint_metadata.json (written last: a <step> without
               it is a save in progress, or one cut short); the pointer `latest.txt`

and beside them the launcher's own records: the engine and nanotron dialect the checkpoints were written by, the
one-writer lock, the experiment tracker's run id. A step is *complete* when its engine's last file is there; the
*pointer* names the step a resume starts from (written after the step is complete).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from launcher import protocol as P

TORCH_STATE = "state.pt"  # the torch engine's checkpoint, and its record written after it
TORCH_META = "meta.json"
TORCH_PARTIAL = ".tmp-"  # .tmp-<step>-<random>: the torch engine's save in progress
ENGINE_RECORD = "engine"  # the engine that wrote the run's checkpoints ("torch" | "nanotron")
ENGINES = ("torch", "nanotron")


def pointer_step(root: Path) -> int | None:
    """The step the run's pointer names (either engine's), None where there is none (or it is unreadable)."""
    for pointer in P.POINTERS:
        try:
            text = (root / pointer).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def pointer_engines(root: Path) -> list[str]:
    """The engines whose pointer the folder holds (runs saved before the engine's record say it so)."""
    return [engine for pointer, engine in P.POINTERS.items() if (root / pointer).exists()]


def recorded_engine(root: Path) -> str | None:
    """The engine whose checkpoints the folder holds: its record, else the pointer found; None before any save."""
    saved = pointer_engines(root)
    if not saved:
        return None
    try:
        recorded = (root / ENGINE_RECORD).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    return recorded if recorded in ENGINES else saved[0]


def engine_of(step_dir: Path) -> str | None:
    """The engine of a complete checkpoint in `step_dir`; None where it is not one (partial, or something else)."""
    if (step_dir / TORCH_STATE).is_file() and (step_dir / TORCH_META).is_file():
        return "torch"
    if (step_dir / "model").is_dir() and (step_dir / P.NANOTRON_METADATA).is_file():
        return "nanotron"
    return None


def complete_steps(root: Path) -> dict[int, str]:
    """Every complete checkpoint in the folder: step -> engine."""
    found = {}
    for child in _children(root):
        if child.name.isdigit() and (engine := engine_of(child)) is not None:
            found[int(child.name)] = engine
    return found


@dataclass(frozen=True)
class Partial:
    """A checkpoint not (yet) complete: a save in progress, or one a kill cut short."""

    step: int
    path: Path
    why: str


def partial_steps(root: Path) -> list[Partial]:
    """Every save in the folder that is not a complete checkpoint, oldest step first."""
    found = []
    for child in _children(root):
        name = child.name
        if name.startswith(TORCH_PARTIAL) and child.is_dir():
            step = name[len(TORCH_PARTIAL) :].split("-", 1)[0]
            if step.isdigit():
                found.append(
                    Partial(int(step), child, f"the torch engine's save of step {step} is in progress ({child})")
                )
        elif name.isdigit() and child.is_dir() and engine_of(child) is None:
            found.append(Partial(int(name), child, _why_partial(child)))
    return sorted(found, key=lambda p: (p.step, p.path.name))


def _why_partial(step_dir: Path) -> str:
    if (step_dir / "model").is_dir():
        return f"{step_dir} has weights but no {P.NANOTRON_METADATA}, which nanotron writes last"
    if (step_dir / TORCH_STATE).is_file():
        return f"{step_dir} has {TORCH_STATE} but no {TORCH_META}"
    return f"{step_dir} holds no checkpoint of either engine"


def in_progress(root: Path, step: int) -> str | None:
    """What says `step` is being written (or was cut short), or None."""
    return next((p.why for p in partial_steps(root) if p.step == step), None)


def step_dir(root: Path, step: int) -> Path:
    return root / str(step)


def size_of(path: Path) -> int:
    """Bytes under `path` (files only; what cannot be read counts 0)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _children(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError:
        return []
