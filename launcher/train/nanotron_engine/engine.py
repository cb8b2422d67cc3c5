"""The nanotron engine: nanotron's own DistributedTrainer, fed as nanotron's run_train.py feeds it; 0.4's, or
main's where the config is in main's dialect (the job's Python then has nanotron main: docs/nanotron-dialects.md).

It needs a CUDA GPU, NCCL and nanotron (its ParallelContext accepts only NCCL), so it runs on GPU nodes only.
nanotron's models import flash_attn at module level; where flash_attn cannot be imported,
`launcher.train.nanotron_engine.flash_attn_compat` stands in for it (attention through torch SDPA; the job's log says
so). main's trainer also imports triton and grouped_gemm (its MoE layers) at module level: where they cannot be
imported, `launcher.train.nanotron_engine.triton_compat` stands in for the import (a dense Llama never calls them).
The launcher's contracts (stop requests, metrics file, last step saved, atomic checkpoint pointer, wandb) are
added by the subclass in `launcher.train.nanotron_engine.trainer`; the data (local datasets, epochs) are fed here,
tokenized folders (main's Nanosets) by `launcher.train.nanotron_engine.folders`.

Each of main's data stages gets its own feed (`_main_dataloaders`), built when main's loop reaches the stage, from
the stage's own dataset, resuming at the samples its checkpoint metadata says that stage consumed.

nanotron (0.4 and main alike) resumes only from `checkpoints.resume_checkpoint_path` (a checkpoint, or a
directory whose latest.txt names one). The generated config leaves it empty (a fresh run has nothing to resume),
so at start-up `resume_path` points it at the run's own checkpoints_path once that holds a checkpoint: a requeued
or relaunched job resumes where the last attempt saved, as the torch engine does.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from launcher.errors import TrainError
from launcher.nanotron_config import dialect
from launcher.nanotron_config.parallel import resume_relayout
from launcher.train import packcache
from launcher.train.data import load_split, load_tokenizer, pack
from launcher.train.environment import JobEnvironment
from launcher.train.nanotron_engine import compat as nanotron_compat
from launcher.train.nanotron_engine import compiled, flash_attn_compat, folders, triton_compat
from launcher.train.nanotron_engine import mends as nanotron_mends
from launcher.train.nanotron_engine.pointer import POINTER as NANOTRON_POINTER
from launcher.train.nanotron_engine.trainer import trainer_class
from launcher.train.settings import TrainConfig
from launcher.train.stop import deaf_workers, report_outcome

EPOCH_MESSAGE = "data: the dataset is exhausted; epoch {epoch} begins at step {step}"  # the torch engine's words


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
    """How nanotron's attention will run here: flash_attn's kernels, FlashAttention 4, or torch SDPA."""
    return flash_attn_compat.note()


def resume_path(checkpoints_path: str | None, resume_checkpoint_path: str | None) -> str | None:
    """Where nanotron should resume from: the run's own checkpoints once it has one (as the torch engine does: a
    requeued or relaunched run continues), else the config's resume_checkpoint_path (e.g. a fine-tuning start)."""
    if checkpoints_path and (Path(checkpoints_path) / NANOTRON_POINTER).is_file():
        return checkpoints_path
    return resume_checkpoint_path or None


