"""Mends for bugs of nanotron's own code that the configs the launcher writes would meet, applied by the nanotron
engine once nanotron is imported (`apply`). Each is narrow: it changes the one function that is wrong, and only
where that function is the wrong one (a fixed nanotron is left as it is). docs/engines.md lists them, with the
tests that fail without them; the trainer subclass (`launcher.train.nanotron_engine.trainer`) holds the ones that belong
to the training loop.

- **0.4, a checkpoint's shapes under numpy >= 2.** The merged column linears (qkv, gate_up) record their unsharded
  shape from numpy integers, and `str()` of numpy 2's integers is `np.int64(128)`: the metadata says
  `(np.int64(128), 64)`, which 0.4's reader cannot parse (`int('np.int64(128)')`), reported as "Checkpoint
  version mismatch". Every 0.4 checkpoint then loads only into the layout that wrote it: no `init_method.path`
  into another tp or pp, no relaunch with fewer nodes. Written as plain integers, and read either way (main
  parses it since PR #322).
- **main, ZeRO-1 with fp32 gradient accumulation and dp > 1.** `_init_model` decides
  `make_ddp = dp > 1 or cp > 1 and not (fp32_accumulation and zero_stage > 0)`, where `and` binds first: DDP is
  built anyway, and its fp32 gradient hook raises NotImplementedError for ZeRO in the first backward (every such
  run: the launcher's defaults with `--zero_stage 1`). Compiled again with the parentheses meant (0.4's own line
  has them), so the gradient accumulator reduces the gradients, as in 0.4.
- **main, several nodes with 8 GPUs or fewer in all.** `ParallelContext` takes the ranks a node holds as
  `LOCAL_WORLD_SIZE` only when the world is larger than 8, and as the whole world otherwise: a job of 2 nodes x 4
  (or 2 x 2) builds its node groups across nodes and dies at start-up ("Local rank mismatch"). torchrun always sets
  `LOCAL_WORLD_SIZE`: it is read whenever it is set.
- **0.4 and main, an optimizer resumed into another tp or pp.** `load_optimizer` finds the saved shards with
  `optimizer_pp-*-of-{pp}_tp-*-of-{tp}.pt`, but nanotron names them `..._tp-R-of-T_exp-E-of-X.pt`: the pattern
  matches only where the saved tp equals the expert-parallel size (1), so resuming a tp > 1 run with another tp
  or pp died with `KeyError: (0, 0)`. The pattern is widened to either name. (A ZeRO-1 optimizer in another layout
  has two more such patterns: the launcher refuses that change before the queue instead: `launcher.config`.)
"""

from __future__ import annotations

import re
from typing import Any

_NUMPY_INT = re.compile(r"^\s*(?:np|numpy)\.u?int\d*\((-?\d+)\)\s*$")


def shape_from_text(text: str) -> tuple[int, ...]:
    """'(128, 64)', '(np.int64(128), 64)' or '(128,)' as a shape (nanotron's own reading, numpy's repr allowed)."""
    pieces = [piece for piece in text.strip()[1:-1].split(",") if piece.strip()]
    return tuple(int(_NUMPY_INT.sub(r"\1", piece)) for piece in pieces)


def mend_checkpoint_shapes() -> bool:
    """0.4's TensorMetadata writes plain integers and reads numpy's too; False where nanotron has no such reader
    (main: nothing to mend)."""
    import dataclasses
    from typing import Tuple  # noqa: UP035  # nanotron's type hooks are keyed by typing's Tuple[int, ...]

    import torch
    from nanotron.serialize import metadata

    config = getattr(metadata.TensorMetadata, "_metadata_config", None)
    hooks = getattr(config, "type_hooks", None)
    key = Tuple[int, ...]  # noqa: UP006  # not tuple[int, ...]: a different key
    if config is None or not hooks or key not in hooks:
        return False
    if getattr(metadata.TensorMetadata, "_launcher_mended", False):
        return True
    hooks = {**hooks, key: lambda text: torch.Size(shape_from_text(text))}
    metadata.TensorMetadata._metadata_config = dataclasses.replace(config, type_hooks=hooks)
    real_to_str_dict = metadata.TensorMetadata.to_str_dict

    def to_str_dict(self: Any) -> dict[str, str]:
        written = real_to_str_dict(self)
        written["unsharded_shape"] = str(tuple(int(size) for size in self.unsharded_shape))
        return written

    metadata.TensorMetadata.to_str_dict = to_str_dict
    metadata.TensorMetadata._launcher_mended = True
    return True


