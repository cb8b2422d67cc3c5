"""The eval jobs' settings as the job's supervisor reads them (job.json's `evals`, launcher/node/job.py's `Job`):
which steps are evaluated, the eval job's script, name and log. Standard library only (the supervisor's side)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EvalSettings:
    """What the supervisor needs to submit a run's eval jobs (the job's settings hold it: job.json's `evals`)."""

    script: str  # the bundle's eval job script (protocol.EVAL_SCRIPT); its one argument: the step
    bundle: str  # the run's bundle directory
    checkpoints: str  # the run's checkpoints folder
    run_name: str
    log: str  # the eval job's log, with "{step}" for the step
    every: int  # --eval_every (0: the last step only)
    last_step: int  # --train_steps
    tasks: str  # the tasks, as the log's line names them

    def evaluated(self, step: int) -> bool:
        """Whether `step`'s checkpoint is evaluated: a multiple of --eval_every, or the run's last step."""
        return step > 0 and (step == self.last_step or (self.every > 0 and step % self.every == 0))

    def job_name(self, step: int) -> str:
        return f"{self.run_name}-eval-{step}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> EvalSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(data)
        if missing:
            raise ValueError(f"the eval settings lack {', '.join(sorted(missing))}")
        return cls(**{name: data[name] for name in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EvalSettings:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the eval settings are not a JSON object")
        return cls.from_dict(data)
