"""What the cluster says of itself, as data for resolution: the GPUs and CPUs of the partition's nodes, whether it
takes `--requeue=expedite`, its Slurm release. Asked once, before resolution (`launcher.slurm.facts.ask`: one
`sinfo`, one `scontrol show config`); a dry run asks nothing. Resolution reads them here, purely: the GPU the memory
check plans for where no flag names one, the CPUs of a node where --cpus_per_node is not given, the requeue mode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher.config.flags import SlurmArgs
from launcher.nanotron_config import gpus


@dataclass(frozen=True)
class ClusterFacts:
    """The cluster's answers (`asked` False: a dry run, or Slurm did not answer; nothing is known)."""

    asked: bool = False
    gpu_types: tuple[str | None, ...] = ()  # the GRES types of the partition's GPUs (None: a GPU without a type)
    node_shapes: tuple[tuple[int, int], ...] = ()  # (CPUs, GPUs) of each kind of node in the partition
    expedites_requeue: bool = False  # Slurm 25.11+ with SlurmctldParameters=enable_expedited_requeue
    release: str = ""  # Slurm's release ("24.11.1"), "" where it does not say


NOT_ASKED = ClusterFacts()


def gpu_choice(slurm: SlurmArgs, facts: ClusterFacts, flagged: gpus.GpuChoice) -> gpus.GpuChoice:
    """The GPU the memory check plans for: the flags' (`flagged`) where --gpu_type or --gpu_memory_gb says, else the
    one sinfo names for the partition, else the default (a type this project does not know is assumed, and said)."""
    if slurm.gpu_type is not None or slurm.gpu_memory_gb is not None or not facts.gpu_types:
        return flagged
    choice = gpus.from_gres(list(facts.gpu_types))
    if choice is not None:
        return choice
    named = sorted({t for t in facts.gpu_types if t})
    if not named:
        return flagged
    origin = f"sinfo says gpu:{', gpu:'.join(named)}, not in configs/gpus.yaml: assumed; give --gpu_type"
    return dataclasses.replace(gpus.default_choice(), origin=origin)


def cpus_per_node(slurm: SlurmArgs, facts: ClusterFacts) -> tuple[int, str]:
    """--cpus_per_node where not given: the partition's nodes' CPUs in proportion to the GPUs the job asks of them
    (all of them for a whole node), else one per process; and why. Without it, where the cluster sets no default
    (DefCpuPerGPU), every process of a node and its data loaders share one CPU."""
    cpus, why = max(slurm.gpus_per_node, 1), "one per process"
    if not facts.asked:
        return cpus, why + " (a dry run asks Slurm nothing; launched, it asks the partition's nodes)"
    shapes = facts.node_shapes
    shares = [c * min(slurm.gpus_per_node, g) // g if g else c for c, g in shapes]
    if shares and min(shares) >= cpus:
        node_cpus, node_gpus = min(shapes)
        return min(shares), f"the partition's nodes have {node_cpus} CPUs" + (
            f" for {node_gpus} GPUs" if node_gpus else ""
        )
    return cpus, why
