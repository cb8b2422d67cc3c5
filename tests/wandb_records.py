"""What wandb's offline mode wrote, read back for the tests: each `offline-run-*` directory's run id and the steps
its history holds, from its `run-ID.wandb` file (wandb's log format: a 7-byte header, then 32 KiB blocks of records,
each a crc32, a length and a type, a protobuf `Record` split across blocks where it must be). wandb 0.31 has no
reader of its own in Python; the protobuf classes are its own."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass(frozen=True)
class OfflineRun:
    directory: str
    run_id: str | None  # None: wandb wrote nothing there (its service killed before it wrote its file)
    steps: tuple[int, ...]


def records(path: Path) -> Iterator[object]:
    """The protobuf records of one .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb log"
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every offline run directory under `wandb_dir` (WANDB_DIR/wandb): its run id and its history's steps."""
    runs = []
    for directory in sorted(wandb_dir.glob("offline-run-*")):
        run_ids, steps = set(), []
        for path in directory.glob("run-*.wandb"):
            for record in records(path):
                kind = record.WhichOneof("record_type")  # type: ignore[attr-defined]
                if kind == "run":
                    run_ids.add(record.run.run_id)  # type: ignore[attr-defined]
                elif kind == "history":
                    steps.append(record.history.step.num)  # type: ignore[attr-defined]
        assert len(run_ids) <= 1, (directory, run_ids)
        runs.append(OfflineRun(directory.name, run_ids.pop() if run_ids else None, tuple(steps)))
    return runs
