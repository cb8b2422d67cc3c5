"""A real Slurm cluster on this one machine: one slurmctld, one slurmd per virtual node, its own munged.

Everything the cluster needs lives under ONE directory (default `<project root>/.slurm`, git-ignored):

    etc/slurm.conf, etc/gres.conf   generated config; clients need only SLURM_CONF=<dir>/etc/slurm.conf
    dev/gpu0..                      plain files standing in for GPU devices (scheduling only, no CUDA)
    (munge)                         key, socket, pid, log and seed of a private munged (user munge) live in
                                    /tmp/launcher-munge-<crc32(dir)>: munged must reach them from any checkout
    state/                          slurmctld's StateSaveLocation and each slurmd's spool dir (state/<node>)
    run/, log/                      the daemons' pid files and logs, and the job completion log

The daemons daemonize themselves, so they outlive the process that started them; `down` stops them by pid file,
and only a pid whose command line names this directory counts as ours. Its TCP ports (launcher/localcluster/
config.py: 10000-19999, below the kernel's ephemeral range) derive from a hash of the directory, so clusters in
different directories do not collide; where one is taken as the cluster starts, it takes the next free ones
(`ports.settle`), and where a daemon still finds its port taken (taken after that check), `up` tries once more on
other ports. A cluster has at most 19 nodes. It must run as root: slurmd runs jobs as their submitter and munged
runs as user munge. CLI: `python -m launcher.localcluster {up,down,status,env} [--dir DIR]` (`__main__.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from launcher.errors import LauncherError
from launcher.localcluster import accounting, containers, ports
from launcher.localcluster.slurm_conf import ClusterSpec, config_files

READY_TIMEOUT_S, STOP_TIMEOUT_S, PIDFILE_TIMEOUT_S = 30.0, 10.0, 10.0
READY_STATES = {"idle", "mixed", "allocated", "completing"}
PORT_TAKEN = "Address already in use"  # what a daemon logs (strerror(EADDRINUSE)) when its port is taken
# held while a cluster settles on its ports and window of job ids and starts, until ready: one at a time on the
# machine (launcher.localcluster.ports), as the tests' workers start theirs at once
START_LOCK = Path("/tmp/launcher-localcluster-start.lock")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol")


class ClusterError(LauncherError):
    """The local cluster could not be started; the message includes the relevant daemon's log tail."""


def _pidfile(spec: ClusterSpec, name: str) -> Path:
    return spec.munge_dir / "munged.pid" if name == "munged" else spec.dir / f"run/{name}.pid"


def _logfile(spec: ClusterSpec, name: str) -> Path:
    return spec.munge_dir / "munged.log" if name == "munged" else spec.dir / f"log/{name}.log"


def _daemon_names(spec: ClusterSpec) -> list[str]:
    db = accounting.DAEMONS[::-1] if spec.accounting else ()
    return ["munged", *db, "slurmctld", *(f"slurmd.{node}" for node in spec.node_names)]


def _running_slurmds(spec: ClusterSpec) -> list[str]:
    return sorted(p.name.removesuffix(".pid") for p in (spec.dir / "run").glob("slurmd.*.pid"))


