"""Tests of launcher.localcluster against a real Slurm cluster (2 nodes x 2 fake GPUs) in a temporary directory.

Its ports derive from the directory, so it does not collide with a cluster in another directory (and move on where
another process holds them). Skipped when Slurm is not installed, except under CI=true, where a missing Slurm is a
failure.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import every_node_in_service, no_job_left

from launcher import localcluster
from launcher import protocol as P
from launcher.localcluster import ClusterSpec, accounting, ports, slurm_conf

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
    except (FileNotFoundError, ProcessLookupError):  # gone, or going (a read as it exits: ESRCH)
        return False


def ctld_port(spec: ClusterSpec) -> int:
    """The slurmctld port the cluster's slurm.conf names: one of a slot's."""
    port = int(re.search(r"^SlurmctldPort=(\d+)$", spec.conf.read_text(), re.MULTILINE).group(1))
    assert (port - slurm_conf.PORT_BASE) % slurm_conf.PORT_STEP == 0, port
    return port


def test_ports_derive_from_the_directory(tmp_path: Path) -> None:
    a, b = ClusterSpec(tmp_path / "a", 2, 0), ClusterSpec(tmp_path / "b", 2, 0)
    assert a.ctld_port == ClusterSpec(tmp_path / "a", 3, 1).ctld_port
    assert a.ctld_port != b.ctld_port
    assert 10000 <= a.ctld_port < 20000
    assert a.ports == [a.ctld_port, a.ctld_port + 1, a.ctld_port + 2]
    assert ClusterSpec(tmp_path / "a", 2, 0, accounting=True).ports == [*a.ports, a.ctld_port + 20]  # slurmdbd's


def test_no_port_is_in_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """Every TCP port a local cluster may listen on (any slot, the most nodes, slurmdbd), and every rendezvous port a
    job may open, lies outside the kernel's ephemeral range as /proc gives it, where outgoing connections take their
    local ports (CI's fresh clone met MariaDB's port held so); and the two sets never meet (the local cluster's jobs
    open their rendezvous on the same 127.0.0.1). MariaDB listens on no TCP port at all."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert ports.ephemeral_range() == range(low, high + 1)
    daemons = [port for slot in range(slurm_conf.PORT_SLOTS) for port in
               ClusterSpec(tmp_path, slurm_conf.MAX_NODES, 0, accounting=True, port_slot=slot).ports]  # fmt: skip
    assert (
        len(set(daemons)) == len(daemons) == slurm_conf.PORT_SLOTS * (slurm_conf.MAX_NODES + 2)
    )  # no two slots share one
    rendezvous = range(P.RDZV_PORT_LOW, P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN)
    assert not [port for port in [*daemons, *rendezvous] if low <= port <= high]
    assert not set(daemons) & set(rendezvous)
    argv = accounting.mariadbd_argv(ClusterSpec(tmp_path, accounting=True))
    assert "--skip-networking" in argv and not [a for a in argv if a.startswith(("--port", "--bind-address"))]