def resumable_config(config_file: str, job: JobEnvironment) -> str:
    """The config nanotron should load: `config_file` itself, or a private copy (in the job's TMPDIR) that differs only
    where the run needs it to: resume_checkpoint_path, when the run should resume from somewhere the config does not
    name; and tp_linear_async_communication false for nanotron 0.4 with tp > 1, whose asynchronous backward is
    wrong (the launcher writes it so; a config written otherwise would train on a wrong gradient).

    (nanotron 0.4's DistributedTrainer takes a file path only: its constructor opens what it is given.)
    """
    with open(config_file, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    ckpt = data.get("checkpoints") or {}
    resume = resume_path(ckpt.get("checkpoints_path"), ckpt.get("resume_checkpoint_path"))
    parallelism = data.get("parallelism") or {}
    written = "main" if dialect.is_main(data) else "0.4"
    asked = parallelism.get("tp_linear_async_communication")
    asynchronous, why = dialect.tp_async(written, parallelism.get("tp") or 1, parallelism.get("tp_mode", ""), asked)
    changed = False
    if resume is not None:
        refuse_relayout(Path(resume), data, written)
    if resume is not None and resume != ckpt.get("resume_checkpoint_path"):
        ckpt["resume_checkpoint_path"] = resume
        changed = True
        if job.is_main:
            print(f"resuming from the run's own checkpoints in {resume} (latest: {_pointer(resume)})", flush=True)
    if why is not None:
        parallelism["tp_linear_async_communication"] = asynchronous
        changed = True
        if job.is_main:
            print(f"this config asks for asynchronous tensor-parallel communication, but {why}", flush=True)
    if not changed:
        return config_file
    derived = Path(job.tmp_dir) / f"launcher-nanotron-{os.getpid()}-rank{job.rank}.yaml"
    derived.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(derived)


def refuse_relayout(root: Path, config: dict, written: str) -> None:
    """A resume into a layout nanotron cannot re-shard `root`'s checkpoint into fails here, with the reason (the
    launcher says it before the queue: this is for a config changed or started otherwise)."""
    saved, where = dialect.saved_layout(root)
    p = config.get("parallelism") or {}
    zero = int((config.get("optimizer") or {}).get("zero_stage") or 0)
    new = {"dp": int(p.get("dp") or 1), "tp": int(p.get("tp") or 1), "pp": int(p.get("pp") or 1), "zero_stage": zero}
    why = None if saved is None else resume_relayout(saved, new, written)
    if why is not None:
        raise TrainError(
            f"this run resumes from {where}, but {why}: resume in the saved layout, or start afresh with --resume false"
        )


def _pointer(checkpoints_path: str) -> str:
    return (Path(checkpoints_path) / NANOTRON_POINTER).read_text(encoding="utf-8").strip()


def train(config_file: str, cfg: TrainConfig, job: JobEnvironment | None = None, compile_layers: bool = False) -> None:
    """Train `config_file` with nanotron's DistributedTrainer (every rank calls it); `cfg` is the same file; `job`:
    the process's environment (read now where not given); `compile_layers`: its decoder layers through torch.compile
    (`compiled`)."""
    job = job or JobEnvironment.read()
    lacking = missing()
    if lacking:
        raise TrainError(
            f"the nanotron engine needs {', '.join(lacking)}, missing here: use --engine torch "
            "(data parallel, runs on CPU or GPU)"
        )
    is_main = job.is_main
    nanotron_compat.apply()  # nanotron 0.4's circular import (nanotron.logging <-> nanotron.config)
    flash_attn_compat.install(is_main)  # before nanotron's models import flash_attn (a real one is kept)
    if cfg.dialect == "main":  # main's trainer imports triton kernels and grouped_gemm at module level
        triton_compat.install()
        triton_compat.install_grouped_gemm()
        importlib.import_module("nanotron.trainer")
        triton_compat.uninstall()  # torch would take the stand-in for a real triton
    importlib.import_module("nanotron.trainer")
    nanotron_mends.apply(cfg.dialect)  # nanotron's own bugs that the launcher's configs would meet

    done = _saved_step(cfg.checkpoints_path)
    if done is not None and done >= cfg.train_steps:  # nanotron would assert; say it as the torch engine does
        report_outcome(job, finished=True, step=done)
        if is_main:
            print(f"run already finished: checkpoint step {done}, train_steps {cfg.train_steps}", flush=True)
        return
    given = config_file
    config_file = resumable_config(config_file, job)
    try:
        trainer = trainer_class(cfg, job)(config_file)  # joins the process group (nanotron's ParallelContext)
        if config_file != given:
            Path(config_file).unlink(missing_ok=True)  # read: the trainer holds the config now
        if compile_layers:
            count = compiled.compile_decoder_layers(trainer.unwrapped_model)
            trainer.first_step_note = compiled.summary
            if is_main:
                print(compiled.COMPILED_LINE.format(count=count), flush=True)
        if cfg.dialect == "main":
            trainer.train(_main_dataloaders(trainer, cfg))  # its data stages
        else:
            trainer.train(_dataloader(trainer, cfg))
        report_outcome(job, finished=True, step=trainer.iteration_step)
        if is_main:
            print(
                f"training finished at step {trainer.iteration_step}; checkpoints in {cfg.checkpoints_path}", flush=True
            )
    finally:  # a stop's SystemExit included
        if dist.is_initialized():
            dist.destroy_process_group()


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
    cache = Path(cfg.checkpoints_path) / packcache.CACHE_DIR
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


def _main_dataloaders(trainer, cfg: TrainConfig) -> dict:  # type: ignore[no-untyped-def]
    """nanotron main run_train.py's get_dataloader: one feed per data stage, by stage name, each made (lazily: main
    calls it when its loop enters the stage) as `_dataloader` makes 0.4's, from the stage's own data (`cfg` for the
    first stage, `cfg.stages` for the later ones), resuming at the samples main's metadata says the stage consumed.
    (main's run_train.py reads local datasets no better than 0.4's, and passes its get_train_dataloader a
    `consumed_train_samples_stage` it does not take.)"""
    later = {stage.name: stage.data for stage in cfg.stages}

    def feed(stage):  # type: ignore[no-untyped-def]  # main's DatasetStageArgs
        done = [m.consumed_train_samples for m in trainer.metadata.data_stages if m.name == stage.name]
        return _dataloader(trainer, later.get(stage.name, cfg), stage.data, sum(done))

    return {stage.name: (lambda stage=stage: feed(stage)) for stage in trainer.config.data_stages}


def _dataloader(trainer, cfg: TrainConfig, data=None, consumed: int | None = None):  # type: ignore[no-untyped-def]
    """nanotron run_train.py's get_dataloader: dummy tokens, or the dataset packed by `packed_dataset`, fed
    by nanotron's own get_train_dataloader epoch after epoch (`epochs`). `data` and `consumed`: main's stage's
    data section and the samples that stage consumed (0.4: its one data section and all samples consumed)."""
    is_main = data is not None
    if is_main:
        from nanotron.data.dataloader import dummy_infinite_data_generator, get_train_dataloader
    else:
        from nanotron.dataloader import dummy_infinite_data_generator, get_train_dataloader

        data, consumed = trainer.config.data, trainer.consumed_train_samples
    from nanotron.parallel.pipeline_parallel.utils import get_input_output_pp_ranks
    from nanotron.utils import main_rank_first

    input_pp_rank, output_pp_rank = get_input_output_pp_ranks(model=trainer.model)
    context = trainer.parallel_context
    extra = {"use_position_ids": False} if is_main else {}  # main's collator adds position ids for Qwen2 only
    if data.dataset is None:
        # main's generator reads the context-parallel group from its own argument (None: every run without a
        # dataset died at its first batch), as main's run_train.py passes it
        random_extra = {**extra, "cp_pg": context.cp_pg} if is_main else extra
        return dummy_infinite_data_generator(
            micro_batch_size=trainer.micro_batch_size,
            sequence_length=trainer.sequence_length,
            input_pp_rank=input_pp_rank,
            output_pp_rank=output_pp_rank,
            vocab_size=trainer.model_config.vocab_size,
            seed=data.seed,
            parallel_context=context,
            **random_extra,
        )()

    def announce(epoch: int) -> None:
        if dist.get_rank(context.world_pg) == 0:
            print(EPOCH_MESSAGE.format(epoch=epoch, step=trainer.iteration_step), flush=True)

    if cfg.nanoset:  # tokenized folders: read from their files, no tokenizer, no cache (`folders`)
        return folders.feed(trainer, cfg, consumed or 0, input_pp_rank, output_pp_rank, announce)
    tokenizer = load_tokenizer(cfg)  # checked on every rank (vocab_size), before any rank waits on another
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    with main_rank_first(context.world_pg):  # rank 0 tokenizes and caches; the others reuse
        train_dataset = packed_dataset(
            cfg,
            tokenizer,
            num_proc=data.dataset.dataset_processing_num_proc_per_process or 1,
            overwrite_cache=bool(data.dataset.dataset_overwrite_cache),
        )
    dp = context.dp_pg.size()

    def loader_at(epoch: int, skip: int):  # type: ignore[no-untyped-def]
        loader = get_train_dataloader(
            train_dataset=train_dataset,
            sequence_length=trainer.sequence_length,
            parallel_context=context,
            input_pp_rank=input_pp_rank,
            output_pp_rank=output_pp_rank,
            micro_batch_size=trainer.micro_batch_size,
            consumed_train_samples=skip * dp,  # nanotron skips consumed_train_samples / dp samples of this rank's
            dataloader_num_workers=data.num_loading_workers,
            seed_worker=data.seed,
            dataloader_drop_last=True,
            **extra,
        )
        sampler = getattr(loader.sampler, "batch_sampler", loader.sampler)  # under nanotron's SkipBatchSampler
        sampler.set_epoch(epoch)  # a DistributedSampler: seed + epoch orders the epoch (main's: unshuffled)
        deaf_workers(loader)  # Slurm's SIGTERM is the rank's
        return loader

    per_epoch = (len(train_dataset) // dp) // trainer.micro_batch_size * trainer.micro_batch_size
    if per_epoch == 0:
        raise TrainError(
            f"the dataset makes {len(train_dataset)} windows of {trainer.sequence_length + 1} tokens, not one "
            f"micro-batch of {trainer.micro_batch_size} for each of the {dp} data-parallel ranks: use a larger "
            "dataset, a shorter sequence length or a smaller micro batch"
        )
    return epochs(loader_at, per_epoch, consumed // dp, announce)


def epochs(
    loader_at: Callable[[int, int], Iterable[dict]],
    samples_per_epoch: int,
    consumed: int,
    announce: Callable[[int], None],
) -> Iterator[dict]:
    """This rank's micro-batches forever: `loader_at(epoch, skip)` (a DataLoader over the epoch's order, its first
    `skip` samples skipped) for epoch 0, 1, ..., starting where `consumed` samples end (`samples_per_epoch` of them
    make an epoch). `announce(n)` as the first micro-batch of epoch n (counted from 1, n >= 2) is drawn, that is
    during the step that reads it. nanotron's own loader ends after one pass, and its loop then dies of
    "generator raised StopIteration"."""
    epoch, skip = divmod(consumed, samples_per_epoch)
    while True:
        new = skip == 0 and epoch > 0
        for batch in loader_at(epoch, skip):
            if new:
                announce(epoch + 1)
                new = False
            yield batch
        epoch, skip = epoch + 1, 0
