"""The bundle's record of the run's traffic with the bucket (protocol.REMOTE_RECORD, `remote.jsonl`): a line per step
uploaded (its bytes and seconds), per upload that failed, per step the bucket's retention removed, per step
downloaded (a resume from the bucket). One writer a job: its supervisor (the uploader's thread, and the resume before
it); `totals` is the one reader (the ledger, the manifest, `jobs checkpoints`). Standard library only."""

from __future__ import annotations

import time
from pathlib import Path

from launcher import jsonl


def append(path: Path, event: str, job: str, **fields: object) -> None:
    jsonl.append(path, {"event": event, **fields, "time": round(time.time(), 3), "job": job})


def rows(path: Path) -> list[dict]:
    return jsonl.read(path)


def totals(path: Path) -> dict | None:
    """The record totalled: steps uploaded, their bytes and seconds; failures; steps removed from the bucket; steps
    downloaded and their bytes and seconds. None where the run keeps no such record (no --checkpoints_remote)."""
    if not path.is_file():
        return None
    found = rows(path)

    def of(event: str) -> list[dict]:
        return [r for r in found if r.get("event") == event]

    up, down = of("uploaded"), of("downloaded")
    return {
        "uploaded": len(up),
        "uploaded_bytes": sum(int(r.get("bytes") or 0) for r in up),
        "upload_seconds": round(sum(float(r.get("seconds") or 0) for r in up), 3),
        "upload_failures": len(of("upload_failed")),
        "removed": len(of("removed")),
        "downloaded": len(down),
        "downloaded_bytes": sum(int(r.get("bytes") or 0) for r in down),
        "download_seconds": round(sum(float(r.get("seconds") or 0) for r in down), 3),
    }
