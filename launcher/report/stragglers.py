"""The ranks training named as slower than the others (launcher/train/ranks.py writes them, a JSON line per look
while one stays slow, into the bundle's stragglers file): read back for the run's summary and training.png."""

from __future__ import annotations

from pathlib import Path

from launcher import jsonl
from launcher import protocol as P
from launcher.bundle import manifest


def rows(path: Path) -> list[dict]:
    """The stragglers file's records, in order (none where there is no file)."""
    return [r for r in jsonl.read(path) if isinstance(r.get("step"), int) and isinstance(r.get("ratio"), (int, float))]


def by_who(found: list[dict]) -> dict[str, list[dict]]:
    """Each straggler's records, by who it is ("rank 3 on node2", "node2 (ranks 2-3)")."""
    out: dict[str, list[dict]] = {}
    for r in found:
        who = f"rank {r['rank']} on {r['node']}" if r.get("rank") is not None else f"{r['node']} (ranks {r['ranks']})"
        out.setdefault(who, []).append(r)
    return out


def ratio(found: list[dict]) -> float:
    """How many times the median rank's own work per step a straggler took, at its slowest look."""
    return max(r["ratio"] for r in found)


def named(run: manifest.Manifest) -> list[str]:
    """The run's stragglers in words, for its summary: who, how much slower, over which steps."""
    return [
        f"{who}: {ratio(found):.1f}x the median rank's own work per step (steps {found[0].get('since', '?')}-"
        f"{found[-1]['step']}, {len(found)} looks)"
        for who, found in by_who(rows(run.bundle_dir / P.STRAGGLERS_FILE)).items()
    ]
