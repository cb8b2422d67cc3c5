"""The eval jobs of a run (--eval_tasks, docs/evals.md), submitted by the job's supervisor: one per evaluated step,
once that step's checkpoint is complete, never by a training rank. Standard library only (the supervisor's side).

Which steps: every multiple of --eval_every, and the run's last step (only the last without --eval_every).

Once per step, across restarts in the allocation, requeues and a second launch of the run: the record is by step
under the run's checkpoints folder (`.evals/<step>.json`), which every job and every launch of the run shares (a
second launch writes a new bundle but resumes the same checkpoints; the one-writer lock lives there too). A step is
claimed first (the file created exclusively, state "submitting"), then `sbatch`, then the record names the job
("submitted"). A kill between the claim and the record leaves "submitting": whoever finds it asks Slurm for a job
of the step's name (`squeue --name`, one query, only then) and takes it for the step's where there is one, else
submits. A job that started has said so in the record itself ("running"), so Slurm forgetting a finished job does
not make a second one. The eval job writes its end there too ("done", "failed" with the cause).

Nothing here raises into the supervisor: sbatch is time-limited, its refusal is recorded ("refused", with sbatch's
words) and said in the log, and training goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher import checkpoint_layout as layout
from launcher import protocol as P
from launcher.evals.record import claim, read_record, write_record
from launcher.evals.settings import EvalSettings

SBATCH_TIMEOUT_S = 120  # sbatch's answer (it retries by itself for a while when the queue is full)
SQUEUE_TIMEOUT_S = 60
LOOK_EVERY_S = 2.0  # while the step runs: how often the pointers are looked at (one stat each)
OPEN = ("submitting", "submitted", "running")  # a step whose eval job may still run
Runner = Callable[..., subprocess.CompletedProcess]


# -- Slurm


def sbatch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch runs in: the training job's, without Slurm's own variables of that job (sbatch would
    read some as the eval job's options); SLURM_CONF stays."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def _first_words(text: str) -> str:
    return " ".join(text.split())[:300] or "no answer"


def jobs_named(name: str, run: Runner = subprocess.run) -> list[str] | None:
    """The jobs of that name Slurm knows (any state it still holds); None where squeue does not answer."""
    try:
        out = run(["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"], capture_output=True, text=True,
                  timeout=SQUEUE_TIMEOUT_S, env=sbatch_env(os.environ))  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [word for word in out.stdout.split() if word.replace("_", "").isdigit()]


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


def submit(s: EvalSettings, step: int, by: str, run: Runner = subprocess.run) -> Submission:
    """The step's eval job, submitted unless its record says it was (see the module's docstring); `by`: the training
    job that submits. Never raises for Slurm's sake."""
    root = Path(s.checkpoints)
    found = read_record(root, step)
    if found is None:
        if not claim(root, step, by=by, bundle=s.bundle):
            return Submission(step, why="claimed by another look", retry=True)
    elif found.get("state") == "submitting":  # a kill (or a timeout) between the claim and the record
        named = jobs_named(s.job_name(step), run)
        if named is None:
            return Submission(step, why="Slurm did not say whether it was submitted", retry=True)
        if named:
            write_record(root, step, state="submitted", job=named[-1], by=by, bundle=s.bundle)
            _lease(root, step, named[-1])
            return Submission(step, job=named[-1])
        write_record(root, step, state="submitting", by=by, bundle=s.bundle)
    else:
        return Submission(step, job=str(found.get("job") or ""), why=str(found.get("cause") or found.get("state")))
    log = s.log.replace("{step}", str(step))
    argv = ["sbatch", "--parsable", f"--job-name={s.job_name(step)}", f"--output={log}", s.script, str(step)]
    held = _lease(root, step, by)  # the step held from here: retention leaves it for the eval job
    try:
        out = run(argv, capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S, env=sbatch_env(os.environ))
    except (OSError, subprocess.TimeoutExpired) as e:  # (the hold stays, in this job's name: it may be submitted)
        return Submission(step, why=f"sbatch did not answer ({type(e).__name__})", retry=True)
    job = out.stdout.strip().split(";")[0]
    if out.returncode == 0 and job.isdigit():
        _lease(root, step, job)  # the eval job's, until it ends (it drops it; retention drops a dead job's)
    if held is not None:
        layout.drop_lease(held)
    if out.returncode != 0 or not job.isdigit():
        why = f"sbatch refused it: {_first_words(out.stderr or out.stdout)}"
        write_record(root, step, state="refused", cause=why, by=by, bundle=s.bundle)
        return Submission(step, why=why, new=True)
    write_record(root, step, state="submitted", job=job, by=by, bundle=s.bundle, log=log)
    return Submission(step, job=job, new=True)


