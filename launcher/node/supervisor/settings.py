"""The run's values, as the batch script exports them before it execs the supervisor (their names:
protocol.SUPERVISOR_ENV). Slurm's own (SLURM_JOB_ID, ...) come from the job's environment."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher import protocol as P
from launcher.node.supervisor.supervise import Files

ENV = P.SUPERVISOR_ENV


@dataclass(frozen=True)
class Settings:
    """One job's values: Slurm's, and the run's (the template's exports)."""

    job: str
    restart_count: int
    nodelist: str  # SLURM_JOB_NODELIST
    batch_node: str  # SLURMD_NODENAME ("": the allocation's first)
    partition: str
    python: str
    node_script: Path
    checkpoints: Path
    log: Path
    metrics: Path
    ranks: Path
    files: Files
    layout: int  # nodes the layout trains on
    allocated: int  # nodes the job asked for (the layout's and the spares)
    gpus: int
    max_requeues: int
    max_restarts: int
    max_excluded: int
    heartbeat_s: float
    watchdog: tuple[str, ...]  # the watchdog's options after --notify (empty: no watchdog, --hang_timeout 0)
    backend: str
    container: tuple[str, ...]  # srun's pyxis options (empty: none)
    debug: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The settings from the job's environment; a KeyError names a value the batch script did not export."""
        e = {key: env.get(name, "") for key, name in ENV.items()}
        files = Files(Path(env[ENV["stop"]]), Path(env[ENV["outcome"]]), Path(e["progress"]),
                      Path(e["hung"]), Path(e["preflight"]), Path(e["port_taken"]), Path(e["requeues"]),
                      Path(e["restarts"]), Path(e["log_dir"]))  # fmt: skip
        return cls(
            job=env["SLURM_JOB_ID"],
            restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
            nodelist=env["SLURM_JOB_NODELIST"],
            batch_node=env.get("SLURMD_NODENAME", ""),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            python=e["python"],
            node_script=Path(e["node_script"]),
            checkpoints=Path(e["checkpoints"]),
            log=Path(e["log"]),
            metrics=Path(e["metrics"]),
            ranks=Path(e["ranks"]),
            files=files,
            layout=int(e["layout"]),
            allocated=int(e["allocated"] or e["layout"]),
            gpus=int(e["gpus"] or 0),
            max_requeues=int(e["max_requeues"] or 0),
            max_restarts=int(e["max_restarts"] or 0),
            max_excluded=int(e["max_excluded"] or 1),
            heartbeat_s=float(e["heartbeat_s"] or 60),
            watchdog=tuple(shlex.split(e["watchdog"])),
            backend=e["backend"] or "c10d",
            container=tuple(shlex.split(e["container"])),
            debug=e["debug"] == "1",
        )
