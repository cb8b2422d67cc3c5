"""Kill points for the fault-injection tests (tests/test_retention_slurm.py, test_remote_slurm.py): loaded at
interpreter start by the job's Python those tests make (a `--python` wrapper that puts this folder first on
PYTHONPATH: the supervisor, the node step and every training process load it), and active only where
LAUNCHER_TEST_KILL_AT=POINT@STEP. The process that reaches POINT at STEP kills itself with SIGKILL, once: it first
makes the file LAUNCHER_TEST_KILL_ONCE, and where that file is there nothing is killed (the run launched again goes
through). Test side only, never the product.

  save-mid-write       the torch engine: rank 0 has written state.pt into .tmp-STEP-*, not meta.json (the save is
                       not renamed into place); nanotron's: every rank has written its model and optimizer files
                       into STEP/, rank 0 not checkpoint_metadata.json (written last)
  save-before-pointer  either engine: STEP is complete, the pointer (latest, latest.txt) not moved to it
  purge-mid-delete     the job's supervisor: STEP renamed out of the steps' names by the purge, half its files
                       deleted
  upload-mid-copy      the job's supervisor (--checkpoints_remote): STEP's first file copied to the bucket, the
                       others and the marker not (tests/test_remote_slurm.py)

Then the next sitecustomize on the path, if any, runs as Python would have run it (tests/cpu_nanotron's, for the
nanotron engine on CPU).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any

POINT, _, STEP = os.environ.get("LAUNCHER_TEST_KILL_AT", "").partition("@")
ONCE = os.environ.get("LAUNCHER_TEST_KILL_ONCE", "")


def die_at(point: str, step: int) -> None:
    """SIGKILL this process where `point` at `step` is the one asked for, and only the first time."""
    if point != POINT or str(step) != STEP or not ONCE:
        return
    try:
        os.close(os.open(ONCE, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    sys.stdout.write(f"[fault point] {point} at step {step}: SIGKILL to pid {os.getpid()}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _torch_checkpoint(module: Any) -> None:
    real_write, real_pointer = module._fsynced_write, module.write_pointer

    def fsynced_write(path: Path, write: Any) -> None:
        if path.name == "meta.json":  # state.pt is written: the save is cut in the middle
            die_at("save-mid-write", int(path.parent.name.split("-")[1]))
        real_write(path, write)

    def write_pointer(root: Path, step: int) -> None:
        die_at("save-before-pointer", step)
        real_pointer(root, step)

    module._fsynced_write, module.write_pointer = fsynced_write, write_pointer


def _nanotron_trainer(module: Any) -> None:
    real_pointer = module.write_pointer

    def write_pointer(checkpoints_path: Any, step: int) -> None:
        die_at("save-before-pointer", step)
        real_pointer(checkpoints_path, step)

    module.write_pointer = write_pointer


def _nanotron_serialize(module: Any) -> None:
    real_meta = module.save_meta

    def save_meta(parallel_context: Any, root_folder: Path, checkpoint_metadata: dict) -> None:
        import torch.distributed as dist

        if dist.get_rank(parallel_context.world_pg) == 0:
            die_at("save-mid-write", int(Path(root_folder).name))
        real_meta(parallel_context=parallel_context, root_folder=root_folder, checkpoint_metadata=checkpoint_metadata)

    module.save_meta = save_meta


def _purge(module: Any) -> None:
    real_remove = module.remove_tree

    def remove_tree(path: Path) -> None:
        step = path.name.removeprefix(".purging-").split("-")[0]
        if path.is_dir() and step.isdigit():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            for f in files[: len(files) // 2]:
                f.unlink()
            die_at("purge-mid-delete", int(step))
        real_remove(path)

    module.remove_tree = remove_tree


def _bucket(module: Any) -> None:
    real_upload = module.Bucket.upload

    def upload(self: Any, step_dir: Path, step: int, size: int) -> None:
        if POINT == "upload-mid-copy" and str(step) == STEP:
            first = sorted(p for p in Path(step_dir).rglob("*") if p.is_file())[0]
            self._run("cp", str(first), self.step_url(step) + first.relative_to(step_dir).as_posix())
            die_at("upload-mid-copy", step)
        real_upload(self, step_dir, step, size)

    module.Bucket.upload = upload


PATCHES = {
    "launcher.train.torch_engine.checkpoint": _torch_checkpoint,
    "launcher.train.nanotron_engine.trainer": _nanotron_trainer,
    "nanotron.serialize.main": _nanotron_serialize,
    "launcher.retention.purge": _purge,
    "launcher.remote.bucket": _bucket,
}


def _install(patches: dict[str, Any]) -> None:
    """tests/after_import.py's install, the file loaded by its path (this folder alone is on the job's PYTHONPATH)."""
    spec = importlib.util.spec_from_file_location("_after_import", Path(__file__).parents[1] / "after_import.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.install(patches)


def _next_sitecustomize() -> None:
    """The sitecustomize this one hides (the next on sys.path), run as Python would have run it."""
    here = Path(__file__).resolve().parent
    for entry in sys.path:
        candidate = Path(entry or ".").resolve() / "sitecustomize.py"
        if candidate.parent != here and candidate.is_file():
            spec = importlib.util.spec_from_file_location("_hidden_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            return


if POINT:
    _install(PATCHES)
_next_sitecustomize()
