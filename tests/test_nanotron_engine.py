"""The nanotron engine on CPU: nanotron 0.4's own training loop, pipeline engine, optimizer, LR scheduler and
checkpoint save/load, driven by the engine's `train()` with the launcher's trainer subclass.

nanotron's DistributedTrainer.__init__ cannot run on a CPU (it counts parameters in "cuda" tensors, builds the
model on "cuda"), so `cpu_trainer` builds the same object as __init__ does, step for step, with nanotron's own
functions on the CPU; the rest of nanotron runs as installed except CUDA-only plumbing, patched in `on_cpu`:
ParallelContext.set_device, LlamaModel's P2P buffers (pp=1 sends nothing), the dataloader's move to "cuda",
the memory log, torch.cuda.synchronize, and the sanity checks inside nanotron's checkpoint save and optimizer load
(they move optimizer states to "cuda" to compare them across ranks: with one rank there is nothing to compare).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed as dist
from conftest import bundle_of, tiny_config, write_config

from launcher.errors import TrainError
from launcher.train.nanotron_engine import compat as nanotron_compat
from launcher.train.nanotron_engine import engine as nanotron_engine
from launcher.train.nanotron_engine import flash_attn_compat
from launcher.train.nanotron_engine import trainer as nanotron_trainer
from launcher.train.nanotron_engine.engine import EPOCH_MESSAGE, epochs
from launcher.train.nanotron_engine.pointer import POINTER, pointer_writes_dropped, write_pointer
from launcher.train.settings import load_train_config
from launcher.train.stop import STOP_MESSAGE

if TYPE_CHECKING:
    from conftest import DemoData


def test_the_pointer_is_replaced_whole_and_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / POINTER).write_text("3")
    synced, seen_before_replace = [], []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or real_fsync(fd))
    monkeypatch.setattr(
        os, "replace", lambda a, b: seen_before_replace.append((tmp_path / POINTER).read_text()) or real_replace(a, b)
    )
    write_pointer(tmp_path, 12)
    assert (tmp_path / POINTER).read_text() == "12"  # nanotron's format: parse_ckpt_path does int(read())
    assert seen_before_replace == ["3"], "until the new pointer is whole, readers see the old one"
    assert synced == [False, True], "the file's data, then the directory entry"
    assert sorted(p.name for p in tmp_path.iterdir()) == [POINTER], "no temporary file left"


def test_nanotrons_own_pointer_write_is_dropped_and_only_there(tmp_path: Path) -> None:
    module = ModuleType("fake_trainer")  # a module whose functions call `open` as nanotron.trainer's do
    exec(
        "def save(folder):\n"
        "    with open(folder / 'latest.txt', mode='w') as fo:\n"
        "        fo.write('7')\n"
        "    with open(folder / 'model_config.json', mode='w') as fo:\n"
        "        fo.write('{}')\n",
        vars(module),
    )
    with pointer_writes_dropped(module):
        module.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_config.json"]
    assert "open" not in vars(module), "the builtin is back"
    module.save(tmp_path)
    assert (tmp_path / "latest.txt").read_text() == "7"
    other = tmp_path / "rank1"
    other.mkdir()
    with pointer_writes_dropped(module, is_main=False):  # every other rank: neither the pointer nor model_config
        module.save(other)
    assert list(other.iterdir()) == []


def test_epochs_go_around_reshuffled_and_resume_where_they_stopped() -> None:
    """Six samples an epoch, micro-batches of two: a pass ends, the next begins in a new order, and a stream
    started after k samples continues exactly as the uninterrupted one, across epoch boundaries too."""
    orders = {e: [(e * 7 + 3 * i) % 6 for i in range(6)] for e in range(5)}  # a different order every epoch

    def loader_at(epoch: int, skip: int) -> list[dict]:
        order = orders[epoch][skip:]
        return [{"ids": order[i : i + 2], "epoch": epoch} for i in range(0, len(order), 2)]

    announced: list[int] = []
    stream = epochs(loader_at, samples_per_epoch=6, consumed=0, announce=announced.append)
    straight = [next(stream) for _ in range(10)]
    assert [b["epoch"] for b in straight] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert announced == [2, 3, 4], "announced as the first micro-batch of each new epoch is drawn"
    for consumed in (2, 6, 8, 12):
        announced.clear()
        resumed = epochs(loader_at, samples_per_epoch=6, consumed=consumed, announce=announced.append)
        assert [next(resumed) for _ in range(10 - consumed // 2)] == straight[consumed // 2 :], consumed
        assert announced == [e for e in (2, 3, 4) if (e - 1) * 6 >= consumed]


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[SimpleNamespace]:
    """nanotron (through the flash_attn stand-in) with its CUDA-only plumbing patched for the CPU."""
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}
    nanotron_compat.apply()
    flash_attn_compat.install(is_main=False)
    import nanotron.trainer as trainer  # noqa: I001  # first: nanotron.models alone is an import circle in 0.4
    import nanotron.models.llama as llama
    import nanotron.parallel
    import nanotron.serialize.optimizer
    from nanotron.parallel.pipeline_parallel.p2p import P2P

    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "WANDB_MODE": "disabled",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("LAUNCHER_BUNDLE",):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(nanotron.parallel.ParallelContext, "set_device", lambda self: None)
    monkeypatch.setattr(llama, "P2P", lambda pg, device: P2P(pg, torch.device("cpu")))
    monkeypatch.setattr(trainer, "sanity_check_dataloader", lambda dataloader, parallel_context, config: dataloader)
    monkeypatch.setattr(trainer, "log_memory", lambda logger: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(trainer, "save", functools.partial(trainer.save, sanity_checks=False))
    monkeypatch.setattr(nanotron.serialize.optimizer, "check_optim_state_in_sync", lambda optimizer, pg: None)
    monkeypatch.setattr(nanotron_engine, "missing", lambda: [])
    real_class = nanotron_trainer.trainer_class
    monkeypatch.setattr(
        nanotron_engine, "trainer_class", lambda cfg, job: functools.partial(cpu_trainer, real_class(cfg, job))
    )
    yield SimpleNamespace(trainer=trainer)
    if dist.is_initialized():
        dist.destroy_process_group()
    if trainer.wandb is not None:  # nanotron never finishes its wandb run (run_train.py's exit hooks do)
        trainer.wandb.finish()
        trainer.wandb.teardown()
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def cpu_trainer(cls: type, config_file: str) -> Any:
    """An instance of `cls` (a DistributedTrainer) as DistributedTrainer.__init__ makes it, on the CPU."""
    from nanotron import helpers, serialize
    from nanotron.config import get_config_from_file
    from nanotron.models.base import build_model
    from nanotron.parallel import ParallelContext
    from nanotron.random import set_random_seed
    from nanotron.trainer import CONFIG_TO_MODEL_CLASS, mark_tied_parameters

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # ParallelContext's, on CPU
    t = object.__new__(cls)
    t.config = config = get_config_from_file(config_file)
    t.model_config = config.model.model_config
    p = config.parallelism
    t.parallel_context = ParallelContext(
        tensor_parallel_size=p.tp, pipeline_parallel_size=p.pp, data_parallel_size=p.dp
    )
    set_random_seed(config.general.seed)
    t.random_states = helpers.init_random_states(parallel_config=p, tp_pg=t.parallel_context.tp_pg)
    t.model_config.vocab_size = helpers._vocab_size_with_padding(
        t.model_config.vocab_size, pg_size=1, make_vocab_size_divisible_by=config.model.make_vocab_size_divisible_by
    )
    t.model_config.max_position_embeddings = config.tokens.sequence_length
    build = CONFIG_TO_MODEL_CLASS[type(t.model_config).__name__]
    t.model = t.unwrapped_model = build_model(
        model_builder=lambda: build(config=t.model_config, parallel_context=t.parallel_context, parallel_config=p,
                                    random_states=t.random_states),
        parallel_context=t.parallel_context, dtype=config.model.dtype, device=torch.device("cpu"),
    )  # fmt: skip
    mark_tied_parameters(model=t.model, parallel_context=t.parallel_context, parallel_config=p)
    t.init_checkpoint_path = serialize.parse_ckpt_path(config=config)
    if t.init_checkpoint_path is not None:
        t.param_shard_metadata = serialize.load_weights(
            model=t.model, parallel_context=t.parallel_context, root_folder=t.init_checkpoint_path
        )
    else:
        t.model.init_model_randomly(config=config)
    t.optimizer, t.grad_accumulator = helpers.init_optimizer_and_grad_accumulator(
        model=t.model, optimizer_args=config.optimizer, parallel_context=t.parallel_context
    )
    t.lr_scheduler = helpers.lr_scheduler_builder(
        optimizer=t.optimizer,
        lr_scheduler_args=config.optimizer.learning_rate_scheduler,
        total_training_steps=config.tokens.train_steps,
    )
    t.start_iteration_step = t.consumed_train_samples = 0
    if t.init_checkpoint_path is not None:
        serialize.load_optimizer(optimizer=t.optimizer, parallel_context=t.parallel_context,
                                 root_folder=t.init_checkpoint_path, param_shard_metadata=t.param_shard_metadata,
                                 model=t.model)  # fmt: skip
        serialize.load_lr_scheduler(lr_scheduler=t.lr_scheduler, root_folder=t.init_checkpoint_path)
        metas = serialize.load_meta(parallel_context=t.parallel_context, root_folder=t.init_checkpoint_path).metas
        t.start_iteration_step, t.consumed_train_samples = metas["last_train_step"], metas["consumed_train_samples"]
    t.logger_ranks = t.parallel_context.world_rank_matrix[0, t.unwrapped_model.output_pp_rank, 0, 0].flatten()
    t.loggerwriter = t.setup_log_writers()
    t.micro_batch_size = config.tokens.micro_batch_size
    t.n_micro_batches_per_batch = config.tokens.batch_accumulation_per_replica
    t.global_batch_size = t.micro_batch_size * t.n_micro_batches_per_batch * t.parallel_context.dp_pg.size()
    t.sequence_length = config.tokens.sequence_length
    t.iteration_step = t.start_iteration_step
    t.limit_val_batches = config.tokens.limit_val_batches
    t.post_init()
    return t


def test_the_cpu_trainer_is_built_as_nanotrons_init_builds_it() -> None:
    """The functions cpu_trainer calls are the ones DistributedTrainer.__init__ (and its init_model) call."""
    import inspect

    nanotron_compat.apply()
    source = inspect.getsource(cpu_trainer)
    spec = importlib.util.find_spec("nanotron")
    assert spec is not None and spec.origin is not None
    init = (Path(spec.origin).parent / "trainer.py").read_text()
    for call in ("get_config_from_file(", "ParallelContext(", "set_random_seed(", "init_random_states(",
                 "_vocab_size_with_padding(", "build_model(", "mark_tied_parameters(", "parse_ckpt_path(",
                 "load_weights(", "init_model_randomly(", "init_optimizer_and_grad_accumulator(",
                 "lr_scheduler_builder(", "load_optimizer(", "load_lr_scheduler(", "load_meta(",
                 "setup_log_writers()", "self.post_init()"):  # fmt: skip
        assert call.replace("self.", "t.") in source and call in init, call


def run(config: dict, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The nanotron engine's train() on `config` (every line it and nanotron print to stdout)."""
    config_file = write_config(path, config)
    try:
        nanotron_engine.train(str(config_file), load_train_config(str(config_file)))
    except SystemExit as e:  # a stop: the engine exits 0 after saving
        assert e.code == 0
    assert not dist.is_initialized(), "the engine destroys the process group on its way out"
    return capsys.readouterr().out


