"""The nanotron engine: nanotron 0.4's own DistributedTrainer, fed as nanotron's run_train.py feeds it.

It needs a CUDA GPU, NCCL and nanotron (its ParallelContext accepts only NCCL), so it runs on GPU nodes only.
nanotron's models import flash_attn at module level; where flash_attn cannot be imported,
`launcher.train.flash_attn_compat` stands in for it (attention through torch SDPA; the job's log says so).

Beyond nanotron's own loop, a small subclass adds the launcher's two job-side contracts:
- stop requests (`launcher.train.stop`): checked after every step; the checkpoint is nanotron's own;
- `LAUNCHER_METRICS_FILE`: the first rank that holds the loss (nanotron's logger rank) appends one JSON line
  per logged step (grad_norm is null when clipping is off: nanotron computes it only while clipping).
nanotron 0.4 resumes only from `checkpoints.resume_checkpoint_path` (a checkpoint, or a directory whose latest.txt
names one). The generated config leaves it empty (a fresh run has nothing to resume), so at start-up
`resume_path` points it at the run's own checkpoints_path once that holds a checkpoint: a requeued or relaunched
job resumes where the last attempt saved, as the torch engine does.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from launcher.errors import TrainError
from launcher.train import flash_attn_compat, nanotron_compat
from launcher.train.config import TrainConfig
from launcher.train.data import load_split, load_tokenizer, pack
from launcher.train.metrics import StepMetrics, append_metrics
from launcher.train.model import PEAK_BF16_FLOPS
from launcher.train.schedule import lr_at
from launcher.train.stop import STOP_MESSAGE, StopRequest, report_outcome


def missing() -> list[str]:
    """What this machine lacks for the nanotron engine (empty: it can run). flash_attn is not among them:
    `flash_attn_compat` stands in where it cannot be imported."""
    lacking = [] if torch.cuda.is_available() else ["a CUDA GPU"]
    if not dist.is_nccl_available():
        lacking.append("NCCL")
    try:
        importlib.import_module("nanotron")
    except ImportError:
        lacking.append("nanotron")
    return lacking


def attention_note() -> str:
    """How nanotron's attention will run here: flash_attn's kernels, or torch SDPA through the stand-in."""
    return (
        "attention through flash_attn"
        if flash_attn_compat.real_flash_attn_error() is None
        else flash_attn_compat.MESSAGE
    )


NANOTRON_POINTER = "latest.txt"  # written by nanotron's save_checkpoint into checkpoints_path
CACHE_DIR = ".data-cache"  # packed datasets, under checkpoints_path


def resume_path(checkpoints_path: str | None, resume_checkpoint_path: str | None) -> str | None:
    """Where nanotron should resume from: the run's own checkpoints once it has one (as the torch engine does: a
    requeued or relaunched run continues), else the config's resume_checkpoint_path (e.g. a fine-tuning start)."""
    if checkpoints_path and (Path(checkpoints_path) / NANOTRON_POINTER).is_file():
        return checkpoints_path
    return resume_checkpoint_path or None


