"""The session's Slurm clusters: a real local cluster (2 nodes x 2 fake GPUs), started once for all tests (once per
worker where pytest-xdist runs several), and one with accounting (slurmdbd on a MariaDB of its own), started only
for the tests that ask for it (`slurm_accounting`), so that both paths, with sacct and without, stay tested.

Imported by conftest.py (with the hook that stops a session where a test uses the cluster and its file does not
say so: `pytestmark = pytest.mark.slurm`). Outside CI, tests that need it skip (with the reason) when Slurm is not
installed; under CI=true they never skip. A cluster that was already up (e.g.
after `make demo`) is reused and left up. Under scripts/slurm_root.sh it is that release's, in `.slurm-24.11[-gwN]`
or `.slurm-26.05[-gwN]`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from launcher import localcluster
from launcher.slurm import parse

if TYPE_CHECKING:
    from conftest import DemoData

IN_CI = os.environ.get("CI") == "true"


# The fixtures that are the local cluster, or stand on it: a test file whose tests use one says so at its top with
# `pytestmark` (pyproject.toml's markers; tests/test_architecture.py reads every file for it).
CLUSTER_FIXTURES = ("slurm_cluster_spec", "slurm_cluster", "slurm_env", "slurm_accounting_spec", "slurm_accounting",
                    "slurm_nanoset")  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the session's cluster and whose file does not say so (`pytestmark = pytest.mark.slurm`, and
    `accounting` beside it for the cluster with accounting) stops the session before any test runs, its file named:
    `make test` picks its parts by these markers, so a test unmarked would run in the wrong part, or on no
    release."""
    unmarked = set()
    for item in items:
        used = getattr(item, "fixturenames", ())
        if any(name in used for name in CLUSTER_FIXTURES) and item.get_closest_marker("slurm") is None:
            unmarked.add(f"{item.nodeid.split('::')[0]}: pytestmark = pytest.mark.slurm")
        if "slurm_accounting_spec" in used and item.get_closest_marker("accounting") is None:
            unmarked.add(f"{item.nodeid.split('::')[0]}: pytestmark = [pytest.mark.slurm, pytest.mark.accounting]")
    if unmarked:
        raise pytest.UsageError("tests that use the local cluster in a file that does not say so; add at its top:\n  "
                                + "\n  ".join(sorted(unmarked)))  # fmt: skip


def require_slurm(accounting: bool = False) -> None:
    needed = ["slurmctld"] + (["slurmdbd", "mariadbd"] if accounting else [])
    missing = [name for name in needed if shutil.which(name, path=f"{os.environ['PATH']}:/usr/sbin:/sbin") is None]
    if missing:
        script = (
            "scripts/install_accounting.sh" if accounting and missing != ["slurmctld"] else "scripts/install_slurm.sh"
        )
        if IN_CI:
            pytest.fail(f"{', '.join(missing)} not installed under CI=true: {script} must install it")
        pytest.skip(f"{', '.join(missing)} not installed (run {script} or make test)")


def _directory(name: str) -> Path:
    """`<project>/<name>` (the cluster's directory, `localcluster.default_dir()`'s name by default: `.slurm`, or
    `.slurm-24.11` or `.slurm-26.05` inside scripts/slurm_root.sh), one per pytest-xdist worker: `make test` runs two,
    each with its own daemons and ports."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return localcluster.default_dir().with_name(name if worker is None else f"{name}-{worker}")


@pytest.fixture(scope="session")
def slurm_cluster_spec() -> Iterator[localcluster.ClusterSpec]:
    """The session's local cluster, running."""
    require_slurm()
    spec = localcluster.ClusterSpec(_directory(localcluster.default_dir().name), nodes=2, gpus_per_node=2)
    was_up = localcluster.is_up(spec)
    localcluster.up(spec)
    yield spec
    if not was_up:
        localcluster.down(spec)


@pytest.fixture(scope="session")
def slurm_cluster(slurm_cluster_spec: localcluster.ClusterSpec) -> dict[str, str]:
    """Environment variables (SLURM_CONF) that point Slurm's commands at the running local cluster."""
    return slurm_cluster_spec.env()


def every_node_in_service(spec: localcluster.ClusterSpec) -> None:
    """Each test starts on a cluster whose nodes are all in service: a node an earlier test left drained or down
    (a step Slurm could not kill in time, "Kill task failed"; a slurmd that stopped answering) is named in a warning,
    with Slurm's reason, and brought back (one sinfo query where all is well)."""
    argv = ["sinfo", "-h", "-N", "-o", parse.NODE_STATES]
    out = subprocess.run(argv, env={**os.environ, **spec.env()}, capture_output=True, text=True, timeout=60)
    away = [n for n in parse.parse_node_states(out.stdout) if not n.in_service]
    if out.returncode == 0 and not away:
        return
    said = ", ".join(f"{n.name} {n.state} ({n.reason})" for n in away) or out.stderr.strip()
    warnings.warn(f"the cluster in {spec.dir} had nodes out of service: {said}; brought back", stacklevel=1)
    localcluster.up(spec)  # restarts a daemon that died, resumes drained and down nodes, waits until all are ready


