"""The launcher's DistributedTrainer: nanotron's own trainer and loop (0.4's or main's, whichever the job's Python
imports), with the launcher's job-side contracts.

nanotron's `train()` runs, per step: `training_step` (which ends in `post_train_step`), then counts the step's
samples, logs every `iteration_step_info_interval` steps (`train_step_logs`), and saves at multiples of
`checkpoint_interval`; after the loop, `post_training` (main first saves the last step where `save_final_state`
says so). The two differ in what they count and return: 0.4 counts `consumed_train_samples` and its
training_step returns (outputs, loss); main counts in `metadata` (the run's and the current data stage's samples,
its tokens, its last step: checkpoint format 1.5) and returns (outputs, loss, z_loss, tbi_logs). `Counts` hides
that. The subclass from `trainer_class` adds:

- stop requests (`launcher.train.stop`), agreed by all ranks after every step: the step is counted and logged
  (whatever the log interval), saved, and the process exits 0 ("stopped STEP"); a request on the last step lets
  the run finish and is consumed once the last step is saved;
- the last step saved (nanotron saves only at multiples of checkpoint_interval and its post_training saves
  nothing) and logged (nanotron logs only every iteration_step_info_interval steps), as the torch engine does;
- the bundle's metrics.jsonl (`LAUNCHER_BUNDLE`): the first rank that holds the loss (nanotron's logger rank)
  appends one JSON line per logged step (grad_norm is null when clipping is off: nanotron computes it only while
  clipping);
- wandb: nanotron's `wandb.init` is unguarded (no key and no WANDB_MODE: a traceback); here, as in the torch
  engine, a one-line error that says what to do (`WANDB_MODE=offline` or `disabled` both work without network),
  and the run's one wandb run opened (`tracker.one_wandb_run`); the rank map written (`launcher.train.ranks`);
- the `latest.txt` pointer written once per filesystem, atomically (a temporary file, fsync, os.replace, fsync of
  the directory), after every rank's files are on disk. nanotron 0.4 rewrites it from every rank with a
  truncating `open(..., "w")` as soon as that rank is done, so a reader (a resuming job) could see it empty, or
  naming a checkpoint whose other ranks are still writing. Its own write is dropped (`pointer.pointer_writes_dropped`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from launcher.checkpoint_layout import note_save
from launcher.errors import TrainError
from launcher.train.environment import JobEnvironment
from launcher.train.metrics import StepMetrics, append_metrics, peak_flops
from launcher.train.nanotron_engine.pointer import pointer_writes_dropped, write_pointer
from launcher.train.ranks import nodes_of_ranks, write_rank_map
from launcher.train.settings import TrainConfig
from launcher.train.stop import STOP_MESSAGE, StopRequest, report_outcome, report_progress
from launcher.train.tracker import WANDB_FIX, one_wandb_run


def is_main_trainer(trainer: Any) -> bool:
    """Whether `trainer` is nanotron main's (it keeps its counts in `metadata`, checkpoint format 1.5)."""
    return hasattr(trainer, "metadata")


def count_step(trainer: Any, sign: int = 1) -> None:
    """Count (sign 1) or uncount (-1) the current step's samples as nanotron's loop does after training_step."""
    samples = sign * trainer.global_batch_size
    if not is_main_trainer(trainer):
        trainer.consumed_train_samples += samples
        return
    meta = trainer.metadata
    meta.consumed_train_samples += samples
    meta.consumed_tokens_total += samples * trainer.sequence_length
    meta.current_stage.consumed_train_samples += samples
    meta.last_train_step = trainer.iteration_step if sign > 0 else trainer.iteration_step - 1


def start_step(trainer: Any) -> int:
    """The step the run resumed from (0 for a fresh start)."""
    return trainer.metadata.last_train_step if is_main_trainer(trainer) else trainer.start_iteration_step


def mend_init_model_randomly(config: Any) -> None:
    """nanotron main (2411b02)'s `LlamaForTraining.init_model_randomly(config)` hands `config.model` to its
    parametrizator, which reads `.model.init_method`, `.model.model_config` and `.parallelism.tp` of what it is
    given (a whole Config, as its Qwen2 passes): every fresh Llama run dies there ("'ModelArgs' object has no
    attribute 'model'"). Give `config.model` those two names (itself, the run's parallelism), so either reading
    finds the same values. Not dataclass fields: the config nanotron saves is unchanged. Nothing is done for 0.4
    (no data stages: its Llama reads the whole config) or where `config.model` already has them."""
    if not hasattr(config, "data_stages"):
        return
    model_args = config.model
    if not hasattr(model_args, "model"):
        model_args.model = model_args
    if not hasattr(model_args, "parallelism"):
        model_args.parallelism = config.parallelism


