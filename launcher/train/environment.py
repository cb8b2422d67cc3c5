"""What the job reads from its environment, read in one place into one typed value (after submitit's
`JobEnvironment`): torchrun's ranks, and the files and settings of the launcher's protocol that the node step
sets (`launcher.protocol`'s ENV_* names).

`JobEnvironment.read()` is the job's only look at `os.environ`; the entry (`launcher.train.main.run`) reads it once
and hands it to the engine, which hands it on (a caller that gives none gets the environment read then).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher import protocol as P
from launcher.nanotron_config.provenance import hub_cache

STOP_FILE_EVERY_S = 5.0  # rank 0's looks for the stop file, at most this often (P.ENV_STOP_FILE_EVERY changes it)
STRAGGLER_EVERY = 100  # steps between rank 0's looks at every rank's step time (P.ENV_STRAGGLER_EVERY changes it)


def _seconds(text: str | None, default: float) -> float:
    """A positive, finite number of seconds (--extra_env may set one: a short run), else the default."""
    try:
        value = float(text or default)
    except ValueError:
        return default
    return value if 0 < value < math.inf else default


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


@dataclass(frozen=True)
class JobEnvironment:
    """This process's place in the job and the launcher's files, as the environment gives them."""

    rank: int = 0  # RANK (torchrun); 0 when started alone
    local_rank: int = 0  # LOCAL_RANK: this process's GPU on its node
    world_size: int = 1  # WORLD_SIZE: the processes torchrun started
    distributed: bool = False  # RANK and WORLD_SIZE are both set: torchrun's process group (env://) to join
    # The bundle's files (P.ENV_BUNDLE: the job's bundle; each None where training runs outside a job):
    stop_file: str | None = None  # P.STOP_FILE: the supervisor's word to checkpoint and exit
    outcome_file: str | None = None  # P.OUTCOME_FILE: rank 0's word on how training ended
    metrics_file: str | None = None  # P.METRICS: one JSON line per logged step
    progress_file: str | None = None  # P.PROGRESS_FILE: rank 0's progress, for the hang watchdog
    signal_grace: float = 0.0  # P.ENV_SIGNAL_GRACE: seconds a time-limit save has (0: the job does not requeue)
    stop_file_every: float = STOP_FILE_EVERY_S  # P.ENV_STOP_FILE_EVERY
    tmp_dir: str = "/tmp"  # TMPDIR
    wandb_disabled: bool = False  # WANDB_MODE=disabled: wandb is never imported
    node: str = ""  # the node this process runs on, as Slurm names it (P.ENV_NODE_TAG's "JOB:NODE"); "" alone
    ranks_file: str | None = None  # P.RANKS_FILE: which node holds which ranks (rank 0 writes it)
    stragglers_file: str | None = None  # P.STRAGGLERS_FILE: the ranks named slower than the others
    straggler_every: int = STRAGGLER_EVERY  # P.ENV_STRAGGLER_EVERY: steps between looks at every rank's step time
    runtime_file: str | None = None  # P.RUNTIME_RECORD: rank 0 appends what this attempt runs with
    job_id: str | None = None  # SLURM_JOB_ID
    attempt: int = 1  # SLURM_RESTART_COUNT + 1: this job's attempt
    nodelist: str | None = None  # SLURM_JOB_NODELIST (a hostlist)
    hub_cache: Path = field(default_factory=lambda: hub_cache({}))  # huggingface_hub's (HF_HUB_CACHE, HF_HOME)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, writes the launcher's files and the records."""
        return self.rank == 0

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> JobEnvironment:
        """The environment as the job sees it (`os.environ` unless given)."""
        env = os.environ if environ is None else environ
        bundle = env.get(P.ENV_BUNDLE) or None

        def in_bundle(name: str) -> str | None:
            return str(Path(bundle) / name) if bundle else None

        return cls(
            rank=_int(env.get("RANK"), 0),
            local_rank=_int(env.get("LOCAL_RANK"), 0),
            world_size=_int(env.get("WORLD_SIZE"), 1),
            distributed="RANK" in env and "WORLD_SIZE" in env,
            stop_file=in_bundle(P.STOP_FILE),
            outcome_file=in_bundle(P.OUTCOME_FILE),
            metrics_file=in_bundle(P.METRICS),
            progress_file=in_bundle(P.PROGRESS_FILE),
            signal_grace=_seconds(env.get(P.ENV_SIGNAL_GRACE), 0.0),
            stop_file_every=_seconds(env.get(P.ENV_STOP_FILE_EVERY), STOP_FILE_EVERY_S),
            tmp_dir=env.get("TMPDIR") or "/tmp",
            wandb_disabled=env.get("WANDB_MODE", "").lower() == "disabled",
            node=env.get(P.ENV_NODE_TAG, "").partition(":")[2],
            ranks_file=in_bundle(P.RANKS_FILE),
            stragglers_file=in_bundle(P.STRAGGLERS_FILE),
            straggler_every=max(_int(env.get(P.ENV_STRAGGLER_EVERY), STRAGGLER_EVERY), 1),
            runtime_file=in_bundle(P.RUNTIME_RECORD),
            job_id=env.get("SLURM_JOB_ID") or None,
            attempt=_int(env.get("SLURM_RESTART_COUNT"), 0) + 1,
            nodelist=env.get("SLURM_JOB_NODELIST") or None,
            hub_cache=hub_cache(env),
        )
