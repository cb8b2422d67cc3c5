"""Healthy nodes before the long run: a seconds-long check on every node of the allocation, before torchrun.

Each node checks itself: it sees the GPUs the job asks for (`nvidia-smi -L`, where nvidia-smi exists), the
paths the run writes are writable and the ones it reads are readable from here, the job's Python has the modules
the engine needs. Then the nodes meet at the rendezvous host's port (the one torchrun uses next): every node sends
its findings, the first node answers all of them with the verdict. That also proves the rendezvous works across
the nodes; a node that cannot reach it is named. The first node prints one line per problem,
`node check failed on NODE: WHAT`, writes them to the report file for the supervisor (which goes on without those
nodes), and every node exits 5; a port already taken on the first node exits 6 (the supervisor tries another); any
other failure to listen is named as what it is (out of files, ...), not as a taken port.

At thousands of nodes the first node never holds a socket per node: each node reports on a short connection and
asks again every few seconds until the verdict is there (one selector loop, a bounded number of sockets open).
The first node, where torchrun's rendezvous store listens next, also checks its own limits: the open-file limit
(raised to the hard limit; about (GPUs + 1) x nodes needed) and the listen backlog (net.core.somaxconn).

Standard library (and `launcher.protocol`) only: the node step runs it (`main`) in its own process, with the job's
Python, before anything heavy is imported; `python -m launcher.node.nodecheck ...` runs it alone.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import random
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from launcher import protocol  # standard library only, like this module

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
    gpus, processes = protocol.counted(seen, "GPU"), protocol.counted(expected, "process")
    return [f"sees {gpus} (nvidia-smi -L), the job runs {processes} on it"] if seen < expected else []


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


def module_problems(modules: list[str], container: str | None = None) -> list[str]:
    """Modules the engine imports that this node's Python lacks (found without importing them); in a container,
    said of the container (its image, or the host paths it mounts, must bring them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return []
    if container:
        return [protocol.CONTAINER_LACKS.format(image=container, python=sys.executable, modules=", ".join(missing))]
    return [f"{sys.executable} lacks {', '.join(missing)}"]


def head_limit_problems(nodes: int, gpus: int) -> tuple[list[str], list[str]]:
    """The head's limits against what the rendezvous needs: (problems, warnings), each naming the limit.

    torchrun's store on this node holds a connection from every node's agent and every training process: about
    (GPUs + 1) x nodes open files in one process. The open-file limit is raised to its hard limit first (the node
    step does it too: Slurm passes the submitting shell's soft limit, often 1024). A listen backlog smaller
    than the nodes that connect at once makes the kernel drop connections, which clients retry after 1, 3, 7 s:
    slow, not fatal, so a warning."""
    problems, warnings = [], []
    need = (max(gpus, 1) + 1) * nodes + 256
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        if soft != resource.RLIM_INFINITY and soft < need:
            problems.append(
                f"the open-file limit is {soft} (ulimit -n, hard limit {hard}); the rendezvous store of "
                f"{protocol.counted(nodes, 'node')} x {protocol.counted(gpus, 'process')} needs about {need}: ask the "
                f"cluster's admins to raise nofile "
                f"(limits.conf, or LimitNOFILE of slurmd)"
            )
    except (ImportError, ValueError, OSError) as e:
        warnings.append(f"could not read or raise the open-file limit ({e})")
    try:
        somaxconn = int(open("/proc/sys/net/core/somaxconn", encoding="ascii").read())
        if somaxconn < nodes:
            warnings.append(
                f"net.core.somaxconn is {somaxconn}, below the {nodes} nodes that connect at once: the kernel drops "
                f"the rest and they retry (slower start); sysctl -w net.core.somaxconn={max(4096, nodes)}"
            )
    except (OSError, ValueError):
        pass
    return problems, warnings


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


def poll_interval(nodes: int) -> float:
    """Seconds between a peer's asks for the verdict: the head answers about 500 asks a second at most."""
    return min(max(nodes / 500, 0.2), 10.0)


def ask(head: str, port: int, nodes: list[str], node: str, mine: list[str], timeout: float) -> dict[str, list[str]]:
    """A peer: report, and ask again every few seconds until the head has the verdict (one short connection
    each time, so that the head never holds a socket per node)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((head, port), timeout=10) as sock:
                sock.settimeout(30)
                _send(sock, {"node": node, "problems": mine})
                answer = _receive(sock)  # this side closes first, so the head's port is free at once
            assert isinstance(answer, dict)
            if "verdict" in answer:  # the nodes with problems (and the head): the others have none
                return {n: answer["verdict"].get(n, []) for n in nodes}
            deadline = max(deadline, time.monotonic() + float(answer["wait"]) + 30)  # reported: the head is there
            time.sleep(float(answer["wait"]) * random.uniform(0.8, 1.2))
            continue
        except (OSError, ConnectionError, ValueError, KeyError, AssertionError):
            pass
        if time.monotonic() > deadline:
            return {node: mine + [f"cannot reach the rendezvous host {head}:{port} within {timeout:.0f} s"]}
        time.sleep(random.uniform(0.1, 0.3))


class Head:
    """The first node's side: short connections served by one selector loop, a bounded number open at once."""

    def __init__(self, port: int, nodes: list[str], found: dict[str, list[str]], max_open: int):
        # OSError here: the port is taken (EADDRINUSE), or a limit (the caller says which)
        self.server = socket.create_server(("", port), reuse_port=False, backlog=min(len(nodes), 65535))
        self.server.setblocking(False)
        self.nodes, self.found, self.max_open = nodes, found, max_open
        self.verdict: dict[str, list[str]] | None = None
        self.told: set[str] = set()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.server, selectors.EVENT_READ)
        self.listening, self.open = True, 0
        self.wait = poll_interval(len(nodes))

    def _accept(self) -> None:
        try:
            sock, _ = self.server.accept()
        except BlockingIOError:
            return
        except OSError:  # out of files after all: stop taking new ones until some close (they wait in the backlog)
            self._listen(False)
            return
        sock.setblocking(False)
        self.open += 1
        self.selector.register(sock, selectors.EVENT_READ, [b"", False])
        if self.open >= self.max_open:
            self._listen(False)

    def _listen(self, on: bool) -> None:
        if on != self.listening:
            if on:
                self.selector.register(self.server, selectors.EVENT_READ)
            else:
                self.selector.unregister(self.server)
            self.listening = on

    def _close(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        sock.close()
        self.open -= 1
        self._listen(True)

    def _read(self, sock: socket.socket, state: list) -> None:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if state[1] or not chunk:  # answered: the peer closes first (no TIME_WAIT on the head's port)
            self._close(sock)
            return
        state[0] += chunk
        if not state[0].endswith(b"\n"):
            return
        try:
            report = json.loads(state[0])
            node = str(report["node"])
            self.found[node] = [str(p) for p in report["problems"]]
        except (ValueError, KeyError, TypeError):
            self._close(sock)
            return
        if self.verdict is None and all(n in self.found for n in self.nodes):
            self.verdict = dict(self.found)
        if self.verdict is not None:  # short at thousands of nodes: only the nodes with problems, and the head
            answer: dict = {"verdict": {n: p for n, p in self.verdict.items() if p or n == self.nodes[0]}}
        else:
            answer = {"wait": self.wait}
        state[1] = True
        try:
            sock.setblocking(True)
            sock.settimeout(10)
            _send(sock, answer)
            sock.setblocking(False)
        except OSError:
            self._close(sock)
            return
        if self.verdict is not None:
            self.told.add(node)

    def serve(self, timeout: float, never: str) -> dict[str, list[str]]:
        """Answer until every node that reported has the verdict (or a while past the deadline)."""
        deadline, absent = time.monotonic() + timeout, set()
        try:
            while True:
                now = time.monotonic()
                if self.verdict is None and now > deadline:
                    absent = {n for n in self.nodes if n not in self.found}
                    self.found.update({n: [never] for n in absent})
                    self.verdict, deadline = dict(self.found), now  # those that reported come back soon
                if self.verdict is not None:
                    untold = [n for n in self.nodes[1:] if n not in self.told and n not in absent]
                    if (not untold and self.open == 0) or now > deadline + 5 * self.wait + 30:
                        return self.verdict
                for key, _ in self.selector.select(timeout=0.5):
                    if key.fileobj is self.server:
                        self._accept()
                    else:
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
        finally:
            for key in list(self.selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            self.selector.close()


def gather(head: str, port: int, nodes: list[str], node: str, mine: list[str], timeout: float) -> dict[str, list[str]]:
    """Every node's problems, gathered by the first node and sent back to all: node -> problems."""
    if len(nodes) == 1:
        return {node: mine}
    if node != nodes[0]:
        return ask(head, port, nodes, node, mine, timeout)
    try:
        import resource

        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        files = 1024
    max_open = max(8, min(1024, (files if files > 0 else 1024) // 2 - 32))
    never = f"never reached the rendezvous host {head}:{port} within {timeout:.0f} s"
    return Head(port, nodes, {node: mine}, max_open).serve(timeout, never)


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
    parser.add_argument("--container", help="the image this check runs in (srun --container-image), if any")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the other nodes")
    parser.add_argument("--report", help="where the first node writes the problems, one 'NODE: WHAT' a line")
    args = parser.parse_args(argv)
    nodes = args.nodes.split(",")
    mine = gpu_problems(args.gpus) + path_problems(args.writable, args.readable)
    mine += module_problems([m for m in args.modules.split(",") if m], args.container)
    if args.node == nodes[0]:  # the head: the rendezvous store lives here
        limits, warnings = head_limit_problems(len(nodes), args.gpus)
        mine += limits
        for warning in warnings:
            print(protocol.line("node_warning", node=args.node, what=warning), flush=True)
    try:
        found = gather(args.head, args.port, nodes, args.node, mine, args.timeout)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(f"rendezvous port {args.port} on {args.node} is taken ({e.strerror or e}): another port", flush=True)
            return PORT_TAKEN
        # not the port: a limit or the network, named as such (the other nodes say they could not reach it)
        found = {args.node: mine + [f"cannot listen on port {args.port} ({e.strerror or e})"]}
    failed = [(node, what) for node in nodes for what in found.get(node, [])]
    if args.node == nodes[0] or nodes[0] not in found:  # the first node says it all; a node cut off, its own
        for node, what in failed:
            print(protocol.line("node_check_failed", node=node, what=what), flush=True)
        if args.report and failed:
            with open(args.report, "w", encoding="utf-8") as f:
                f.writelines(f"{node}: {what}\n" for node, what in failed)
    return FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
