"""The job's records in a bundle, read as data: metrics.jsonl (one JSON object a logged step, appended by training's
rank 0; a line cut by a kill mid-write is skipped) and checkpoints.jsonl (the supervisor's line per checkpoint seen
and per purge, where --keep_last/--keep_every are set: launcher/node/purge.py)."""

from __future__ import annotations

from pathlib import Path

from launcher import jsonl


def checkpoint_totals(path: Path) -> dict | None:
    """The checkpoints record totalled: saves seen and their bytes, steps removed and the bytes freed, purges; None
    where the job keeps no such record (no retention rule)."""
    if not path.is_file():
        return None
    rows = jsonl.read(path)
    saved = [r for r in rows if r.get("event") == "saved"]
    purges = [r for r in rows if r.get("event") == "purge"]
    return {
        "saved": len(saved),
        "written_bytes": sum(int(r.get("bytes") or 0) for r in saved),
        "removed": sum(len(r.get("removed") or []) for r in purges),
        "freed_bytes": sum(int(r.get("freed") or 0) for r in purges),
        "purges": len(purges),
    }
