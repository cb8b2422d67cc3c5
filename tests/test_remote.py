"""Checkpoints in a bucket, the job's side (launcher/remote/; docs/checkpoints.md#in-a-bucket), against the real local
S3 server (a one-node Ceph behind radosgw, tests/s3_server.py) with the real client (s5cmd), no Slurm: the uploader
copying every complete step and its marker last, byte for byte; a step found in the bucket already; another save of
a step uploaded again; what a cut upload leaves (objects without a marker, incomplete multipart uploads) removed; the
bucket's retention; local retention's `owed`; the resume from the bucket into an empty folder, and a damaged object
refused; the marker's own reading. The real job on the local cluster: tests/test_remote_slurm.py."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server

from launcher import checkpoint_layout as ckpt
from launcher import jsonl
from launcher import protocol as P
from launcher.localcluster import s3, s3_access
from launcher.node.job import Job, from_json
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.effects import Node
from launcher.node.supervisor.records import take_lock
from launcher.node.supervisor.state import Allocation, Notice
from launcher.remote import fetch, marker
from launcher.remote.bucket import Bucket
from launcher.remote.client import Client, run
from launcher.remote.multipart import Credentials, Multipart, signed
from launcher.remote.settings import RemoteSettings, split_url
from launcher.remote.upload import Uploads
from launcher.retention.rules import NOT_IN_BUCKET, Rules

MiB = 1 << 20


class World:
    """The uploader's effects in a test: the client really run (in the server's user's environment), lines kept."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.said = env, []

    def say(self, name: str, **fields: object) -> None:
        self.said.append((name, fields))

    def s3(self, argv, timeout):
        return run(argv, timeout, env=self.env)

    def jobs_alive(self, jobs):
        return dict.fromkeys(jobs, False)

    def names(self) -> list[str]:
        return [name for name, _ in self.said]


def torch_step(root: Path, step: int, size: int = 1000) -> Path:
    folder = root / str(step)
    folder.mkdir(parents=True)
    (folder / ckpt.TORCH_STATE).write_bytes(os.urandom(size))
    (folder / ckpt.TORCH_META).write_text(json.dumps({"step": step, "data_position": step}))
    return folder


def job_of(tmp_path: Path, url: str, keep_last: int | None = None) -> Job:
    settings = RemoteSettings(url, keep_last=keep_last)
    bundle = tmp_path / "bundle"
    bundle.mkdir(parents=True, exist_ok=True)
    return Job("r", bundle, tmp_path / "log.out", tmp_path / "ck", Path(os.sys.executable), Path("."),
               tmp_path / "train.py", tmp_path / "config.yaml", "torch", 1, 1, tmp_path, remote=settings)  # fmt: skip


def wait(uploads: Uploads) -> list[int]:
    return uploads.settle(lambda: True)


def listed(server: S3Server, url: str) -> dict[str, int]:
    rows = [json.loads(line) for line in server.s5cmd("--json", "ls", f"{url}/*").stdout.splitlines()]
    return {r["key"][len(url) + 1 :]: r["size"] for r in rows}


def bytes_of(server: S3Server, url: str, tmp: Path) -> dict[str, bytes]:
    server.s5cmd("cp", f"{url}/*", f"{tmp}/")
    return {p.relative_to(tmp).as_posix(): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}


@pytest.fixture
def world(s3_server: S3Server) -> Iterator[World]:
    yield World(s3_server.env)


