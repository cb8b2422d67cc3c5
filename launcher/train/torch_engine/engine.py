"""The portable engine: transformers' Llama under torch DistributedDataParallel, on CPU (gloo) or GPU (nccl).

It trains what a nanotron 0.4 config describes, data parallel only (tp = pp = 1), with nanotron's init, AdamW and
LR schedule, so a run can be tried on a CPU machine or a GPU node without nanotron's CUDA-only dependencies.

A run resumes from `<checkpoints_path>/latest` when there is one, and honours stop requests
(`launcher.train.stop`) at the next step boundary with a checkpoint. On CPU, a resumed run's losses equal an
uninterrupted run's: the data stream is indexed by position, and model, optimizer and RNG states are restored.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launcher.errors import TrainError
from launcher.train.data import StagedBatches
from launcher.train.environment import JobEnvironment
from launcher.train.metrics import Reporter, StepMetrics, peak_flops
from launcher.train.ranks import StragglerWatch, nodes_of_ranks, write_rank_map
from launcher.train.schedule import lr_at
from launcher.train.settings import TrainConfig
from launcher.train.stop import STOP_MESSAGE, StopRequest, grace_warning, report_outcome, report_progress
from launcher.train.torch_engine import checkpoint
from launcher.train.torch_engine.model import WithLoss, build_model, compile_for_gpu, count_parameters, flops_per_token
from launcher.train.torch_engine.resume import resume
from launcher.train.torch_engine.shared_data import batches


@dataclass(frozen=True)
class Rank:
    """This process's place in the job."""

    rank: int
    world_size: int
    device: torch.device


def check_supported(cfg: TrainConfig, world_size: int) -> None:
    """Refuse what this engine cannot train, before any process group exists."""
    if cfg.tp > 1 or cfg.pp > 1:
        raise TrainError(
            f"the torch engine is data parallel only, but tp={cfg.tp} pp={cfg.pp}: use the nanotron engine "
            "(--engine nanotron, on GPU nodes with flash_attn), or --tp 1 --pp 1"
        )
    if world_size != cfg.dp:
        raise TrainError(
            f"{world_size} process(es) started but the config has dp={cfg.dp}: start dp processes "
            f"(torchrun --nproc_per_node ...) or set --dp {world_size}"
        )
    if cfg.init_path:
        raise TrainError(
            f"the torch engine cannot start from nanotron weights (model.init_method.path: {cfg.init_path}): use "
            "the nanotron engine (--engine nanotron, on GPU nodes), or model.init_method.std for a fresh model"
        )
    if torch.cuda.is_available() and cfg.dtype == "float16":
        raise TrainError("the torch engine trains in bfloat16 or float32, not float16: set model.dtype to bfloat16")


def init_distributed(job: JobEnvironment) -> Rank:
    """Join torchrun's process group (env://), or make a one-process group when started without torchrun."""
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", job.local_rank)
        torch.cuda.set_device(device)  # before the process group, so NCCL binds each rank to its own GPU
    backend = "nccl" if device.type == "cuda" else "gloo"
    if job.distributed:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Rank(dist.get_rank(), dist.get_world_size(), device)


def train(cfg: TrainConfig, job: JobEnvironment | None = None) -> None:
    """Train the run described by `cfg` to `train_steps`, or until a stop request. Every rank calls it. `job`: the
    process's environment (read now where not given)."""
    job = job or JobEnvironment.read()
    check_supported(cfg, job.world_size)
    where = init_distributed(job)
    try:
        TorchTrainer(cfg, where, job).train()
    finally:
        dist.destroy_process_group()


# torch 2.13 names it forward_sync_buffers (broadcast_buffers, deprecated, warns); earlier releases broadcast_buffers
NO_FORWARD_BUFFER_SYNC: dict[str, Any] = {
    "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else "broadcast_buffers": False
}  # fmt: skip