def no_job_left(spec: localcluster.ClusterSpec) -> None:
    """After each test, none of its jobs is left on the cluster: one still pending or running (a test that failed
    midway, or let its job run on) is cancelled and named in a warning, and every job is waited out of Slurm's
    queue, its steps' ends included, so that the next test starts on an idle cluster. A step whose processes are
    slow to die (a task in an uninterruptible write under load) holds its job COMPLETING until they do, or until
    UnkillableStepTimeout drains its node: either way here, within this test, never in the next one."""
    env = {**os.environ, **spec.env()}

    def queued() -> list[list[str]] | None:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True, text=True, timeout=60)
        return [line.split() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else None

    jobs = queued()
    running = [job for job, state in jobs or [] if state != "COMPLETING"]
    if running:
        warnings.warn(f"the test left jobs {', '.join(running)} in {spec.dir}: cancelled", stacklevel=1)
        subprocess.run(["scancel", *running], env=env, capture_output=True, timeout=60)
    deadline = time.monotonic() + spec.unkillable_step_timeout_s + 30
    while jobs and time.monotonic() < deadline:
        time.sleep(0.5)
        jobs = queued()
    if jobs:
        warnings.warn(f"jobs still in the queue of {spec.dir} after the test: {jobs}", stacklevel=1)


ACCOUNTING_GRACE_S = 10  # short, so that a preemption a run does not heed ends within a test's patience


@pytest.fixture(scope="session")
def slurm_accounting_spec() -> Iterator[localcluster.ClusterSpec]:
    """A local cluster with accounting, running: slurmdbd on its own MariaDB, the cluster, account `research` and
    root registered, AccountingStorageTRES=gres/gpu; preemption's grace time ACCOUNTING_GRACE_S."""
    require_slurm(accounting=True)
    # `.slurm-acct`, or `.slurm-26.05-acct`: a release's slurmctld and slurmdbd refuse another release's state
    name = f"{localcluster.default_dir().name}-acct"
    spec = localcluster.ClusterSpec(_directory(name), nodes=2, gpus_per_node=2, accounting=True,
                                    preempt_grace_s=ACCOUNTING_GRACE_S)  # fmt: skip
    was_up = localcluster.is_up(spec)
    localcluster.up(spec)
    yield spec
    if not was_up:
        localcluster.down(spec)


@pytest.fixture(scope="session")
def slurm_accounting(slurm_accounting_spec: localcluster.ClusterSpec) -> dict[str, str]:
    """SLURM_CONF of the cluster with accounting (a test that takes it leaves it as `slurm_env` leaves the session's:
    tests/test_accounting.py's `acct_env`)."""
    return slurm_accounting_spec.env()


@pytest.fixture
def slurm_env(
    slurm_cluster_spec: localcluster.ClusterSpec, slurm_cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """Per test: SLURM_CONF set in this process too (the launcher runs in-process in some tests); every node of
    the cluster in service before, and no job of the test's left after."""
    every_node_in_service(slurm_cluster_spec)
    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    yield {**os.environ, **slurm_cluster}
    no_job_left(slurm_cluster_spec)
    every_node_in_service(slurm_cluster_spec)


def slurm_release(env: dict[str, str]) -> tuple[int, int]:
    """The (year, month) release of the cluster's Slurm: (22, 5) from Debian 12, (24, 11) or (26, 5) under
    scripts/slurm_root.sh."""
    out = subprocess.run(["sbatch", "--version"], env=env, capture_output=True, text=True, check=True).stdout
    major, minor = re.search(r"(\d+)\.(\d+)", out).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def tokenize_on_slurm(env: dict[str, str], demo: DemoData, output: Path, tasks: int = 2) -> Path:
    """`demo`'s dataset tokenized by `launcher.data tokenize --slurm` on the cluster of `env` (its SLURM_CONF):
    datatrove's SlurmPipelineExecutor submits an array of `tasks` tasks, the command follows it to its end and checks
    the folder (a Nanoset of `tasks` token files)."""
    from launcher.data.__main__ import main

    argv = ["tokenize", "--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer), "--output", str(output),
            "--tasks", str(tasks), "--slurm", "--partition", "debug", "--time_limit", "10", "--show_logs"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:  # sbatch, run by datatrove, reads SLURM_CONF from this process
        patch.setenv("SLURM_CONF", env["SLURM_CONF"])
        assert main(argv) == 0, f"tokenize --slurm failed: see {output / 'tokenize' / 'logs'}"
    return output


@pytest.fixture(scope="session")
def slurm_nanoset(slurm_cluster: dict[str, str], demo_data: DemoData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`demo_data`'s dataset tokenized as a Slurm array job (2 tasks) on the session's cluster: the folder that
    tests/test_data_slurm.py checks and the torch engine's preemption test (tests/test_preemption.py) trains on."""
    return tokenize_on_slurm(slurm_cluster, demo_data, tmp_path_factory.mktemp("slurm-nanoset") / "out")
