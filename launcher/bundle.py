"""The reproducibility bundle: config YAML, sbatch script and manifest, never overwritten.

Each launch claims a fresh directory with an exclusive `mkdir` (`<configs_path>/<run_name>/<stamp>`, a numeric
suffix when two launches share a second), and creates its files with mode "x", so no launch can replace another's
files. The script and log names derive from the same stamp.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LAUNCHER_SCRIPT = Path(__file__).resolve().parent.parent / "slurm_launcher.py"
PACKAGES = (
    "nanotron",
    "torch",
    "transformers",
    "datasets",
    "tokenizers",
    "wandb",
    "simple-parsing",
    "pyyaml",
    "jinja2",
)


@dataclass(frozen=True)
class BundlePaths:
    """Where one launch's files live (all absolute)."""

    bundle_dir: Path
    config: Path
    manifest: Path
    script: Path
    log: Path
    stop_file: Path
    outcome_file: Path
    srun_status_file: Path
    metrics: Path
    checkpoints: Path

    @property
    def bundle_id(self) -> str:
        return f"{self.bundle_dir.parent.name}/{self.bundle_dir.name}"


def _paths(run_name: str, stamp: str, configs: Path, scripts: Path, logs: Path, checkpoints: Path) -> BundlePaths:
    bundle_dir = configs / run_name / stamp
    return BundlePaths(
        bundle_dir=bundle_dir,
        config=bundle_dir / "config.yaml",
        manifest=bundle_dir / "manifest.json",
        script=scripts / run_name / f"{stamp}.sbatch",
        log=logs / run_name / f"{stamp}.out",
        stop_file=bundle_dir / "stop-requested",
        outcome_file=bundle_dir / "outcome",
        srun_status_file=bundle_dir / "srun-exit-code",
        metrics=bundle_dir / "metrics.jsonl",
        checkpoints=checkpoints,
    )


def claim(
    run_name: str, configs: str, scripts: str, logs: str, checkpoints: str, fresh: bool, now: float | None = None
) -> BundlePaths:
    """Create a new, empty bundle directory and return the paths of its files.

    `fresh` starts a run afresh beside existing checkpoints: it gets its own checkpoint directory.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    ckpt = Path(checkpoints) / run_name
    for n in range(1, 10_000):
        candidate = stamp if n == 1 else f"{stamp}-{n}"
        paths = _paths(
            run_name,
            candidate,
            Path(configs),
            Path(scripts),
            Path(logs),
            ckpt.with_name(f"{run_name}-{candidate}") if fresh else ckpt,
        )
        if paths.script.exists() or paths.log.exists():
            continue
        try:
            paths.bundle_dir.mkdir(parents=True)
        except FileExistsError:
            continue
        return paths
    raise RuntimeError(f"no free bundle name under {configs}/{run_name}")  # 10k launches in one second


def release(paths: BundlePaths) -> None:
    """Undo a claim whose launch stopped before writing: remove the (empty) bundle directory, and the run's
    directory of bundles if that leaves it empty.

    The script and log directories are made only when the bundle is written (`make_room`), so a release never
    touches them: a pending job of this run may be waiting to write its log into an empty log directory.
    """
    with contextlib.suppress(FileNotFoundError):
        paths.bundle_dir.rmdir()
    with contextlib.suppress(OSError):  # not empty: other launches of this run live there
        paths.bundle_dir.parent.rmdir()


def make_room(paths: BundlePaths) -> None:
    """The directories the script and the job's log go to (shared by every launch of the run; never removed)."""
    paths.script.parent.mkdir(parents=True, exist_ok=True)
    paths.log.parent.mkdir(parents=True, exist_ok=True)


def write_new(path: Path, text: str, mode: int = 0o644) -> str:
    """Create `path` (it must not exist) with `text`, complete or not at all; return its sha256.

    The text goes to a private temporary file first, which is then hard-linked to `path`: `link` fails if `path`
    exists (no launch replaces another's file) and is atomic (a reader never sees a half-written file).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links: exclusive create, still never a replace
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, mode)
    finally:
        tmp.unlink(missing_ok=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _versions() -> dict[str, str | None]:
    """Versions of the packages that shape a run. One pass over the dist-info directory names on sys.path
    (`name-version.dist-info`): importlib.metadata's per-package lookups cost a tenth of a dry run."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            children = os.listdir(entry or ".")
        except OSError:
            continue
        for child in children:
            if child.endswith(".dist-info"):
                dist, _, dist_version = child[: -len(".dist-info")].rpartition("-")
                found.setdefault(_normalized(dist), dist_version)
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        version = found.get(_normalized(name))
        if version is None:  # an egg-info or other layout: ask importlib.metadata (slow to import: only then)
            from importlib import metadata

            try:
                version = metadata.version(name)
            except metadata.PackageNotFoundError:
                version = None
        versions[name] = version
    return versions


def manifest(args: object, argv: list[str], paths: BundlePaths, hashes: dict[str, str], derived: dict) -> dict:
    """The manifest's content at launch (Slurm fields are added by `record_submission`)."""
    described = _git("describe", "--always", "--dirty", "--abbrev=40")  # "<commit>[-dirty]", one call
    return {
        "run_name": paths.bundle_dir.parent.name,
        "bundle_id": paths.bundle_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join([sys.executable, str(LAUNCHER_SCRIPT), *argv]),  # run it again from "cwd"
        "cwd": os.getcwd(),
        "resolved": dataclasses.asdict(args),  # type: ignore[call-overload]
        "derived": derived,
        "files": {
            "config": {"path": str(paths.config), "sha256": hashes["config"]},
            "script": {"path": str(paths.script), "sha256": hashes["script"]},
        },
        "outputs": {"log": str(paths.log), "checkpoints": str(paths.checkpoints), "metrics": str(paths.metrics)},
        "project": {
            "commit": described.removesuffix("-dirty") if described else None,
            "dirty": described.endswith("-dirty") if described else None,
        },
        "host": {"hostname": platform.node(), "user": os.environ.get("USER")},
        "versions": _versions(),
        "slurm": {"submitted": False},
    }


def write_manifest(path: Path, data: dict, new: bool = False) -> None:
    """Write the manifest: exclusively the first time, then by atomic replace."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if new:
        write_new(path, text)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_manifest(bundle_dir: Path) -> dict:
    return json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
