"""The job's records in a bundle, read as data: metrics.jsonl (one JSON object a logged step, appended by training's
rank 0; a line cut by a kill mid-write is skipped) and checkpoints.jsonl (the supervisor's line per checkpoint seen
and per purge, where --keep_last/--keep_every are set: launcher/node/purge.py)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill mid-write
    return rows


def checkpoint_totals(path: Path) -> dict | None:
    """The checkpoints record totalled: saves seen and their bytes, steps removed and the bytes freed, purges; None
    where the job keeps no such record (no retention rule)."""
    try:
        rows = read_metrics(path)
    except OSError:
        return None
    saved = [r for r in rows if r.get("event") == "saved"]
    purges = [r for r in rows if r.get("event") == "purge"]
    return {
        "saved": len(saved),
        "written_bytes": sum(int(r.get("bytes") or 0) for r in saved),
        "removed": sum(len(r.get("removed") or []) for r in purges),
        "freed_bytes": sum(int(r.get("freed") or 0) for r in purges),
        "purges": len(purges),
    }
