"""The local cluster's TCP ports as it starts: its slot's, or the next free slot's where one of them is taken.

A port the kernel's ephemeral range holds (`net.ipv4.ip_local_port_range`) may be any outgoing connection's local
end at any moment, so no slot with a port in it is chosen (the slots, 10000-19999, lie below the default range,
32768-60999; a machine whose range reaches lower skips those it covers). A port some other process listens on (or
holds bound: another cluster's daemon, a test's socket, a stale process) is found by binding it here first, as the
daemons will (all addresses, SO_REUSEADDR): the cluster then takes the next slot, and says so. A cluster that
already has a slurm.conf keeps the slot it names, so that restarting it (or `up` again) finds it where it was.

A slot also names the cluster's window of job ids (`ClusterSpec.job_id_window`), from which its jobs' rendezvous
ports derive: a slot whose window a running cluster holds (another slot of that window with its slurmctld's port
taken) is passed over too, while another will do, so that two clusters' jobs never share an id, and with it a port
and a rendezvous. `daemons.up` settles and starts one cluster at a time on the machine (`START_LOCK`), so that two
starting at once cannot both pick a window.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

from launcher.localcluster.slurm_conf import JOB_ID_WINDOWS, PORT_BASE, PORT_SLOTS, PORT_STEP, ClusterSpec

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = range(32768, 61000)  # Linux's default, where RANGE_FILE cannot be read


class NoFreePorts(Exception):
    """Every slot has a port that is taken or ephemeral."""


def ephemeral_range() -> range:
    """The kernel's ephemeral port range (inclusive bounds in RANGE_FILE; a range here)."""
    try:
        low, high = (int(x) for x in RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return range(low, high + 1)


def taken(port: int) -> OSError | None:
    """Why `port` cannot be listened on now (None: it can), tried as a daemon binds it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
            sock.listen()
    except OSError as e:
        return e
    return None


def configured_slot(spec: ClusterSpec) -> int | None:
    """The slot the cluster's existing slurm.conf names (its SlurmctldPort), if any."""
    try:
        found = re.search(r"^SlurmctldPort=(\d+)$", spec.conf.read_text(), re.MULTILINE)
    except OSError:
        return None
    offset = int(found.group(1)) - PORT_BASE if found else -1
    return offset // PORT_STEP if 0 <= offset < PORT_STEP * PORT_SLOTS and offset % PORT_STEP == 0 else None


def kept(spec: ClusterSpec) -> ClusterSpec:
    """The spec on the slot its slurm.conf names (where it has one), else on its own."""
    slot = configured_slot(spec) if spec.port_slot is None else spec.port_slot
    return spec if slot is None else dataclasses.replace(spec, port_slot=slot)


def problem(ports: list[int], ephemeral: range) -> str | None:
    """Why one of `ports` will not do (None: all will)."""
    for port in ports:
        if port in ephemeral:
            return f"port {port} is in the kernel's ephemeral range ({ephemeral.start}-{ephemeral.stop - 1})"
        if e := taken(port):
            return f"port {port} is taken ({e.strerror or e})"
    return None


def window_holder(spec: ClusterSpec) -> str | None:
    """Why the spec's window of job ids will not do (None: it will): another slot of that window with its slurmctld's
    port taken, a running cluster's."""
    for slot in range(spec.job_id_window, PORT_SLOTS, JOB_ID_WINDOWS):
        port = dataclasses.replace(spec, port_slot=slot).ctld_port
        if slot != spec.slot and taken(port):
            return f"job ids {spec.first_job_id}.. are those of the cluster on port {port}"
    return None


def settle(spec: ClusterSpec) -> ClusterSpec:
    """The spec on the first slot, from its own on, whose ports are all outside the ephemeral range and free and
    whose window of job ids no running cluster holds; where every window is held, the first whose ports will do
    (its jobs' rendezvous then move to the next free port where a port is taken)."""
    ephemeral, skipped = ephemeral_range(), list[str]()
    for own_window in (True, False):
        for k in range(PORT_SLOTS):
            candidate = dataclasses.replace(spec, port_slot=(spec.slot + k) % PORT_SLOTS)
            said = problem(candidate.ports, ephemeral) or (window_holder(candidate) if own_window else None)
            if said is None:
                if skipped:
                    print(f"{skipped[0]}: the cluster in {spec.dir} takes ports {candidate.ports[0]}-"
                          f"{candidate.ports[-1]} and job ids {candidate.first_job_id}.. instead")  # fmt: skip
                return candidate
            skipped.append(said)
    raise NoFreePorts(
        f"no free ports for the local cluster in {PORT_BASE}-{PORT_BASE + PORT_STEP * PORT_SLOTS - 1}, outside the "
        f"kernel's ephemeral range: {skipped[0]}, and every other slot has one taken too"
    )
