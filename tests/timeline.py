"""Where a `make test` part's time goes, and the order that shortens it.

`make test` runs each part on pytest-xdist workers (two for the host part, four for a Slurm release's), a test file
at a time (`--dist loadfile`): a part ends when its busiest worker does, and a long file handed out last leaves the
others idle meanwhile. So:
- the files known to be long go out first (`LONG_FILES`, longest first: the usual remedy for such a schedule);
  every other file keeps pytest's order after them. Every worker sorts alike, as xdist needs.
- with LAUNCHER_TEST_TIMELINE=FILE, pytest's main process writes a row per test (worker, when it ended in seconds
  from the start, its setup + call + teardown seconds, ok or failed, its id) to FILE: `make test` writes
  logs/timeline-*.tsv, for whoever trims the suite next (bench/README.md says how to read it).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

# Seconds each file took in a quiet fresh-clone run (2026-12-06, bbef6b0: the sum of its tests' setup, call and
# teardown, logs/timeline-*.tsv; a file in two parts of 22.05: both summed), over a minute only. A file's place
# matters, not its figure; a part weighs a file by the share of its tests it runs.
LONG_FILES = {
    "test_operations.py": 460,
    "test_evals_slurm.py": 460,
    "test_goodput.py": 390,
    "test_retention_slurm.py": 320,
    "test_e2e_training.py": 300,
    "test_slurm_e2e.py": 235,
    "test_containers.py": 225,
    "test_preemption.py": 215,
    "test_s3_server.py": 180,  # (38 s with the S3 server's root built: on a bare machine its first test builds it)
    "test_verdict_slurm.py": 170,
    "test_nanotron_multirank.py": 150,
    "test_nanotron_slurm.py": 140,
    "test_nanoset_slurm.py": 135,
    "test_accounting.py": 125,
    "test_supervisor_slurm.py": 110,
    "test_remote_slurm.py": 100,
    "test_follow.py": 100,
    "test_nanotron_main_cpu.py": 90,
    "test_export.py": 85,
    "test_export_chain.py": 80,
    "test_slurm_versions.py": 70,
    "test_evals_job.py": 65,
    "test_nanoset_nanotron.py": 60,
}


_DESELECTED: Counter[str] = Counter()


def _file(item: pytest.Item) -> str:
    return Path(str(item.fspath)).name


def pytest_deselected(items: list[pytest.Item]) -> None:
    """The tests a part leaves out (`-m`), by file: what is left of a long file may be short."""
    _DESELECTED.update(_file(item) for item in items)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected what the part leaves out
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long files first, longest first, each weighed by the share of its tests the part runs (a part that runs 1
    of a file's 25 tests gets a short file: handed out first, it would hold a worker while xdist gave the worker's
    second file, a long one, no other); a stable sort keeps every other test where pytest put it."""
    selected = Counter(_file(item) for item in items)

    def weight(item: pytest.Item) -> float:
        name = _file(item)
        return -LONG_FILES.get(name, 0) * selected[name] / (selected[name] + _DESELECTED[name])

    items.sort(key=weight)


_START = time.monotonic()
_SPENT: dict[str, float] = {}
_FAILED: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In pytest's main process (xdist's controller, where reports carry the worker's node), a row per test once
    its teardown is reported."""
    where = os.environ.get("LAUNCHER_TEST_TIMELINE")
    if not where:
        return
    node = getattr(report, "node", None)
    if node is None and "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker's own report: its controller writes the row
    worker = node.gateway.id if node is not None else "main"  # ("main": pytest without xdist)
    _SPENT[report.nodeid] = _SPENT.get(report.nodeid, 0.0) + report.duration
    if report.failed:
        _FAILED.add(report.nodeid)
    if report.when == "teardown":
        ended = time.monotonic() - _START
        outcome = "failed" if report.nodeid in _FAILED else "ok"
        with open(where, "a", encoding="utf-8") as out:
            out.write(f"{worker}\t{ended:.1f}\t{_SPENT.pop(report.nodeid):.1f}\t{outcome}\t{report.nodeid}\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each worker's tests, busy seconds and end, and the files that took longest: what LONG_FILES follows."""
    where = os.environ.get("LAUNCHER_TEST_TIMELINE")
    if not where or "PYTEST_XDIST_WORKER" in os.environ or not Path(where).is_file():
        return
    workers: dict[str, list[float]] = {}
    files: dict[str, float] = {}
    for line in Path(where).read_text(encoding="utf-8").splitlines():
        worker, ended, spent, _, nodeid = line.split("\t")
        tests, busy, last = workers.get(worker, [0, 0.0, 0.0])
        workers[worker] = [tests + 1, busy + float(spent), max(last, float(ended))]
        name = nodeid.split("::")[0].rsplit("/", 1)[-1]
        files[name] = files.get(name, 0.0) + float(spent)
    terminalreporter.section("where the time went (tests/timeline.py)")
    for worker, (tests, busy, last) in sorted(workers.items()):
        terminalreporter.write_line(f"{worker}: {tests:.0f} tests, busy {busy:.0f} s, its last ended at {last:.0f} s")
    longest = sorted(files.items(), key=lambda kv: -kv[1])[:12]
    terminalreporter.write_line("longest files: " + ", ".join(f"{name} {spent:.0f} s" for name, spent in longest))
