"""A real S3 server on this machine, for the tests and by hand: a one-node Ceph cluster (a monitor and one OSD) behind
radosgw, Ceph's S3 gateway, from Debian forky's Ceph 20.2 (docs/s3-server.md: why this server, its figures).

Everything it keeps lives under ONE directory (default `<project root>/.s3`, git-ignored):

    ceph.conf                 generated (launcher/localcluster/s3_conf.py: the settings, the ports)
    mon.a/, osd.0/, rgw/      the monitor's store, the OSD's (bluestore: its `block` file, sparse), radosgw's
    run/NAME.pid              each daemon's pid (mon, osd, rgw), as started here
    log/                      each daemon's own log (client.rgw.log has a line per S3 request, with its status) and
                              NAME.out, its stdout and stderr
    credentials               the keys of `python -m launcher.localcluster s3 up` (launcher/localcluster/s3_access.py)
    made                      written once the cluster is made and answered: a directory without it is made anew

Each daemon runs in the foreground from the root filesystem scripts/s3_root.sh builds once, with chroot, in a mount
namespace of its own: the root over itself read-only (no daemon writes to the cached root), /proc, a tmpfs at /tmp
and this directory at /srv/s3. Those mounts end with the daemon: `down` has nothing to unmount, a crash leaves none.
A process is this directory's daemon when its environment names the directory (S3_SERVER_DIR), so that several
servers on one machine never stop each other's. It must run as root (chroot, mount namespaces).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from launcher.errors import LauncherError
from launcher.localcluster import ports
from launcher.localcluster.s3_conf import MOUNT, PORT_SLOTS, S3Spec, ceph_conf, configured_fsid, configured_slot

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "s3_root.sh"
# held while a server settles on its ports and starts, until it answers: one at a time on the machine
START_LOCK = Path("/tmp/launcher-localcluster-s3.lock")
DAEMONS = {"mon": ["ceph-mon", "-f", "-i", "a"], "osd": ["ceph-osd", "-f", "-i", "0"],
           "rgw": ["radosgw", "-f", "-n", "client.rgw"]}  # fmt: skip
LOGS = {"mon": "mon.a.log", "osd": "osd.0.log", "rgw": "client.rgw.log"}
MADE = ("ceph.conf", "mon.a", "osd.0", "rgw", "run", "log", "crash", "made")  # what a server's directory holds
READY_TIMEOUT_S, STOP_TIMEOUT_S, TOOL_TIMEOUT_S = 60.0, 10.0, 60.0
# radosgw's own shutdown waits minutes for its dedup thread (20.2.4); all it keeps is in the cluster already
GATEWAY_GRACE_S = 2.0
_children: dict[int, subprocess.Popen[bytes]] = {}  # the daemons this process started: reaped as they end


class S3Error(LauncherError):
    """The server could not be built, started or set up (a user, a bucket: launcher.localcluster.s3_access); the message
    carries what the daemon or the command said."""


@functools.cache
def root() -> Path:
    """The root filesystem the daemons run from (scripts/s3_root.sh builds it once, about a minute)."""
    said: list[str] = []  # what it says as it builds: shown as it comes, and its end kept for the error
    with subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stderr:
            print(line, end="", file=sys.stderr)
            said = [*said[-15:], line]
        path = proc.stdout.read().strip().splitlines()
    if proc.returncode != 0 or not path:
        raise S3Error(f"{SCRIPT} could not build the S3 server's root filesystem (exit status {proc.returncode}): "
                      + "".join(said).strip())  # fmt: skip
    return Path(path[-1])


def _inside(spec: S3Spec, argv: list[str]) -> list[str]:
    """`argv` run from the root filesystem in a mount namespace of its own (the module's doc), by exec: the pid of
    the returned command is the pid of `argv`'s process."""
    mounts = ('root=$1 dir=$2; shift 2; mount --bind "$root" "$root" && mount -o remount,bind,ro "$root" && '
              'mount -t proc proc "$root/proc" && mount -t tmpfs -o size=64m tmpfs "$root/tmp" && '
              f'mount --bind "$dir" "$root{MOUNT}" && exec chroot "$root" "$@"')  # fmt: skip
    env = ["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", f"CEPH_CONF={MOUNT}/ceph.conf",
           f"S3_SERVER_DIR={spec.dir}"]  # fmt: skip
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, "-", str(root()), str(spec.dir),
            *env, *argv]  # fmt: skip