def test_every_complete_step_is_uploaded_byte_for_byte_its_marker_last(
    s3_server: S3Server, s3_folder: str, world: World, tmp_path: Path
) -> None:
    job = job_of(tmp_path, f"s3://{s3_folder}/r")
    for step in (10, 20):
        torch_step(job.checkpoints, step, 3 * MiB + step)
    (job.checkpoints / "30").mkdir()  # a save in progress: not uploaded
    (job.checkpoints / "30" / ckpt.TORCH_STATE).write_bytes(b"half")
    uploads = Uploads(job, "7", world, s3_server.env)
    assert uploads.owed(ckpt.look(job.checkpoints)) == {10: NOT_IN_BUCKET, 20: NOT_IN_BUCKET}
    assert wait(uploads) == []
    assert uploads.owed(ckpt.look(job.checkpoints)) == {}
    back = bytes_of(s3_server, f"s3://{s3_folder}/r", tmp_path / "back")
    here = {p.relative_to(job.checkpoints).as_posix(): p.read_bytes()
            for s in (10, 20) for p in sorted((job.checkpoints / str(s)).iterdir())}  # fmt: skip
    assert {k: v for k, v in back.items() if not k.endswith(marker.SUFFIX)} == here
    for step in (10, 20):
        found = marker.parse(back[f"{step}{marker.SUFFIX}"].decode())
        assert found is not None and found.files == marker.describe(job.checkpoints / str(step))
        assert found.engine == "torch" and found.extra["job"] == "7"
        puts = s3_server.requests(rf'"PUT /{s3_folder}/r/{step}[/.]')
        assert puts[-1].split('"PUT ')[1].startswith(f"/{s3_folder}/r/{step}{marker.SUFFIX}")  # the marker last
    rows = jsonl.read(job.file(P.REMOTE_RECORD))
    assert [(r["event"], r["step"]) for r in rows] == [("uploaded", 10), ("uploaded", 20)]
    assert rows[0]["bytes"] == ckpt.size_of(job.checkpoints / "10") and rows[0]["seconds"] > 0
    assert world.names() == ["uploaded", "uploaded"]
    assert all(P.pattern("uploaded").match(P.line(n, None, **f)) for n, f in world.said)

    again = Uploads(job, "8", world, s3_server.env)  # the next job: found there, nothing copied again
    assert wait(again) == [] and len(jsonl.read(job.file(P.REMOTE_RECORD))) == 2

    (job.checkpoints / "20" / ckpt.TORCH_META).write_text('{"step": 20, "data_position": 21}')  # another save of 20
    third = Uploads(job, "9", world, s3_server.env)
    assert wait(third) == []
    assert (
        bytes_of(s3_server, f"s3://{s3_folder}/r/20", tmp_path / "b3")["meta.json"]
        == b'{"step": 20, "data_position": 21}'
    )
    assert [r["step"] for r in jsonl.read(job.file(P.REMOTE_RECORD))] == [10, 20, 20]


def _cut_upload(server: S3Server, source: Path, url: str) -> None:
    """A multipart upload of `source` (parts of 5 MiB, one at a time) cut by a SIGKILL of radosgw once two parts are
    stored (it can no longer complete), radosgw then started again: an incomplete upload, no object."""
    argv = server.command("--retry-count", "0", "cp", "--part-size", "5", "--concurrency", "1", str(source), url)
    proc = subprocess.Popen(argv, env=server.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bucket, key = split_url(url)
    server.wait_for_requests(rf'"PUT /{bucket}/{key}\?partNumber=\d+&uploadId=\S+ HTTP/1.1" 200 ', 2)
    s3.kill_gateway(server.spec)
    proc.wait(timeout=120)
    s3.start_gateway(server.spec)


def test_what_cut_uploads_leave_is_finished_or_removed(
    s3_server: S3Server, s3_folder: str, world: World, tmp_path: Path
) -> None:
    """A step cut in the middle of its upload (one object whole, one a multipart upload cut: no marker) is uploaded
    again whole; a folder without a marker of a step no longer on disk, and an incomplete upload under another
    step, are removed; no incomplete multipart upload is left."""
    url = f"s3://{s3_folder}/r"
    job = job_of(tmp_path, url)
    torch_step(job.checkpoints, 10, 3 * MiB)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(200 * MiB))
    s3_server.s5cmd("cp", str(job.checkpoints / "10" / ckpt.TORCH_META), f"{url}/10/meta.json")
    _cut_upload(s3_server, big, f"{url}/10/state.pt")
    s3_server.s5cmd("cp", str(job.checkpoints / "10" / ckpt.TORCH_META), f"{url}/5/meta.json")  # not on disk
    _cut_upload(s3_server, big, f"{url}/7/state.pt")
    big.unlink()
    multipart = Multipart(s3_server.spec.endpoint, s3_server.bucket, s3_server.env)
    assert len(multipart.uploads(split_url(url)[1] + "/")) == 2
    uploads = Uploads(job, "7", world, s3_server.env)
    assert wait(uploads) == [] and "upload_failed" not in world.names()
    there = listed(s3_server, url)
    meta = (job.checkpoints / "10" / ckpt.TORCH_META).stat().st_size
    assert there == {"10/meta.json": meta, "10/state.pt": 3 * MiB, f"10{marker.SUFFIX}": there[f"10{marker.SUFFIX}"]}
    assert multipart.uploads(split_url(url)[1] + "/") == []


