"""The resolved run: every flag's final value, and what resolution read from them once (the typed dataset value,
the later data stages, the dependency, the extra environment), with the values derived from them. Built by
`launcher.config.resolve`; read by the checks, the performance model, the renderer and the summary.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config import runtime
from launcher.config.dependency_syntax import Dependency
from launcher.config.facts import NOT_ASKED, ClusterFacts
from launcher.config.flags import GROUPS, LaunchArgs
from launcher.nanotron_config import dialect, mixture, schema
from launcher.nanotron_config.gpus import GpuChoice
from launcher.nanotron_config.nanoset import TokenizedFolder
from launcher.nanotron_config.parallel import ParallelDims
from launcher.nanotron_config.schema import get_path
from launcher.nanotron_config.shape import ModelShape, from_model_config
from launcher.nanotron_config.stages import Stage


@dataclass(frozen=True)
class RunSpec:
    """A fully resolved launch: every flag has its final value; derived values beside them."""

    args: LaunchArgs
    tie_word_embeddings: bool
    extra_env: dict[str, str]
    tokenizer_vocab: int | None  # the local tokenizer's vocabulary size, when it can be read
    base_config: dict  # the nanotron YAML the generated config starts from
    base_config_path: str
    gpu: GpuChoice  # what the memory check and the planner assume (the flags', else the cluster's facts')
    adapted: dict[str, str] = field(default_factory=dict)  # defaults changed to suit the run: flag -> what it became
    dialect: dialect.Choice = dialect.Choice("0.4", "")  # the nanotron config dialect written, and why
    # What resolution read once from the flags' text (the text stays in `args`, local paths made absolute):
    datasets: mixture.Datasets = None  # --dataset: a name, a mixture {name: weight}, or None (random tokens)
    stages: tuple[Stage, ...] = ()  # --data_stages: the later data stages (none: a --config's, if any, stand)
    dependency: Dependency | None = None  # --dependency (None: none, or one that does not parse)
    # The tokenized folders the stages read (nanotron main's Nanosets), by absolute path: each as it read whole, or
    # None where it did not (resolution said why)
    nanosets: dict[str, TokenizedFolder | None] = field(default_factory=dict)
    # Where the run's checkpoints go where not <checkpoints_path>/<run_name>: the directory a rerun resumes
    # (`launcher.runs.rerun`), or a --config's checkpoints.checkpoints_path (nanotron's: the run's folder itself); and
    # whether a rerun starts in a directory of its own even where the run's holds no checkpoint yet.
    checkpoints: Path | None = None
    fresh: bool = False
    # `--requeue=expedite` where the job requeues: the cluster enables it and its Slurm is 25.11+ (the cluster's facts,
    # `scontrol show config` asked once before resolution; a dry run asks nothing: a plain --requeue)
    expedited_requeue: bool = False
    facts: ClusterFacts = NOT_ASKED  # what the cluster said of itself before resolution (nothing in a dry run)

    @functools.cached_property
    def config(self) -> dict:
        """The run's canonical nanotron config (0.4's paths, main's keys kept), built once for this spec: the checks,
        the figures and each dialect's file (`schema.written`) read it. (A spec replaced by `dataclasses.replace`
        builds its own.)"""
        return schema.build_config(
            self.flag_values(), self.base_config, str(self.checkpoints_dir), self.datasets, self.stages, self.nanosets
        )

    @property
    def checkpoints_dir(self) -> Path:
        """The run's checkpoints: <checkpoints_path>/<run_name>, or the directory a rerun resumes or a --config names
        (a fresh start's bundle may get its own)."""
        return self.checkpoints or Path(self.args.paths.checkpoints_path) / self.args.run_name

    @property
    def padded_vocab(self) -> int:
        """The vocabulary nanotron builds: padded to a multiple of tp x make_vocab_size_divisible_by."""
        step = (self.args.parallelism.tp or 1) * int(schema.get_path(self.base_config, schema.VOCAB_MULTIPLE) or 1)
        return -(-(self.args.model.vocab_size or 0) // step) * step

    @property
    def rendezvous(self) -> tuple[str, str]:
        """(the rendezvous torchrun uses: c10d or static, why): --rdzv_backend, auto by the node count."""
        return runtime.choose(self.args.job.rdzv_backend, self.args.slurm.nodes)

    @property
    def world_size(self) -> int:
        return self.args.slurm.nodes * self.args.slurm.gpus_per_node

    @property
    def dims(self) -> ParallelDims:
        """The parallel layout the flags make: dp (1 where it cannot be derived, as tp or pp is not positive: said
        there), tp, pp, cp on the job's nodes x GPUs."""
        p, s = self.args.parallelism, self.args.slurm
        dp = p.dp if p.dp is not None else 1
        cp = p.cp if p.cp > 0 else 1
        return ParallelDims(self.world_size, dp, p.tp or 0, p.pp or 0, self.args.training.grad_accum_steps, cp,
                            nodes=s.nodes, gpus_per_node=s.gpus_per_node)  # fmt: skip

    @property
    def shape(self) -> ModelShape:
        """The model shape: the resolved flags (a preset defines them all), the base or --config YAML's other
        model settings."""
        m = self.args.model
        sizes = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "model_size"}
        assert all(v is not None for v in sizes.values()), f"unresolved model shape {m}"
        model_config = get_path(self.base_config, ("model", "model_config")) or {}
        return from_model_config(model_config, **sizes, tie_word_embeddings=self.tie_word_embeddings)

    def flag_values(self) -> dict[str, Any]:
        """Every flag's resolved value by flag name, and the values derived beside the flags that the nanotron
        config carries (`tie_word_embeddings`): what `schema.build_config` writes (with `datasets` and `stages`)."""
        values: dict[str, Any] = {"run_name": self.args.run_name, "tie_word_embeddings": self.tie_word_embeddings}
        for name in GROUPS:
            group = getattr(self.args, name)
            values.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group)})
        return values
