"""nanotron main's own code on CPU, run by tests/test_nanotron_main_cpu.py in a process of its own:
`python nanotron_main_cpu.py SRC WHAT [ARGS...]` with main's source at SRC first on the path (the installed nanotron
is PyPI's 0.4; one process cannot hold both). It prints one JSON line, `{"result": ...}`, for the test to judge.

flash_attn, triton and grouped_gemm are the launcher's stand-ins (`launcher.train.nanotron_engine.flash_attn_compat`,
`launcher.train.nanotron_engine.triton_compat`). `on_cpu()` patches what in main is CUDA-only plumbing a CPU cannot run,
and
nothing else:

- `ParallelContext.set_device` (torch.cuda.set_device); the process group is one-process gloo, made before
  ParallelContext, which then builds its groups on it (its `assert backend == "nccl"` checks an argument the
  trainer never passes, so it holds);
- the device "cuda" that main names in its calls (`build_model`'s default device, `init_on_device_and_dtype` in its
  trainer, `torch.tensor(..., device="cuda")` counting parameters, `P2P(..., device="cuda")`, the dataloader's
  `.to("cuda")`, clip_grad_norm's and the fp32 gradient accumulator's buffers) means the CPU: a torch function mode
  (`CudaIsCpu`) rewrites that one argument of torch's functions and tensor methods. Nothing else in their calls
  changes;
- main's random-token generator's `torch.Generator(device="cuda")` (a class: the mode does not see it) is made on
  the CPU;
- `state_dict_to_device(optimizer state, "cuda")` on resume (the trainer loads the states onto the CPU and moves
  them, then asserts they are on "cuda"): the states stay where they are loaded, on the CPU with the model;
- `all_reduce` runs under no_grad: gloo has no native AVG (torch sums, then divides in place, which autograd
  refuses on a parameter), and main's trainer averages its freshly initialised parameters across dp with it;
  NCCL's AVG writes into the buffer outside autograd, as this then does;
- the trainer's memory log (`log_memory`: torch.cuda.reset_peak_memory_stats, absent from a CPU build);
- the sanity checks inside nanotron's checkpoint save and optimizer load, which move optimizer states to "cuda"
  to compare them across ranks (with one rank there is nothing to compare), as the 0.4 tests do.

- main's timers are asked for as wall-clock (CPU) timers: a CUDA timer without CUDA turns itself into a CPU
  timer, and the next step's request for it as a CUDA timer is refused ("already exists with different settings").

`torch.cuda.memory_allocated` and `empty_cache` answer 0 and do nothing on a CPU build.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from nanotron_names import as_transformers  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from launcher.train.nanotron_engine import flash_attn_compat, triton_compat  # noqa: E402

flash_attn_compat.install(is_main=False)
triton_compat.install()
triton_compat.install_grouped_gemm()

import nanotron.trainer  # noqa: E402

triton_compat.uninstall()  # as the nanotron engine does once main is imported: torch would take it for triton
assert nanotron.__file__.startswith(sys.argv[1]), nanotron.__file__  # main's, not the installed 0.4

CPU = torch.device("cpu")


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == "cuda":
        return CPU
    if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
        return CPU
    return value


class CudaIsCpu(TorchFunctionMode):
    """torch's functions and tensor methods called with the device "cuda" get the CPU instead."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = {k: _cpu(v) if k == "device" else v for k, v in (kwargs or {}).items()}
        return func(*(_cpu(a) for a in args), **kwargs)


