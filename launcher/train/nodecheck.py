"""Healthy nodes before the long run: a seconds-long check on every node of the allocation, before torchrun.

Each node checks itself: it sees the GPUs the job asks for (`nvidia-smi -L`, where nvidia-smi exists), the
paths the run writes are writable and the ones it reads are readable from here, the job's Python has the modules
the engine needs. Then the nodes meet at the rendezvous host's port (the one torchrun uses next): every node sends
its findings, the first node answers all of them with the verdict. That also proves the rendezvous works across
the nodes; a node that cannot reach it is named. The first node prints one line per problem,
`preflight failed on NODE: WHAT`, writes them to the report file for the batch script (which requeues the job
without those nodes), and every node exits 5; a port already taken on the first node exits 6 (the batch script
tries another).

Standard library only: it runs with the job's Python before anything heavy is imported, as a script by path
(`python nodecheck.py ...`), without the launcher package on sys.path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run by path with the job's Python: the launcher package is two levels up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launcher import protocol  # noqa: E402  (standard library only, like this file)

FAILED, PORT_TAKEN = 5, 6


def gpu_problems(expected: int) -> list[str]:
    """This node's GPUs against what the job asks for, where nvidia-smi exists (else nothing to say)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or expected <= 0:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"nvidia-smi -L did not answer ({e})"]
    if out.returncode != 0:
        first = (out.stderr.strip() or out.stdout.strip() or f"exit status {out.returncode}").splitlines()[0]
        return [f"nvidia-smi -L fails: {first}"]
    seen = sum(line.startswith("GPU ") for line in out.stdout.splitlines())
    return [f"sees {seen} GPUs (nvidia-smi -L), the job runs {expected} processes on it"] if seen < expected else []


def path_problems(writable: list[str], readable: list[str]) -> list[str]:
    """Directories the run writes (created if need be, then a file written and removed) and paths it reads."""
    out = []
    for directory in writable:
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".launcher-nodecheck-"):
                pass
        except OSError as e:
            out.append(f"cannot write {directory} ({e.strerror or e})")
    for path in readable:
        if not os.path.exists(path):
            out.append(f"cannot see {path} (not there from this node)")
        elif not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
            out.append(f"cannot read {path}")
    return out


def module_problems(modules: list[str]) -> list[str]:
    """Modules the engine imports that this node's Python lacks (found without importing them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return [f"{sys.executable} lacks {', '.join(missing)}"] if missing else []


def _send(sock: socket.socket, data: object) -> None:
    sock.sendall(json.dumps(data).encode() + b"\n")


def _receive(sock: socket.socket) -> object:
    buffer = b""
    while not buffer.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a whole message")
        buffer += chunk
    return json.loads(buffer)


def gather(head: str, port: int, nodes: list[str], node: str, mine: list[str], timeout: float) -> dict[str, list[str]]:
    """Every node's problems, gathered by the first node and sent back to all: node -> problems."""
    if len(nodes) == 1:
        return {node: mine}
    if node != nodes[0]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((head, port), timeout=5) as sock:
                    sock.settimeout(timeout)
                    _send(sock, {"node": node, "problems": mine})
                    verdict = _receive(sock)  # this side closes first, so the head's port is free at once
                assert isinstance(verdict, dict)
                return verdict
            except (OSError, ConnectionError, ValueError):
                if time.monotonic() > deadline:
                    return {node: mine + [f"cannot reach the rendezvous host {head}:{port} within {timeout:.0f} s"]}
                time.sleep(0.2)
    server = socket.create_server(("", port), reuse_port=False)  # OSError: the port is taken (the caller says so)
    server.settimeout(timeout)
    found, peers = {node: mine}, []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < len(nodes) and time.monotonic() < deadline:
            try:
                sock, _ = server.accept()
            except TimeoutError:
                break
            sock.settimeout(max(deadline - time.monotonic(), 1))
            report = _receive(sock)
            assert isinstance(report, dict)
            found[str(report["node"])] = [str(p) for p in report["problems"]]
            peers.append(sock)
        for missing in nodes:
            if missing not in found:
                found[missing] = [f"never reached the rendezvous host {head}:{port} within {timeout:.0f} s"]
        for sock in peers:
            _send(sock, found)
        for sock in peers:  # wait for each peer to close first: no TIME_WAIT left on the head's port
            sock.settimeout(5)
            try:
                sock.recv(1)
            except OSError:
                pass
            sock.close()
    finally:
        server.close()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="the rendezvous host (the first node's address)")
    parser.add_argument("--port", type=int, required=True, help="the rendezvous port")
    parser.add_argument("--nodes", required=True, help="the job's nodes, comma-separated, the first node first")
    parser.add_argument("--node", required=True, help="this node's name")
    parser.add_argument("--gpus", type=int, default=0, help="processes (GPUs) the job runs on every node")
    parser.add_argument("--writable", action="append", default=[], help="a directory the run writes")
    parser.add_argument("--readable", action="append", default=[], help="a path the run reads")
    parser.add_argument("--modules", default="", help="modules the engine imports, comma-separated")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the other nodes")
    parser.add_argument("--report", help="where the first node writes the problems, one 'NODE: WHAT' a line")
    args = parser.parse_args(argv)
    nodes = args.nodes.split(",")
    mine = gpu_problems(args.gpus) + path_problems(args.writable, args.readable)
    mine += module_problems([m for m in args.modules.split(",") if m])
    try:
        found = gather(args.head, args.port, nodes, args.node, mine, args.timeout)
    except OSError as e:
        print(f"rendezvous port {args.port} on {args.node} is taken ({e.strerror or e}): another port", flush=True)
        return PORT_TAKEN
    failed = [(node, what) for node in nodes for what in found.get(node, [])]
    if args.node == nodes[0] or nodes[0] not in found:  # the first node says it all; a node cut off, its own
        for node, what in failed:
            print(protocol.line("preflight_failed", node=node, what=what), flush=True)
        if args.report and failed:
            with open(args.report, "w", encoding="utf-8") as f:
                f.writelines(f"{node}: {what}\n" for node, what in failed)
    return FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
