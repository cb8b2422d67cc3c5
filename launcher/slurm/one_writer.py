"""One writer per run, checked before the queue: a launch of a run whose job is still pending or running (same
run name, same checkpoints path) is refused, naming the live job and the fix. Two jobs of one run would write the
same checkpoints; the later one's resume would race the earlier one's saves.

A live job counts as this run's when it holds the run's lock (the batch script writes its job id to
`<checkpoints>/.launcher-lock` as it starts) or when its batch script is one of this run's bundles whose manifest
names the same checkpoints. Chaining the launch after it (`--dependency afterany:ID`, or any kind naming it) is the
way to queue one behind the other; `--resume false` gets a checkpoint directory of its own.
"""

from __future__ import annotations

from pathlib import Path

from launcher import checkpoint_layout as ckpt
from launcher.bundle import manifest
from launcher.config.spec import RunSpec
from launcher.problems import Problem
from launcher.slurm import client


def _bundle_checkpoints(configs_path: str, run_name: str, script: str) -> str | None:
    """The checkpoints path a run's batch script trains into, from its bundle's manifest (the script is named by
    the bundle's stamp)."""
    try:
        return str(manifest.load(Path(configs_path) / run_name / Path(script).stem).checkpoints)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def problems(spec: RunSpec) -> list[Problem]:
    """A problem per live job of this run that would write the same checkpoints, unless the launch waits for it."""
    a = spec.args
    if not a.paths.resume:
        return []  # a fresh start gets a checkpoint directory of its own
    checkpoints = spec.checkpoints_dir  # a rerun may resume another run's directory, under another name
    holder = ckpt.lock_holder(checkpoints)
    awaited = {job_id.split("_")[0] for job_id in (spec.dependency.job_ids if spec.dependency else [])}
    out = []
    names = sorted({a.run_name, checkpoints.name})  # the jobs of this run, and of the run whose directory it is
    for job_id, state, script in client.live_jobs(",".join(names)):
        ours = job_id == holder or any(
            _bundle_checkpoints(a.paths.configs_path, name, script) == str(checkpoints) for name in names
        )
        if ours and job_id not in awaited:
            out.append(
                Problem(
                    "run_name",
                    f"job {job_id} is {state} and trains into {checkpoints}; a second job would "
                    "write the same checkpoints",
                    f"queue this one after it with --dependency afterany:{job_id}, cancel it (scancel {job_id}), or "
                    "give another --run_name or --checkpoints_path",
                )
            )
    return out
