"""A sweep's record (`sweep.json`, in a directory of its own beside its points' bundles), written and read here
only: the points, their values and bundles, and their job ids as they are submitted. `load` reads it into a
typed `SweepRecord`; the sweep, `jobs`, the GPU-hour ledger and the pictures ask it by name, not by raw keys."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from launcher import atomic
from launcher import protocol as P
from launcher.bundle.files import write_new

RECORD = P.SWEEP_RECORD


@dataclass(frozen=True)
class SweepPoint:
    run_name: str
    values: dict[str, str]  # flag -> value, as typed
    bundle: Path  # the point's bundle directory
    job_id: str | None  # None until (unless) it is submitted


@dataclass(frozen=True)
class SweepRecord:
    directory: Path  # where sweep.json is (<configs_path>/<run_name>/<stamp>)
    sweep: str  # the --sweep text
    created: str
    points: tuple[SweepPoint, ...]
    rank_by: str | None = None  # --rank_by: the eval score its points are ranked by (None: their final loss)

    @property
    def name(self) -> str:
        """The sweep's run name (its points are NAME-1, NAME-2, ...)."""
        return self.directory.parent.name

    @property
    def submitted(self) -> list[SweepPoint]:
        """The points that have a job."""
        return [p for p in self.points if p.job_id]


def directory_of(target: Path) -> Path | None:
    """The sweep directory a path names (the directory or its sweep.json), None if it is no sweep's."""
    directory = target.parent if target.name == RECORD else target
    return directory if (directory / RECORD).is_file() else None


def load(directory: Path) -> SweepRecord:
    """The record in a sweep's directory. Raises OSError, or ValueError/KeyError for a damaged one."""
    data = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    points = tuple(
        SweepPoint(str(e["run_name"]), dict(e["values"]), Path(e["bundle"]), e.get("job_id") or None)
        for e in data["points"]
    )
    rank_by = data.get("rank_by") or None
    return SweepRecord(directory, str(data.get("sweep", "")), str(data.get("created", "")), points, rank_by)


def _text(record: SweepRecord) -> str:
    points = [
        {"run_name": p.run_name, "values": p.values, "bundle": str(p.bundle), "job_id": p.job_id} for p in record.points
    ]
    ranked = {"rank_by": record.rank_by} if record.rank_by else {}
    return json.dumps({"sweep": record.sweep, "created": record.created, **ranked, "points": points}, indent=2) + "\n"


def write(directory: Path, sweep: str, points: list[SweepPoint], rank_by: str | None = None) -> SweepRecord:
    """A new sweep's record, in its (claimed, empty) directory."""
    record = SweepRecord(directory, sweep, time.strftime("%Y-%m-%dT%H:%M:%S%z"), tuple(points), rank_by)
    write_new(directory / RECORD, _text(record))
    return record


def record_job(directory: Path, index: int, job_id: str) -> None:
    """Note the job id of the point at `index` (0-based) in the sweep's record."""
    record = load(directory)
    points = list(record.points)
    points[index] = dataclasses.replace(points[index], job_id=job_id)
    atomic.replace(directory / RECORD, _text(dataclasses.replace(record, points=tuple(points))))
