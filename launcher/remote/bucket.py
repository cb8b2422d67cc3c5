"""The run's folder in the bucket, and what is done to it (docs/checkpoints.md#in-a-bucket):

    s3://BUCKET/PREFIX/<run folder>/<step>/...              a step's files, as the checkpoints folder holds them
    s3://BUCKET/PREFIX/<run folder>/<step>.complete.json    its marker (launcher/remote/marker.py), written last

A step counts only where its marker is there: an upload writes every file, then the marker; a removal deletes the
marker first, then the files. One listing of the run's folder (one request, by delimiter) tells the complete steps
(markers) from the folders without one (an upload in progress, or cut). Every request is an s5cmd command through a
`Runner` (the supervisor's Effects, or `client.Local`). Standard library only."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.remote import marker as markers
from launcher.remote.client import SMALL_TIMEOUT_S, UPLOAD_RATE_FLOOR, Client, RemoteError, Runner, not_found, words
from launcher.remote.marker import Marker
from launcher.remote.settings import RemoteSettings


@dataclass(frozen=True)
class Listing:
    """The run's folder at one look: the complete steps (a marker each) and every step folder (complete or not)."""

    complete: frozenset[int] = frozenset()
    folders: frozenset[int] = frozenset()

    @property
    def newest(self) -> int | None:
        return max(self.complete, default=None)


def copy_timeout(size: int) -> float:
    """How long a copy of `size` bytes may take before it counts as stalled: 10 minutes, and as long again as it
    takes at UPLOAD_RATE_FLOOR."""
    return 600 + math.ceil(size / UPLOAD_RATE_FLOOR)


class Bucket:
    """One run's folder in the bucket, through the client."""

    def __init__(self, settings: RemoteSettings, client: Client, runner: Runner) -> None:
        self.settings, self.client, self.runner = settings, client, runner
        self.url = settings.url.rstrip("/")

    def step_url(self, step: int) -> str:
        return f"{self.url}/{step}/"

    def marker_url(self, step: int) -> str:
        return f"{self.url}/{step}{markers.SUFFIX}"

    def _run(self, *args: str, timeout: float = SMALL_TIMEOUT_S, json_out: bool = False,
             missing_ok: bool = False) -> str:  # fmt: skip
        proc = self.runner.s3(self.client.argv(*args, json=json_out), timeout)
        if proc.returncode == 0 or (missing_ok and not_found(proc)):
            return proc.stdout if proc.returncode == 0 else ""
        raise RemoteError(words(proc))

    def _listed(self, pattern: str) -> list[dict]:
        rows = []
        for line in self._run("ls", pattern, json_out=True, missing_ok=True).splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("key"), str):
                rows.append(row)
        return rows

    def listing(self) -> Listing:
        """The run's folder at one look (an empty one where it has nothing yet); RemoteError where it cannot be
        listed (the endpoint down, the bucket missing, the keys refused)."""
        complete, folders = set(), set()
        for row in self._listed(f"{self.url}/"):
            name = row["key"].rstrip("/").rsplit("/", 1)[-1]
            if row.get("type") == "directory" and name.isdigit():
                folders.add(int(name))
            elif name.endswith(markers.SUFFIX) and name.removesuffix(markers.SUFFIX).isdigit():
                complete.add(int(name.removesuffix(markers.SUFFIX)))
        return Listing(frozenset(complete), frozenset(folders))

    def marker(self, step: int) -> Marker | None:
        """The step's marker (None: none, or not one this launcher reads)."""
        return markers.parse(self._run("cat", self.marker_url(step), missing_ok=True) or "{}")

    def objects(self, step: int) -> dict[str, int]:
        """Every object under the step's folder: its path in the step -> its size."""
        base = self.step_url(step)
        return {row["key"][len(base) :]: int(row.get("size") or 0) for row in self._listed(base + "*")
                if row.get("type") != "directory" and row["key"].startswith(base)}  # fmt: skip

    def upload(self, step_dir: Path, step: int, size: int) -> None:
        """Every file of `step_dir` copied under the step's folder (whole objects: a cut copy leaves none half)."""
        self._run("cp", *self.client.copy_options(), f"{step_dir}/*", self.step_url(step), timeout=copy_timeout(size))

    def put_marker(self, found: Marker) -> None:
        self.put(self.marker_url(found.step), found.to_json())

    def put(self, url: str, text: str) -> None:
        """A small object written whole (from a temporary file: s5cmd 2.3's `pipe` says nothing of a failure)."""
        fd, name = tempfile.mkstemp(prefix="launcher-s3-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            self._run("cp", name, url)
        finally:
            os.unlink(name)

    def remove_marker(self, step: int) -> None:
        self._run("rm", self.marker_url(step), missing_ok=True)

    def remove_objects(self, step: int, paths: list[str]) -> None:
        """Objects of the step's folder, by their paths in it (one batch request per 1,000)."""
        base = self.step_url(step)
        for start in range(0, len(paths), 1000):
            self._run("rm", *(base + p for p in paths[start : start + 1000]), missing_ok=True)

    def remove_step(self, step: int) -> None:
        """The step gone: its marker first (it no longer counts), then its files."""
        self.remove_marker(step)
        self._run("rm", self.step_url(step) + "*", missing_ok=True)

    def download(self, step: int, into: Path, size: int) -> None:
        """The step's files into `into` (made), as its folder holds them."""
        into.mkdir(parents=True, exist_ok=True)
        self._run("cp", *self.client.copy_options(), self.step_url(step) + "*", f"{into}/", timeout=copy_timeout(size))
