"""The cluster's facts, asked once before resolution (`launcher.config.facts.ClusterFacts`): one `sinfo` (the
partition's GPU types and its nodes' CPUs and GPUs) and one `scontrol show config` (Slurm's release, whether it takes
`--requeue=expedite`). A dry run asks nothing; where Slurm does not answer, nothing is known (submitting says why)."""

from __future__ import annotations

from launcher.config.facts import NOT_ASKED, ClusterFacts
from launcher.config.flags import LaunchArgs
from launcher.errors import SlurmUnavailable
from launcher.slurm import client, releases


def ask(args: LaunchArgs) -> ClusterFacts:
    """What the cluster says of the partition the run asks for; NOT_ASKED on a dry run or where Slurm is away."""
    if args.execution.dry_run:
        return NOT_ASKED
    try:
        types, shapes = client.partition_nodes(args.slurm.partition)
        config = client.cluster_config()
    except SlurmUnavailable:
        return NOT_ASKED
    return ClusterFacts(
        asked=True,
        gpu_types=tuple(types),
        node_shapes=tuple(shapes),
        expedites_requeue=releases.expedites_requeue(config),
        release=config.get("SLURM_VERSION", ""),
    )