class TorchWithCpuGenerator:
    """torch, but a `Generator` asked for on "cuda" is made on the CPU (a class, not a torch function: the mode
    does not see its device argument). Put in place of the module name `torch` of one of main's modules only."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def Generator(device: Any = "cpu") -> torch.Generator:  # noqa: N802  # torch's name
        return torch.Generator(device=_cpu(device))


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """main's CUDA-only plumbing patched for a one-process gloo run (see the module's docstring)."""
    import nanotron.distributed
    import nanotron.serialize.main
    import nanotron.serialize.optimizer
    from nanotron.parallel import ParallelContext

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}.items():
        os.environ.setdefault(name, value)
    ParallelContext.set_device = lambda self: None
    real_all_reduce = dist.all_reduce

    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return real_all_reduce(*args, **kwargs)

    dist.all_reduce = nanotron.distributed.all_reduce = all_reduce  # main calls it through nanotron.distributed
    real_save = nanotron.serialize.main.save

    def save(*args: Any, **kwargs: Any) -> Any:
        return real_save(*args, **{**kwargs, "sanity_checks": False})

    nanotron.serialize.main.save = save
    import nanotron.trainer

    nanotron.trainer.save = save  # the name its save_checkpoint calls
    nanotron.trainer.log_memory = lambda *args, **kwargs: None  # torch.cuda.reset_peak_memory_stats
    nanotron.trainer.state_dict_to_device = lambda *args, **kwargs: None  # asserts the states are on "cuda"
    from nanotron.logging.timers import Timers, TimerType

    real_timer = Timers.__call__

    def timer(self: Any, name: Any, timer_type: Any = TimerType.CUDA, *args: Any, **kwargs: Any) -> Any:
        return real_timer(self, name, TimerType.CPU, *args, **kwargs)

    Timers.__call__ = timer
    nanotron.serialize.optimizer.check_optim_state_in_sync = lambda *args, **kwargs: None
    import nanotron.data.dataloader

    nanotron.data.dataloader.torch = TorchWithCpuGenerator()  # its random tokens' torch.Generator(device="cuda")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with CudaIsCpu():
            yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def llamas(cases: list[dict]) -> list[dict]:
    """`llama(**case)` for each case, in this one process (one import of nanotron, one process group)."""
    return [llama(**case) for case in cases]


def llama(rope_interleaved: bool, dtype: str) -> dict:
    """main's LlamaForTraining, built, tied and initialised by main's own functions, forward and backward; then the
    torch engine's Llama (launcher.train.torch_engine.llama) on the same weights and tokens: both losses, the largest
    gradient difference (relative to the largest gradient), the logits' largest difference."""
    from nanotron.config import LlamaConfig, ParallelismArgs, RandomInit
    from nanotron.models.base import build_model
    from nanotron.models.llama import LlamaForTraining
    from nanotron.parallel import ParallelContext
    from nanotron.trainer import mark_tied_parameters

    from launcher.nanotron_config.shape import ModelShape
    from launcher.train.torch_engine.llama import LlamaForCausalLM

    shape = ModelShape(32, 64, 2, 4, 2, 96, 32, rms_norm_eps=1e-5, rope_theta=500000.0,
                       rope_interleaved=rope_interleaved)  # fmt: skip
    context = ParallelContext(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1)
    config = LlamaConfig(
        hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads, vocab_size=shape.vocab_size,
        max_position_embeddings=shape.max_seq_len, rms_norm_eps=shape.rms_norm_eps,
        rope_theta=shape.rope_theta, rope_interleaved=rope_interleaved, tie_word_embeddings=False,
    )  # fmt: skip
    parallel = ParallelismArgs(dp=1, pp=1, tp=1)  # main's Llama reads it (tp_recompute_allgather, ...)
    model = build_model(
        model_builder=lambda: LlamaForTraining(config=config, parallel_context=context, parallel_config=parallel),
        parallel_context=context,
        dtype=getattr(torch, dtype),
    )  # main's default device: "cuda"
    mark_tied_parameters(model=model, parallel_context=context, parallel_config=parallel)
    torch.manual_seed(0)
    model.init_model_randomly(config=init_config(RandomInit(std=0.05), config))
    tokens = torch.randint(0, shape.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1))
    ids, labels, mask = tokens[:, :-1], tokens[:, 1:], torch.ones(3, 16, dtype=torch.bool)
    loss = model(input_ids=ids, input_mask=mask, label_ids=labels, label_mask=mask)["loss"]
    loss.backward()
    devices = sorted({p.device.type for p in model.parameters()})

    reference = LlamaForCausalLM(shape)
    weights = as_torch_engine({n: p.detach().float() for n, p in model.named_parameters()}, shape)
    assert set(weights) == set(reference.state_dict()), sorted(set(weights) ^ set(reference.state_dict()))
    reference.load_state_dict(weights)
    if dtype != "float32":
        reference.to(getattr(torch, dtype))
    logits = reference(ids)
    ref_loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
    ref_loss.backward()
    grads = as_torch_engine({n: p.grad for n, p in model.named_parameters()}, shape)
    worst = max(
        ((grads[n].float() - p.grad.float()).abs().max() / p.grad.float().abs().max()).item()
        for n, p in reference.named_parameters()
    )
    with torch.no_grad():
        sharded = model.model(input_ids=ids, input_mask=mask)  # (length, batch, vocab)
        logit_diff = (sharded.transpose(0, 1).float() - reference(ids).float()).abs().max().item()
    return {"loss": loss.item(), "reference_loss": ref_loss.item(), "worst_grad": worst, "logits": logit_diff,
            "devices": devices, "grads_finite": all(p.grad.isfinite().all().item() for p in model.parameters()),
            "grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters()}),
            "world": [context.tp_pg.size(), context.dp_pg.size(), context.pp_pg.size(), context.cp_pg.size()],
            "backend": dist.get_backend(context.world_pg)}  # fmt: skip


