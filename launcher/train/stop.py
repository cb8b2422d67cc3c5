"""Stop requests: SIGUSR1, or the file named by `LAUNCHER_STOP_FILE` appearing on the shared filesystem.

Either asks the job to save a checkpoint at the next step boundary and exit 0, so Slurm can requeue it. The
ranks agree every step with an all_reduce(MAX) of their flags. The request is consumed: rank 0 removes the
stop file once the checkpoint is saved, so the requeued job trains on.

The outcome is explicit: rank 0 writes `LAUNCHER_OUTCOME_FILE` as training ends, "finished STEP" or "stopped STEP"
(at a checkpoint before the last step). The batch script requeues a stopped run and never a finished one, so a
request that comes as the run ends (the time-limit warning landing during the last steps) changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import torch
import torch.distributed as dist

STOP_MESSAGE = "preempted: checkpoint saved at step {step}; exiting so the job can be requeued"


class StopRequest:
    """Watches for a stop request on this rank; `agreed()` says whether any rank has one."""

    def __init__(self, device: torch.device):
        self.device, self.signalled = device, False
        self.path = os.environ.get("LAUNCHER_STOP_FILE") or None
        self.previous_handler = None
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self.previous_handler = signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def agreed(self) -> bool:
        """Whether any rank has a request (a collective: every rank calls it at every step boundary)."""
        requested = self.signalled or (self.path is not None and os.path.exists(self.path))
        flag = torch.tensor(float(requested), device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def consume(self, is_main: bool) -> None:
        """Remove the stop file (rank 0 only) once the checkpoint is saved, so the requeued job trains on."""
        if is_main and self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    def close(self) -> None:
        """Put back the SIGUSR1 handler that was there before."""
        if self.previous_handler is not None:
            signal.signal(signal.SIGUSR1, self.previous_handler)


def report_outcome(is_main: bool, finished: bool, step: int) -> None:
    """Tell the batch script how training ended (rank 0 only): "finished STEP" or "stopped STEP"."""
    path = os.environ.get("LAUNCHER_OUTCOME_FILE")
    if not is_main or not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{'finished' if finished else 'stopped'} {step}\n")
    os.replace(tmp, path)
