"""The project's own Slurm cluster on one machine, for the demo and the tests (never imported by the launcher or
the job): its shape and config files (`config`), its daemons (`daemons`), the demo's data and tokenizer
(`demo_data`), and the command line (`python -m launcher.localcluster`)."""

from launcher.localcluster.daemons import ClusterError, daemon_pids, down, is_up, status, up
from launcher.localcluster.slurm_conf import ClusterSpec, default_dir

__all__ = ["ClusterError", "ClusterSpec", "daemon_pids", "default_dir", "down", "is_up", "status", "up"]