def _lease(root: Path, step: int, job: str) -> layout.Lease | None:
    """A lease on `step` in the name of Slurm job `job` (None where it cannot be written: the step is then held
    only once the eval job runs)."""
    try:
        return layout.take_lease(root, step, "eval", env={"SLURM_JOB_ID": job})
    except OSError:
        return None


# -- the supervisor's side


def say_line(name: str, **fields: object) -> None:
    """A contract line in the job's log, whole, in one write (stamped as the supervisor's own lines)."""
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    sys.stdout.write(P.line(name, stamp, **fields) + "\n")
    sys.stdout.flush()


class Evals:
    """The supervisor's eval submissions: `poll` between the step's polls, `on_checkpoint` for a new complete
    checkpoint (and as the attempt ends)."""

    def __init__(self, settings: EvalSettings, job: str, say: Callable[..., None] = say_line,
                 run: Runner = subprocess.run, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.s, self.job, self.say, self.run, self.clock = settings, job, say, run, clock
        self.root = Path(settings.checkpoints)
        self.stamp: tuple | None = None
        self.next_look = float("-inf")
        self.thread: threading.Thread | None = None
        self.done: set[int] = set()  # steps this process has settled (submitted, found submitted, or refused)

    def poll(self, wait: bool = False) -> None:
        """Where a pointer moved since the last look (looked at every LOOK_EVERY_S): the new steps' submissions, in
        a thread while the step runs; at once (after one in flight) where `wait` (the step has ended)."""
        if self.thread is not None and self.thread.is_alive():
            if not wait:
                return
            self.thread.join()
        now = self.clock()
        if not wait and now < self.next_look:
            return
        self.next_look = now + LOOK_EVERY_S
        stamp = layout.pointer_stamp(self.root)
        if stamp == self.stamp and not wait:
            return
        self.stamp = stamp
        if wait:
            self.on_checkpoint()
        else:
            self.thread = threading.Thread(target=self.on_checkpoint, daemon=True, name="evals")
            self.thread.start()

    def on_checkpoint(self, step: int | None = None) -> list[Submission]:
        """A new complete checkpoint (`step`, where the caller knows it), or the attempt's end: every complete
        evaluated step not yet settled gets its eval job. Said in the log; never raises."""
        try:
            return self._on_checkpoint(step)
        except Exception as e:  # noqa: BLE001  a bug here must not end training: its traceback, and the line
            traceback.print_exc()
            self.say("eval_not_submitted", step=step if step is not None else "?", why=f"{type(e).__name__}: {e}")
            return []

    def _on_checkpoint(self, step: int | None) -> list[Submission]:
        complete = set(layout.complete_steps(self.root))
        if step is not None and layout.engine_of(layout.step_dir(self.root, step)) is not None:
            complete.add(step)
        made = []
        for candidate in sorted(complete - self.done):
            if not self.s.evaluated(candidate):
                continue
            done = submit(self.s, candidate, self.job, self.run)
            if done.new and done.submitted:
                log = self.s.log.replace("{step}", str(candidate))
                self.say("eval_submitted", step=candidate, eval_job=done.job, tasks=self.s.tasks, log=log)
            elif done.new:
                self.say("eval_not_submitted", step=candidate, why=done.why)
            if not done.retry:
                self.done.add(candidate)
            made.append(done)
        return made
