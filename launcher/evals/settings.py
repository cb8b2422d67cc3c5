"""--eval_tasks and its flags as the job reads them (job.json's `evals`, in launcher/node/job.py's `Job`): what each
eval job scores and where it runs. Which steps are evaluated, and the eval job's name and log, are the job's
(`Job.evaluated`, `Job.eval_name`, `Job.eval_log`): the run's name, bundle, log and last step are said once, in the
job's settings. Standard library only (the supervisor's side)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EvalSettings:
    """What the eval jobs do: the run's own (--eval_tasks), or those `jobs evaluate` asks for."""

    tasks: tuple[str, ...]  # lm-eval's task, group and tag names
    include: tuple[str, ...] = ()  # folders of task YAMLs lm-eval reads beside its own (a preset's, --eval_include)
    said: str = ""  # the tasks as the job's log names them (a preset by its name)
    every: int = 0  # --eval_every (0: the run's last step only)
    limit: int | None = None  # --eval_limit: the samples a task is scored on (None: all)
    gpus: int = 0  # --eval_gpus (0: the eval job runs on its node's CPUs)
    heldout: str | None = None  # --eval_heldout: the held-out data (None: none)
    partition: str = ""  # the eval job's partition ("": Slurm's default)
    time_limit: str = ""  # the eval job's time limit (HH:MM:SS; "": the partition's)

    def evaluated(self, step: int, last_step: int) -> bool:
        """Whether `step`'s checkpoint is evaluated: a multiple of --eval_every, or the run's last step."""
        return step > 0 and (step == last_step or (self.every > 0 and step % self.every == 0))

    @property
    def key(self) -> str:
        """What is scored, as a short name: the same tasks, task folders, limit and held-out data give the same key
        (a step is evaluated once per key)."""
        what = json.dumps([list(self.tasks), list(self.include), self.limit, self.heldout])
        return hashlib.sha256(what.encode("utf-8")).hexdigest()[:10]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> EvalSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        if unknown := set(data) - names:
            raise ValueError(f"unknown eval settings {', '.join(sorted(unknown))}")
        if "tasks" not in data:
            raise ValueError("the eval settings name no tasks")
        values = dict(data)
        values.update({name: tuple(values[name]) for name in ("tasks", "include") if name in values})
        return cls(**values)