def recompiled(function: Any, wrong: str, right: str) -> Any:
    """`function` compiled again from its own source with the text `wrong` replaced by `right`, in its module's
    namespace; None where its source does not hold `wrong` (a nanotron without the bug)."""
    import inspect
    import sys
    import textwrap

    original = inspect.unwrap(function)  # (under a decorator, e.g. torch.no_grad)
    lines, first = inspect.getsourcelines(original)
    source = textwrap.dedent("".join(lines))
    if wrong not in source:
        return None
    namespace: dict[str, Any] = {}
    filename = inspect.getsourcefile(original) or "<nanotron>"
    padded = "\n" * (first - 1) + source.replace(wrong, right)  # tracebacks name nanotron's own lines
    exec(compile(padded, filename, "exec"), vars(sys.modules[function.__module__]), namespace)
    mended = namespace[function.__name__]
    mended.__qualname__ = function.__qualname__
    return mended


def mend_in_place(owner: Any, name: str, wrong: str, right: str) -> bool:
    """`owner.name` replaced by itself `recompiled` with `wrong` read as `right`, once; False where its source does
    not hold `wrong`."""
    function = getattr(owner, name)
    if getattr(function, "_launcher_mended", False):
        return True
    mended = recompiled(function, wrong, right)
    if mended is None:
        return False
    mended._launcher_mended = True
    setattr(owner, name, mended)
    return True


MAKE_DDP_WRONG = "parallel_context.data_parallel_size > 1 or parallel_context.context_parallel_size > 1 and not ("
MAKE_DDP_RIGHT = "(parallel_context.data_parallel_size > 1 or parallel_context.context_parallel_size > 1) and not ("


def mend_make_ddp() -> bool:
    """main's DistributedTrainer._init_model with `make_ddp`'s parentheses; False where there is nothing to mend."""
    from nanotron.trainer import DistributedTrainer

    return mend_in_place(DistributedTrainer, "_init_model", MAKE_DDP_WRONG, MAKE_DDP_RIGHT)


SHARDS_WRONG = '_tp-*-of-{ckp_tp_size}.pt"'
SHARDS_RIGHT = '_tp-*-of-{ckp_tp_size}*.pt"'


def mend_optimizer_shards() -> bool:
    """`load_optimizer` with the shard pattern widened, wherever nanotron's modules hold it; False where there is
    nothing to mend."""
    import sys

    from nanotron.serialize import optimizer as serialize_optimizer

    function = serialize_optimizer.load_optimizer
    if not mend_in_place(serialize_optimizer, "load_optimizer", SHARDS_WRONG, SHARDS_RIGHT):
        return False
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("nanotron") and m is not None]:
        if getattr(module, "load_optimizer", None) is function:  # imported by name elsewhere (the trainer)
            module.load_optimizer = serialize_optimizer.load_optimizer  # type: ignore[attr-defined]
    return True


LOCAL_WRONG = 'int(os.environ.get("LOCAL_WORLD_SIZE", "8")) if world_size > 8 else world_size'
LOCAL_RIGHT = (
    'int(os.environ.get("LOCAL_WORLD_SIZE", "8")) if world_size > 8 or "LOCAL_WORLD_SIZE" in os.environ else world_size'
)


def mend_local_world_size() -> bool:
    """main's ParallelContext.__init__ reading torchrun's LOCAL_WORLD_SIZE whenever it is set; False where there is
    nothing to mend."""
    from nanotron.parallel.context import ParallelContext

    return mend_in_place(ParallelContext, "__init__", LOCAL_WRONG, LOCAL_RIGHT)


def apply(dialect: str) -> None:
    """The mends of `dialect`'s nanotron (imported already, its trainer included)."""
    mend_optimizer_shards()
    if dialect == "main":
        mend_make_ddp()
        mend_local_world_size()
    else:
        mend_checkpoint_shapes()
