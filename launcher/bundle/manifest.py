"""The manifest: what a launch was (command line, resolved flags, figures, file hashes, git commit, package
versions, host) and what became of it (Slurm's job id, or its refusal; the run's verdict once it ends)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import atomic, jsonl
from launcher import protocol as P
from launcher.bundle.files import BundlePaths, write_new
from launcher.nanotron_config import provenance
from launcher.nanotron_config.presets import BASE_CONFIG, PRESETS_DIR

LAUNCHER_SCRIPT = Path(__file__).resolve().parents[2] / "slurm_launcher.py"


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def versions() -> dict[str, str | None]:
    """The versions a manifest holds (`provenance.RUN_PACKAGES`, read by `provenance.versions`)."""
    return provenance.versions(provenance.RUN_PACKAGES)


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def inputs(model_size: str, config: str | None) -> dict[str, dict]:
    """The files the flags were resolved from, as they were: the --model_size preset, the base config and the
    --config YAML (path and sha256; a rerun says which of them has changed since)."""
    files = {"preset": PRESETS_DIR / f"{model_size}.yaml", "base_config": BASE_CONFIG}
    if config:
        files["config"] = Path(os.path.expanduser(config)).absolute()  # (a rerun may start in another directory)
    return {name: {"path": str(path), "sha256": _sha256(path)} for name, path in files.items()}


def project_state() -> dict[str, Any]:
    """The launcher's git commit and whether its checkout has uncommitted changes (None, None: not a checkout)."""
    described = _git("describe", "--always", "--dirty", "--abbrev=40")  # "<commit>[-dirty]", one call
    return {
        "commit": described.removesuffix("-dirty") if described else None,
        "dirty": described.endswith("-dirty") if described else None,
    }


def at_launch(args: object, argv: list[str], paths: BundlePaths, hashes: dict[str, str], derived: dict) -> dict:
    """The manifest as the launch writes it (Slurm's side is added by `record`)."""
    return {
        "run_name": paths.bundle_dir.parent.name,
        "bundle_id": paths.bundle_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join([sys.executable, str(LAUNCHER_SCRIPT), *argv]),  # run it again from "cwd"
        "cwd": os.getcwd(),
        "resolved": dataclasses.asdict(args),  # type: ignore[call-overload]
        "derived": derived,
        "inputs": inputs(args.model.model_size, args.execution.config),  # type: ignore[attr-defined]
        "files": {
            "config": {"path": str(paths.config), "sha256": hashes["config"]},
            "script": {"path": str(paths.script), "sha256": hashes["script"]},
            "job": {"path": str(paths.job), "sha256": hashes["job"]},
        },
        "outputs": {"log": str(paths.log), "checkpoints": str(paths.checkpoints), "metrics": str(paths.metrics)},
        "project": project_state(),
        "host": {"hostname": platform.node(), "user": os.environ.get("USER")},
        "versions": versions(),
        "slurm": {"submitted": False},
    }


