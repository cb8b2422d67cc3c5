"""One experiment-tracker (wandb) run per training run, whatever happens to its jobs.

- **One id**: kept beside the checkpoints (`protocol.WANDB_RUN_ID_FILE`, made by the first process that asks), and
  every attempt, restart in the allocation and relaunch opens the run with it and `resume="allow"`: they append to
  one run (offline, each start writes a directory of its own, all of one run: `wandb sync` appends them in order).
  nanotron's trainer calls `wandb.init` itself: `one_wandb_run` gives its call the id.
- **No step lost**: a preemption's SIGTERM reaches wandb's own service process with the training's, and it dies
  without writing what it held (offline, everything since its start: it writes its file at the end); a process
  killed outright loses the same. So the steps wandb holds for certain are recorded when a run finishes whole
  (`protocol.WANDB_LOGGED_FILE`: the last step), and the next start gives wandb again, from the job's own metrics
  file, every step after that one up to the checkpoint it resumes from (`lost_steps`). wandb drops a step it already
  has (a step lower than its run's): steps stay continuous, none twice. (The torch engine; nanotron's trainer logs
  through its own calls.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher import atomic, jsonl
from launcher import protocol as P
from launcher.errors import TrainError
from launcher.train.settings import TrainConfig

WANDB_FIX = "run `wandb login`, or set WANDB_MODE=offline (sync later) or disabled"


def wandb_run_id(checkpoints_path: str) -> str:
    """The run's wandb id, kept beside its checkpoints: read, or made by the first process to ask (a new file is
    linked into place, never replaced, so that two askers agree on one id)."""
    path = Path(checkpoints_path) / P.WANDB_RUN_ID_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        temporary = atomic.temporary_name(path)
        temporary.write_text(secrets.token_hex(4) + "\n", encoding="utf-8")  # wandb's ids: 8 of [0-9a-z]
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process made it first: its id is the run's
        finally:
            temporary.unlink()
    return path.read_text(encoding="utf-8").strip()


@contextlib.contextmanager
def one_wandb_run(wandb: Any, checkpoints_path: str) -> Iterator[None]:
    """While inside, `wandb.init` opens the run's own wandb run (`wandb_run_id`, resume="allow") whoever calls it:
    nanotron's trainer calls `wandb.init` itself, with a name of its own for each attempt."""
    if wandb is None:
        yield
        return
    init = wandb.init
    wandb.init = functools.partial(init, id=wandb_run_id(checkpoints_path), resume="allow")
    try:
        yield
    finally:
        wandb.init = init


def start(cfg: TrainConfig) -> Any:
    """The run's wandb run, opened (rank 0)."""
    import wandb

    try:
        return wandb.init(project=cfg.project, name=cfg.run_name, config=dataclasses.asdict(cfg),
                          id=wandb_run_id(cfg.checkpoints_path), resume="allow")  # fmt: skip
    except wandb.errors.Error as e:
        raise TrainError(f"wandb could not start ({e}): {WANDB_FIX}") from None


def logged_to(checkpoints_path: str) -> int:
    """The last step the run's wandb run holds for certain (0: none known)."""
    try:
        text = (Path(checkpoints_path) / P.WANDB_LOGGED_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def lost_steps(metrics_file: str | None, after: int, up_to: int) -> list[dict]:
    """The metrics file's rows of steps `after` < step <= `up_to`, the last line of each, in step order: what wandb
    may have lost of the steps before training resumes."""
    if not metrics_file or up_to <= after:
        return []
    rows: dict[int, dict] = {}
    for row in jsonl.read(metrics_file):
        if isinstance(row.get("step"), int) and after < row["step"] <= up_to:
            rows[row["step"]] = row
    return [rows[step] for step in sorted(rows)]


def finish(run: Any, checkpoints_path: str, step: int) -> None:
    """Finish the wandb run (it writes out its data); once it has, record the last step it holds. A wandb that
    cannot finish (its service gone with a preemption's SIGTERM) costs a warning, not the training's exit code:
    the next start gives it those steps again."""
    try:
        run.finish()
    except Exception as e:  # noqa: BLE001  wandb's own failure, whatever it is
        print(f"warning: wandb could not finish its run ({type(e).__name__}: {e}); the next start logs its steps "
              "again", file=sys.stderr, flush=True)  # fmt: skip
        return
    if step > logged_to(checkpoints_path):
        atomic.replace(Path(checkpoints_path) / P.WANDB_LOGGED_FILE, f"{step}\n")
