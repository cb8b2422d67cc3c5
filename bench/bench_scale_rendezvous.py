"""The rendezvous store at 1,000-4,000 nodes, on loopback with torch's own TCPStore (one client a simulated agent,
threads in this process). Not a test.

    python bench/bench_scale_rendezvous.py [--nodes 1000 4000]

c10d (before): the rendezvous state is one value of ~125 bytes a node that every agent reads every second and
compare-and-sets every 5 s as its keep-alive, for the whole run; measured here: how long one such round (every
agent reads the state once) takes, i.e. what fraction of each second the store spends on it.
static (now): each agent connects once, sets its own key and reads back its own assignment, and the first
agent reads all keys once (torchelastic's rank assignment); measured: the time until every agent has its answer.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

STATE_BYTES_A_NODE = 125  # c10d's state per node, measured in issue 24 (123 KiB at 1,000 nodes)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def run_threads(count: int, work) -> float:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started


def one(nodes: int) -> dict:
    port = free_port()
    master = TCPStore("127.0.0.1", port, nodes + 1, True, timeout=timedelta(seconds=300), wait_for_workers=False)
    clients = [TCPStore("127.0.0.1", port, nodes + 1, False, timeout=timedelta(seconds=300)) for _ in range(nodes)]
    master.set("state", b"x" * (STATE_BYTES_A_NODE * nodes))

    def c10d_round(i: int) -> None:
        clients[i].get("state")

    c10d_s = run_threads(nodes, c10d_round)

    def static_join(i: int) -> None:
        clients[i].set(f"role_info/{i}", b"r" * 64)
        clients[i].get(f"assigned/{i}")  # waits until the first agent has assigned every rank

    def first_agent() -> None:
        master.wait([f"role_info/{i}" for i in range(nodes)])
        master.multi_get([f"role_info/{i}" for i in range(nodes)])
        for i in range(nodes):
            master.set(f"assigned/{i}", str(i * 8))

    assigner = threading.Thread(target=first_agent)
    assigner.start()
    static_s = run_threads(nodes, static_join)
    assigner.join()
    return {
        "nodes": nodes,
        "c10d_state_kib": round(STATE_BYTES_A_NODE * nodes / 1024),
        "c10d_one_read_round_s": round(c10d_s, 2),
        "c10d_bytes_per_s_needed_mib": round(nodes * STATE_BYTES_A_NODE * nodes * (1 + 1 / 5) / 2**20),
        "static_join_s": round(static_s, 2),
        "static_bytes_per_agent": 64 + 8,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 4000])
    args = parser.parse_args()
    for nodes in args.nodes:
        print(one(nodes), flush=True)


if __name__ == "__main__":
    main()
