"""A step's marker in the bucket: what makes a remote checkpoint count. Written last, after every file of the step
is uploaded, it names each file with its size and checksum; a step whose marker is absent is no checkpoint (an upload
in progress, or one a kill, a preemption or a network fault cut), and one whose files do not match it is not taken
either (a download checks every size and checksum before the step is put in place).

The checksum is CRC-32 (zlib's, the one S3 itself offers as an object checksum): it is there to catch accidental
damage (a file changed under an upload, a transfer or a store that lost bytes), not an adversary, and it is the
cheapest of the standard library's: measured here at 1.5x SHA-1's and SHA-256's speed and 3x MD5's, BLAKE2b's
(bench/bench_remote.py, docs/performance.md). A 16 GB checkpoint is read once more for it, in the uploader's thread.
Standard library only."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
CHECKSUM = "crc32"
SUFFIX = ".complete.json"  # <run folder>/<step>.complete.json, beside <run folder>/<step>/
CHUNK = 8 << 20

Files = dict[str, tuple[int, str]]  # a step's files: path (POSIX, relative to the step) -> (bytes, crc32 as 8 hex)


def crc32(path: Path) -> str:
    """The file's CRC-32, as 8 hex digits (zlib releases the GIL over each chunk: the supervisor's loop goes on)."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


def sizes(step_dir: Path) -> dict[str, int]:
    """Every file under `step_dir` and its size (a stat each: cheap)."""
    found = {}
    for folder, dirs, names in os.walk(step_dir):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            found[path.relative_to(step_dir).as_posix()] = path.stat().st_size
    return found


def describe(step_dir: Path) -> Files:
    """Every file under `step_dir`, its size and checksum (the whole step read once)."""
    return {rel: (size, crc32(step_dir / rel)) for rel, size in sizes(step_dir).items()}


@dataclass(frozen=True)
class Marker:
    """A complete remote step: its files, the engine that wrote them, the config dialect they were written from."""

    step: int
    engine: str
    files: Files
    dialect: str = ""  # nanotron's "0.4" | "main" where the checkpoints folder records it
    extra: dict = field(default_factory=dict)  # who wrote it, when: for the reader, never compared

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())

    def to_json(self) -> str:
        files = {rel: {"bytes": size, CHECKSUM: crc} for rel, (size, crc) in sorted(self.files.items())}
        data = {"format": FORMAT, "step": self.step, "engine": self.engine, "dialect": self.dialect,
                "checksum": CHECKSUM, "bytes": self.bytes, "files": files, **self.extra}  # fmt: skip
        return json.dumps(data, indent=1) + "\n"


def parse(text: str) -> Marker | None:
    """A marker from its text; None where it is not one this launcher writes (damaged, another format)."""
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("checksum") != CHECKSUM:
            return None
        files = {str(rel): (int(v["bytes"]), str(v[CHECKSUM])) for rel, v in data["files"].items()}
        known = {"format", "step", "engine", "dialect", "checksum", "bytes", "files"}
        extra = {k: v for k, v in data.items() if k not in known}
        return Marker(int(data["step"]), str(data["engine"]), files, str(data.get("dialect") or ""), extra)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def mismatches(expected: Mapping[str, tuple[int, str]], found: Mapping[str, tuple[int, str]], at_most: int = 3) -> str:
    """How `found` differs from `expected`, in words ("" where it does not)."""
    said = [f"{rel} missing" for rel in sorted(set(expected) - set(found))]
    said += [f"{rel} not in the marker" for rel in sorted(set(found) - set(expected))]
    for rel in sorted(set(expected) & set(found)):
        (want, want_crc), (got, got_crc) = expected[rel], found[rel]
        if want != got:
            said.append(f"{rel} has {got} bytes, not {want}")
        elif want_crc != got_crc:
            said.append(f"{rel}'s {CHECKSUM} is {got_crc}, not {want_crc}")
    more = f" and {len(said) - at_most} more" if len(said) > at_most else ""
    return "; ".join(said[:at_most]) + more
