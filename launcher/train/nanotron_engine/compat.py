"""Compatibility shim for nanotron 0.4 (the only release on PyPI), whose import is broken as shipped.

`nanotron/logging.py` does `from nanotron.config.config import LoggingArgs` at module level, and
`nanotron.config.config` imports `nanotron.logging`: a circular import that makes `import nanotron.config`
(and so the trainer) fail in every order (upstream huggingface/nanotron#191, #235). `LoggingArgs` is used there
only as a type annotation.

`apply()` installs an import hook that loads `nanotron.logging` from its own source with that one line replaced
by a placeholder name, and changes nothing else. The hook only acts when the line is present, so a fixed
nanotron (installed from git) is imported untouched. Call `apply()` before importing anything from nanotron;
`import_nanotron_config()` does so and returns the `nanotron.config` module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

BROKEN_LINE = "from nanotron.config.config import LoggingArgs"
PLACEHOLDER = "LoggingArgs = 'LoggingArgs'  # launcher.nanotron_compat: annotation only, breaks the import cycle"
TARGET = "nanotron.logging"


class _PatchedSourceLoader(importlib.machinery.SourceFileLoader):
    """Loads nanotron/logging.py with the circular import replaced by a placeholder."""

    def get_data(self, path: str) -> bytes:
        data = super().get_data(path)
        if path.endswith(".py"):
            return data.replace(BROKEN_LINE.encode(), PLACEHOLDER.encode())
        return data

    def get_code(self, fullname: str):  # type: ignore[no-untyped-def]
        # Compile from the patched source, never from a cached .pyc of the original.
        source = self.get_data(self.get_filename(fullname))
        return compile(source, self.get_filename(fullname), "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, encoding="utf-8") as f:
            if BROKEN_LINE not in f.read():
                return None  # a nanotron without the bug
        loader = _PatchedSourceLoader(fullname, spec.origin)
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=loader)


def apply() -> None:
    """Install the import hook (idempotent). Must run before nanotron.logging is first imported."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def import_nanotron_config() -> ModuleType:
    """Return nanotron.config, importable on a CPU-only machine once the shim is applied."""
    apply()
    return importlib.import_module("nanotron.config")