def account_stage_tokens(trainer: Any) -> None:
    """main's checkpoint metadata holds, per data stage, the tokens read from each dataset folder, and its loader
    asserts on resume that they add up to `consumed_tokens_total` ("Mismatch between the total consumed tokens and
    the sum of consumed tokens across stages"). main's loop fills them only from its own folder datasets
    (`get_consumption_stats`); the engine's feed reads one dataset per stage, so each stage's count is its samples
    x its sequence length, under the stage's dataset name. Called before every save."""
    datasets = {stage.name: getattr(stage.data.dataset, "hf_dataset_or_datasets", None)
                for stage in trainer.config.data_stages}  # fmt: skip
    for stage in trainer.metadata.data_stages:
        tokens = stage.consumed_train_samples * stage.sequence_length
        stage.consumed_tokens_per_dataset_folder = {str(datasets.get(stage.name) or "random tokens"): tokens}


def add_new_stages(trainer: Any) -> None:
    """A data stage the config has and the resumed checkpoint's metadata does not (added when the run was
    relaunched, `--data_stages`): main's run_train.py appends its metadata before training (for the last stage;
    main's loop indexes the metadata by the config's stage order), and so does this, for each such stage."""
    from nanotron.trainer import DataStageMetadata

    known = {stage.name for stage in trainer.metadata.data_stages}
    for stage in trainer.config.data_stages:
        if stage.name not in known:
            trainer.metadata.data_stages.append(DataStageMetadata(
                name=stage.name, start_training_step=stage.start_training_step, consumed_train_samples=0,
                consumed_tokens_per_dataset_folder={}, sequence_length=trainer.sequence_length))  # fmt: skip


