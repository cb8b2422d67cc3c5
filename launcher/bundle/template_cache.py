"""The bash templates compiled once, not at every launch: jinja2 lexes, parses and compiles both templates into
Python each time a process renders them (~25 ms of a dry run). Its bytecode cache keeps the compiled code under
$XDG_CACHE_HOME/nanotron-launcher/templates (default ~/.cache), one file per template path; jinja2 checks each
file against the template's source (sha1) and compiles afresh on any change. The file names also carry the
environment's options and jinja2's version, which the source check cannot see. The rendered text is the same
with or without it; a cache that cannot be read or written only costs that time again."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import jinja2
from jinja2.bccache import Bucket, FileSystemBytecodeCache


def directory() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "nanotron-launcher" / "templates"


class _Cache(FileSystemBytecodeCache):
    """jinja2's file cache, silent where the disk says no or a file is damaged (then it compiles as without)."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, EOFError, ValueError, pickle.UnpicklingError):
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def cache_for(options: dict) -> FileSystemBytecodeCache | None:
    """The cache for templates compiled with these Environment options; None where there can be no cache."""
    where = directory()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    key = hashlib.sha1(repr((jinja2.__version__, sorted(options.items()))).encode()).hexdigest()[:16]
    return _Cache(str(where), pattern=f"{key}-%s.cache")
