"""The supervisor's copies of the run's checkpoints to the bucket (--checkpoints_remote: docs/checkpoints.md).

A worker thread of its own, fed by the after-checkpoint follower (`on_checkpoint`, which only wakes it): a long
upload never holds the eval submissions, retention's purge, the supervisor's polls or a training step, and no
training rank ever uploads. Each pass lists the run's folder in the bucket (one request), then takes the complete
steps on disk that are not there yet, oldest first:

1. the step's files described: each size and CRC-32 (launcher/remote/marker.py), and made durable on disk;
2. the incomplete multipart uploads an earlier, cut upload of the step left, aborted (launcher/remote/multipart.py);
   a marker of another save of the step, removed first (the step does not count while it is replaced);
3. every file copied (s5cmd, a child process: it retries each request through a gateway restart);
4. the objects checked against the files (each path and size: a file the copy missed is no checkpoint), those of
   an earlier upload the step no longer has removed, the files checked unchanged since step 1;
5. the marker, last. The upload's line in the bundle's record (bytes, seconds) and in the job's log.

A step whose marker in the bucket names its files as they are on disk (sizes and checksums) is there already (an
upload by an earlier job, a step downloaded from the bucket). Then what cut uploads left is removed (folders without
a marker of steps not on disk, and every incomplete multipart upload), and the bucket's retention (--keep_last_remote)
removes the oldest complete steps, never the newest and never one a reader holds (its lease in the checkpoints
folder). A step the bucket's rule would remove at once is not uploaded.

A failure (the endpoint down, a key refused, the client missing) is said and tried again after a back-off; it never
ends the attempt. Until a step is in the bucket (or the bucket's rule does not want it), local retention keeps it
(`owed`: "not yet in the bucket"). As the attempt ends, the supervisor waits for the pending uploads (`settle`),
unless Slurm is ending the job; what is left, the next job of the run uploads. Standard library only."""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.node.job import Job
from launcher.remote import marker as markers
from launcher.remote import record
from launcher.remote.bucket import Bucket, Listing
from launcher.remote.client import CLIENT, Client, RemoteError, Runner, find
from launcher.remote.multipart import Multipart, MultipartError
from launcher.retention.purge import gigabytes, make_durable, readers
from launcher.retention.rules import NOT_IN_BUCKET

RETRY_S = (30, 60, 120, 300)  # the back-off after a failed pass: the first, second, ... and every later one


class World(Runner, Protocol):
    """What the uploader does beyond the folder (the supervisor's Effects have it)."""

    def say(self, name: str, **fields: object) -> None: ...
    def jobs_alive(self, jobs: Iterable[str]) -> Mapping[str, bool | None]: ...


def signature(step_dir: Path) -> tuple:
    """What changes when a step's files do (each path, size, modification time, inode): a stat a file."""
    out = []
    for rel in sorted(markers.sizes(step_dir)):
        st = (step_dir / rel).stat()
        out.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def rate(size: int, seconds: float) -> str:
    return f"{size / max(seconds, 1e-6) / 1e6:.0f} MB/s"


