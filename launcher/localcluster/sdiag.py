"""How many remote procedure calls the controller has served, by message type (`sdiag`'s "Remote Procedure Call
statistics by message type"): the measure of a follower's cost, for the tests and bench/bench_follow.py. Read
twice and subtract; `sdiag --reset` (root only) is not needed."""

from __future__ import annotations

import re
import subprocess
from collections import Counter

SECTION = "Remote Procedure Call statistics by message type"
ROW = re.compile(r"^\s*(?P<kind>[A-Z][A-Z0-9_]+)\s+\(\s*\d+\)\s+count:(?P<count>\d+)")
OWN = frozenset({"REQUEST_STATS_INFO"})  # sdiag's own question


def parse_rpc_counts(text: str) -> Counter[str]:
    """sdiag's output -> message type -> count, from its by-message-type section only."""
    counts: Counter[str] = Counter()
    inside = False
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics"):
            inside = line.startswith(SECTION)
            continue
        if inside and (row := ROW.match(line)):
            counts[row["kind"]] = int(row["count"])
    return counts


def rpc_counts(env: dict[str, str] | None = None) -> Counter[str]:
    """The controller's RPC counts now (every message type but sdiag's own)."""
    out = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, timeout=30, check=True)
    counts = parse_rpc_counts(out.stdout)
    for kind in OWN:
        counts.pop(kind, None)
    return counts


def served(before: Counter[str], after: Counter[str], nodes: bool = False) -> Counter[str]:
    """The RPCs served between two readings, by type (only the types that grew); without the nodes' own reports
    (MESSAGE_NODE_REGISTRATION_STATUS, ..., which come whoever follows) unless `nodes`."""
    return Counter(
        {
            kind: after[kind] - before.get(kind, 0)
            for kind in after
            if after[kind] > before.get(kind, 0) and (nodes or not kind.startswith("MESSAGE_"))
        }
    )
