"""Tests of launcher.localcluster against a real Slurm cluster (2 nodes x 2 fake GPUs) in a temporary directory.

Its ports derive from the directory, so it does not collide with a cluster in another directory. Skipped when Slurm
is not installed, except under CI=true, where a missing Slurm is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import localcluster
from launcher.localcluster import ClusterSpec

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.environ.get("CI") != "true" and shutil.which("slurmctld") is None,
        reason="Slurm is not installed (run scripts/install_slurm.sh)",
    ),
]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSpec]:
    # pytest's temp directories are private (0700): munge's files live elsewhere, so that must not matter
    spec = ClusterSpec(tmp_path_factory.mktemp("cluster"), nodes=2, gpus_per_node=2)
    localcluster.up(spec)
    yield spec
    localcluster.down(spec)


def run(spec: ClusterSpec, *argv: str) -> str:
    env = {**os.environ, **spec.env()}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60).stdout


def job_state(spec: ClusterSpec, job_id: str) -> str:
    fields = run(spec, "scontrol", "show", "job", job_id).split()
    return next(f.removeprefix("JobState=") for f in fields if f.startswith("JobState="))


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped by init, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][0] != "Z"
    except FileNotFoundError:
        return False


def test_ports_derive_from_the_directory(tmp_path: Path) -> None:
    a, b = ClusterSpec(tmp_path / "a", 2, 0), ClusterSpec(tmp_path / "b", 2, 0)
    assert a.ctld_port == ClusterSpec(tmp_path / "a", 3, 1).ctld_port
    assert a.ctld_port != b.ctld_port
    assert 20000 <= a.ctld_port < 30000


def test_up_shows_idle_nodes_with_gpus(spec: ClusterSpec) -> None:
    lines = run(spec, "sinfo", "--noheader", "--Node", "--format=%N %P %T %G").splitlines()
    # every node in both partitions: debug (the default, preemptible) and urgent (the one that preempts)
    assert sorted(lines) == [f"node{n} {p} idle gpu:2" for n in (1, 2) for p in ("debug*", "urgent")]


def test_srun_on_two_nodes(spec: ClusterSpec) -> None:
    out = run(spec, "srun", "-N2", "--ntasks-per-node=1", "bash", "-c", "echo $SLURMD_NODENAME")
    assert sorted(out.split()) == ["node1", "node2"]


def test_sbatch_gpu_job_completes(spec: ClusterSpec, tmp_path: Path) -> None:
    sbatch = ["sbatch", "--parsable", "-N2", "--gpus-per-node=2", f"--output={tmp_path}/%j.out"]
    job_id = run(spec, *sbatch, "--wrap", "srun hostname").strip()
    deadline = time.monotonic() + 60
    while job_state(spec, job_id) not in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
        assert time.monotonic() < deadline, f"job {job_id} still {job_state(spec, job_id)} after 60 s"
        time.sleep(0.2)
    assert job_state(spec, job_id) == "COMPLETED"
    assert len((tmp_path / f"{job_id}.out").read_text().split()) == 2


def test_up_again_is_idempotent(spec: ClusterSpec, capsys: pytest.CaptureFixture[str]) -> None:
    pids = localcluster.daemon_pids(spec)
    assert localcluster.up(spec) == {"SLURM_CONF": str(spec.dir / "etc" / "slurm.conf")}
    assert "already running" in capsys.readouterr().out
    assert localcluster.daemon_pids(spec) == pids


def test_down_stops_the_daemons(spec: ClusterSpec) -> None:
    pids = localcluster.daemon_pids(spec)
    assert len(pids) == 4 and all(pids.values())
    localcluster.down(spec)
    assert not localcluster.is_up(spec)
    assert not any(running(pid) for pid in pids.values() if pid)


def test_up_that_fails_partway_stops_what_it_started(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node whose slurmd cannot take its port (held here): `up` fails naming it, and the munged, slurmctld and
    slurmd it had already started are stopped, not left running."""
    import socket

    spec = ClusterSpec(tmp_path / "partway", nodes=2, gpus_per_node=1)
    with socket.create_server(("127.0.0.1", spec.ctld_port + 2)):  # node2's slurmd port
        with pytest.raises(localcluster.ClusterError, match="slurmd.node2"):
            localcluster.up(spec)
    assert "started slurmd.node1" in capsys.readouterr().out  # it got that far
    assert not any(localcluster.daemon_pids(spec).values())
    ours = [p for p in Path("/proc").glob("[0-9]*") if running(int(p.name)) and names(p, spec)]
    assert ours == []  # no process of this cluster's is left, whatever its pid file says


def names(proc: Path, spec: ClusterSpec) -> bool:
    try:
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    return any(f"{d}/".encode() in cmdline for d in (spec.dir, spec.munge_dir))
