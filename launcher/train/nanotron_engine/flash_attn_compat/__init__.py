"""A stand-in for `flash_attn`, through torch's scaled_dot_product_attention, for nanotron 0.4's training path.

nanotron 0.4 imports flash_attn at module level (models/llama.py, models/starcoder2.py, nn/layer_norm.py), so its
trainer cannot even be imported without it, and flash-attn is CUDA-only, built from source. Training a Llama
calls three of its functions, implemented here with the same semantics:

- `flash_attn.flash_attn_interface.flash_attn_varlen_func` (`attention.py`): packed q/k/v of shape
  (total tokens, heads, head dim) with `cu_seqlens`, causal aligned to the bottom right, GQA by head groups,
  the output alone;
- `flash_attn.layers.rotary.RotaryEmbedding` (`rotary.py`): rotary embedding of q and of k (never v), cos/sin
  tables in the input's dtype, products in float32;
- `flash_attn.ops.triton.layer_norm.layer_norm_fn` with `is_rms_norm=True` (`layer_norm.py`): RMSNorm in float32,
  returned in the input's dtype.

Everything else nanotron imports (`bert_padding`, `flash_attn_with_kvcache`: inference only; nanotron main's
ring attention `_flash_attn_varlen_forward/_backward`) exists so the import succeeds, and raises
NotImplementedError when called, as do the options training never passes. nanotron main also imports the
functional `apply_rotary_emb` (implemented), `flash_attn.modules.mha.flash_attn_varlen_kvpacked_func` (its Qwen2's:
implemented, k and v packed) and reads `flash_attn.__version__` (this says 0.0.0, so main never
imports `flash_attn_func`, its `flash_attention_2` batch path, which is not here).

`install()` registers these modules as `flash_attn` and its submodules in `sys.modules`, only where the real
flash_attn (2.x, `flash_attn.flash_attn_interface`) cannot be imported; the nanotron engine calls it before
importing nanotron's trainer. Where FlashAttention 4 is installed (`flash-attn-4`: `flash_attn.cute` alone) and
the GPU runs it, the varlen attention goes through it (`fa4.py`); the job's log says which (`note()`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType

from launcher.train.nanotron_engine.flash_attn_compat import attention, bert_padding, fa4, layer_norm, mha, rotary

MESSAGE = "flash_attn not found: attention through torch SDPA"
PACKAGES = ("flash_attn", "flash_attn.layers", "flash_attn.modules", "flash_attn.ops", "flash_attn.ops.triton")
LEAVES: dict[str, ModuleType] = {
    "flash_attn.flash_attn_interface": attention,
    "flash_attn.bert_padding": bert_padding,
    "flash_attn.layers.rotary": rotary,
    "flash_attn.modules.mha": mha,
    "flash_attn.ops.triton.layer_norm": layer_norm,
}
REAL = "flash_attn.flash_attn_interface"  # what nanotron imports; FA4 alone makes `flash_attn` a namespace package
MARK = "__launcher_stand_in__"
VERSION = "0.0.0+launcher.stand.in"  # set on the registered `flash_attn` package


def is_installed() -> bool:
    """Whether `flash_attn` in this process is this stand-in."""
    return getattr(sys.modules.get("flash_attn"), MARK, False)


def real_flash_attn_error() -> ImportError | None:
    """Why the real flash_attn cannot be imported here (None: it can)."""
    if is_installed():
        return ImportError(MESSAGE)
    try:
        importlib.import_module(REAL)
    except ImportError as e:
        return e
    return None


def backend() -> str:
    """`flash_attn` (2.x), `fa4` (FlashAttention 4 on this GPU) or `sdpa` (the stand-in alone)."""
    if real_flash_attn_error() is None:
        return "flash_attn"
    fa4.load()
    return "fa4" if fa4.loaded() else "sdpa"


def note() -> str:
    """What attention runs on here, in the job's words: flash_attn, FlashAttention 4 or torch SDPA."""
    if real_flash_attn_error() is None:
        return "attention through flash_attn"
    found = fa4.load()
    return found if fa4.loaded() else MESSAGE + (f" ({found})" if found else "")


def install(is_main: bool) -> bool:
    """Register the stand-in as `flash_attn` unless the real one imports; True when the stand-in is in use.

    `is_main` (rank 0) prints MESSAGE, once, to the job's log.
    """
    if is_installed():
        return True
    if real_flash_attn_error() is None:
        return False
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]  # what a failed import of the real one left behind
    said = note()  # imports FlashAttention 4 where installed: its `flash_attn.cute` modules stay
    namespace = sys.modules.get("flash_attn")
    modules: dict[str, ModuleType] = {name: _package(name) for name in PACKAGES}
    if namespace is not None:  # FA4's namespace package: the stand-in takes its place and its path
        modules["flash_attn"].__path__ = list(getattr(namespace, "__path__", []))
        modules["flash_attn"].cute = sys.modules["flash_attn.cute"]  # type: ignore[attr-defined]
    modules.update(LEAVES)
    setattr(modules["flash_attn"], MARK, True)
    # nanotron main reads it (nn/attention.py): below 2.1.0 it never imports flash_attn_func, which is not here
    modules["flash_attn"].__version__ = VERSION  # type: ignore[attr-defined]
    for name, module in modules.items():
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    if is_main:
        print(said, flush=True)
    return True


def _package(name: str) -> ModuleType:
    module = ModuleType(name, f"launcher.train.nanotron_engine.flash_attn_compat: stand-in for {name} (torch SDPA)")
    module.__path__ = []  # a package: its submodules come from sys.modules
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    return module
