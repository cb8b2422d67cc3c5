"""The launcher's DistributedTrainer: nanotron 0.4's own trainer and loop, with the launcher's job-side contracts.

nanotron's `train()` runs, per step: `training_step` (which ends in `post_train_step`), then counts the step's
samples, logs every `iteration_step_info_interval` steps (`train_step_logs`), and saves at multiples of
`checkpoint_interval`; after the loop, `post_training`. The subclass from `trainer_class` adds:

- stop requests (`launcher.train.stop`), agreed by all ranks after every step: the step is counted and logged
  (whatever the log interval), saved, and the process exits 0 ("stopped STEP"); a request on the last step lets
  the run finish and is consumed once the last step is saved;
- the last step saved (nanotron saves only at multiples of checkpoint_interval and its post_training saves
  nothing) and logged (nanotron logs only every iteration_step_info_interval steps), as the torch engine does;
- `LAUNCHER_METRICS_FILE`: the first rank that holds the loss (nanotron's logger rank) appends one JSON line per
  logged step (grad_norm is null when clipping is off: nanotron computes it only while clipping);
- wandb: nanotron's `wandb.init` is unguarded (no key and no WANDB_MODE: a traceback); here, as in the torch
  engine, a one-line error that says what to do (`WANDB_MODE=offline` or `disabled` both work without network);
- the `latest.txt` pointer written once per filesystem, atomically (a temporary file, fsync, os.replace, fsync of
  the directory), after every rank's files are on disk. nanotron 0.4 rewrites it from every rank with a
  truncating `open(..., "w")` as soon as that rank is done, so a reader (a resuming job) could see it empty, or
  naming a checkpoint whose other ranks are still writing. Its own write is dropped (`pointer_writes_dropped`).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from launcher import atomic
from launcher import protocol as P
from launcher.errors import TrainError
from launcher.train.config import TrainConfig
from launcher.train.metrics import WANDB_FIX, StepMetrics, append_metrics
from launcher.train.model import peak_flops
from launcher.train.schedule import lr_at
from launcher.train.stop import STOP_MESSAGE, StopRequest, report_outcome, report_progress

POINTER = P.NANOTRON_POINTER  # nanotron's pointer to the newest checkpoint, in checkpoints_path


def write_pointer(checkpoints_path: Path, step: int) -> None:
    """Make `<checkpoints_path>/latest.txt` say `step`, atomically and durably: readers see the old pointer or the
    new one, never a partial one, and a crash after this returns cannot lose it."""
    atomic.replace(Path(checkpoints_path) / POINTER, str(step), durable=True)  # nanotron's format: no newline


@contextlib.contextmanager
def pointer_writes_dropped(module: ModuleType) -> Iterator[None]:
    """While active, `open(<dir>/latest.txt, "w")` called from `module`'s functions writes into nothing (a
    discarded buffer); every other `open` there is the builtin. `module` is nanotron.trainer, whose
    save_checkpoint writes the pointer so; nothing else changes in it."""

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and Path(file).name == POINTER and "w" in mode:
            return contextlib.nullcontext(io.StringIO())
        return builtins.open(file, mode, *args, **kwargs)

    missing = object()
    previous = vars(module).get("open", missing)
    module.open = guarded_open  # type: ignore[attr-defined]  # a module global shadows the builtin
    try:
        yield
    finally:
        if previous is missing:
            del module.open  # type: ignore[attr-defined]
        else:
            module.open = previous  # type: ignore[attr-defined]


def trainer_class(cfg: TrainConfig) -> type:
    """nanotron's DistributedTrainer with the launcher's hooks (nanotron and flash_attn must be importable)."""
    import nanotron.trainer
    from nanotron.trainer import DistributedTrainer

    class LauncherTrainer(DistributedTrainer):  # type: ignore[misc, valid-type]
        launcher_cfg = cfg

        def post_init(self) -> None:
            on_gpu = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
            self.stop_request = StopRequest(device)
            self.peak_flops = peak_flops(device)
            self.metrics_file = os.environ.get(P.ENV_METRICS_FILE) or None
            self.last_saved_step = self.start_iteration_step if self.init_checkpoint_path is not None else None
            self.stop_at_end = False

        def is_main(self) -> bool:
            return dist.get_rank(self.parallel_context.world_pg) == 0

        def pre_training(self, *args: Any, **kwargs: Any) -> None:
            wandb = nanotron.trainer.wandb  # None where wandb is not installed: nanotron then logs without it
            errors: tuple[type[Exception], ...] = () if wandb is None else (wandb.errors.Error,)
            try:
                super().pre_training(*args, **kwargs)  # nanotron's wandb.init, on its logger rank
            except errors as e:
                raise TrainError(f"wandb could not start ({e}): {WANDB_FIX}") from None

        def training_step(self, dataloader: Any) -> tuple[Any, Any]:
            outputs, loss_avg = super().training_step(dataloader=dataloader)
            report_progress(self.is_main(), self.iteration_step)  # for the hang watchdog
            last = self.iteration_step >= self.config.tokens.train_steps
            if self.stop_request.agreed():  # a collective: every rank, every step
                if not last:
                    self.honour_stop(outputs, loss_avg)  # exits
                self.stop_at_end = True  # the run ends with this step anyway: post_training saves it
            if last and (self.iteration_step - 1) % self.config.logging.iteration_step_info_interval:
                self.log_step(outputs, loss_avg)  # nanotron's loop logs the last step only on its interval
            return outputs, loss_avg

        def log_step(self, outputs: Any, loss_avg: Any) -> None:
            """Log this step now (nanotron's loop counts its samples after training_step returns)."""
            self.consumed_train_samples += self.global_batch_size
            try:
                self.train_step_logs(outputs=outputs, loss_avg=loss_avg)
            finally:
                self.consumed_train_samples -= self.global_batch_size

        def honour_stop(self, outputs: Any, loss_avg: Any) -> None:
            """Log this step (whatever the log interval), save it, and exit 0 so that the job can be requeued."""
            self.log_step(outputs, loss_avg)
            self.consumed_train_samples += self.global_batch_size  # the checkpoint counts this step's samples
            self.save_checkpoint()
            self.stop_request.consume(self.is_main())
            report_outcome(self.is_main(), finished=False, step=self.iteration_step)
            if self.is_main():
                print(STOP_MESSAGE.format(step=self.iteration_step), flush=True)
            dist.barrier()
            raise SystemExit(0)

        def post_training(self) -> None:
            if self.last_saved_step != self.iteration_step:  # nanotron saves only at multiples of the interval
                self.save_checkpoint()
            if self.stop_at_end:
                self.stop_request.consume(self.is_main())
            super().post_training()

        def save_checkpoint(self) -> Path:
            report_progress(self.is_main(), self.iteration_step, "saving")
            with pointer_writes_dropped(nanotron.trainer):
                path = super().save_checkpoint()
            dist.barrier(self.parallel_context.world_pg)  # every rank's files are written: the pointer may name them
            shared = self.config.checkpoints.checkpoints_path_is_shared_file_system
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if (shared and self.is_main()) or (not shared and local_rank == 0):  # one writer per filesystem
                write_pointer(self.config.checkpoints.checkpoints_path, self.iteration_step)
            self.last_saved_step = self.iteration_step
            report_progress(self.is_main(), self.iteration_step)
            return path

        def train_step_logs(self, outputs: Any, loss_avg: Any) -> None:
            super().train_step_logs(outputs=outputs, loss_avg=loss_avg)
            if self.metrics_file is None or dist.get_rank() != self.logger_ranks[0] or loss_avg is None:
                return
            elapsed = time.time() - self.iteration_start_time
            tokens_per_s = self.global_batch_size * self.sequence_length / elapsed
            model_tflops, _ = self.unwrapped_model.get_flops_per_sec(
                elapsed, self.sequence_length, self.global_batch_size
            )
            grad_norm = getattr(self, "grad_norm_unclipped", None)
            metrics = StepMetrics(
                step=self.iteration_step,
                loss=loss_avg.item(),
                lr=lr_at(self.iteration_step, self.launcher_cfg.lr),  # the step's own LR (nanotron logs the next)
                grad_norm=None if grad_norm is None else grad_norm.item(),
                tokens_per_s=tokens_per_s,
                tokens_per_s_per_gpu=tokens_per_s / dist.get_world_size(),
                mfu=None if self.peak_flops is None else model_tflops * 1e12 / self.peak_flops,
                time=time.time(),
            )
            append_metrics(self.metrics_file, metrics)

    return LauncherTrainer
