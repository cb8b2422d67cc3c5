"""What this attempt really runs with, recorded by rank 0 at its start (once per attempt): one JSON line appended to
the bundle's runtime record (`P.RUNTIME_RECORD`, where the node step names it), beside the launch's manifest,
which it never touches.

It says: the job and attempt, the nodes, the Python, nanotron's version and (a source install) its git commit and
state, torch's, CUDA's and NCCL's versions, the GPU, the Slurm release, the engine, the versions of the packages a
launch's manifest lists (`provenance.versions`: this Python's, to compare with the launcher's), and a fingerprint
of each dataset and of the tokenizer (`launcher.nanotron_config.provenance`). Cheap by design (a few ms on the demo
data: no file is read whole, nothing is imported but what the job has already): `took_s` says what it cost. A
record that cannot be written is said on the log, and training goes on.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import time
from typing import Any

import torch

from launcher import jsonl
from launcher.nanotron_config import provenance
from launcher.train.environment import JobEnvironment
from launcher.train.settings import TrainConfig


def slurm_release() -> str | None:
    """The Slurm release of this node's commands (`scontrol --version`: "slurm 22.05.8" -> "22.05.8")."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        out = subprocess.run([scontrol, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.split()
    return words[-1] if words else None


def torch_stack(local_rank: int) -> dict[str, Any]:
    """torch's version, the CUDA it was built with, NCCL's version and this process's GPU (None on CPU)."""
    nccl = None
    gpu = None
    if torch.cuda.is_available():
        try:
            found = torch.cuda.nccl.version()
            nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
        except (AttributeError, RuntimeError):
            nccl = None
        gpu = torch.cuda.get_device_name(local_rank)
    return {"version": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "gpu": gpu}


def datasets_of(cfg: TrainConfig) -> list[str | None]:
    """Every dataset the run reads, in order: the first stage's (a mixture's parts), then each later stage's."""
    names: list[str | None] = []
    for c in (cfg, *(s.data for s in cfg.stages)):
        for name in [n for n, _ in c.mixture] if c.mixture else [c.dataset]:
            if name not in names:
                names.append(name)
    return names


def record(cfg: TrainConfig, job: JobEnvironment, engine: str) -> dict[str, Any]:
    """This attempt's record (see the module's docstring)."""
    started = time.perf_counter()
    data = {
        name or provenance.RANDOM: provenance.fingerprint(name, "datasets", job.hub_cache) for name in datasets_of(cfg)
    }
    out: dict[str, Any] = {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "nodes": job.nodelist,
        "world_size": job.world_size,
        "python": {"executable": sys.executable, "version": platform.python_version()},
        "engine": engine,
        "nanotron": provenance.nanotron_install(sys.path),
        "torch": torch_stack(job.local_rank),
        "slurm": slurm_release(),
        "versions": provenance.versions(provenance.RUN_PACKAGES),
        "data": data,
        "tokenizer": provenance.fingerprint(cfg.tokenizer, "models", job.hub_cache),
    }
    out["took_s"] = round(time.perf_counter() - started, 4)
    return out


def append(cfg: TrainConfig, job: JobEnvironment, engine: str) -> None:
    """Rank 0 appends this attempt's record to the runtime file (where the launcher named one)."""
    if not job.is_main or not job.runtime_file:
        return
    try:
        jsonl.append(job.runtime_file, record(cfg, job, engine))
    except Exception as e:  # a record is worth no training run: whatever fails here is said, and training goes on
        print(f"warning: this attempt's runtime record was not written ({job.runtime_file}): {e}", flush=True)
