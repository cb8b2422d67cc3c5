"""Where rank 0 reports training progress: stdout, the launcher's metrics file, and wandb.

- stdout: one flushed line per logged step,
  `step 12/30 | loss 5.1234 | lr 3.0000e-04 | grad_norm 1.234 | tokens/s 12345 | tokens/s/gpu 3086 | mfu -`
- the bundle's metrics.jsonl (`LAUNCHER_BUNDLE`), if set: one JSON object per logged step, appended (a resumed run
  appends again, so a step logged before a crash can appear twice: readers keep the last line of each step).
- wandb, unless `WANDB_MODE=disabled` (then wandb is never imported); offline mode needs no network. One wandb run
  per training run (`launcher.train.tracker`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from launcher import jsonl
from launcher.nanotron_config import gpus
from launcher.train import tracker
from launcher.train.environment import JobEnvironment
from launcher.train.settings import TrainConfig


@dataclass(frozen=True)
class StepMetrics:
    """One logged step, as the metrics file stores it."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None  # None: not computed (the nanotron engine without clipping)
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None  # fraction of the GPU's peak bf16 FLOP/s; None on CPU or an unknown GPU
    time: float


def format_line(m: StepMetrics, train_steps: int) -> str:
    """The stdout line for one logged step."""
    mfu = "-" if m.mfu is None else f"{100 * m.mfu:.1f}%"
    grad_norm = "-" if m.grad_norm is None else f"{m.grad_norm:.3f}"
    return (
        f"step {m.step}/{train_steps} | loss {m.loss:.4f} | lr {m.lr:.4e} | grad_norm {grad_norm} | "
        f"tokens/s {m.tokens_per_s:.0f} | tokens/s/gpu {m.tokens_per_s_per_gpu:.0f} | mfu {mfu}"
    )


def append_metrics(path: str, m: StepMetrics) -> None:
    """Append one step to a metrics file (JSON lines), creating its directory if needed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    jsonl.append(path, dataclasses.asdict(m))


class Reporter:
    """Rank 0's sinks for step metrics; on other ranks every method does nothing."""

    def __init__(self, cfg: TrainConfig, job: JobEnvironment):
        self.cfg, self.is_main, self.wandb_disabled = cfg, job.is_main, job.wandb_disabled
        self.metrics_file = job.metrics_file
        self.wandb_run: Any = None
        self.wandb_step = 0  # the last step given to wandb

    def start_wandb(self, resumed_from: int = 0) -> None:
        """Open the run's wandb run (rank 0), unless WANDB_MODE=disabled, and give it again the steps up to
        `resumed_from` (the checkpoint training resumes from) that it may have lost (`tracker.lost_steps`)."""
        if self.is_main and not self.wandb_disabled:
            self.wandb_run = tracker.start(self.cfg)
            self.wandb_step = tracker.logged_to(self.cfg.checkpoints_path)
            for row in tracker.lost_steps(self.metrics_file, self.wandb_step, resumed_from):
                self._to_wandb(row)

    def print(self, message: str) -> None:
        """A line on rank 0's stdout, flushed so Slurm's log shows it at once."""
        if self.is_main:
            print(message, flush=True)

    def log(self, m: StepMetrics) -> None:
        """Report one step to every sink."""
        if not self.is_main:
            return
        self.print(format_line(m, self.cfg.train_steps))
        if self.metrics_file:
            append_metrics(self.metrics_file, m)
        if self.wandb_run is not None:
            self._to_wandb(dataclasses.asdict(m))

    def _to_wandb(self, row: dict) -> None:
        values = {k: v for k, v in row.items() if k not in ("step", "time") and v is not None}
        self.wandb_run.log(values, step=row["step"])
        self.wandb_step = row["step"]

    def close(self) -> None:
        """Finish the wandb run (it writes out its data then); the steps it holds recorded (`tracker.finished`)."""
        if self.wandb_run is not None:
            tracker.finish(self.wandb_run, self.cfg.checkpoints_path, self.wandb_step)
            self.wandb_run = None


def peak_flops(device: torch.device) -> float | None:
    """The dense bf16 peak FLOP/s of this GPU, as configs/gpus.yaml gives it for the device's name; None on CPU or
    a GPU the file does not list."""
    if device.type != "cuda":
        return None
    gpu = gpus.from_device_name(torch.cuda.get_device_name(device))
    return None if gpu is None else gpu.tflops * 1e12