def cpu_config(demo: DemoData, ckpt: Path, **overrides: Any) -> dict:
    """tiny_config for nanotron on CPU: float32, no clipping (nanotron's clip_grad_norm is CUDA-only), bf16 grads
    accumulated in place (its fp32 accumulator allocates on CUDA)."""
    return tiny_config(demo, ckpt, **{"model.dtype": "float32", "optimizer.clip_grad": None,
                                      "optimizer.accumulate_grad_in_fp32": False, **overrides})  # fmt: skip


def metrics(path: Path) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, path.read_text().splitlines())}


def test_nanotrons_loop_goes_around_epochs_and_saves_its_last_step(
    on_cpu: SimpleNamespace, demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("LAUNCHER_BUNDLE", str(tmp_path))  # its metrics.jsonl, its outcome
    ckpt = tmp_path / "ckpt"
    config = cpu_config(demo_data, ckpt, **{"tokens.train_steps": 23, "checkpoints.checkpoint_interval": 10})
    out = run(config, tmp_path / "c.yaml", capsys)

    windows = len(nanotron_engine.packed_dataset(load_train_config(str(tmp_path / "c.yaml")), _tokenizer(demo_data)))
    per_step = 4 * 2  # micro batch x grad accumulation, one data-parallel rank
    assert 23 * per_step > windows, "the run reads more windows than an epoch holds"
    first_of_epoch_2 = windows // 4 * 4  # whole micro-batches per epoch
    assert EPOCH_MESSAGE.format(epoch=2, step=first_of_epoch_2 // per_step + 1) in out
    assert "StopIteration" not in out

    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["10", "20", "23"], "the last step too"
    assert (ckpt / POINTER).read_text() == "23"
    assert not [p for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    assert (tmp_path / "outcome").read_text() == "finished 23\n"
    assert "training finished at step 23" in out
    m = metrics(tmp_path / "metrics.jsonl")
    assert sorted(m) == list(range(1, 24)) and all(0 < m[s]["loss"] < 10 for s in m)
    assert m[1]["lr"] == 0.0 and m[4]["lr"] == pytest.approx(0.01)  # tiny_config's warmup: as the torch engine's

    assert "run already finished: checkpoint step 23, train_steps 23" in run(config, tmp_path / "c.yaml", capsys)


def _tokenizer(demo: DemoData) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(demo.tokenizer))


def test_a_stop_logs_its_step_saves_it_and_the_resumed_run_continues_exactly(
    on_cpu: SimpleNamespace, demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Straight to step 12, against: to step 4, stopped at step 5 (not a logging step), resumed to 12. nanotron's own
    checkpoint save and load, LR scheduler state and data position, on CPU: the same LR and loss at every step."""

    def leg(ckpt: str, steps: int, name: str) -> str:
        monkeypatch.setenv("LAUNCHER_BUNDLE", str(bundle_of(tmp_path, ckpt)))
        overrides = {"tokens.train_steps": steps, "logging.iteration_step_info_interval": 3}
        return run(cpu_config(demo_data, tmp_path / ckpt, **overrides), tmp_path / f"{name}.yaml", capsys)

    leg("a", 12, "straight")
    leg("b", 4, "first")
    stop_file, outcome = bundle_of(tmp_path, "b") / "stop-requested", bundle_of(tmp_path, "b") / "outcome"
    stop_file.touch()
    out = leg("b", 12, "second")
    assert "resuming from the run's own checkpoints" in out and "(latest: 4)" in out
    assert STOP_MESSAGE.format(step=5) in out
    assert outcome.read_text() == "stopped 5\n" and not stop_file.exists()
    assert (tmp_path / "b" / POINTER).read_text() == "5"
    assert 5 in metrics(bundle_of(tmp_path, "b") / "metrics.jsonl"), "the stop step is logged though (5 - 1) % 3 != 0"
    out = leg("b", 12, "third")
    assert "(latest: 5)" in out and outcome.read_text() == "finished 12\n"

    straight, resumed = (metrics(bundle_of(tmp_path, ckpt) / "metrics.jsonl") for ckpt in ("a", "b"))
    assert sorted(straight) == [1, 4, 7, 10, 12] and sorted(resumed) == [1, 4, 5, 7, 10, 12]  # 12: the last
    for step in straight:
        for key in ("loss", "lr"):
            assert resumed[step][key] == pytest.approx(straight[step][key], rel=1e-6, abs=0), (step, key)


def test_wandb_without_a_key_is_one_clear_error(
    on_cpu: SimpleNamespace, demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    config = cpu_config(demo_data, tmp_path / "ckpt", **{"tokens.train_steps": 2})
    with pytest.raises(TrainError, match=r"wandb could not start \(.*\): run `wandb login`, or set WANDB_MODE=offline"):
        run(config, tmp_path / "c.yaml", capsys)
    assert not dist.is_initialized()


def test_auto_takes_nanotron_without_flash_attn_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.train import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nanotron_engine, "missing", lambda: [])
    monkeypatch.setattr(flash_attn_compat, "real_flash_attn_error", lambda: ImportError("no flash_attn"))
    assert main.choose_engine("auto") == ("nanotron", "auto; flash_attn not found: attention through torch SDPA")


def test_what_the_engine_needs_no_longer_includes_flash_attn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # unimportable
    assert nanotron_engine.missing() == ["a CUDA GPU", "NCCL"]  # this machine: no GPU, a CPU build of torch
    assert nanotron_engine.attention_note() == "flash_attn not found: attention through torch SDPA"
