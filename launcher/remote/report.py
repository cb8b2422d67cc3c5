"""The bucket's side of `python -m launcher.jobs checkpoints` (launcher/retention/report.py shows the disk's): every
step in the run's folder in the bucket, complete (its marker, its size) or not (a folder without a marker: an upload
in progress, or one cut), what the bucket's retention keeps, and the run's traffic with the bucket (its bundles'
records). Which steps on disk are not in the bucket yet (local retention keeps them) is judged as the uploader does,
less the checksums: a marker whose files have the sizes the disk's have (reading every checkpoint again is the
job's, not a report's). One listing, and one read a marker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.node.job import Job
from launcher.perf.sizes import human_bytes
from launcher.remote import fetch, record
from launcher.remote import marker as markers
from launcher.remote.bucket import Listing
from launcher.remote.client import RemoteError
from launcher.retention.rules import NOT_IN_BUCKET


@dataclass
class Seen:
    """The run's folder in the bucket at one look (or why it could not be looked at)."""

    url: str
    listing: Listing = field(default_factory=Listing)
    markers: dict[int, markers.Marker] = field(default_factory=dict)
    error: str = ""


def look(job: Job) -> Seen:
    assert job.remote is not None
    bucket = fetch.bucket_of(job.remote, job.python)
    seen = Seen(bucket.url)
    try:
        seen.listing = bucket.listing()
        for step in sorted(seen.listing.complete):
            found = bucket.marker(step)
            if found is not None:
                seen.markers[step] = found
    except RemoteError as e:
        seen.error = str(e)
    return seen


def owed(seen: Seen, root: Path, complete: dict[int, str]) -> dict[int, str]:
    """The steps on disk not in the bucket yet, by their sizes (none said where the bucket could not be looked at)."""
    if seen.error:
        return {}
    out = {}
    for step in complete:
        there = seen.markers.get(step)
        here = markers.sizes(ckpt.step_dir(root, step))
        if there is None or {rel: size for rel, (size, _) in there.files.items()} != here:
            out[step] = NOT_IN_BUCKET
    return out


def show(job: Job, seen: Seen, bundles: list[Path]) -> None:
    """The bucket's lines of the report."""
    assert job.remote is not None
    last = job.remote.keep_last
    keeps = f"the last {last} (--keep_last_remote)" if last else "every checkpoint"
    print(f"  in the bucket {seen.url}: it keeps {keeps}")
    if seen.error:
        print(f"    not listed: {seen.error}")
        return
    steps = sorted(seen.listing.complete | seen.listing.folders)
    if not steps:
        print("    none there")
    kept = sorted(seen.listing.complete)[-last:] if last else sorted(seen.listing.complete)
    for step in steps:
        found = seen.markers.get(step)
        if found is not None:
            why = "; the newest complete" if step == seen.listing.newest else ""
            why += "" if step in kept else "; removed after the next upload"
            print(f"  {step:>9}  {human_bytes(found.bytes):>9}  complete    {found.engine}{why}")
        else:
            print(f"  {step:>9}  {'-':>9}  {'partial':<10}  no marker: an upload in progress, or one cut short (the "
                  "next upload finishes or removes it)")  # fmt: skip
    if seen.markers:
        total = sum(m.bytes for m in seen.markers.values())
        print(f"  in the bucket: {len(seen.markers)} complete step(s), {human_bytes(total)}")
    rows = [record.totals(b / P.REMOTE_RECORD) for b in bundles]
    done = [t for t in rows if t]
    if done:
        up, down = sum(t["uploaded"] for t in done), sum(t["downloaded"] for t in done)
        size, seconds = sum(t["uploaded_bytes"] for t in done), sum(t["upload_seconds"] for t in done)
        print(f"  uploaded by the run's jobs: {up} step(s), {human_bytes(size)} in {seconds:.1f} s; "
              f"{sum(t['removed'] for t in done)} removed from the bucket; {down} downloaded; "
              f"{sum(t['upload_failures'] for t in done)} failed upload pass(es)")  # fmt: skip
