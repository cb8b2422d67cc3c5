"""Where Slurm releases (22.05 to 26.05) say or take things differently, and how the launcher reads them the same
on each (docs/slurm-versions.md; each difference reproduced on the real releases in tests/test_slurm_versions.py).

- An exit code above 128: sacct before 25.11 subtracts 128 (a batch script's `exit 137` reads `9:0`, like an
  `exit 9`), sacct from 25.11, scontrol and squeue on every release say `137:0`. The job's log says the code it
  ended with (protocol's `attempt_ended` line): `as_logged` takes it where sacct's is that code less 128.
- `--gres=gpu:N` beside `--gpus-per-node`: refused by sbatch and srun from 26.05 ("mutually exclusive"), taken
  together before. The launcher asks for GPUs with `--gpus-per-node` only; a `gpu` GRES in the user's
  environment (SBATCH_GRES) would add the second request: `gres_problems` says so before submitting, on every
  release.
- `--requeue=expedite` (25.11): on a node failure the job is eligible at once, at the top of the queue, its old
  nodes held for it (a plain requeue waits cred_expire + 1 s, 121 s by default). Only where SlurmctldParameters
  has enable_expedited_requeue (else sbatch refuses the job); `expedites_requeue` reads it from `scontrol show
  config` at submission, and the batch script asks for it where the job requeues.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from launcher import protocol as P
from launcher.problems import Problem
from launcher.slurm.parse import GRES_ITEM, JobState

ENDED = P.pattern("attempt_ended")
SACCT_SUBTRACTS = 128  # what sacct before 25.11 takes from an exit code above it


def logged_exit_code(job_id: str, log_text: str) -> int | None:
    """The exit code the batch script said it ended with, in the last `attempt_ended` line of `job_id` (None where
    the log has none: an attempt killed before its EXIT trap ran, a log cut short)."""
    codes = [int(m["code"]) for line in log_text.splitlines() if (m := ENDED.search(line)) and m["job"] == job_id]
    return codes[-1] if codes else None


def as_logged(state: JobState, log_text: str) -> JobState:
    """`state` with the exit code the job's log says, where Slurm's is that code less 128 (sacct before 25.11):
    the same code, and so the same verdict, whichever release and command it came from. Unchanged otherwise."""
    logged = logged_exit_code(state.job_id, log_text)
    if logged is None or state.exit_code is None or state.signal or logged < SACCT_SUBTRACTS:
        return state
    if state.exit_code != logged - SACCT_SUBTRACTS:
        return state
    return dataclasses.replace(state, exit_code=logged)


EXPEDITE_SINCE = (25, 11)
EXPEDITE_PARAMETER = "enable_expedited_requeue"


def release_of(version: str) -> tuple[int, int] | None:
    """ "26.05.5" (or "slurm-wlm 26.05.5") -> (26, 5); None where it names none."""
    m = re.search(r"(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2])) if m else None


def expedites_requeue(config: Mapping[str, str]) -> bool:
    """Whether `sbatch --requeue=expedite` may be asked of this cluster (`scontrol show config`, read once at
    submission): its Slurm is 25.11 or newer and SlurmctldParameters enables it. Elsewhere sbatch refuses it
    ("Requested operation not supported on this system"; before 25.11 `--requeue` takes no argument)."""
    release = release_of(config.get("SLURM_VERSION", ""))
    enabled = EXPEDITE_PARAMETER in [
        p.strip().partition("=")[0] for p in config.get("SlurmctldParameters", "").split(",")
    ]
    return enabled and release is not None and release >= EXPEDITE_SINCE


GRES_ENV = ("SBATCH_GRES",)  # sbatch's environment for --gres (SLURM_GRES is srun's, set inside a job: not ours)


def gres_problems(environ: Mapping[str, str]) -> list[Problem]:
    """A `gpu` GRES in sbatch's environment beside the script's `--gpus-per-node`: Slurm 26.05 refuses the job,
    older releases take both requests at once."""
    found = []
    for name in GRES_ENV:
        value = environ.get(name, "")
        gpus = [item for item in GRES_ITEM.split(value) if re.match(r"(gres/)?gpu(:|$)", item.strip())]
        if gpus:
            found.append(
                Problem(
                    "gpus_per_node",
                    f"{name}={value} in the environment asks sbatch for GPUs beside the launcher's --gpus-per-node "
                    "(Slurm 26.05 refuses the two together; older releases take both)",
                    f"unset {name} (or leave its gpu item out): --gpus_per_node asks for the GPUs",
                )
            )
    return found