def tool(spec: S3Spec, *argv: str) -> str:
    """Run one of the root's commands (monmaptool, ceph, radosgw-admin...) on the server; its stdout. A failure says
    the command's stderr, never its stdout (radosgw-admin prints a user's keys there)."""
    try:
        proc = subprocess.run(_inside(spec, list(argv)), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise S3Error(f"{argv[0]} {argv[1]} did not end within {TOOL_TIMEOUT_S:.0f} s on the S3 server in {spec.dir}: "
                      "is it up? (python -m launcher.localcluster s3 status)") from None  # fmt: skip
    if proc.returncode != 0:
        said = proc.stderr.strip()[-2000:]
        raise S3Error(f"{argv[0]} {argv[1]} failed on the S3 server in {spec.dir} (exit status {proc.returncode}):"
                      f"\n{said}")  # fmt: skip
    return proc.stdout


def _wait(done: Callable[[], object], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(missing)"]
    return f"--- last lines of {path}:\n" + "\n".join(text)


def _logs(spec: S3Spec, name: str) -> str:
    return _tail(spec.dir / "log" / f"{name}.out", 5) + "\n" + _tail(spec.dir / "log" / LOGS[name])


def _ours(spec: S3Spec, pid: int) -> bool:
    """Whether `pid` is a live daemon of this directory (a zombie's environment reads empty: not live)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"S3_SERVER_DIR={spec.dir}".encode() in environ.split(b"\0")


def _ended(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie (its sockets closed, unlike a process still exiting whose
    environment already reads empty)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _pid(spec: S3Spec, name: str) -> int | None:
    """The pid of this directory's live daemon `name` (mon, osd, rgw); None if it is not running."""
    try:
        pid = int((spec.dir / "run" / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _ours(spec, pid) else None


def _spawn(spec: S3Spec, name: str) -> None:
    """Start daemon `name` in the foreground, in a session of its own (it outlives this process), and record its pid."""
    with (spec.dir / "log" / f"{name}.out").open("ab") as out:
        proc = subprocess.Popen(_inside(spec, DAEMONS[name]), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    _children[proc.pid] = proc
    (spec.dir / "run" / f"{name}.pid").write_text(f"{proc.pid}\n")
    if not _wait(lambda: _ours(spec, proc.pid) or proc.poll() is not None, STOP_TIMEOUT_S) or proc.poll() is not None:
        raise S3Error(f"{name} did not start (exit status {proc.poll()}):\n{_logs(spec, name)}")
    print(f"started {name} (pid {proc.pid})")


def _stop(spec: S3Spec, name: str, signals: tuple[tuple[signal.Signals, float], ...]) -> None:
    """Send each signal in turn, waiting its time for the daemon to end, until it has."""
    pid = _pid(spec, name)
    if pid is None:
        return
    for sig, wait_s in signals:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if _wait(lambda: _ended(pid), wait_s):
            break
    if pid in _children:
        _children.pop(pid).wait(STOP_TIMEOUT_S)
    print(f"stopped {name} (pid {pid}, {sig.name})")


def _answers(spec: S3Spec) -> bool:
    """Whether radosgw answers HTTP on its endpoint (any status: an anonymous request is answered)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy from the environment
    try:
        with opener.open(spec.endpoint + "/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _wait_answers(spec: S3Spec) -> None:
    def ready() -> bool:
        dead = [name for name in DAEMONS if _pid(spec, name) is None]
        if dead:
            raise S3Error(f"{dead[0]} of the S3 server in {spec.dir} is not running:\n{_logs(spec, dead[0])}")
        return _answers(spec)

    start = time.monotonic()
    if not _wait(ready, READY_TIMEOUT_S):
        waited = f"{READY_TIMEOUT_S:.0f} s"
        raise S3Error(f"radosgw did not answer on {spec.endpoint} within {waited}:\n{_logs(spec, 'rgw')}")
    print(f"S3 server answers on {spec.endpoint} ({time.monotonic() - start:.1f} s)")


def settle_ports(spec: S3Spec, made: bool) -> S3Spec:
    """A made server on the slot its ceph.conf names (its monitor's address is in its store: all its ports must be
    free); a new one on its directory's slot, or the next whose ports are all free and outside the ephemeral range."""
    ephemeral = ports.ephemeral_range()
    if made:
        spec = configured(spec)
        if said := ports.problem(spec.ports, ephemeral):
            raise S3Error(f"{said}: the S3 server in {spec.dir} keeps its ports (its monitor's address is in its "
                          f"store): free the port, or remove {spec.dir} for a new server")  # fmt: skip
        return spec
    skipped = list[str]()
    for k in range(PORT_SLOTS):
        candidate = replace(spec, port_slot=(spec.slot + k) % PORT_SLOTS)
        said = ports.problem(candidate.ports, ephemeral)
        if said is None:
            if skipped:
                print(f"{skipped[0]}: the S3 server in {spec.dir} takes ports {candidate.ports[0]}-"
                      f"{candidate.ports[-1]} instead")  # fmt: skip
            return candidate
        skipped.append(said)
    raise S3Error(f"no free ports for the S3 server in 9000-9999: {skipped[0]}, and every other slot has one taken")


def _make(spec: S3Spec) -> None:
    """A new cluster: the monitor's store, the OSD registered and its store made, then the three daemons started."""
    for name in MADE:  # what a directory left half-made holds (only those names: the directory may be the caller's)
        path = spec.dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for sub in ("run", "log", "crash", "mon.a", "osd.0", "rgw"):
        (spec.dir / sub).mkdir(parents=True)
    fsid, osd = str(uuid.uuid4()), str(uuid.uuid4())
    spec.conf.write_text(ceph_conf(spec, fsid))
    monmap = f"{MOUNT}/run/monmap"
    tool(spec, "monmaptool", "--create", "--fsid", fsid, "--addv", "a", f"[v2:127.0.0.1:{spec.mon_port}]", monmap)
    tool(spec, "ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap)
    _spawn(spec, "mon")
    tool(spec, "ceph", "--connect-timeout", "30", "osd", "new", osd)
    tool(spec, "ceph-osd", "--mkfs", "-i", "0", "--osd-uuid", osd)
    _spawn(spec, "osd")
    _spawn(spec, "rgw")  # its first start creates its pools, once the OSD is up


def configured(spec: S3Spec) -> S3Spec:
    """The spec on the ports its ceph.conf names, where it has one (a server made before, or running)."""
    return replace(spec, port_slot=configured_slot(spec))


def daemon_pids(spec: S3Spec) -> dict[str, int | None]:
    """Each daemon (mon, osd, rgw) -> its pid, or None where it is not running."""
    return {name: _pid(spec, name) for name in DAEMONS}


def is_up(spec: S3Spec) -> bool:
    """Whether the three daemons run and radosgw answers."""
    return all(daemon_pids(spec).values()) and _answers(spec)


def up(spec: S3Spec) -> S3Spec:
    """Start the server (make it first where its directory holds none) and wait until it answers; returns the spec on
    the ports it took. A server already up is left as it is."""
    if os.geteuid() != 0:
        raise S3Error("the local S3 server must be started as root (chroot, mount namespaces)")
    made = (spec.dir / "made").exists()
    if made and is_up(configured(spec)):
        print(f"S3 server in {spec.dir} already running on {configured(spec).endpoint}")
        return configured(spec)
    down(spec)  # whatever still runs of it
    root()  # built (once) before taking the lock
    spec.dir.mkdir(parents=True, exist_ok=True)
    with START_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        spec = settle_ports(spec, made)
        try:
            if made:  # its config written anew (this code's settings), with its cluster's id and ports
                spec.conf.write_text(ceph_conf(spec, configured_fsid(spec)))
                for name in DAEMONS:
                    _spawn(spec, name)
            else:
                _make(spec)
            _wait_answers(spec)
        except BaseException:  # a daemon that would not start, no answer, Ctrl-C: stop what this started
            print(f"the S3 server in {spec.dir} did not come up: stopping what was started")
            down(spec)
            raise
    (spec.dir / "made").touch()
    return spec


def down(spec: S3Spec) -> None:
    """Stop this directory's daemons: radosgw, then the OSD, then the monitor. What they stored stays."""
    _stop(spec, "rgw", ((signal.SIGTERM, GATEWAY_GRACE_S), (signal.SIGKILL, STOP_TIMEOUT_S)))
    for name in ("osd", "mon"):
        _stop(spec, name, ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)))


def kill_gateway(spec: S3Spec) -> None:
    """SIGKILL radosgw (a fault to test against) and wait until it has ended; the cluster behind it stays up."""
    if _pid(spec, "rgw") is None:
        raise S3Error(f"radosgw of the S3 server in {spec.dir} is not running")
    _stop(spec, "rgw", ((signal.SIGKILL, STOP_TIMEOUT_S),))


def start_gateway(spec: S3Spec) -> None:
    """Start radosgw again (after `kill_gateway`) and wait until it answers."""
    if _pid(spec, "rgw") is None:
        _spawn(spec, "rgw")
    _wait_answers(spec)


def status(spec: S3Spec) -> None:
    """Print whether each daemon is alive, the endpoint, and the cluster's own view (`ceph status`)."""
    spec = configured(spec)
    for name, pid in daemon_pids(spec).items():
        print(f"{name:4} {'running, pid ' + str(pid) if pid else 'not running'}")
    print(f"endpoint {spec.endpoint} {'answers' if _answers(spec) else 'does not answer'}")
    if _pid(spec, "mon"):
        print(tool(spec, "ceph", "--connect-timeout", "5", "status"), end="")
