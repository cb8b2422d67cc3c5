"""nanotron's trainer (0.4's or main's) with several ranks on CPU over gloo, for the tests: loaded at interpreter
start (Python imports `sitecustomize` from its path) by the job's Python that `tests/cpu_nanotron.py` makes, and
active only where LAUNCHER_TEST_NANOTRON_ON_CPU=1. Test side only, never the product (docs/engines.md).

It patches CUDA-only plumbing, each patch applied right after nanotron's (or torch's) module is imported, and
nothing of nanotron's parallel arithmetic (../shared/notes/NANOTRON-MULTIRANK.md lists why each is needed):

- the launcher's "the nanotron engine needs a CUDA GPU and NCCL": passed; its `train` runs inside `CudaIsCpu`, a
  torch function mode that maps a device argument of "cuda" (or a CUDA index) to the CPU;
- nanotron's `initialize_torch_distributed` (it raises without CUDA): torchrun's env://, on gloo;
  `ParallelContext.set_device`: nothing;
- `all_reduce` under no_grad (gloo's AVG sums, then divides in place, which autograd refuses on a leaf);
- gloo's `reduce_scatter_tensor` checks dim 0 (out x world == in) where NCCL checks the element count: the input
  is viewed as (out0 x world, ...) where the counts match (main's sync REDUCE_SCATTER);
- torch.cuda's `synchronize`, `empty_cache`, `set_device` do nothing, `current_device` is 0 (mapped to the CPU by
  the mode), the memory statistics are 0; nanotron's memory log does nothing;
- main's `state_dict_to_device(optimizer state, "cuda")` on resume leaves the states where they are (the CPU);
- main's MemoryBuffer (tp > 1) allocates on the CPU (in backward too);
- the pipeline's P2P buffers are made on the CPU (it allocates in autograd's backward, outside the mode);
- 0.4's rotary buffer's `assert ... device.type == "cuda"`: the function is compiled again without that line;
- main's timers are wall-clock (CPU) timers; the random-token generator's `torch.Generator(device="cuda")` (a
  class: the mode does not see it) is the CPU's.

Not a patch but a look, where LAUNCHER_TEST_BATCH_LOG is set: every micro-batch's input_ids the trainer draws, logged
per rank (`_logged`), for the tests that compare what a resumed run reads with what an uninterrupted one does.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

ACTIVE = os.environ.get("LAUNCHER_TEST_NANOTRON_ON_CPU") == "1"


def _cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
        return torch.device("cpu")
    if isinstance(value, int) and not isinstance(value, bool):  # torch.cuda.current_device()'s index
        return torch.device("cpu")
    return value


def cuda_is_cpu() -> Any:
    """A torch function mode: `device=` "cuda" in torch's functions and tensor methods, and a "cuda" positional
    argument of `Tensor.to`, mean the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaIsCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = {k: _cpu(v) if k == "device" else v for k, v in (kwargs or {}).items()}
            if func in (torch.Tensor.to, torch.Tensor.cuda):
                if func is torch.Tensor.cuda:
                    return args[0]
                args = tuple(a if isinstance(a, int | bool) else _cpu(a) for a in args)
            return func(*args, **kwargs)

    return CudaIsCpu()


