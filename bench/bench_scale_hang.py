"""The hang verdict on 4,000 nodes x 8 processes of synthetic py-spy dumps (tests/synthetic_stacks.py), generated in
a temporary directory and deleted. Not a test.

    python bench/bench_scale_hang.py [--nodes 4000] [--per-node 8]

Prints how many nodes the rule before (a node is a suspect when one of its stacks names no collective) and the
rule now (the odd stacks out, at most max(1, nodes / 50)) suspect, and how long the verdict took.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from synthetic_stacks import node_name, write_dumps  # noqa: E402

from launcher.node import watchdog  # noqa: E402


def before(stacks: Path) -> list[str]:
    """The rule before: a process whose dump names no collective marks its node."""
    elsewhere = set()
    for dump in stacks.glob("*-*.txt"):
        text = dump.read_text(encoding="utf-8", errors="replace")
        if "Thread" in text and not any(word in text for word in watchdog.COLLECTIVE):
            elsewhere.add(dump.name.rsplit("-", 1)[0])
    return sorted(elsewhere)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--per-node", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stacks = Path(tmp)
        started = time.monotonic()
        size = write_dumps(stacks, args.nodes, args.per_node, stuck={1234 % args.nodes})
        took = time.monotonic() - started
        print(f"{args.nodes * args.per_node} dumps, {size / 2**20:.0f} MiB, written in {took:.1f} s")
        started = time.monotonic()
        old = before(stacks)
        print(f"before: {len(old)} suspected nodes ({time.monotonic() - started:.1f} s)")
        started = time.monotonic()
        found, why = watchdog.suspects(stacks, max(1, args.nodes // 50))
        took = time.monotonic() - started
        print(f"now: {found} {why} ({took:.1f} s); the stuck node is {node_name(1234 % args.nodes)}")


if __name__ == "__main__":
    main()
