"""The session's Slurm cluster: a real local cluster (2 nodes x 2 fake GPUs), started once for all tests (once per
worker where pytest-xdist runs several).

Imported by conftest.py (with the hook that marks the tests using it `slurm`). Outside CI, tests that need it skip
(with the reason) when Slurm is not installed; under CI=true they never skip. A cluster that was already up (e.g.
after `make demo`) is reused and left up. Under scripts/slurm24.sh it is Slurm 24.11's, in `.slurm-24.11[-gwN]`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from launcher import localcluster

IN_CI = os.environ.get("CI") == "true"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the session's cluster is marked `slurm` (`-m slurm`: the Slurm end-to-end tests, which
    CI also runs on Slurm 24.11 through scripts/slurm24.sh)."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """Environment variables (SLURM_CONF) that point Slurm's commands at the running local cluster."""
    if shutil.which("slurmctld") is None and shutil.which("slurmctld", path="/usr/sbin:/sbin") is None:
        if IN_CI:
            pytest.fail("Slurm is not installed under CI=true: scripts/install_slurm.sh must install it")
        pytest.skip("Slurm is not installed (run scripts/install_slurm.sh or make test)")
    # one cluster per pytest-xdist worker: `make test` runs two, each with its own daemons and ports
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    default = localcluster.default_dir()
    directory = default if worker is None else default.with_name(f"{default.name}-{worker}")
    spec = localcluster.ClusterSpec(directory, nodes=2, gpus_per_node=2)
    was_up = localcluster.is_up(spec)
    env = localcluster.up(spec)
    yield env
    if not was_up:
        localcluster.down(spec)


@pytest.fixture
def slurm_env(slurm_cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Per test: SLURM_CONF set in this process too (the launcher runs in-process in some tests)."""
    for key, value in slurm_cluster.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **slurm_cluster}


def slurm_release(env: dict[str, str]) -> tuple[int, int]:
    """The (year, month) release of the cluster's Slurm: (22, 5) from Debian 12, (24, 11) under scripts/slurm24.sh."""
    out = subprocess.run(["sbatch", "--version"], env=env, capture_output=True, text=True, check=True).stdout
    major, minor = re.search(r"(\d+)\.(\d+)", out).groups()  # type: ignore[union-attr]
    return int(major), int(minor)