def test_ports_in_the_ephemeral_range_are_never_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a machine's ephemeral range reaches down over the cluster's slot, it takes the first slot beyond."""
    spec = ClusterSpec(tmp_path, 2, 0, port_slot=0)
    monkeypatch.setattr(ports, "RANGE_FILE", tmp_path / "range")
    # the rule alone: whatever clusters run on the machine now (another worker's took slot 3 in a CI run)
    monkeypatch.setattr(ports, "taken", lambda port: None)
    monkeypatch.setattr(ports, "window_holder", lambda spec: None)
    (tmp_path / "range").write_text(f"{spec.ctld_port}\t{spec.ctld_port + 2 * slurm_conf.PORT_STEP}\n")
    assert ports.settle(spec).ctld_port == spec.ctld_port + 3 * slurm_conf.PORT_STEP
    (tmp_path / "range").write_text(f"1024\t{slurm_conf.PORT_BASE + slurm_conf.PORT_STEP * slurm_conf.PORT_SLOTS}\n")
    with pytest.raises(ports.NoFreePorts, match="no free ports for the local cluster in 10000-19999"):
        ports.settle(spec)


def test_a_window_of_job_ids_a_running_cluster_holds_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot whose job ids (and so its jobs' rendezvous ports) are those of a running cluster, one on another slot
    of the same window, is passed over like a slot whose own port is taken; where every window is held, the first
    slot whose ports are free is taken all the same (a job's rendezvous then moves to the next free port)."""
    held: set[int] = set()
    monkeypatch.setattr(ports, "taken", lambda port: OSError(98, "Address already in use") if port in held else None)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: range(0))
    spec = ClusterSpec(tmp_path, 2, 0, port_slot=0)
    assert spec.first_job_id == 1 and ClusterSpec(tmp_path, 2, 0, port_slot=slurm_conf.JOB_ID_WINDOWS).first_job_id == 1
    assert ports.settle(spec) == spec
    held.add(ClusterSpec(tmp_path, 2, 0, port_slot=slurm_conf.JOB_ID_WINDOWS).ctld_port)  # a cluster on window 0
    settled = ports.settle(spec)
    assert settled.port_slot == 1 and settled.first_job_id == 1 + slurm_conf.JOB_ID_WINDOW
    # every window held by a cluster on slots JOB_ID_WINDOWS.. : slot 0's ports are free, and it is taken
    held.update(ClusterSpec(tmp_path, 2, 0, port_slot=slurm_conf.JOB_ID_WINDOWS + w).ctld_port
                for w in range(slurm_conf.JOB_ID_WINDOWS))  # fmt: skip
    assert ports.settle(spec) == spec