def test_the_buckets_retention_and_owed(s3_server: S3Server, s3_folder: str, world: World, tmp_path: Path) -> None:
    """--keep_last_remote 2: the two newest stay in the bucket; an older step on disk is not uploaded (the rule
    would remove it at once) and is owed no more; a step a reader leases stays."""
    url = f"s3://{s3_folder}/r"
    job = job_of(tmp_path, url, keep_last=2)
    for step in (10, 20, 30):
        torch_step(job.checkpoints, step)
    uploads = Uploads(job, "7", world, s3_server.env)
    assert wait(uploads) == []
    assert [r["step"] for r in jsonl.read(job.file(P.REMOTE_RECORD))] == [20, 30]  # 10: never uploaded
    assert uploads.owed(ckpt.look(job.checkpoints)) == {}
    torch_step(job.checkpoints, 40)
    with ckpt.leased(job.checkpoints, 20, "export"):  # (a process of this host: it holds while this one runs)
        uploads = Uploads(job, "8", world, s3_server.env)
        assert wait(uploads) == []
        assert {k.split("/")[0].removesuffix(marker.SUFFIX) for k in listed(s3_server, url)} == {"20", "30", "40"}
    uploads = Uploads(job, "9", world, s3_server.env)
    assert wait(uploads) == []
    assert {k.split("/")[0].removesuffix(marker.SUFFIX) for k in listed(s3_server, url)} == {"30", "40"}
    assert ("remote_purged", {"steps": "20", "url": url, "kept": "30, 40", "last": 2}) in world.said


def test_a_resume_from_the_bucket_puts_the_step_in_place(
    s3_server: S3Server, s3_folder: str, world: World, tmp_path: Path
) -> None:
    """An empty folder (a wiped scratch) gets the bucket's newest complete step, whole, with its engine's pointer and
    records; a folder with a newer step gets nothing; a damaged object is refused and nothing is put in place."""
    url = f"s3://{s3_folder}/r"
    first = job_of(tmp_path / "a", url)
    for step in (10, 20):
        torch_step(first.checkpoints, step, 2 * MiB)
    assert wait(Uploads(first, "7", world, s3_server.env)) == []

    second = job_of(tmp_path / "b", url)
    bucket = Uploads(second, "8", world, s3_server.env).bucket
    listing = fetch.resume(second.checkpoints, bucket, second.file(P.REMOTE_RECORD), "8", world.say)
    assert listing is not None and listing.newest == 20
    assert set(ckpt.complete_steps(second.checkpoints)) == {20} and ckpt.pointer_step(second.checkpoints) == 20
    assert marker.describe(second.checkpoints / "20") == marker.describe(first.checkpoints / "20")
    assert (second.checkpoints / ckpt.ENGINE_RECORD).read_text() == "torch\n" and 20 in ckpt.saves(second.checkpoints)
    assert [r["event"] for r in jsonl.read(second.file(P.REMOTE_RECORD))] == ["downloaded"]
    assert world.said[-1][0] == "remote_resumed" and world.said[-1][1]["local"] == "no complete step"
    assert not list(second.checkpoints.glob(f"{P.DOWNLOADING}*"))

    fetch.resume(first.checkpoints, bucket, first.file(P.REMOTE_RECORD), "7", world.say)  # 20 on disk: nothing
    assert "downloaded" not in [r["event"] for r in jsonl.read(first.file(P.REMOTE_RECORD))]

    (tmp_path / "other").write_bytes(os.urandom(2 * MiB))  # the same size, other bytes
    s3_server.s5cmd("cp", str(tmp_path / "other"), f"{url}/20/state.pt")
    third = job_of(tmp_path / "c", url)
    fetch.resume(third.checkpoints, bucket, third.file(P.REMOTE_RECORD), "9", world.say)
    name, fields = world.said[-1]
    assert name == "remote_resume_failed" and "state.pt's crc32 is" in str(fields["why"]), world.said[-1]
    assert ckpt.complete_steps(third.checkpoints) == {} and not list(third.checkpoints.glob(f"{P.DOWNLOADING}*"))


