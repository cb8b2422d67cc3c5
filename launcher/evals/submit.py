"""The eval jobs' submission (docs/evals.md): one eval job per evaluated step and key, once that step's checkpoint is
complete, never by a training rank; by the run's supervisor (--eval_tasks: every multiple of --eval_every and the
last step) or by `python -m launcher.jobs evaluate` (steps already on disk). Standard library only.

Once per step and key, across restarts in the allocation, requeues, a second launch of the run and `jobs evaluate`:
the step is claimed first (its submission record created exclusively, launcher/evals/record.py), then sbatch, then
the record names the job. A kill between the claim and the record leaves "submitting": whoever finds it asks Slurm
for a job of the step's name (one query, only then) and takes it for the step's where there is one; else where the
eval job wrote a result, it ran; else it is submitted. An eval job Slurm says ended without writing its end is
recorded "lost" (its step is then no longer owed an eval).

Everything here acts through a `Queue` (the supervisor's Effects, or the launcher's Slurm client): sbatch and squeue
are time-limited there, a refusal is recorded ("refused", with sbatch's words) and said, and nothing raises into the
supervisor: training goes on.
"""

from __future__ import annotations

import subprocess
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.evals import record
from launcher.evals.settings import EvalSettings
from launcher.node.job import Job


class Queue(Protocol):
    """What a submitter does to Slurm (and says in its log)."""

    def say(self, name: str, **fields: object) -> None: ...
    def sbatch(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]: ...
    def jobs_named(self, name: str) -> list[str] | None: ...  # None: Slurm did not answer
    def jobs_alive(self, jobs: Iterable[str]) -> Mapping[str, bool | None]: ...  # None: Slurm cannot say


def first_words(text: str) -> str:
    return " ".join(text.split())[:300] or "no answer"


@dataclass(frozen=True)
class Submission:
    """What became of a step: its eval job (submitted now or before), or why not."""

    step: int
    job: str = ""
    why: str = ""  # sbatch's refusal, or why nothing was asked
    new: bool = False  # submitted, or refused, by this call
    retry: bool = False  # unsettled: asked again at the next look

    @property
    def submitted(self) -> bool:
        return bool(self.job)


def submit(job: Job, settings: EvalSettings, step: int, by: str, queue: Queue,
           options: Sequence[str] = (), again: bool = False) -> Submission:  # fmt: skip
    """The step's eval job for `settings`, submitted unless its record says it was (the module's docstring); `by`:
    who submits (the training job, or "jobs evaluate"); `options`: sbatch's, before the script (a partition, GPUs,
    a time limit other than the script's); `again`: a step whose eval failed, was refused or lost is submitted
    anew (its submission claimed again; the new eval job writes its result over the old). Never raises for
    Slurm's sake."""
    root, key = job.checkpoints, settings.key
    fields = {"by": by, "bundle": str(job.bundle), "settings": settings.to_dict()}
    found = record.submission(root, step, key)
    if found is not None and again and found.get("state") != "submitting" and failed(found):
        found = record.note_submission(root, step, key, state="submitting", again=True, job="", **fields)
        found = {**found, "fresh": True}
    if found is None:
        if not record.claim(root, step, key, **fields):
            return Submission(step, why="claimed by another submitter", retry=True)
    elif found.get("fresh"):
        pass  # claimed again (`again`): submitted below
    elif found.get("state") == "submitting":  # a kill (or a timeout) between the claim and the record
        named = queue.jobs_named(job.eval_name(step))
        if named is None:
            return Submission(step, why="Slurm did not say whether it was submitted", retry=True)
        ran = record.result_of(found)
        if named or ran is not None:
            eval_job = named[-1] if named else str(ran.get("job") or "") if ran else ""
            record.note_submission(root, step, key, state="submitted", job=eval_job, log=str(job.eval_log(step)))
            return Submission(step, job=eval_job)
    else:
        return Submission(step, job=str(found.get("job") or ""), why=str(found.get("cause") or found.get("state")))
    log = job.eval_log(step)
    argv = ["sbatch", "--parsable", f"--job-name={job.eval_name(step)}", f"--output={log}", *options,
            str(job.file(P.EVAL_SCRIPT)), str(step), key]  # fmt: skip
    out = queue.sbatch(argv)
    eval_job = out.stdout.strip().split(";")[0]
    if out.returncode in (124, 127) and not eval_job.isdigit():  # not answered in time, or not run: unsettled
        return Submission(step, why=f"sbatch did not answer ({first_words(out.stderr)})", retry=True)
    if out.returncode != 0 or not eval_job.isdigit():
        why = f"sbatch refused it: {first_words(out.stderr or out.stdout)}"
        record.note_submission(root, step, key, state="refused", cause=why, **fields)
        return Submission(step, why=why, new=True)
    record.note_submission(root, step, key, state="submitted", job=eval_job, log=str(log), **fields)
    return Submission(step, job=eval_job, new=True)