def init_config(init_method: Any, model_config: Any) -> Any:
    """What main's `LlamaForTraining.init_model_randomly(config)` reads. It hands `config.model` to its
    parametrizator, which reads `.model.init_method`, `.model.model_config` and `.parallelism.tp` of what it gets
    (a whole Config, as Qwen2's passes): so `config.model` here has those too."""
    model = SimpleNamespace(init_method=init_method, model_config=model_config)
    model.model, model.parallelism = model, SimpleNamespace(tp=1)
    return SimpleNamespace(model=model)


def as_torch_engine(named: dict[str, torch.Tensor], shape: Any) -> dict[str, torch.Tensor]:
    """main's Llama tensors (weights or gradients) under the torch engine's names (transformers'): both rotate q and
    k the same way for either `rope_interleaved`, so no rows move."""
    return as_transformers(named, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.intermediate_size)


def engines(runs: list[dict]) -> list[dict]:
    """The nanotron engine's `train()` (its dispatch to main's trainer included) on each run's `config_file`, one
    after another in this process, with the run's `env` set (None: unset; wandb reads its settings once a process)
    (and its stop file made where `stop` says): how each ended. A line `LEG n` starts run n's output."""
    from launcher.errors import TrainError
    from launcher.train.nanotron_engine import engine as nanotron_engine
    from launcher.train.settings import load_train_config

    nanotron_engine.missing = lambda: []  # it asks for a CUDA GPU and NCCL: this run is the CPU's, on gloo
    ended = []
    for n, run in enumerate(runs):
        print(f"LEG {n}", flush=True)
        for name, value in run.get("env", {}).items():  # None: unset
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        if run.get("stop"):  # a stop requested before this attempt starts
            open(os.path.join(os.environ["LAUNCHER_BUNDLE"], "stop-requested"), "w").close()
        if not dist.is_initialized():  # the engine destroys the process group on its way out
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        code, error = None, None
        try:
            nanotron_engine.train(run["config_file"], load_train_config(run["config_file"]))
        except SystemExit as e:  # a stop: the engine exits 0 after saving
            code = e.code
        except TrainError as e:  # what the job says and exits 1 with
            error = str(e)
        ended.append({"exit": code, "error": error, "destroyed": not dist.is_initialized()})
        if dist.is_initialized():  # the engine returned before nanotron used the group (a finished run)
            dist.destroy_process_group()
    return ended


WHAT = {"llamas": llamas, "engines": engines}

if __name__ == "__main__":
    what, args = sys.argv[2], json.loads(sys.argv[3])
    with on_cpu():
        result = WHAT[what](**args)
    print(json.dumps({"result": result}), flush=True)
