"""nanotron main (git, vendored unmodified in ../shared/vendor) for the tests: its source extracted once into
.cache/, and its own config parser run on files in a separate process (the installed nanotron is PyPI's 0.4;
one process cannot hold both). flash_attn and triton are stood in for the import (launcher.train's stand-ins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARBALL = ROOT.parent / "shared" / "vendor" / "nanotron-main-2411b02.tar.gz"
CACHE = ROOT / ".cache" / "nanotron-main-2411b02"
JUDGE = Path(__file__).resolve().parent / "nanotron_main_judge.py"
ON_CPU = Path(__file__).resolve().parent / "nanotron_main_cpu.py"


def source() -> Path:
    """The extracted tree (with src/, examples/); skips where the vendored tarball is absent, never under CI."""
    if not TARBALL.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{TARBALL} is missing: CI must have ../shared/vendor")
        pytest.skip(f"nanotron main's source is vendored at {TARBALL}, absent in this checkout")
    if not (CACHE / "src" / "nanotron" / "config" / "config.py").exists():
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE.parent) as tmp:
            with tarfile.open(TARBALL) as tar:
                tar.extractall(tmp, filter="data")
            try:
                os.replace(tmp, CACHE)  # another worker may have won: its copy is the same
            except OSError:
                pass
            Path(tmp).mkdir(exist_ok=True)  # TemporaryDirectory cleans up what is left
    return CACHE


def python_with_main(tmp_path: Path) -> Path:
    """An executable that runs this Python with nanotron main first on its path: a job's --python with main."""
    wrapper = tmp_path / "python-main"
    src = source() / "src"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{src}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def judge(*paths: Path) -> list[dict]:
    """nanotron main's `get_config_from_file` on each file: what it read ({"error": ...} where it refused)."""
    done = subprocess.run(
        [sys.executable, str(JUDGE), str(source() / "src"), *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def on_cpu(what: str, timeout: int = 600, env: dict[str, str | None] | None = None, **args: object) -> tuple[Any, str]:
    """`what(**args)` of tests/nanotron_main_cpu.py, run with nanotron main's own code on CPU in a process of its
    own (one-process gloo, main's CUDA-only plumbing patched there; `env` adds to this one's, None removes): its
    result and its stdout, or the test fails with its log."""
    done = subprocess.run(
        [sys.executable, str(ON_CPU), str(source() / "src"), what, json.dumps(args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}.items() if v is not None},
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"result"')]
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-5000:])
    return json.loads(lines[-1])["result"], done.stdout
