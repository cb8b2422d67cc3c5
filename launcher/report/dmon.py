"""The GPU monitor's logs, as data: what `nvidia-smi dmon -d 15 -s pumt -o DT -f gpu-JOBID-HOST.log` writes on
each node of a job (the node step starts it wherever nvidia-smi exists; a later attempt on the same node writes
gpu-JOBID-HOST.log.2, .3, ...). Pure: text in, samples out.

The file is columns under two header lines, repeated now and then, each starting with '#': the names, then
the units. With `-s pumt -o DT` (the column set depends on the driver; they are read by name):

    #Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa     fb   bar1 ...
    #YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %     MB     MB ...
     20261123   14:41:47      0     71     33     41      0      0      0      0      0      0    531      2 ...

A value the GPU does not report is '-'. A line cut short (the job killed mid-write) is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableSequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    """One GPU at one time."""

    time: datetime
    gpu: int
    values: dict[str, float | None]  # column -> value; None where dmon printed '-' (not reported)


@dataclass
class DmonLog:
    """One node's monitor log."""

    host: str
    columns: list[str] = field(default_factory=list)  # as the header names them: date, time, gpu, pwr, ...
    units: dict[str, str] = field(default_factory=dict)  # column -> unit: "W", "%", "MB"
    samples: list[Sample] = field(default_factory=list)

    @property
    def gpus(self) -> list[int]:
        return sorted({s.gpu for s in self.samples})

    def series(self, gpu: int, column: str) -> tuple[list[datetime], list[float]]:
        """One GPU's reported values of one column over time ('-' left out)."""
        points = [(s.time, s.values.get(column)) for s in self.samples if s.gpu == gpu]
        kept = [(t, v) for t, v in points if v is not None]
        return [t for t, _ in kept], [v for _, v in kept]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # '-', 'N/A'


def parse(text: str, host: str = "") -> DmonLog:
    """A dmon log's samples; the header lines name the columns (without Date/Time, samples get no usable time)."""
    log = DmonLog(host)
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if line.startswith("#"):
            names = [w.lower() for w in line.lstrip("#").split()]
            if "gpu" in names:
                log.columns = names
            elif log.columns and len(names) == len(log.columns):
                log.units = dict(zip(log.columns, line.lstrip("#").split(), strict=True))
            continue
        if len(words) != len(log.columns) or "gpu" not in log.columns:
            continue  # before any header, or cut short
        row = dict(zip(log.columns, words, strict=True))
        try:
            when = datetime.strptime(f"{row.get('date', '19700101')} {row.get('time', '00:00:00')}", "%Y%m%d %H:%M:%S")
            gpu = int(row["gpu"])
        except ValueError:
            continue
        values = {k: _number(v) for k, v in row.items() if k not in ("date", "time", "gpu")}
        log.samples.append(Sample(when, gpu, values))
    return log


def host_of(path: Path, job_id: str) -> str:
    """The node a log is from, by its name: gpu-JOBID-HOST.log -> HOST (and a later attempt's gpu-JOBID-HOST.log.N)."""
    return re.sub(rf"^gpu-{re.escape(job_id)}-|\.log(\.\d+)?$", "", path.name)


def is_log_of(path: Path, job_id: str) -> bool:
    """Whether a file is one of a job's monitor logs: gpu-JOBID-HOST.log, or gpu-JOBID-HOST.log.N."""
    return re.fullmatch(rf"gpu-{re.escape(job_id)}-.+\.log(\.\d+)?", path.name) is not None


def joined(logs: list[DmonLog]) -> list[DmonLog]:
    """One log a node: the attempts' logs of the same host joined, their samples in time order."""
    by_host: dict[str, DmonLog] = {}
    for log in logs:
        into = by_host.setdefault(log.host, DmonLog(log.host, list(log.columns), dict(log.units)))
        into.samples.extend(log.samples)
    for log in by_host.values():
        log.samples.sort(key=lambda s: (s.time, s.gpu))
    return list(by_host.values())


# Thousands of nodes: each log is read as a stream into a fixed number of time bins (a node's mean over its GPUs
# and the bin's samples, per column shown), so that memory grows with nodes x bins, not with samples.


def _when(date: str, time: str) -> datetime | None:
    try:
        return datetime.strptime(f"{date} {time}", "%Y%m%d %H:%M:%S")
    except ValueError:
        return None


def span(path: Path, edge: int = 65536) -> tuple[datetime, datetime] | None:
    """The first and last sample times of a log, from its first and last `edge` bytes (None without samples)."""
    with open(path, "rb") as f:
        head = f.read(edge)
        size = f.seek(0, 2)
        f.seek(max(0, size - edge))
        tail = f.read(edge)
    found = []
    for chunk in (head, tail):
        rows = [w for w in (line.split() for line in chunk.decode("utf-8", "replace").splitlines()) if len(w) > 3]
        found.append([t for w in rows if not w[0].startswith("#") and (t := _when(w[0], w[1])) is not None])
    return (found[0][0], found[1][-1]) if found[0] and found[1] else None


@dataclass
class Binned:
    """One node's samples in time bins of `width` seconds from `start`: per shown column, the sum and count of its
    GPUs' reported values in each bin."""

    host: str
    start: datetime
    width: float
    sums: Mapping[str, MutableSequence[float]]  # array("d"): 8 bytes a bin, not a Python float's 32
    counts: Mapping[str, MutableSequence[int]]
    gpus: set[int] = field(default_factory=set)

    def means(self, column: str) -> list[float]:
        """Each bin's mean (NaN where the node reported nothing)."""
        return [s / n if n else float("nan") for s, n in zip(self.sums[column], self.counts[column], strict=True)]


def bin_into(binned: Binned, lines: Iterable[str]) -> Binned:
    """Add a log's samples (its lines, streamed) into `binned` (a node's later attempts go into the same bins)."""
    bins = len(next(iter(binned.sums.values())))
    columns: list[str] = []
    wanted: list[tuple[int, str]] = []
    cache: tuple[str, int] = ("", -1)
    for line in lines:
        if line.startswith("#"):
            names = [w.lower() for w in line.lstrip("#").split()]
            if "gpu" in names and "date" in names:
                columns = names
                wanted = [(names.index(c), c) for c in binned.sums if c in names]
            continue
        words = line.split()
        if len(words) != len(columns) or not columns:
            continue
        key = words[0] + words[1]
        if key != cache[0]:
            when = _when(words[0], words[1])
            index = -1 if when is None else int((when - binned.start).total_seconds() // binned.width)
            cache = (key, min(index, bins - 1))
        if cache[1] < 0:
            continue
        try:
            binned.gpus.add(int(words[columns.index("gpu")]))
        except ValueError:
            continue
        for i, column in wanted:
            value = _number(words[i])
            if value is not None:
                binned.sums[column][cache[1]] += value
                binned.counts[column][cache[1]] += 1
    return binned
