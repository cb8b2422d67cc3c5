"""The job's records in a bundle, read as data: metrics.jsonl (one JSON object a logged step, appended by training's
rank 0; a line cut by a kill mid-write is skipped)."""

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