def test_a_gateway_down_is_a_failed_pass_tried_again(
    s3_server: S3Server, s3_folder: str, world: World, tmp_path: Path
) -> None:
    """radosgw killed: the pass fails in words and the step stays owed; started again, the next pass uploads it."""
    job = job_of(tmp_path, f"s3://{s3_folder}/r")
    torch_step(job.checkpoints, 10)
    s3.kill_gateway(s3_server.spec)
    uploads = Uploads(job, "7", world, s3_server.env)
    uploads.bucket = Bucket(uploads.bucket.settings, Client(uploads.bucket.client.path, s3_server.spec.endpoint,
                                                            retries=0), world)  # fmt: skip
    assert wait(uploads) == [10] and world.names() == ["upload_failed"]
    assert "connection refused" in str(world.said[0][1]["why"]) and uploads.owed(ckpt.look(job.checkpoints))
    s3.start_gateway(s3_server.spec)
    uploads = Uploads(job, "8", world, s3_server.env)
    assert wait(uploads) == [] and world.names()[-1] == "uploaded"


def test_the_marker_and_the_signature() -> None:
    files = {"a": (3, "00000001"), "model/b": (5, "00000002")}
    found = marker.Marker(20, "nanotron", files, "main", {"job": "7"})
    assert marker.parse(found.to_json()) == found and found.bytes == 8
    assert marker.parse("{}") is None and marker.parse("not json") is None
    assert marker.mismatches(files, {"a": (3, "00000001")}) == "model/b missing"
    assert marker.mismatches(files, {**files, "a": (4, "00000001")}) == "a has 4 bytes, not 3"
    # AWS's own examples of Signature Version 4 (its documentation's "GET Bucket Lifecycle" and "Get Bucket (List
    # Objects)", header-based): the same signatures
    creds = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    when = datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)
    for query, signature in (({"lifecycle": ""}, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
                             ({"max-keys": "2", "prefix": "J"},
                              "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")):  # fmt: skip
        request = signed("GET", "https://examplebucket.s3.amazonaws.com/", query, creds, "us-east-1", when)
        assert request.get_header("Authorization").endswith(f"Signature={signature}")


def test_the_attempts_end_waits_for_the_uploads_unless_slurm_ends_the_job(
    s3_server: S3Server, s3_folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's end of an attempt (its real Attempt and Node effects): after a SIGTERM (Slurm's end of the job)
    nothing is uploaded and what is left is said; otherwise it waits for every upload, then purges what --keep_last 1
    no longer keeps now that it is in the bucket."""
    for name, value in s3_access.client_env(s3_server.spec, s3_server.user).items():
        monkeypatch.setenv(name, value)  # (the job's environment: the supervisor's client inherits it)
    url = f"s3://{s3_folder}/r"
    job = dataclasses.replace(job_of(tmp_path, url), retention=Rules(keep_last=1))
    for step in (10, 20):
        torch_step(job.checkpoints, step)
        ckpt.note_save(job.checkpoints, step)
    assert take_lock(job.checkpoints, "48", lambda holder: "") is None

    def attempt() -> tuple[Attempt, io.StringIO]:
        out = io.StringIO()
        return Attempt(from_json(job.to_json()), Allocation("48", 1, "node1", "node1"), Node(out=out)), out

    ended, out = attempt()
    ended.state.notice = Notice.TERMINATED
    ended.settle_uploads()
    assert "not in the bucket yet: steps 10, 20 (on disk" in out.getvalue() and "waiting" not in out.getvalue()
    assert bucket_listing(s3_server, url).complete == frozenset() and set(ckpt.complete_steps(job.checkpoints)) == {
        10, 20}  # fmt: skip

    finished, out = attempt()
    finished.settle_uploads()
    said = out.getvalue()
    assert "waiting for steps 10, 20 to be in the bucket before the job ends" in said, said
    assert "step 20 is in the bucket" in said and "retention removed step(s) 10 " in said
    assert bucket_listing(s3_server, url).complete == {10, 20} and set(ckpt.complete_steps(job.checkpoints)) == {20}


def bucket_listing(server: S3Server, url: str):
    return Bucket(RemoteSettings(url), Client(s3_access.s5cmd(), server.spec.endpoint), World(server.env)).listing()