def failed(sub: Mapping) -> bool:
    """Whether a submission's eval ended without scores: it was refused or lost, or its result failed after it was
    submitted (a result older than the submission is that of the eval job before an `again`)."""
    res = record.result_of(sub)
    if sub.get("state") in record.SETTLED_SUBMISSIONS:
        return True
    return res is not None and res.get("state") == "failed" and float(res.get("ended") or 0) >= float(
        sub.get("time") or 0)  # fmt: skip


def lost(root: Path, queue: Queue) -> list[dict]:
    """The submitted eval jobs Slurm says have ended without writing their end (killed outright, or before they
    started), each recorded "lost" (its step owed no more): one query for them all, only where there are some."""
    pending = {where: sub for where, sub in record.submissions(root).items() if sub.get("state") == "submitted"
               and sub.get("job") and not record.settled(sub, record.result_of(sub))}  # fmt: skip
    if not pending:
        return []
    alive = queue.jobs_alive({str(sub["job"]) for sub in pending.values()})
    gone = []
    for (step, key), sub in pending.items():
        if alive.get(str(sub["job"])) is False and not record.settled(sub, res := record.result_of(sub)):
            state = (res or {}).get("state")
            cause = f"eval job {sub['job']} ended" + (f" while {state}" if state else " before it started") + \
                " without writing its end (killed outright: its time limit, its memory, a node's failure)"  # fmt: skip
            gone.append(record.note_submission(root, step, key, state="lost", cause=cause))
    return gone


class Evals:
    """The supervisor's eval submissions (--eval_tasks): `on_checkpoint` after each new complete checkpoint (the
    supervisor's after-checkpoint look, launcher/node/supervisor/followers.py) and as the attempt ends."""

    def __init__(self, job: Job, slurm_job: str, queue: Queue) -> None:
        assert job.evals is not None, "only with --eval_tasks"
        self.job, self.settings, self.slurm_job, self.queue = job, job.evals, slurm_job, queue
        self.done: set[int] = set()  # steps this process has settled (submitted, found submitted, or refused)

    def on_checkpoint(self) -> list[Submission]:
        """Every complete evaluated step not yet settled gets its eval job; the lost ones recorded. Said in the log;
        never raises."""
        try:
            return self._on_checkpoint()
        except Exception as e:  # noqa: BLE001  a bug here must not end training: its traceback, and the line
            traceback.print_exc()
            self.queue.say("eval_not_submitted", step="?", why=f"{type(e).__name__}: {e}")
            return []

    def _on_checkpoint(self) -> list[Submission]:
        made = []
        for step in sorted(set(ckpt.complete_steps(self.job.checkpoints)) - self.done):
            if not self.job.evaluated(step):
                continue
            done = submit(self.job, self.settings, step, self.slurm_job, self.queue)
            if done.new and done.submitted:
                self.queue.say("eval_submitted", step=step, eval_job=done.job, tasks=self.settings.said,
                               log=self.job.eval_log(step))  # fmt: skip
            elif done.new:
                self.queue.say("eval_not_submitted", step=step, why=done.why)
            if not done.retry:
                self.done.add(step)
            made.append(done)
        for sub in lost(self.job.checkpoints, self.queue):
            self.queue.say("eval_lost", step=sub["step"], eval_job=sub["job"], why=sub["cause"])
        return made