def write_manifest(path: Path, data: dict, new: bool = False) -> None:
    """Write the manifest: exclusively the first time, then by atomic replace."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if new:
        write_new(path, text)
        return
    atomic.replace(path, text)


@dataclass(frozen=True)
class Manifest:
    """A written manifest, read back: what the rest of the launcher asks of it, by name (`load`). Read once and
    handed down: what a run's end adds (`record_end`, `record_ledger`) goes into `data` and the file alike."""

    path: Path  # the manifest.json
    data: dict

    @property
    def bundle_dir(self) -> Path:
        return self.path.parent

    @property
    def job_id(self) -> str | None:
        return self.data.get("slurm", {}).get("job_id") or None

    @property
    def not_submitted(self) -> str:
        """Why it has no job: Slurm's refusal, or a dry run."""
        return str(self.data.get("slurm", {}).get("error") or "dry run")

    def output(self, name: str) -> Path:
        """An output's path: "log", "checkpoints" or "metrics"."""
        default = {"metrics": self.bundle_dir / P.METRICS}.get(name)
        value = self.data.get("outputs", {}).get(name)
        if value is None and default is None:
            raise KeyError(f"{self.path} names no {name}")
        return Path(value) if value is not None else default  # type: ignore[return-value]

    @property
    def log(self) -> Path:
        return self.output("log")

    @property
    def checkpoints(self) -> Path:
        return self.output("checkpoints")

    @property
    def metrics(self) -> Path:
        return self.output("metrics")

    @property
    def flags(self) -> dict[str, Any]:
        """The run's resolved flags, one flat dict (micro_batch_size, tp, ...)."""
        resolved = self.data.get("resolved") or {}
        return {k: v for group in resolved.values() if isinstance(group, dict) for k, v in group.items()}

    @property
    def memory(self) -> dict | None:
        """The memory model's estimate recorded at launch (estimate_bytes, gpu_bytes, gpu), if any."""
        memory = (self.data.get("derived") or {}).get("memory")
        return memory if isinstance(memory, dict) else None

    @property
    def verdict(self) -> dict | None:
        verdict = self.data.get("verdict")
        return verdict if isinstance(verdict, dict) else None

    @property
    def runtime(self) -> list[dict]:
        """What each attempt of the job really ran with (`P.RUNTIME_RECORD`, beside the manifest: rank 0 appends a
        line as each attempt starts), in order; an attempt recorded twice (its rendezvous retried) by its last
        line. [] before the job's first attempt, or for a bundle from before the record."""
        found: dict[tuple, dict] = {}
        for rec in jsonl.read(self.bundle_dir / P.RUNTIME_RECORD):
            found.pop(key := (rec.get("job_id"), rec.get("attempt")), None)
            found[key] = rec
        return list(found.values())

    @property
    def export_job_id(self) -> str | None:
        """--export_hf: the export job chained to the run's (None: none asked, or not submitted)."""
        return self.data.get("slurm", {}).get("export_job_id") or None

    @property
    def export_result(self) -> dict | None:
        """--export_hf: what the export job wrote (P.EXPORT_RESULT: output, step, loss, perplexity, ...), or None."""
        try:
            found = json.loads((self.bundle_dir / P.EXPORT_RESULT).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    @property
    def rerun_of(self) -> dict | None:
        """The bundle this run reruns (`python -m launcher.jobs rerun`), and what differed then; None otherwise."""
        origin = self.data.get("rerun_of")
        return origin if isinstance(origin, dict) else None


def load(target: Path) -> Manifest:
    """The manifest of a bundle directory (or the manifest file itself). Raises OSError or ValueError."""
    path = target if target.name == P.MANIFEST else target / P.MANIFEST
    data = json.loads(path.read_text(encoding="utf-8"))
    sections = ("slurm", "resolved", "outputs", "files", "inputs", "derived", "versions", "ended")
    if not isinstance(data, dict) or any(not isinstance(data.get(k, {}), dict | None) for k in sections):
        raise ValueError(f"{path} is not a launcher manifest (damaged: a section of it is not a mapping)")
    return Manifest(path, data)


def record(manifest_path: Path, **slurm_fields: object) -> Manifest:
    """Add Slurm's side of the story (submitted, job_id, error, ...) to a written manifest; the manifest as it now
    is, to hand down (the end of a followed run reads it no more)."""
    run = load(manifest_path)
    run.data["slurm"].update(slurm_fields)
    write_manifest(run.path, run.data)
    return run


def record_end(run: Manifest, ended: dict, verdict: dict | None) -> None:
    """What became of the run (in the manifest in hand, and its file): Slurm's final word (`ended`: state, exit
    code, requeues) and the launcher's verdict on why it ended so (cause, where, message, fix; None when it
    COMPLETED)."""
    run.data.update(ended=ended, verdict=verdict)
    write_manifest(run.path, run.data)


def record_ledger(run: Manifest, ledger: dict) -> None:
    """Where the run's GPU time went (launcher.ledger.breakdown's record: GPU-hours allocated, trained, lost and to
    what, every attempt), once it has ended; in the manifest in hand, and its file."""
    run.data["ledger"] = ledger
    write_manifest(run.path, run.data)


def record_origin(run: Manifest, origin: dict) -> None:
    """A rerun's manifest names the bundle it reruns, and what differed from it when it was launched."""
    run.data["rerun_of"] = origin
    write_manifest(run.path, run.data)