def _ours(spec: ClusterSpec, pid: int) -> bool:
    """Whether `pid` is a live process whose command line (or, for slurmdbd, which takes no config path, whose
    SLURM_CONF) names this cluster's (or its munge) directory."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmdline += Path(f"/proc/{pid}/environ").read_bytes() if cmdline.startswith(b"slurmdbd") else b""
    except OSError:
        return False
    return any(f"{d}/".encode() in cmdline for d in (spec.dir, spec.munge_dir))


def _pid(spec: ClusterSpec, name: str) -> int | None:
    """The pid of our live daemon `name`; None if it is not running (or the pid is now someone else's)."""
    try:
        pid = int(_pidfile(spec, name).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _ours(spec, pid) else None


def daemon_pids(spec: ClusterSpec) -> dict[str, int | None]:
    """Each daemon of the cluster (including slurmds of an earlier, larger cluster) -> its pid, or None if dead."""
    kept = [name for name in accounting.DAEMONS if _pidfile(spec, name).exists()]  # an earlier --accounting's
    names = dict.fromkeys([*_daemon_names(spec), *_running_slurmds(spec), *kept])
    return {name: _pid(spec, name) for name in names}


def _wait(done: Callable[[], object], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _tail(path: Path, lines: int = 20) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(missing)"]
    return f"--- last lines of {path}:\n" + "\n".join(text)


def _logs(spec: ClusterSpec, name: str) -> str:
    return _tail(spec.dir / f"log/{name}.out", 5) + "\n" + _tail(_logfile(spec, name))


def _slurm(spec: ClusterSpec, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **spec.env()}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=30)


def _check_searchable(spec: ClusterSpec) -> None:
    """munged runs as user munge and wants its socket reachable by all users: every parent must be o+x."""
    closed = [p for p in spec.munge_dir.parents if p.exists() and not p.stat().st_mode & 0o001]
    if closed:
        raise ClusterError(f"munged (user munge) cannot reach {spec.munge_dir}: chmod o+x {closed[0]}")


def _prepare(spec: ClusterSpec) -> None:
    """Write the config, the fake GPUs and munge's key; make every directory the daemons need."""
    _check_searchable(spec)
    spec.dir.mkdir(parents=True, exist_ok=True)
    spec.dir.chmod(0o755)
    spec.munge_dir.mkdir(mode=0o755, exist_ok=True)
    for sub in ("etc", "dev", "state/ctld", "run", "log", *(f"state/{n}" for n in spec.node_names)):
        (spec.dir / sub).mkdir(parents=True, exist_ok=True)
    for path, text in config_files(spec).items():
        path.write_text(text)
    for k in range(spec.gpus_per_node):
        (spec.dir / f"dev/gpu{k}").touch()
    key = spec.munge_dir / "munge.key"
    if not key.exists():
        key.touch(mode=0o600)
        key.write_bytes(os.urandom(1024))
    for path in (spec.munge_dir, *spec.munge_dir.iterdir()):
        shutil.chown(path, "munge", "munge")
    if spec.accounting:
        _accounting(accounting.prepare, spec)


def _accounting(step: Callable[..., None], *args: object) -> None:
    try:
        step(*args)
    except accounting.AccountingError as e:
        raise ClusterError(str(e)) from None


def _spawn(spec: ClusterSpec, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run a self-daemonizing daemon and wait for its pid file."""
    env = {**os.environ, **spec.env(), **(env or {})}
    with (spec.dir / f"log/{name}.out").open("ab") as out:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    if proc.returncode != 0 or not _wait(lambda: _pid(spec, name), PIDFILE_TIMEOUT_S):
        raise ClusterError(f"{name} did not start (exit status {proc.returncode}):\n{_logs(spec, name)}")
    print(f"started {name} (pid {_pid(spec, name)})")


def _start(spec: ClusterSpec) -> None:
    m, conf = spec.munge_dir, str(spec.conf)
    munged = ["--key-file", m / "munge.key", "--socket", m / "munge.socket.2", "--pid-file", m / "munged.pid"]
    munged += ["--log-file", m / "munged.log", "--seed-file", m / "munged.seed"]
    _spawn(spec, "munged", ["runuser", "-u", "munge", "--", str(shutil.which("munged")), *map(str, munged)])
    if spec.accounting:  # slurmdbd before slurmctld, which registers with it
        _accounting(accounting.start_database, spec)
        _spawn(spec, "slurmdbd", ["slurmdbd"], accounting.slurmdbd_env(spec))
        _accounting(accounting.register, spec, "local")
    _spawn(spec, "slurmctld", ["slurmctld", "-f", conf])
    for node in spec.node_names:
        _spawn(spec, f"slurmd.{node}", _slurmd_argv(spec, node))


def _slurmd_argv(spec: ClusterSpec, node: str) -> list[str]:
    """slurmd for `node`; where the spec makes a path read-only on that node, in a mount namespace of its own with
    that path bound read-only, which its jobs inherit: a node that cannot write where the others can."""
    argv = ["slurmd", "-f", str(spec.conf), "-N", node]
    paths = [path for name, path in spec.read_only if name == node]
    commands = [f"mount --bind {shlex.quote(p)} {shlex.quote(p)} && mount -o remount,bind,ro {shlex.quote(p)}"
                for p in paths]  # fmt: skip
    commands += containers.slurmd_mounts(node) if spec.containers else []
    if not commands:
        return argv
    mounts = " && ".join(commands)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "-", *argv]


def _node_states(spec: ClusterSpec) -> dict[str, str]:
    proc = _slurm(spec, "sinfo", "--noheader", "--Node", "--format=%N %T")
    return dict(line.split() for line in proc.stdout.splitlines()) if proc.returncode == 0 else {}


def _check_ready(spec: ClusterSpec) -> bool:
    """True once every node is usable; resumes nodes that came up DOWN or DRAINED; fails if a daemon died."""
    dead = [name for name in _daemon_names(spec) if _pid(spec, name) is None]
    if dead:
        raise ClusterError(f"{dead[0]} is not running:\n{_logs(spec, dead[0])}")
    states = _node_states(spec)
    for node, state in states.items():
        if state.startswith(("down", "drain")):
            print(f"resuming {node} (state {state})")
            _slurm(spec, "scontrol", "update", f"nodename={node}", "state=resume")
    return all(states.get(node) in READY_STATES for node in spec.node_names)


def _wait_ready(spec: ClusterSpec) -> None:
    start = time.monotonic()
    if not _wait(lambda: _check_ready(spec), READY_TIMEOUT_S):
        logs = "\n".join(_logs(spec, name) for name in _daemon_names(spec)[1:])
        raise ClusterError(f"nodes not ready after {READY_TIMEOUT_S:.0f} s: {_node_states(spec)}\n{logs}")
    print(f"all {spec.nodes} nodes ready in {time.monotonic() - start:.1f} s")


def is_up(spec: ClusterSpec) -> bool:
    """Whether all of the spec's daemons run and slurmctld answers."""
    alive = all(_pid(spec, name) for name in _daemon_names(spec))
    return alive and _slurm(spec, "scontrol", "ping").returncode == 0


def up(spec: ClusterSpec) -> dict[str, str]:
    """Start the cluster (restart it if its config changed) and wait until all nodes are usable; returns env vars."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not found: run scripts/install_slurm.sh")
    if os.geteuid() != 0:
        raise ClusterError("the local cluster must be started as root (munged runs as munge, slurmd as root)")
    if spec.containers:
        try:
            containers.install()
        except containers.ContainersUnavailable as e:
            raise ClusterError(f"--containers: {e}") from None
    spec = ports.kept(spec)  # on the ports its slurm.conf names, where it has one
    unchanged = all(p.exists() and p.read_text() == text for p, text in config_files(spec).items())
    if unchanged and is_up(spec):
        print(f"cluster in {spec.dir} already running")
        _wait_ready(spec)
        return spec.env()
    if any(daemon_pids(spec).values()):
        print(f"restarting the cluster in {spec.dir} (its config changed or a daemon is down)")
    try:
        return _start_on_free_ports(spec)
    except ClusterError as e:  # a daemon whose port was taken after settle() found it free: other ports, once
        if PORT_TAKEN not in str(e):
            raise
        print(f"a port of the cluster in {spec.dir} was taken as it started ({PORT_TAKEN}): trying other ports")
    return _start_on_free_ports(spec)


def _start_on_free_ports(spec: ClusterSpec) -> dict[str, str]:
    """Stop what runs, then start the cluster on free ports and wait until ready; stop what started if it fails."""
    down(spec)
    with START_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        try:
            spec = ports.settle(spec)
        except ports.NoFreePorts as e:
            raise ClusterError(str(e)) from None
        _prepare(spec)
        try:
            _start(spec)
            _wait_ready(spec)
        except BaseException:  # a daemon that would not start, nodes never ready, Ctrl-C: stop what this started
            print(f"the cluster in {spec.dir} did not come up: stopping what was started")
            down(spec)
            raise
    return spec.env()


def _stop(spec: ClusterSpec, name: str) -> None:
    pid = _pid(spec, name)
    if pid is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if _wait(lambda: not _ours(spec, pid), STOP_TIMEOUT_S):
            break
    print(f"stopped {name} (pid {pid}, {sig.name})")


def _cancel_jobs(spec: ClusterSpec) -> None:
    """Cancel every job and wait (bounded) until they are gone: slurmstepd and its tasks would outlive slurmd."""
    jobs = _slurm(spec, "squeue", "--noheader", "--format=%A").stdout.split() if _pid(spec, "slurmctld") else []
    if jobs:
        _slurm(spec, "scancel", *jobs)
        print(f"cancelled jobs {' '.join(jobs)}")
        _wait(lambda: not _slurm(spec, "squeue", "--noheader").stdout.strip(), STOP_TIMEOUT_S)


def down(spec: ClusterSpec) -> None:
    """Cancel all jobs, then stop this directory's daemons (every slurmd with a pid file, slurmctld, munged)."""
    _cancel_jobs(spec)
    for name in [*_running_slurmds(spec), "slurmctld", *accounting.DAEMONS, "munged"]:
        _stop(spec, name)


def status(spec: ClusterSpec) -> None:
    """Print whether each daemon is alive, then sinfo and squeue."""
    for name, pid in daemon_pids(spec).items():
        print(f"{name:16} {'running, pid ' + str(pid) if pid else 'not running'}")
    if _pid(spec, "slurmctld"):
        for argv in (["sinfo", "--Node", "--long"], ["squeue"]):
            proc = _slurm(spec, *argv)
            print(proc.stdout + proc.stderr, end="")