class TorchTrainer:
    """One rank's model, optimizer, data stream and position in the run."""

    def __init__(self, cfg: TrainConfig, where: Rank, job: JobEnvironment):
        self.cfg, self.where, self.job = cfg, where, job
        self.reporter = Reporter(cfg, job)
        self.batches = batches(cfg, where.rank, where.world_size)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.model: nn.Module = build_model(cfg.model, cfg.init_std, cfg.seed).to(where.device)  # seeds torch
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=lr_at(1, cfg.lr),
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            fused=where.device.type == "cuda",  # one kernel per step over all parameters: MFU 29.7% -> 32.8% (H100)
        )
        self.compute_dtype = torch.float32
        if where.device.type == "cuda" and cfg.dtype == "bfloat16":
            self.compute_dtype = torch.bfloat16
        # optimizer steps done; micro-batches consumed by this rank (the newest readable checkpoint's, or 0)
        self.step_s, self.grace_warned = 0.0, False  # the last step's time; whether a save outgrew the grace
        self.step, self.position = resume(
            cfg, where.world_size, where.device, self.model, self.optimizer, self.reporter
        )
        nodes = nodes_of_ranks(job)  # every rank's node: the batch script's rank map, the stragglers' names
        write_rank_map(job, nodes)
        self.stragglers = StragglerWatch(job, nodes, where.device)
        self.own_work_done = 0.0  # when this rank's own part of the step ended (before its last backward)

    def train(self) -> None:
        """Steps `step + 1 .. train_steps`, logging, checkpointing and honouring stop requests."""
        cfg, job = self.cfg, self.job
        if self.step >= cfg.train_steps:
            report_outcome(job, finished=True, step=self.step)
            self.reporter.print(f"run already finished: checkpoint step {self.step}, train_steps {cfg.train_steps}")
            return
        self._announce()
        ddp, stop = self.wrap(), StopRequest(self.where.device, job)
        self.reporter.start_wandb(resumed_from=self.step)
        try:
            if self._steps(ddp, stop):
                report_outcome(job, finished=True, step=self.step)
                self.reporter.print(f"training finished at step {self.step}; checkpoints in {cfg.checkpoints_path}")
        finally:  # wandb first, while SIGTERM only asks to stop: after a peer's death torchrun sends it to this rank
            self.reporter.close()  # as wandb writes its run out (offline, it keeps nothing until then)
            stop.close()

    def _announce(self) -> None:
        cfg, where = self.cfg, self.where
        if where.device.type == "cpu" and cfg.dtype != "float32":
            self.reporter.print(f"note: model.dtype is {cfg.dtype}; on CPU the torch engine trains in float32")
        self.reporter.print(
            f"engine torch | world size {where.world_size} | device {where.device} | dtype {self.compute_dtype} | "
            f"parameters {count_parameters(self.model):,} | global batch {cfg.global_batch_size} sequences "
            f"({cfg.global_batch_size * cfg.sequence_length:,} tokens) | steps {self.step + 1}..{cfg.train_steps}"
        )

    def _steps(self, ddp: DistributedDataParallel, stop: StopRequest) -> bool:
        """The steps to the last, saving where due; False when a stop request ended them before it."""
        cfg, job = self.cfg, self.job
        if self.step == 0 and cfg.save_initial_state:
            checkpoint.save(cfg, 0, self.model, self.optimizer, self.position)
        window_start, window_steps = time.perf_counter(), 0  # the steps whose throughput the next log line gives
        while self.step < cfg.train_steps:
            self.step += 1
            stepping = time.perf_counter()
            loss_sum, grad_norm = self.train_step(ddp)
            self.step_s = time.perf_counter() - stepping
            self.stragglers.timed(self.own_work_done - stepping, self.step_s)
            self.stragglers.look(self.step, time.time())
            window_steps += 1
            if (self.step - 1) % max(cfg.log_interval, 1) == 0 or self.step == cfg.train_steps:
                self._log(loss_sum, grad_norm, window_steps, window_start)
                window_start, window_steps = time.perf_counter(), 0
            stopping = stop.agreed()
            report_progress(job, self.step)
            periodic = cfg.checkpoint_interval > 0 and self.step % cfg.checkpoint_interval == 0
            if periodic or stopping or self.step == cfg.train_steps:
                self._save()
                window_start = time.perf_counter()  # saving is not training time
            if stopping:
                stop.consume(job.is_main)
                if self.step < cfg.train_steps:
                    report_outcome(job, finished=False, step=self.step)
                    self.reporter.print(STOP_MESSAGE.format(step=self.step))
                    return False
        return True

    def _save(self) -> None:
        """A checkpoint of the step just done, announced to the launcher while it is written."""
        report_progress(self.job, self.step, "saving")
        saving = time.perf_counter()
        checkpoint.save(self.cfg, self.step, self.model, self.optimizer, self.position)
        report_progress(self.job, self.step)
        if not self.grace_warned and (warning := grace_warning(self.job, time.perf_counter() - saving, self.step_s)):
            self.reporter.print(warning)  # once: a time-limit save would not fit --signal_grace
            self.grace_warned = True

    def wrap(self) -> DistributedDataParallel:
        """The model with its loss under DDP; compiled on a GPU (see model.compile_for_gpu)."""
        on_gpu = self.where.device.type == "cuda"
        module = compile_for_gpu(self.model) if on_gpu else WithLoss(self.model)
        # gradient_as_bucket_view: gradients live in DDP's buckets, no copy in and out of them each step;
        # no buffer broadcast at each forward: the only buffers (RoPE's frequencies) are computed alike on every rank,
        # and without it a rank's forward passes are its own work (launcher.train.ranks)
        return DistributedDataParallel(
            module,
            device_ids=[self.where.device] if on_gpu else None,
            gradient_as_bucket_view=True,
            **NO_FORWARD_BUFFER_SYNC,
        )

    def train_step(self, ddp: DistributedDataParallel) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over grad_accum_steps micro-batches; returns (sum of their losses, grad norm)."""
        device, accum = self.where.device, self.cfg.grad_accum_steps
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, self.cfg.lr)
        autocast = torch.autocast(device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32)
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            if isinstance(self.batches, StagedBatches) and (stage := self.batches.begins(self.position)):
                self.reporter.print(f"data: stage {stage} begins at step {self.step}")
            elif self.batches.epoch(self.position) > self.batches.epoch(max(self.position - 1, 0)):
                epoch = self.batches.epoch(self.position)
                self.reporter.print(f"data: the dataset is exhausted; epoch {epoch + 1} begins at step {self.step}")
            tokens = self.batches.micro_batch(self.position).to(device)
            self.position += 1
            # gradients are all-reduced once, on the last micro-batch
            with ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext():
                with autocast:
                    loss = ddp(tokens)
                if micro == accum - 1:
                    self.own_work_done = time.perf_counter()  # what follows waits for the other ranks
                (loss / accum).backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad or math.inf)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, grad_norm

    def _log(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor, steps: int, since: float) -> None:
        """Report the step just done, and the throughput of the `steps` steps done since `since`.

        A collective: the loss is averaged over the dp ranks.
        """
        cfg, where = self.cfg, self.where
        loss = loss_sum / (cfg.grad_accum_steps * where.world_size)
        dist.all_reduce(loss)
        loss_value = loss.item()  # waits for the GPU: the step's kernels precede the all_reduce on the stream
        tokens_per_s = steps * cfg.global_batch_size * cfg.sequence_length / (time.perf_counter() - since)
        per_gpu = tokens_per_s / where.world_size
        peak = peak_flops(where.device)
        mfu = None if peak is None else per_gpu * flops_per_token(self.model, cfg.model, cfg.sequence_length) / peak
        self.reporter.log(
            StepMetrics(
                step=self.step,
                loss=loss_value,
                lr=lr_at(self.step, cfg.lr),
                grad_norm=grad_norm.item(),
                tokens_per_s=tokens_per_s,
                tokens_per_s_per_gpu=per_gpu,
                mfu=mfu,
                time=time.time(),
            )
        )
