"""A stand-in for `triton`, for the import only: nanotron main's config imports its ring-attention modules, which
define Triton kernels at module level (`@triton.jit`, `tl.constexpr`), and the CPU build of torch has no Triton.

`install()` registers `triton`, `triton.language` and `triton.language.extra(.libdevice)` in `sys.modules`, only
where the real triton cannot be imported. Every name in them is a placeholder: decorators return a kernel that
raises NotImplementedError when launched (`kernel[grid](...)`); nanotron's Llama never launches one (they serve
context parallelism, which the launcher refuses).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, NoReturn

WHY = "the launcher's triton stand-in is for the import only; install triton on the GPU nodes"
MODULES = ("triton", "triton.language", "triton.language.extra", "triton.language.extra.libdevice")


class _Kernel:
    def __init__(self, fn: Any):
        self.fn = fn

    def __getitem__(self, grid: object) -> NoReturn:
        raise NotImplementedError(f"Triton kernel {getattr(self.fn, '__name__', self.fn)}: {WHY}")

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(f"Triton kernel {getattr(self.fn, '__name__', self.fn)}: {WHY}")


class _Placeholder:
    """Any name of triton: an attribute, a type in an annotation, a decorator or a decorator factory."""

    def __getattr__(self, name: str) -> _Placeholder:
        return _Placeholder()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return _Kernel(args[0])  # @triton.jit
        return lambda fn: _Kernel(fn)  # @triton.autotune(...), @triton.heuristics(...)


class _Module(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


def install() -> bool:
    """Register the stand-in unless the real triton imports; True when the stand-in is in use."""
    if getattr(sys.modules.get("triton"), "__launcher_stand_in__", False):
        return True
    try:
        importlib.import_module("triton")
        return False
    except ImportError:
        pass
    modules = {name: _Module(name, f"launcher.train.triton_compat: stand-in for {name}") for name in MODULES}
    for name, module in modules.items():
        module.__path__ = []  # type: ignore[attr-defined]
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__launcher_stand_in__ = True  # type: ignore[attr-defined]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    return True
