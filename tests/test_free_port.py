"""The ports tests hand to their own listeners (tests/launcher_helpers.py `free_port`): each pytest-xdist worker draws
from a share of its own, and a port drawn stays claimed by the process that drew it, so that no other process
drawing (another worker, another checkout's suite) hands it to a second listener (torchrun, finding its port held,
waits on the holder as a client until its store times out)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import launcher_helpers
import pytest
from launcher_helpers import TEST_PORTS, free_port, worker_ports

HOLDER = """
import sys
sys.path.insert(0, {tests!r})
import launcher_helpers
launcher_helpers.PORT_CLAIMS = launcher_helpers.Path({claims!r})
launcher_helpers.worker_ports = lambda: range({low}, {high})
print(launcher_helpers.free_port(), launcher_helpers.free_port(), flush=True)
sys.stdin.read()  # holds its claims until the test closes its stdin
"""


def test_every_worker_draws_from_a_share_of_its_own(monkeypatch: pytest.MonkeyPatch):
    shares = []
    for n in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
        shares.append(set(worker_ports()))
    assert all(len(share) == len(TEST_PORTS) // 4 and share <= set(TEST_PORTS) for share in shares)
    assert all(not (a & b) for i, a in enumerate(shares) for b in shares[i + 1 :])  # no port in two shares
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert worker_ports() == TEST_PORTS  # without xdist: all of it


def test_a_port_another_process_drew_is_never_drawn_and_one_listened_on_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    ports = range(worker_ports().stop - 3, worker_ports().stop)  # this worker's own: no other worker draws there
    monkeypatch.setattr(launcher_helpers, "PORT_CLAIMS", tmp_path)
    monkeypatch.setattr(launcher_helpers, "worker_ports", lambda: ports)
    code = HOLDER.format(tests=str(Path(__file__).parent), claims=str(tmp_path), low=ports.start, high=ports.stop)
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = {int(p) for p in holder.stdout.readline().split()}  # type: ignore[union-attr]
        assert len(held) == 2 and held <= set(ports)
        (left,) = set(ports) - held
        assert {free_port() for _ in range(10)} == {left}  # its claims are passed over, however often one draws
        with socket.create_server(("", left)):  # the one port left, listened on: nothing to draw
            with pytest.raises(RuntimeError, match="no free port"):
                free_port()
    finally:
        holder.communicate(input="", timeout=60)
    with socket.create_server(("", left)):
        assert free_port() in held  # its claims went with it
