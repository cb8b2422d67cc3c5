"""Stop requests: SIGTERM, SIGUSR1, or the bundle's `stop-requested` (LAUNCHER_BUNDLE's) appearing on the shared disk.

Each asks the job to save a checkpoint at the next step boundary and exit 0. SIGTERM is Slurm's notice to the
training processes of a preemption (within its grace time), a cancel, or the time limit; the stop file is the job's
supervisor's word for the time-limit warning (USR1 to the supervisor). The node step starts torchrun with SIGTERM
blocked so that torchrun does not stop the processes itself; a StopRequest unblocks it once it can handle it. The
ranks agree every step with an all_reduce(MAX) of their flags; only rank 0 looks for the stop file, every few
seconds (at 32,000 ranks, one metadata request where there were 32,000 a step). The request is consumed: rank 0
removes the stop file once the checkpoint is saved, so the requeued job trains on.

The outcome is explicit: rank 0 writes the bundle's `outcome` as training ends, "finished STEP" or "stopped STEP"
(at a checkpoint before the last step). The supervisor requeues a stopped run and never a finished one, so a
request that comes as the run ends (the time-limit warning landing during the last steps) changes nothing.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from launcher import atomic
from launcher import protocol as P
from launcher.train.environment import JobEnvironment

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

STOP_MESSAGE = P.STOP_MESSAGE
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


# On a shared filesystem every look is a metadata request to its server: rank 0 alone looks for the stop file, at
# most every `JobEnvironment.stop_file_every` seconds (the time-limit warning comes minutes ahead), and rank 0
# rewrites the progress file at most this often (the hang watchdog allows at least 10 s); a change of phase
# ("saving") is written at once.
PROGRESS_EVERY_S = 5.0


class StopRequest:
    """Watches for a stop request on this rank; `agreed()` says whether any rank has one."""

    def __init__(self, device: torch.device, job: JobEnvironment):
        self.device, self.signalled = device, False
        self.path, self.every = job.stop_file, job.stop_file_every
        self.looked = float("-inf")  # when rank 0 last looked for the stop file
        self.previous_handlers: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self.previous_handlers = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))  # a notice that came meanwhile arrives now

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def agreed(self) -> bool:
        """Whether any rank has a request (a collective: every rank calls it at every step boundary)."""
        requested = self.signalled or self._file_seen()
        flag = torch.tensor(float(requested), device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _file_seen(self) -> bool:
        """Rank 0 only, at most every `every` seconds: whether the stop file is there (the all_reduce tells all)."""
        now = time.monotonic()
        if self.path is None or dist.get_rank() != 0 or now - self.looked < self.every:
            return False
        self.looked = now
        return os.path.exists(self.path)

    def consume(self, is_main: bool) -> None:
        """Remove the stop file (rank 0 only) once the checkpoint is saved, so the requeued job trains on."""
        if is_main and self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    def close(self) -> None:
        """Put back the handlers that were there before."""
        for sig, handler in self.previous_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _tell(job: JobEnvironment, path: str | None, text: str) -> None:
    """Replace the protocol's file at `path` with `text`, whole (rank 0 only; no file, no word)."""
    if job.is_main and path:
        atomic.replace(Path(path), text)


def report_outcome(job: JobEnvironment, finished: bool, step: int) -> None:
    """Tell the supervisor how training ended (rank 0 only): "finished STEP" or "stopped STEP"."""
    _tell(job, job.outcome_file, P.OUTCOME_FORMAT.format(word=P.FINISHED if finished else P.STOPPED, step=step))


_last_progress: list = [None, float("-inf")]  # the phase last written, and when


def report_progress(job: JobEnvironment, step: int, phase: str = "step") -> None:
    """Tell the hang watchdog where training stands (rank 0 only): "STEP UNIXTIME PHASE", replaced whole, at most
    every PROGRESS_EVERY_S unless the phase changes. `phase` is "step" after a step, "saving" while a checkpoint
    is written."""
    now = time.monotonic()
    if not job.is_main or (phase == _last_progress[0] and now - _last_progress[1] < PROGRESS_EVERY_S):
        return
    _last_progress[:] = [phase, now]
    _tell(job, job.progress_file, P.PROGRESS_FORMAT.format(step=step, time=time.time(), phase=phase))


def grace_warning(job: JobEnvironment, save_s: float, step_s: float) -> str | None:
    """A warning when a time-limit save would not fit the notice Slurm gives (`LAUNCHER_SIGNAL_GRACE` seconds
    before the limit): the step under way, then the save, with a fifth to spare. None when it fits."""
    grace = job.signal_grace
    need = save_s + step_s
    if not grace or need * 1.25 <= grace:
        return None
    return (
        f"warning: a checkpoint took {save_s:.0f} s and a step {step_s:.1f} s: a time-limit save needs ~{need:.0f} s "
        f"of the {grace:.0f} s warning Slurm gives; launch again with --signal_grace {int(need * 1.5) + 30} or the "
        f"time-limit save may be cut short (the run then resumes from the save before)"
    )


def deaf_workers(loader: DataLoader) -> None:
    """Leave Slurm's SIGTERM to the training process, not to `loader`'s workers (their init, and how they start).

    Slurm's notice reaches every process of the job step, and torch's loader workers die of a SIGTERM that is not
    their training process's: the rank then failed with "DataLoader worker ... is killed by signal: Terminated"
    instead of saving (seen on the local cluster with nanotron's one loading worker). Each worker has SIGTERM
    blocked and a thread takes each one: its training process's (torch's own shutdown of a stuck worker) ends the
    worker, as torch's handler would; any other sender's is left to the training process. Slurm's SIGKILL still
    ends it. The block is set as the worker is forked, not in its init alone: a library's at-fork hook starts
    threads in the child before the init runs (wandb's OpenTelemetry export threads, in a run that logs to W&B
    online), and a thread that had SIGTERM open took Slurm's notice and ended the worker."""
    if loader.num_workers == 0:
        return
    loader.worker_init_fn = _deaf_init(loader.worker_init_fn)
    if (loader.multiprocessing_context or multiprocessing.get_context()).get_start_method() == "fork":
        loader.multiprocessing_context = _ForkContextWithTheNoticeBlocked()  # spawn's and forkserver's children
        # run no at-fork hook of this process's


class _ForkWithTheNoticeBlocked(multiprocessing.context.ForkProcess):
    """A forked process whose every thread starts with SIGTERM blocked: the thread that forks it blocks SIGTERM
    around the fork (the child inherits its mask, and its at-fork hooks' threads theirs), then has its own back."""

    def start(self) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a notice that came meanwhile arrives now


class _ForkContextWithTheNoticeBlocked(multiprocessing.context.ForkContext):
    Process = _ForkWithTheNoticeBlocked


def _deaf_init(init: Callable[[int], None] | None) -> Callable[[int], None]:
    """A loader worker's init: SIGTERM blocked (where the worker did not start so), a thread that ends the worker on
    its training process's SIGTERM alone, then `init`."""

    def init_deaf(worker_id: int) -> None:
        parent = os.getppid()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        def answer_only_the_parent() -> None:
            while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
                pass
            os._exit(0)  # what torch's worker handler does on its parent's SIGTERM

        threading.Thread(target=answer_only_the_parent, name="sigterm-from-parent", daemon=True).start()
        if init is not None:
            init(worker_id)

    return init_deaf
