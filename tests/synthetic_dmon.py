"""Synthetic `nvidia-smi dmon -d 15 -s pumt -o DT` logs of many nodes (tests/test_report.py,
bench/bench_scale_logs.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

HEADER = (
    "#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa     fb   bar1\n"
    "#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %     MB     MB\n"
)
START = datetime(2026, 11, 24, 10, 0, 0)


def write_logs(directory: Path, job_id: str, nodes: int, gpus: int, samples: int, slow: set[int]) -> int:
    """One log a node (gpu-JOBID-nodeNNNN.log), `samples` every 15 s; the nodes in `slow` at 10% utilisation, the
    others at 90%. Returns the bytes written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    for n in range(nodes):
        sm = 10 if n in slow else 90
        lines = [HEADER]
        for k in range(samples):
            when = START + timedelta(seconds=15 * k)
            stamp = f" {when:%Y%m%d}   {when:%H:%M:%S}"
            lines += [f"{stamp}  {g:5d}  {600 + g:5d}     60     70  {sm:5d}     40      0      0      0      0  "
                      f"70000      2\n" for g in range(gpus)]  # fmt: skip
        written += (directory / f"gpu-{job_id}-node{n:04d}.log").write_text("".join(lines))
    return written
