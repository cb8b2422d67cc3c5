"""The project's own Slurm cluster on one machine, for the demo and the tests (never imported by the launcher or
the job): its shape and config files (`config`), its daemons (`daemons`), the demo's data and tokenizer
(`demo_data`), and the command line (`python -m launcher.localcluster`)."""

from launcher.localcluster.config import ClusterSpec, default_dir
from launcher.localcluster.daemons import ClusterError, daemon_pids, down, is_up, status, up

__all__ = ["ClusterError", "ClusterSpec", "daemon_pids", "default_dir", "down", "is_up", "status", "up"]