def test_two_clusters_on_one_window_get_job_ids_of_their_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two clusters whose slots share a window of job ids, started at once (as the tests' workers start theirs): the
    second takes another window, and their jobs' ids (their rendezvous ports and ids) never meet. The case a run of
    the suite on four workers met: two clusters' job 11002 met in one rendezvous, and one of the runs restarted."""
    first = ClusterSpec(tmp_path_factory.mktemp("one"), nodes=1, gpus_per_node=0, port_slot=7)
    second = ClusterSpec(tmp_path_factory.mktemp("two"), nodes=1, gpus_per_node=0,
                         port_slot=7 + slurm_conf.JOB_ID_WINDOWS)  # fmt: skip
    assert first.first_job_id == second.first_job_id
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(localcluster.up, (first, second)))
        sbatch = ("sbatch", "--parsable", "--output=/dev/null", "--wrap", "true")
        ids = [int(run(spec, *sbatch)) for spec in (first, second)]
        windows = [(job_id - 1) // slurm_conf.JOB_ID_WINDOW for job_id in ids]
        assert windows[0] != windows[1], ids
        assert [ctld_port(first), ctld_port(second)] != [first.ctld_port, second.ctld_port]  # one of them moved
    finally:
        localcluster.down(first)
        localcluster.down(second)


def holding_its_ports(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClusterSpec, list[socket.socket]]:
    """A cluster's spec (2 nodes) and listening sockets on its slurmctld's and second slurmd's ports; another spec
    where another worker's cluster holds one of them already (it had moved to that slot: a CI run failed so)."""
    for _ in range(20):
        spec = ClusterSpec(tmp_path_factory.mktemp("held"), nodes=2, gpus_per_node=1)  # short: slurmstepd's sockets
        held: list[socket.socket] = []
        try:
            for port in (spec.ctld_port, spec.slurmd_port(2)):
                held.append(socket.create_server(("127.0.0.1", port)))
            return spec, held
        except OSError:
            for sock in held:
                sock.close()
    pytest.fail("20 clusters' ports were all held by others")


def test_up_takes_other_ports_where_its_own_are_held(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """As CI met it: another process listens on ports the cluster would take (its slurmctld's and a slurmd's). It
    comes up on the next free ones, says so, runs a job, and stays on them when `up` runs again."""
    spec, held = holding_its_ports(tmp_path_factory)
    try:
        localcluster.up(spec)
        assert f"port {spec.ctld_port} is taken" in capsys.readouterr().out
        conf = spec.conf.read_text()
        assert ctld_port(spec) != spec.ctld_port  # the next free slot (where no running cluster's job ids are)
        assert sorted(run(spec, "srun", "-N2", "hostname").split()) == [socket.gethostname()] * 2
        localcluster.up(spec)
        assert "already running" in capsys.readouterr().out and spec.conf.read_text() == conf
    finally:
        localcluster.down(spec)
        for sock in held:
            sock.close()


def test_up_tries_other_ports_when_a_daemon_finds_its_own_taken(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port taken between the check and the daemon's bind (the check here made blind to it, once): slurmd says
    'Address already in use', and `up` starts the cluster again on other ports."""
    spec = ClusterSpec(tmp_path_factory.mktemp("race"), nodes=2, gpus_per_node=1)
    checked: list[int] = []
    taken = ports.taken

    def blind_at_first(port: int) -> OSError | None:
        checked.append(port)
        return None if len(checked) <= len(spec.ports) else taken(port)

    monkeypatch.setattr(ports, "taken", blind_at_first)
    monkeypatch.setattr(ports, "window_holder", lambda spec: None)  # the checks counted are the cluster's own ports'
    try:
        with socket.create_server(("127.0.0.1", spec.slurmd_port(2))):
            localcluster.up(spec)
        out = capsys.readouterr().out
        assert "(Address already in use): trying other ports" in out and f"port {spec.slurmd_port(2)} is taken" in out
        assert ctld_port(spec) != spec.ctld_port
        assert localcluster.is_up(spec)
    finally:
        localcluster.down(spec)


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


def test_a_job_left_running_is_waited_out_and_a_node_slurm_drained_brought_back(spec: ClusterSpec, tmp_path: Path):
    """What tests/slurm_cluster.py does around every Slurm test, so that one test's slow kill never fails the next:
    after it, a job it left running is cancelled and waited out of the queue (its steps' ends included), and a node
    Slurm drained for a step whose processes outlived UnkillableStepTimeout ("Kill task failed") is brought back,
    each said in a warning. The cluster gives a step that long: ClusterSpec's, not Slurm's 60 s."""
    config = run(spec, "scontrol", "show", "config")
    assert re.search(rf"^UnkillableStepTimeout\s*=\s*{spec.unkillable_step_timeout_s} sec", config, re.M), config
    job = run(spec, "sbatch", "--parsable", "-N2", f"--output={tmp_path}/%j.out", "--wrap", "srun sleep 300").strip()
    deadline = time.monotonic() + 60
    while job_state(spec, job) != "RUNNING":
        assert time.monotonic() < deadline, job_state(spec, job)
        time.sleep(0.2)
    with pytest.warns(UserWarning, match=f"the test left jobs {job} in {spec.dir}: cancelled"):
        no_job_left(spec)
    assert run(spec, "squeue", "-h") == "" and job_state(spec, job) == "CANCELLED"
    run(spec, "scontrol", "update", "nodename=node1", "state=drain", "reason=Kill task failed")  # as slurmstepd does
    with pytest.warns(UserWarning, match=r"node1 \S+ \(Kill task failed\); brought back"):
        every_node_in_service(spec)
    states = run(spec, "sinfo", "-h", "-N", "-o", "%N %T").split()
    assert states[1::2] == ["idle"] * 4, states  # both nodes, in both partitions


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
    """A node whose slurmd cannot start (a read-only mount of a path that does not exist): `up` fails naming it, and
    the munged, slurmctld and slurmd it had already started are stopped, not left running."""
    missing = str(tmp_path / "missing")
    spec = ClusterSpec(tmp_path / "partway", nodes=2, gpus_per_node=1, read_only=(("node2", missing),))
    with pytest.raises(localcluster.ClusterError, match="slurmd.node2 did not start"):
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
