"""Stand-ins for `triton` and `grouped_gemm`, for the import only.

nanotron main's config imports its ring-attention modules, which define Triton kernels at module level
(`@triton.jit`, `tl.constexpr`), and the CPU build of torch has no Triton. `install()` registers `triton`,
`triton.language` and `triton.language.extra(.libdevice)` in `sys.modules`, only where the real triton cannot be
imported. Every name in them is a placeholder: decorators return a kernel that raises NotImplementedError when
launched (`kernel[grid](...)`); nanotron's Llama never launches one (they serve context parallelism, which the
launcher refuses). torch takes an importable `triton` for the real one (torch._dynamo, which torch.optim loads,
imports `triton.backends`), so where a process goes on to train, `uninstall()` takes the stand-in out again once
nanotron is imported.

nanotron main's trainer imports its mixture-of-experts layers (`nanotron.nn.moe`, through
`nanotron.scaling.parametrization`), which import `grouped_gemm.ops` at module level and raise where it is absent,
so even a dense Llama cannot start without that CUDA extension (built from git). `install_grouped_gemm()` stands in
for it the same way: `ops.gmm`, `ops.permute`, ... raise NotImplementedError when called; a dense Llama never
calls them (the launcher refuses MoE models).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, NoReturn

WHY = "the launcher's triton stand-in is for the import only; install triton on the GPU nodes"
MODULES = ("triton", "triton.language", "triton.language.extra", "triton.language.extra.libdevice")
GROUPED_GEMM_WHY = "the launcher's grouped_gemm stand-in is for the import only (a dense model never calls it)"
GROUPED_GEMM_MODULES = ("grouped_gemm", "grouped_gemm.ops")


class _Kernel:
    def __init__(self, fn: Any, why: str = WHY):
        self.fn, self.why = fn, why

    def __getitem__(self, grid: object) -> NoReturn:
        raise NotImplementedError(f"Triton kernel {getattr(self.fn, '__name__', self.fn)}: {self.why}")

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(f"{getattr(self.fn, '__name__', self.fn)}: {self.why}")


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


class _Function(_Module):
    """A module whose every name is a function that raises when called (grouped_gemm.ops.gmm, ...)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Kernel(f"{self.__name__}.{name}", GROUPED_GEMM_WHY)


def install() -> bool:
    """Register the triton stand-in unless the real triton imports; True when the stand-in is in use."""
    return _install(MODULES, _Module, probe="triton")


def install_grouped_gemm() -> bool:
    """Register the grouped_gemm stand-in unless the real one imports; True when the stand-in is in use."""
    return _install(GROUPED_GEMM_MODULES, _Function, probe="grouped_gemm.ops")


def _install(names: tuple[str, ...], kind: type[_Module], probe: str) -> bool:
    if getattr(sys.modules.get(names[0]), "__launcher_stand_in__", False):
        return True
    try:
        importlib.import_module(probe)
        return False
    except ImportError:
        pass
    for name in [n for n in sys.modules if n == names[0] or n.startswith(names[0] + ".")]:
        del sys.modules[name]  # what a failed import of the real one left behind
    modules = {name: kind(name, f"launcher.train.nanotron_engine.triton_compat: stand-in for {name}") for name in names}
    for name, module in modules.items():
        module.__path__ = []  # type: ignore[attr-defined]
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__launcher_stand_in__ = True  # type: ignore[attr-defined]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    return True


def uninstall() -> None:
    """Take the triton stand-in out of `sys.modules` (a real triton is left alone), once nanotron is imported: the
    modules that imported it keep their placeholders, and torch, which treats an importable `triton` as the real
    one (torch._inductor imports `triton.backends.compiler` when `import triton` succeeds), finds none."""
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        if getattr(sys.modules[name], "__launcher_stand_in__", False):
            del sys.modules[name]