class Uploads:
    """The run's uploader: `on_checkpoint` (the follower), `owed` (local retention's), `settle` (the attempt's end)."""

    def __init__(self, job: Job, slurm_job: str, world: World, env: Mapping[str, str] = os.environ,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        assert job.remote is not None, "only with --checkpoints_remote"
        settings = job.remote
        self.job, self.slurm_job, self.world, self.clock = job, slurm_job, world, clock
        self.bucket = Bucket(settings, Client.of(settings, find(job.python, settings.client) or CLIENT, env), world)
        self.multipart = Multipart(self.bucket.client.endpoint, settings.bucket, env)
        self.root, self.record = job.checkpoints, job.file(P.REMOTE_RECORD)
        self.cv = threading.Condition()
        self.settled: set[int] = set()  # steps in the bucket as they are on disk, or that its rule does not want
        self.described: dict[int, tuple[tuple, markers.Files]] = {}  # step -> (signature, files) of its last look
        self.asked = self.passed = 0  # passes asked for, passes ended (by the number asked when each began)
        self.failures, self.retry_at, self.failing = 0, 0.0, False
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.said_unaborted = False

    # -- the supervisor's side
    def on_checkpoint(self) -> None:
        """A pass asked for (the worker started at the first): never waits."""
        with self.cv:
            self.asked += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True, name="uploads")
                self.thread.start()
            self.cv.notify_all()

    def owed(self, folder: ckpt.Folder) -> dict[int, str]:
        """Local retention's: each complete step on disk that is not in the bucket yet."""
        with self.cv:
            settled = set(self.settled)
        return {step: NOT_IN_BUCKET for step in folder.complete if step not in settled}

    def pending(self) -> list[int]:
        with self.cv:
            return sorted(set(ckpt.complete_steps(self.root)) - self.settled)

    def settle(self, keep_waiting: Callable[[], bool]) -> list[int]:
        """One more pass, waited for while `keep_waiting()` says so (the supervisor handles its notices there); the
        steps still not in the bucket after it (a failed pass is not tried again here). The worker then stops."""
        self.on_checkpoint()
        with self.cv:
            wanted, self.retry_at = self.asked, 0.0
            self.cv.notify_all()
        while keep_waiting():
            with self.cv:
                if self.passed >= wanted:
                    break
                self.cv.wait(0.2)
        return self.stop()

    def stop(self) -> list[int]:
        """No pass after the one in flight (the process is ending); the steps not in the bucket yet."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        return self.pending()

    # -- the worker
    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.stopping and not self._due():
                    self.cv.wait(max(self.retry_at - self.clock(), 0.05) if self.retry_at else None)
                if self.stopping:
                    return
                target = self.asked
            ok = self._safely(self._pass)
            with self.cv:
                self.passed = target
                if ok:
                    self.failures, self.retry_at, self.failing = 0, 0.0, False
                else:
                    self.retry_at = self.clock() + RETRY_S[min(self.failures, len(RETRY_S) - 1)]
                    self.failures, self.failing = self.failures + 1, True
                self.cv.notify_all()

    def _due(self) -> bool:
        if self.retry_at and self.clock() < self.retry_at:
            return False
        return self.asked > self.passed or self.failing

    def _safely(self, work: Callable[[], None]) -> bool:
        """`work`, its failure said (never raised: training goes on)."""
        retry = RETRY_S[min(self.failures, len(RETRY_S) - 1)]
        try:
            work()
            return True
        except RemoteError as e:
            step, why = e.args if len(e.args) == 2 else ("-", str(e))
            self.world.say("upload_failed", step=step, why=why, retry=retry)
            record.append(self.record, "upload_failed", self.slurm_job, step=step, why=why)
        except Exception as e:  # noqa: BLE001  a bug here must not end training: its traceback, and the line
            traceback.print_exc()
            self.world.say("upload_failed", step="-", why=f"{type(e).__name__}: {e}".splitlines()[0], retry=retry)
        return False

    def _pass(self) -> None:
        local = ckpt.complete_steps(self.root)
        try:
            listing = self.bucket.listing()
        except RemoteError as e:  # (said for the steps it holds up)
            raise RemoteError(",".join(map(str, sorted(set(local) - self.settled))) or "-", str(e)) from None
        wanted = self._wanted(listing, local)
        for step in sorted(set(local) - self.settled):
            with self.cv:
                if self.stopping:
                    return
            if step not in wanted:
                with self.cv:
                    self.settled.add(step)  # the bucket's rule would remove it at once: never uploaded
                continue
            try:
                self._one(step, local[step], listing)
            except RemoteError as e:
                raise RemoteError(step, str(e)) from None
            except FileNotFoundError:
                continue  # gone from disk meanwhile (not by retention, which keeps it: by hand)
            listing = Listing(listing.complete | {step}, listing.folders | {step})
        self._leftovers(listing, set(local))
        self._retention(listing)

    def _wanted(self, listing: Listing, local: Mapping[int, str]) -> set[int]:
        """The steps the bucket's rule keeps among those there and those on disk (all, without a rule)."""
        every = sorted(set(listing.complete) | set(local))
        last = self.job.remote.keep_last if self.job.remote else None
        return set(every if last is None else every[-last:])

    def _describe(self, step_dir: Path, step: int) -> tuple[tuple, markers.Files]:
        """The step's files with their checksums, read again only where a file changed since the last look."""
        sig = signature(step_dir)
        known = self.described.get(step)
        if known is None or known[0] != sig:
            files = markers.describe(step_dir)
            known = (signature(step_dir), files)
            if known[0] != sig:
                raise RemoteError(f"step {step} changed as it was read: it is read again at the next pass")
            self.described[step] = known
        return known

    def _one(self, step: int, engine: str, listing: Listing) -> None:
        step_dir = ckpt.step_dir(self.root, step)
        sig, files = self._describe(step_dir, step)
        there = self.bucket.marker(step) if step in listing.complete else None
        if there is not None and there.files == files:
            with self.cv:
                self.settled.add(step)  # uploaded by an earlier job, or downloaded from the bucket
            return
        started = time.monotonic()
        make_durable(step_dir)  # (cheap where the engine fsynced its files)
        self._abort(f"{self.bucket.settings.prefix}/{step}/")
        if step in listing.complete:
            self.bucket.remove_marker(step)  # another save of the step: it does not count while it is replaced
        size = sum(s for s, _ in files.values())
        self.bucket.upload(step_dir, step, size)
        objects = self.bucket.objects(step)
        stray = sorted(set(objects) - set(files))
        if stray:
            self.bucket.remove_objects(step, stray)
        wrong = markers.mismatches({r: (s, "") for r, (s, _) in files.items()},
                                   {r: (objects[r], "") for r in objects if r in files})  # fmt: skip
        if wrong:
            raise RemoteError(f"the bucket does not hold step {step} as the disk does after the copy ({wrong})")
        if signature(step_dir) != sig:
            raise RemoteError(f"step {step} changed on disk as it was uploaded: it is uploaded again")
        dialect = (self.root / P.DIALECT_RECORD).read_text(encoding="utf-8").strip() if engine == "nanotron" and (
            self.root / P.DIALECT_RECORD).is_file() else ""  # fmt: skip
        self.bucket.put_marker(markers.Marker(step, engine, files, dialect, {
            "run": self.job.run_name, "job": self.slurm_job, "uploaded": round(time.time(), 3)}))  # fmt: skip
        seconds = time.monotonic() - started
        with self.cv:
            self.settled.add(step)
        record.append(self.record, "uploaded", self.slurm_job, step=step, bytes=size, seconds=round(seconds, 3),
                      files=len(files))  # fmt: skip
        self.world.say("uploaded", step=step, size=gigabytes(size), seconds=f"{seconds:.1f}", rate=rate(size, seconds),
                       url=self.bucket.step_url(step))  # fmt: skip

    def _abort(self, prefix: str) -> None:
        """The incomplete multipart uploads under `prefix`, aborted; where that cannot be, said once (not a failure:
        the upload goes on)."""
        why = "no access key in the environment or the credentials file (an instance role, SSO)"
        try:
            if self.multipart.creds is not None:
                self.multipart.abort(prefix)
                return
        except MultipartError as e:
            why = str(e)
        if not self.said_unaborted:
            self.said_unaborted = True
            self.world.say("uploads_not_aborted", url=self.bucket.url, why=why)

    def _leftovers(self, listing: Listing, local: set[int]) -> None:
        """What cut uploads left: folders without a marker of steps not complete on disk, and every incomplete
        multipart upload of the run's folder (the worker is the run's one writer, and between uploads here)."""
        for step in sorted(listing.folders - listing.complete - local):
            self.bucket.remove_step(step)
        self._abort(f"{self.bucket.settings.prefix}/")

    def _retention(self, listing: Listing) -> None:
        last = self.job.remote.keep_last if self.job.remote else None
        if last is None or len(listing.complete) <= last:
            return
        held = readers(ckpt.look(self.root), self.world.jobs_alive, drop_stale=False)
        complete = sorted(listing.complete)
        gone = [step for step in complete[:-last] if step not in held]
        for step in gone:
            there = self.bucket.marker(step)
            self.bucket.remove_step(step)
            record.append(self.record, "removed", self.slurm_job, step=step, bytes=there.bytes if there else 0,
                          why=f"not among the last {last} (--keep_last_remote)")  # fmt: skip
        if gone:
            kept = [s for s in complete if s not in gone]
            self.world.say("remote_purged", steps=", ".join(map(str, gone)), url=self.bucket.url,
                           kept=", ".join(map(str, kept)), last=last)  # fmt: skip