def _patch_torch_distributed(dist: Any) -> None:
    import torch

    real_all_reduce, real_reduce_scatter_tensor = dist.all_reduce, dist.reduce_scatter_tensor

    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return real_all_reduce(*args, **kwargs)

    def reduce_scatter_tensor(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        world = dist.get_world_size(kwargs.get("group") or (args[1] if len(args) > 1 else None))
        if input.shape[0] != output.shape[0] * world and input.numel() == output.numel() * world:
            input = input.reshape(output.shape[0] * world, *output.shape[1:])
        return real_reduce_scatter_tensor(output, input, *args, **kwargs)

    dist.all_reduce, dist.reduce_scatter_tensor = all_reduce, reduce_scatter_tensor


def _patch_torch_cuda(cuda: Any) -> None:
    for name in ("synchronize", "empty_cache", "set_device", "reset_peak_memory_stats", "manual_seed"):
        setattr(cuda, name, lambda *args, **kwargs: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, lambda *args, **kwargs: 0)
    cuda.current_device = lambda: 0


def _patch_engine(engine: Any) -> None:
    engine.missing = lambda: []
    real_train = engine.train

    def train(*args: Any, **kwargs: Any) -> Any:
        with cuda_is_cpu():
            return real_train(*args, **kwargs)

    engine.train = train


def _patch_nanotron_distributed(module: Any) -> None:
    import torch.distributed as dist

    def initialize_torch_distributed() -> bool:
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo", init_method="env://")
        return True

    module.initialize_torch_distributed = initialize_torch_distributed
    if hasattr(module, "all_reduce"):  # main calls nanotron.distributed.all_reduce
        module.all_reduce = dist.all_reduce
    if hasattr(module, "reduce_scatter_tensor"):
        real = module.reduce_scatter_tensor

        def reduce_scatter_tensor(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            world = dist.get_world_size(group)
            if input.shape[0] != output.shape[0] * world and input.numel() == output.numel() * world:
                input = input.reshape(output.shape[0] * world, *output.shape[1:])
            return real(output, input, *args, **kwargs)

        module.reduce_scatter_tensor = reduce_scatter_tensor


def _patch_context(module: Any) -> None:
    module.ParallelContext.set_device = lambda self: None


def _patch_trainer(module: Any) -> None:
    module.log_memory = lambda *args, **kwargs: None
    if hasattr(module, "state_dict_to_device"):  # main, on resume: moves the states, then asserts they are on CUDA
        module.state_dict_to_device = lambda *args, **kwargs: None
    if os.environ.get("LAUNCHER_TEST_BATCH_LOG") and hasattr(module, "sanity_check_dataloader"):
        module.sanity_check_dataloader = _logged(module.sanity_check_dataloader, os.environ["LAUNCHER_TEST_BATCH_LOG"])


def _logged(real: Any, base: str) -> Any:
    """The tests' look at what the trainer reads: every micro-batch's input_ids as it is drawn (a rank holding
    them), one JSON line each, appended to `<base>.rank<RANK>.jsonl`."""
    import json

    path = f"{base}.rank{os.environ.get('RANK', '0')}.jsonl"

    def sanity_check_dataloader(*args: Any, **kwargs: Any) -> Any:
        for batch in real(*args, **kwargs):
            ids = batch.get("input_ids")
            if hasattr(ids, "tolist"):
                with open(path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(ids.tolist()) + "\n")
            yield batch

    return sanity_check_dataloader


def _recompiled(function: Any, wrong: str, right: str) -> Any:
    from launcher.train.nanotron_engine.mends import recompiled  # the product's own way to mend one function's text

    return recompiled(function, wrong, right) or function


def _patch_llama(module: Any) -> None:
    """0.4's RotaryEmbedding.init_rotary_embeddings asserts its buffer is on CUDA: compiled again without it."""
    cls = getattr(module, "RotaryEmbedding", None)
    if cls is not None and hasattr(cls, "init_rotary_embeddings"):
        cls.init_rotary_embeddings = _recompiled(
            cls.init_rotary_embeddings, 'assert self.freqs_cis.device.type == "cuda"', "pass"
        )


def _patch_memory_buffer(module: Any) -> None:
    """main's MemoryBuffer (tp > 1) allocates on `torch.cuda.current_device()`, in autograd's backward too."""
    if hasattr(module, "MemoryBuffer"):  # (0.4 has none)
        module.MemoryBuffer.get = _recompiled(
            module.MemoryBuffer.get, "device=torch.cuda.current_device()", 'device="cpu"'
        )


def _patch_timers(module: Any) -> None:
    real = module.Timers.__call__

    def timer(self: Any, name: Any, timer_type: Any = None, *args: Any, **kwargs: Any) -> Any:
        return real(self, name, module.TimerType.CPU, *args, **kwargs)

    module.Timers.__call__ = timer


def _patch_random_tokens(module: Any) -> None:
    import torch

    class TorchWithCpuGenerator:
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def Generator(device: Any = "cpu") -> Any:  # noqa: N802  # torch's name
            return torch.Generator(device=_cpu(device))

    module.torch = TorchWithCpuGenerator()


def _patch_p2p(module: Any) -> None:
    """The pipeline's P2P keeps its device and allocates on it in autograd's backward too, where the mode is not
    active: the CPU, from the start."""
    real_init = module.P2P.__init__

    def __init__(self: Any, pg: Any, device: Any) -> None:
        real_init(self, pg, _cpu(device))

    module.P2P.__init__ = __init__


PATCHES = {
    "nanotron.parallel.utils": _patch_memory_buffer,
    "nanotron.parallel.pipeline_parallel.p2p": _patch_p2p,
    "torch.distributed": _patch_torch_distributed,
    "torch.cuda": _patch_torch_cuda,
    "launcher.train.nanotron_engine.engine": _patch_engine,
    "nanotron.distributed": _patch_nanotron_distributed,
    "nanotron.parallel.context": _patch_context,
    "nanotron.trainer": _patch_trainer,
    "nanotron.models.llama": _patch_llama,
    "nanotron.logging.timers": _patch_timers,
    "nanotron.data.dataloader": _patch_random_tokens,  # main's
    "nanotron.dataloader": _patch_random_tokens,  # 0.4's
}


def _install(patches: dict[str, Any]) -> None:
    """tests/after_import.py's install, the file loaded by its path (this folder alone is on the job's PYTHONPATH)."""
    spec = importlib.util.spec_from_file_location("_after_import", Path(__file__).parents[1] / "after_import.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.install(patches)


if ACTIVE:
    _install(PATCHES)
