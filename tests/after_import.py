"""A patch run on a module right after it is imported, for the test side's sitecustomize files (tests/cpu_nanotron/,
tests/fault_points/): they load this file by its path at interpreter start, before anything else is imported."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Mapping
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, and wraps the loader of a module named in `patches` so that
    its patch runs once the module has executed."""

    def __init__(self, patches: Mapping[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                real_exec, patch = spec.loader.exec_module, self.patches[name]

                def exec_module(module: Any, real_exec: Any = real_exec, patch: Any = patch) -> None:
                    real_exec(module)
                    patch(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def install(patches: Mapping[str, Callable[[Any], None]]) -> None:
    """Each patch runs after its module's next import (and now, on a module imported already)."""
    sys.meta_path.insert(0, AfterImport(patches))
    for name in [n for n in patches if n in sys.modules]:
        patches[name](sys.modules[name])