def mend_lr_scheduler_resume(trainer: Any) -> None:
    """Bugs of nanotron's resume, each of which makes a resumed run train on another LR than the uninterrupted one:

    - 0.4: `load_lr_scheduler` restores the schedule's state but not the optimizer's LR, which the schedule's
      constructor has just set to its step-0 value: the first step after every resume trains at the LR of step 0
      (0 with a linear warmup: a step lost, and the loss higher from there on; seen on an H200 and on CPU);
    - main: `load_lr_scheduler` calls the scheduler's `_initial_step()` after loading its state, which steps the
      schedule once more: the run trains one step ahead on its LR schedule from the first step after the resume on;
    - main: `lr_scheduler_builder` hands each parameter group's LR *at build time* to the schedule as its
      `initial_lr` (the peak the decay starts from), and on a resume the trainer builds the schedule after
      `load_optimizer` has put the LR of the saved step into the groups: every step after a resume in the decay is
      off, by a share that grows with how far the decay had gone (at half a cosine decay to a tenth of the peak,
      ~9%).

    Where main's loader steps, load the saved state again with nanotron's own file name and give each group's
    schedule its true peak (the scheduler's `base_lrs`: the groups' `initial_lr`, saved with the state); then, in
    either dialect, put the saved step's LR into the optimizer, as it was when the checkpoint was saved."""
    import functools
    import inspect

    from nanotron.serialize import optimizer as serialize_optimizer

    scheduler = trainer.lr_scheduler
    if "_initial_step" in inspect.getsource(serialize_optimizer.load_lr_scheduler):
        zero = trainer.config.optimizer.zero_stage
        name = serialize_optimizer.lr_scheduler_filename(trainer.parallel_context, zero)
        scheduler.load_state_dict(torch.load(Path(trainer.init_checkpoint_path) / "lr_scheduler" / name))
        scheduler.lr_lambdas = [
            functools.partial(f.func, *f.args, **{**f.keywords, "initial_lr": peak})
            if isinstance(f, functools.partial) and "initial_lr" in f.keywords
            else f
            for f, peak in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)
        ]
    for group, peak, schedule in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas,
                                     strict=True):  # fmt: skip
        group["lr"] = peak * schedule(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


PARAMETERS_LINE = "parameters per rank (pipeline stage x tensor shard): {counts}"


def say_parameters_per_rank(trainer: Any, device: torch.device) -> None:
    """Rank 0 prints how many parameters each (pp, tp) rank holds, as nanotron built them (a tied one counted
    where it lives): what the launcher's memory model assumes for the layout (`launcher.perf.memory`), and
    tests/test_nanotron_multirank.py holds the two equal. One all_reduce of pp x tp integers, once."""
    context = trainer.parallel_context
    pp, tp = context.pp_pg.size(), context.tp_pg.size()
    counts = torch.zeros(pp, tp, dtype=torch.int64, device=device)
    if dist.get_rank(context.dp_pg) == 0:  # the dp replicas hold the same
        held = sum(param.numel() for param in trainer.unwrapped_model.parameters())
        counts[dist.get_rank(context.pp_pg), dist.get_rank(context.tp_pg)] = held
    dist.all_reduce(counts, group=context.world_pg)
    if dist.get_rank(context.world_pg) == 0:
        print(PARAMETERS_LINE.format(counts=counts.tolist()), flush=True)


def share_the_loss(trainer: Any, logs: dict) -> dict:
    """nanotron main with pp > 1 died at its first logged step, on every run (upstream issue #405): its
    `train_step_logs` reads `loss_avg.item()` on every rank, before its logger-rank check, and only the last
    pipeline stage has a loss. Here the last stage's loss (and z-loss, where the model computes one) is broadcast
    over the pipeline group (one scalar a logged step), so every rank logs the run's own loss. 0.4 reads the loss
    on its logger ranks only: nothing is done there, nor with one stage."""
    pp = trainer.parallel_context.pp_pg
    if not is_main_trainer(trainer) or pp.size() == 1:
        return logs
    source = dist.get_global_rank(pp, trainer.unwrapped_model.output_pp_rank)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    shared = dict(logs)
    keys = ["loss_avg"] + (["z_loss_avg"] if getattr(trainer.model_config, "z_loss_enabled", False) else [])
    for key in keys:
        held = logs.get(key)
        value = held.detach().to(torch.float32).clone() if held is not None else torch.zeros((), device=device)
        dist.broadcast(value, src=source, group=pp)
        shared[key] = value
    return shared


def trainer_class(cfg: TrainConfig, job: JobEnvironment) -> type:
    """nanotron's DistributedTrainer with the launcher's hooks (nanotron and flash_attn must be importable); `job`:
    this process's environment (its rank is the world group's: nanotron's ParallelContext joins torchrun's)."""
    import nanotron.trainer
    from nanotron.trainer import DistributedTrainer

    class LauncherTrainer(DistributedTrainer):  # type: ignore[misc, valid-type]
        launcher_cfg = cfg
        first_step_note: Callable[[], str] | None = None  # what rank 0 says after this attempt's first step

        def pre_init(self) -> None:
            super().pre_init()
            mend_init_model_randomly(self.config)

        def post_init(self) -> None:
            super().post_init()  # main: its S3 mover and lighteval runner (None unless configured); 0.4: nothing
            resumed = self.init_checkpoint_path is not None
            if resumed and (not is_main_trainer(self) or self.config.checkpoints.load_lr_scheduler):
                mend_lr_scheduler_resume(self)  # 0.4 always loads the schedule on a resume
                if is_main_trainer(self):
                    add_new_stages(self)
            on_gpu = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
            self.stop_request = StopRequest(device, job)
            self.peak_flops = peak_flops(device)
            self.metrics_file = job.metrics_file
            self.last_saved_step = start_step(self) if self.init_checkpoint_path is not None else None
            self.stop_at_end = False
            say_parameters_per_rank(self, device)
            write_rank_map(job, nodes_of_ranks(job))  # for the batch script's restart decision

        def is_main(self) -> bool:
            return dist.get_rank(self.parallel_context.world_pg) == 0

        def pre_training(self, *args: Any, **kwargs: Any) -> None:
            wandb = nanotron.trainer.wandb  # None where wandb is not installed: nanotron then logs without it
            errors: tuple[type[Exception], ...] = () if wandb is None else (wandb.errors.Error,)
            try:
                with one_wandb_run(wandb, self.config.checkpoints.checkpoints_path):  # one run, every attempt's
                    super().pre_training(*args, **kwargs)  # nanotron's wandb.init, on its logger rank
            except errors as e:
                raise TrainError(f"wandb could not start ({e}): {WANDB_FIX}") from None

        def training_step(self, dataloader: Any) -> tuple[Any, ...]:
            self.step_lr = self.lr_scheduler.optimizer.param_groups[0]["lr"]  # what this step's update applies
            returned = super().training_step(dataloader=dataloader)  # 0.4: (outputs, loss); main: 4 values
            logs = dict(zip(("outputs", "loss_avg", "z_loss_avg", "tbi_logs"), returned, strict=False))
            report_progress(job, self.iteration_step)  # for the hang watchdog
            if self.first_step_note is not None:
                if self.is_main():
                    print(self.first_step_note(), flush=True)
                self.first_step_note = None
            last = self.iteration_step >= self.config.tokens.train_steps
            if self.stop_request.agreed():  # a collective: every rank, every step
                if not last:
                    self.honour_stop(logs)  # exits
                self.stop_at_end = True  # the run ends with this step anyway: post_training saves it
            if last and (self.iteration_step - 1) % self.config.logging.iteration_step_info_interval:
                self.log_step(logs)  # nanotron's loop logs the last step only on its interval
            return returned

        def log_step(self, logs: dict) -> None:
            """Log this step now (nanotron's loop counts its samples after training_step returns)."""
            count_step(self)
            try:
                self.train_step_logs(**logs)
            finally:
                count_step(self, -1)

        def honour_stop(self, logs: dict) -> None:
            """Log this step (whatever the log interval), save it, and exit 0 so that the job can be requeued."""
            self.log_step(logs)
            count_step(self)  # the checkpoint counts this step's samples
            self.save_checkpoint()
            self.stop_request.consume(self.is_main())
            report_outcome(job, finished=False, step=self.iteration_step)
            if self.is_main():
                print(STOP_MESSAGE.format(step=self.iteration_step), flush=True)
            dist.barrier()
            raise SystemExit(0)

        def post_training(self) -> None:
            if self.last_saved_step != self.iteration_step:  # 0.4 saves only at multiples of the interval
                self.save_checkpoint()
            if self.stop_at_end:
                self.stop_request.consume(self.is_main())
            super().post_training()

        def save_checkpoint(self) -> Path:
            report_progress(job, self.iteration_step, "saving")
            if is_main_trainer(self):
                account_stage_tokens(self)
            shared = self.config.checkpoints.checkpoints_path_is_shared_file_system
            writer = (shared and self.is_main()) or (not shared and job.local_rank == 0)  # one writer per filesystem
            if writer:  # the step is the launcher's: retention may remove it (docs/checkpoints.md)
                note_save(Path(self.config.checkpoints.checkpoints_path), self.iteration_step)
            with pointer_writes_dropped(nanotron.trainer, self.is_main()):
                path = super().save_checkpoint()
            dist.barrier(self.parallel_context.world_pg)  # every rank's files are written: the pointer may name them
            if writer:
                write_pointer(self.config.checkpoints.checkpoints_path, self.iteration_step)
            self.last_saved_step = self.iteration_step
            report_progress(job, self.iteration_step)
            return path

        def train_step_logs(self, **logs: Any) -> None:
            super().train_step_logs(**share_the_loss(self, logs))
            loss_avg = logs.get("loss_avg")
            if self.metrics_file is None or dist.get_rank() != self.logger_ranks[0] or loss_avg is None:
                return
            if is_main_trainer(self):  # main times the step (its iteration_timer, ended by its train_step_logs)
                elapsed = self.iteration_timer.elapsed
            else:
                elapsed = time.time() - self.iteration_start_time
            tokens_per_s = self.global_batch_size * self.sequence_length / elapsed
            model_tflops, _ = self.unwrapped_model.get_flops_per_sec(
                elapsed, self.sequence_length, self.global_batch_size
            )
            grad_norm = getattr(self, "grad_norm_unclipped", None)
            metrics = StepMetrics(
                step=self.iteration_step,
                loss=loss_avg.item(),
                lr=self.step_lr,  # the LR the step applied (nanotron logs the next step's)
                grad_norm=None if grad_norm is None else grad_norm.item(),
                tokens_per_s=tokens_per_s,
                tokens_per_s_per_gpu=tokens_per_s / dist.get_world_size(),
                mfu=None if self.peak_flops is None else model_tflops * 1e12 / self.peak_flops,
                time=time.time(),
            )
            append_metrics(self.metrics_file, metrics)

    return LauncherTrainer