def resumable_config(config_file: str, tmp_dir: str) -> str:
    """The config nanotron should load: `config_file` itself, or, when the run should resume from somewhere the
    config does not name, a private copy (in `tmp_dir`) that differs only in resume_checkpoint_path.

    (nanotron 0.4's DistributedTrainer takes a file path only: its constructor opens what it is given.)
    """
    with open(config_file, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    ckpt = data.get("checkpoints") or {}
    resume = resume_path(ckpt.get("checkpoints_path"), ckpt.get("resume_checkpoint_path"))
    if resume is None or resume == ckpt.get("resume_checkpoint_path"):
        return config_file
    ckpt["resume_checkpoint_path"] = resume
    rank = os.environ.get("RANK", "0")
    derived = Path(tmp_dir) / f"launcher-nanotron-{os.getpid()}-rank{rank}.yaml"
    derived.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    if rank == "0":
        print(f"resuming from the run's own checkpoints in {resume} (latest: {_pointer(resume)})", flush=True)
    return str(derived)


def _pointer(checkpoints_path: str) -> str:
    return (Path(checkpoints_path) / NANOTRON_POINTER).read_text(encoding="utf-8").strip()


def train(config_file: str, cfg: TrainConfig) -> None:
    """Train `config_file` with nanotron's DistributedTrainer (every rank calls it); `cfg` is the same file."""
    lacking = missing()
    if lacking:
        raise TrainError(
            f"the nanotron engine needs {', '.join(lacking)}, missing here: use --engine torch "
            "(data parallel, runs on CPU or GPU)"
        )
    is_main = int(os.environ.get("RANK", "0")) == 0
    nanotron_compat.apply()  # nanotron 0.4's circular import (nanotron.logging <-> nanotron.config)
    flash_attn_compat.install(is_main)  # before nanotron's models import flash_attn (a real one is kept)
    from nanotron.trainer import DistributedTrainer

    done = _saved_step(cfg.checkpoints_path)
    if done is not None and done >= cfg.train_steps:  # nanotron would assert; say it as the torch engine does
        report_outcome(is_main, finished=True, step=done)
        if is_main:
            print(f"run already finished: checkpoint step {done}, train_steps {cfg.train_steps}", flush=True)
        return
    given = config_file
    config_file = resumable_config(config_file, os.environ.get("TMPDIR") or "/tmp")

    class LauncherTrainer(DistributedTrainer):  # type: ignore[misc, valid-type]
        def post_init(self) -> None:
            self.stop_request = StopRequest(torch.device("cuda", torch.cuda.current_device()))
            self.metrics_file = os.environ.get("LAUNCHER_METRICS_FILE") or None

        def post_train_step(self) -> None:
            if not self.stop_request.agreed():
                return
            # nanotron's loop counts this step's samples after this hook: count them for the checkpoint
            self.consumed_train_samples += self.global_batch_size
            last = self.iteration_step >= self.config.tokens.train_steps
            if not last or self.iteration_step % self.config.checkpoints.checkpoint_interval:
                self.save_checkpoint()  # (on the last step nanotron saves by itself only at the interval)
            self.stop_request.consume(dist.get_rank() == 0)
            if last:  # the run ends anyway, complete
                self.consumed_train_samples -= self.global_batch_size
                return
            report_outcome(dist.get_rank() == 0, finished=False, step=self.iteration_step)
            if dist.get_rank() == 0:
                print(STOP_MESSAGE.format(step=self.iteration_step), flush=True)
            dist.barrier()
            raise SystemExit(0)

        def train_step_logs(self, outputs, loss_avg) -> None:  # type: ignore[no-untyped-def]
            super().train_step_logs(outputs=outputs, loss_avg=loss_avg)
            if self.metrics_file is None or dist.get_rank() != self.logger_ranks[0] or loss_avg is None:
                return
            elapsed = time.time() - self.iteration_start_time
            tokens_per_s = self.global_batch_size * self.sequence_length / elapsed
            model_tflops, _ = self.unwrapped_model.get_flops_per_sec(
                elapsed, self.sequence_length, self.global_batch_size
            )
            name = torch.cuda.get_device_name()
            peak = next((p for key, p in PEAK_BF16_FLOPS.items() if key in name), None)
            grad_norm = getattr(self, "grad_norm_unclipped", None)
            metrics = StepMetrics(
                step=self.iteration_step,
                loss=loss_avg.item(),
                lr=lr_at(self.iteration_step, cfg.lr),  # the step's own LR (nanotron logs the next one)
                grad_norm=None if grad_norm is None else grad_norm.item(),
                tokens_per_s=tokens_per_s,
                tokens_per_s_per_gpu=tokens_per_s / dist.get_world_size(),
                mfu=None if peak is None else model_tflops * 1e12 / peak,
                time=time.time(),
            )
            append_metrics(self.metrics_file, metrics)

    trainer = LauncherTrainer(config_file)
    if config_file != given:
        Path(config_file).unlink(missing_ok=True)  # read: the trainer holds the config now
    trainer.train(_dataloader(trainer, cfg))
    report_outcome(is_main, finished=True, step=trainer.iteration_step)


def _saved_step(checkpoints_path: str) -> int | None:
    try:
        return int(_pointer(checkpoints_path))
    except (OSError, ValueError):
        return None


def packed_dataset(cfg: TrainConfig, tokenizer, num_proc: int = 1, overwrite_cache: bool = False):  # type: ignore[no-untyped-def]
    """The run's dataset as rows of sequence_length + 1 token ids (`input_ids`), what nanotron's dataloader reads.

    Not nanotron 0.4's own `get_datasets` + `clm_process`: the first calls `load_dataset(path)`, which reads
    neither a `save_to_disk` Dataset nor a local data file, and the second calls `tokenizer.batch_encode_plus`,
    which transformers 5 removed. The split comes from `load_split` and the windows from `pack`, as the torch
    engine's do, through a cached `datasets` map (rank 0 tokenizes; the other ranks reuse its cache), each batch
    of documents joined with eos and its remainder dropped, as clm_process does. Needs no GPU.

    The cache goes under `<checkpoints_path>/.data-cache/`, named by the input's fingerprint and the packing
    function's (tokenizer, column, length): `datasets` would write it beside a `save_to_disk` dataset, which may
    be read-only, and the checkpoint directory is writable (the launcher checked it) and seen by every node.
    """
    import datasets
    from datasets.fingerprint import Hasher

    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else cfg.model.eos_token_id
    column, length = cfg.text_column, cfg.sequence_length

    def tokenize_and_pack(batch: dict) -> dict:
        texts = [text for text in batch[column] if text]
        token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        return {"input_ids": pack(token_lists, eos_id, length)}

    raw = load_split(cfg)
    key = Hasher.hash([raw._fingerprint, Hasher.hash(tokenize_and_pack)])
    cache = Path(cfg.checkpoints_path) / CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    return raw.map(
        tokenize_and_pack,
        cache_file_name=str(cache / f"packed-{key}.arrow"),
        batched=True,
        remove_columns=raw.column_names,
        features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64"), length=length + 1)}),
        num_proc=num_proc if num_proc > 1 else None,
        load_from_cache_file=not overwrite_cache,
        desc=f"Packing texts into windows of {length + 1} tokens",
    )


def _dataloader(trainer, cfg: TrainConfig):  # type: ignore[no-untyped-def]
    """nanotron 0.4 run_train.py's get_dataloader: dummy tokens, or the dataset packed by `packed_dataset`."""
    from nanotron.dataloader import dummy_infinite_data_generator, get_train_dataloader
    from nanotron.parallel.pipeline_parallel.utils import get_input_output_pp_ranks
    from nanotron.utils import main_rank_first

    input_pp_rank, output_pp_rank = get_input_output_pp_ranks(model=trainer.model)
    data = trainer.config.data
    if data.dataset is None:
        return dummy_infinite_data_generator(
            micro_batch_size=trainer.micro_batch_size,
            sequence_length=trainer.sequence_length,
            input_pp_rank=input_pp_rank,
            output_pp_rank=output_pp_rank,
            vocab_size=trainer.model_config.vocab_size,
            seed=data.seed,
            parallel_context=trainer.parallel_context,
        )()
    tokenizer = load_tokenizer(cfg)  # checked on every rank (vocab_size), before any rank waits on another
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    with main_rank_first(trainer.parallel_context.world_pg):  # rank 0 tokenizes and caches; the others reuse
        train_dataset = packed_dataset(
            cfg,
            tokenizer,
            num_proc=data.dataset.dataset_processing_num_proc_per_process or 1,
            overwrite_cache=bool(data.dataset.dataset_overwrite_cache),
        )
        return get_train_dataloader(
            train_dataset=train_dataset,
            sequence_length=trainer.sequence_length,
            parallel_context=trainer.parallel_context,
            input_pp_rank=input_pp_rank,
            output_pp_rank=output_pp_rank,
            micro_batch_size=trainer.micro_batch_size,
            consumed_train_samples=trainer.consumed_train_samples,
            dataloader_num_workers=data.num_loading_workers,
            seed_worker=data.seed,
            dataloader_drop_last=True,
        )
