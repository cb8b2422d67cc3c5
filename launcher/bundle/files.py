"""The bundle's files on disk: a fresh directory per launch, files created whole, never overwritten.

Each launch claims a fresh directory with an exclusive `mkdir` (`<configs_path>/<run_name>/<stamp>`, a numeric
suffix when two launches share a second), and creates its files with mode "x", so no launch can replace another's
files. The script and log names derive from the same stamp.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher import protocol as P


@dataclass(frozen=True)
class BundlePaths:
    """Where one launch's files live (all absolute)."""

    bundle_dir: Path
    config: Path
    manifest: Path
    script: Path
    job: Path  # the job's settings (P.JOB_FILE): what the supervisor and the node step read
    log: Path
    stop_file: Path
    outcome_file: Path
    requeues_file: Path  # one line per requeue the job asked for: "WHY attempt N step S nodes EXCLUDED"
    restarts_file: Path  # one line per failure the job went on from (P.RESTART_FORMAT): a restart, or a requeue
    ranks_file: Path  # which node holds which ranks, as the node step started (training's rank 0)
    stragglers_file: Path  # the ranks training named as slower than the others (JSON lines)
    progress_file: Path  # "STEP UNIXTIME PHASE", written by training's rank 0, read by the hang watchdog
    hung_file: Path  # the watchdog's finding: "STEP IDLE_S LIMIT_S"
    node_check_report: Path  # the node checks' problems, one "NODE: WHAT" a line
    port_taken_file: Path  # left by the first node when its rendezvous port was taken
    metrics: Path
    runtime: Path  # one line per attempt, appended by the job's rank 0: what it really ran (P.RUNTIME_RECORD)
    checkpoints: Path

    @property
    def bundle_id(self) -> str:
        return f"{self.bundle_dir.parent.name}/{self.bundle_dir.name}"


def paths_for(run_name: str, stamp: str, configs: Path, scripts: Path, logs: Path, checkpoints: Path) -> BundlePaths:
    bundle_dir = configs / run_name / stamp
    return BundlePaths(
        bundle_dir=bundle_dir,
        config=bundle_dir / P.CONFIG,
        manifest=bundle_dir / P.MANIFEST,
        script=scripts / run_name / f"{stamp}{P.SCRIPT_SUFFIX}",
        job=bundle_dir / P.JOB_FILE,
        log=logs / run_name / f"{stamp}{P.LOG_SUFFIX}",
        stop_file=bundle_dir / P.STOP_FILE,
        outcome_file=bundle_dir / P.OUTCOME_FILE,
        requeues_file=bundle_dir / P.REQUEUES_FILE,
        restarts_file=bundle_dir / P.RESTARTS_FILE,
        ranks_file=bundle_dir / P.RANKS_FILE,
        stragglers_file=bundle_dir / P.STRAGGLERS_FILE,
        progress_file=bundle_dir / P.PROGRESS_FILE,
        hung_file=bundle_dir / P.HUNG_FILE,
        node_check_report=bundle_dir / P.NODE_CHECK_REPORT,
        port_taken_file=bundle_dir / P.PORT_TAKEN_FILE,
        metrics=bundle_dir / P.METRICS,
        runtime=bundle_dir / P.RUNTIME_RECORD,
        checkpoints=checkpoints,
    )


def claim_dir(parent: Path, now: float | None = None, free: Callable[[str], bool] = lambda stamp: True) -> Path:
    """Create a new, empty directory `parent/<stamp>` named by the time (`-2`, `-3`, ... when launches share a
    second) with an exclusive mkdir, so that no two launches ever get the same one; `free(stamp)` may veto a name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = parent / (stamp if n == 1 else f"{stamp}-{n}")
        if not free(candidate.name):
            continue
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"no free directory name under {parent}")  # 10k launches in one second


def claim(
    run_name: str,
    configs: str,
    scripts: str,
    logs: str,
    checkpoints: str,
    fresh: bool,
    now: float | None = None,
    checkpoints_dir: Path | None = None,
) -> BundlePaths:
    """Create a new, empty bundle directory and return the paths of its files.

    `fresh` starts a run afresh beside existing checkpoints: it gets its own checkpoint directory. The run's
    checkpoints are `<checkpoints>/<run_name>`, or `checkpoints_dir` where the caller chose them (a rerun that
    resumes the run it reruns).
    """
    ckpt = checkpoints_dir or Path(checkpoints) / run_name

    def paths_of(stamp: str) -> BundlePaths:
        fresh_ckpt = ckpt.with_name(f"{ckpt.name}-{stamp}") if fresh else ckpt
        return paths_for(run_name, stamp, Path(configs), Path(scripts), Path(logs), fresh_ckpt)

    def free(stamp: str) -> bool:  # the script and log of another launch of that stamp
        paths = paths_of(stamp)
        return not (paths.script.exists() or paths.log.exists())

    return paths_of(claim_dir(Path(configs) / run_name, now, free).name)


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
