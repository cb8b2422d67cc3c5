"""The local S3 server (launcher/localcluster/s3.py: a one-node Ceph cluster behind radosgw), proved with the client
the job side will copy checkpoints with (s5cmd): bytes, multipart uploads of checkpoint-like keys, ranged reads,
listings across pages, deletes, and what a radosgw killed in the middle of an upload leaves (nothing visible), then
answers again. radosgw's own log (a line per request, with its status) shows what the client asked of it."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from s3_server import S3Server

from launcher.localcluster import s3
from launcher.localcluster.__main__ import main
from launcher.localcluster.s3_conf import S3Spec

MiB = 1 << 20


def _random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def _parts(folder: str, key: str) -> str:
    """A pattern for radosgw's log: an answered (200) upload of a part of `folder/key`."""
    return rf'"PUT /{folder}/{key}\?partNumber=\d+&uploadId=\S+ HTTP/1.1" 200 '


def test_round_trip_is_byte_for_byte(s3_server: S3Server, s3_folder: str, tmp_path: Path) -> None:
    data = _random_file(tmp_path / "shard.bin", 3 * MiB + 17)
    (tmp_path / "empty").write_bytes(b"")
    s3_server.s5cmd("cp", str(tmp_path / "shard.bin"), f"s3://{s3_folder}/step-1/shard.bin")
    s3_server.s5cmd("cp", str(tmp_path / "empty"), f"s3://{s3_folder}/step-1/empty")
    s3_server.s5cmd("cp", f"s3://{s3_folder}/step-1/*", str(tmp_path / "back") + "/")
    assert (tmp_path / "back/shard.bin").read_bytes() == data
    assert (tmp_path / "back/empty").read_bytes() == b""


def test_multipart_uploads_of_dotted_keys(s3_server: S3Server, s3_folder: str, tmp_path: Path) -> None:
    """The keys a checkpoint has (dots in the last part, and in a folder): uploaded in parts of 5 MiB, whole."""
    data = _random_file(tmp_path / "weights.safetensors", 12 * MiB + 1)
    keys = ["step-100/model/weights.safetensors", "step-100.v2/optimizer/optimizer.pt.0"]
    for key in keys:
        s3_server.s5cmd("cp", "--part-size", "5", "--concurrency", "2", str(tmp_path / "weights.safetensors"),
                        f"s3://{s3_folder}/{key}")  # fmt: skip
        assert len(s3_server.requests(_parts(s3_folder, key))) == 3
        listed = s3_server.s5cmd("ls", "--etag", f"s3://{s3_folder}/{key}").stdout.split()
        assert listed[-3].endswith("-3") and int(listed[-2]) == len(data), listed  # the multipart ETag: 3 parts
        s3_server.s5cmd("cp", f"s3://{s3_folder}/{key}", str(tmp_path / "back"))
        assert (tmp_path / "back").read_bytes() == data


def test_ranged_reads(s3_server: S3Server, s3_folder: str, tmp_path: Path) -> None:
    """A download in parts is ranged GETs (206, each its part's size) whose bytes make the object."""
    data = _random_file(tmp_path / "shard", 12 * MiB + 1)
    key = "step-7/model/shard.safetensors"
    s3_server.s5cmd("cp", str(tmp_path / "shard"), f"s3://{s3_folder}/{key}")  # one PUT: below s5cmd's 50 MiB parts
    s3_server.s5cmd("cp", "--part-size", "5", "--concurrency", "3", f"s3://{s3_folder}/{key}", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data
    ranged = s3_server.requests(rf'"GET /{s3_folder}/{key} HTTP/1.1" 206 ')
    sizes = sorted(int(line.split('HTTP/1.1" 206 ')[1].split()[0]) for line in ranged)
    assert sizes == [2 * MiB + 1, 5 * MiB, 5 * MiB]


def test_listings_by_prefix_and_across_pages(s3_server: S3Server, s3_folder: str, tmp_path: Path) -> None:
    """1,001 keys under one prefix (a page holds 1,000) are listed whole; a listing by delimiter shows the folders."""
    many = tmp_path / "many"
    many.mkdir()
    for k in range(1001):
        (many / f"f{k:04d}.txt").write_text(str(k))
    s3_server.s5cmd("cp", f"{many}/*", f"s3://{s3_folder}/step-2/many/")
    (tmp_path / "latest.txt").write_text("2")
    s3_server.s5cmd("cp", str(tmp_path / "latest.txt"), f"s3://{s3_folder}/latest.txt")
    s3_server.s5cmd("cp", str(tmp_path / "latest.txt"), f"s3://{s3_folder}/step-3/latest.txt")
    listed = s3_server.s5cmd("ls", f"s3://{s3_folder}/step-2/many/*").stdout.splitlines()
    assert sorted(line.split()[-1] for line in listed) == [f"f{k:04d}.txt" for k in range(1001)]
    bucket, folder = s3_folder.split("/")
    assert s3_server.requests(rf'"GET /{bucket}\?[^ ]*continuation-token=[^ ]*prefix={folder}%2Fstep-2%2Fmany%2F')
    top = s3_server.s5cmd("ls", f"s3://{s3_folder}/").stdout.splitlines()
    assert sorted(line.split()[-1] for line in top) == ["latest.txt", "step-2/", "step-3/"]
    assert [line.split()[0] for line in top if line.endswith("/")] == ["DIR", "DIR"]


def test_deletes(s3_server: S3Server, s3_folder: str, tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    for key in ("step-1/a", "step-1/model/b.safetensors", "step-2/a"):
        s3_server.s5cmd("cp", str(tmp_path / "a"), f"s3://{s3_folder}/{key}")
    s3_server.s5cmd("rm", f"s3://{s3_folder}/step-2/a")
    s3_server.s5cmd("rm", f"s3://{s3_folder}/step-1/*")
    gone = s3_server.s5cmd("ls", f"s3://{s3_folder}/*", check=False)
    assert gone.returncode != 0 and "no object found" in gone.stderr
    assert s3_server.s5cmd("cat", f"s3://{s3_folder}/step-2/a", check=False).returncode != 0


def _upload_cut_by_a_kill(server: S3Server, folder: str, source: Path, key: str, *flags: str) -> subprocess.Popen[str]:
    """s5cmd uploading `source` in parts of 5 MiB, one at a time; radosgw SIGKILLed once two parts are stored."""
    argv = server.command(*flags, "cp", "--part-size", "5", "--concurrency", "1", str(source), f"s3://{folder}/{key}")
    upload = subprocess.Popen(argv, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server.wait_for_requests(_parts(folder, key), 2)
    s3.kill_gateway(server.spec)
    return upload


def test_a_gateway_killed_in_a_multipart_upload_leaves_no_object(
    s3_server: S3Server, s3_folder: str, tmp_path: Path
) -> None:
    """radosgw SIGKILLed with two parts of ten stored: the upload fails, and once radosgw is started again no object
    (nor part of one) is visible under the key; what was stored before is whole; the same upload then succeeds."""
    kept = _random_file(tmp_path / "kept", 1 * MiB)
    s3_server.s5cmd("cp", str(tmp_path / "kept"), f"s3://{s3_folder}/step-1/kept")
    data = _random_file(tmp_path / "big", 50 * MiB)
    key = "step-2/model/weights.safetensors"
    upload = _upload_cut_by_a_kill(s3_server, s3_folder, tmp_path / "big", key, "--retry-count", "0")
    output, _ = upload.communicate(timeout=120)
    assert upload.returncode != 0, output
    s3.start_gateway(s3_server.spec)
    listed = s3_server.s5cmd("ls", f"s3://{s3_folder}/step-2/*", check=False)
    assert listed.returncode != 0 and "no object found" in listed.stderr, listed.stdout
    s3_server.s5cmd("cp", f"s3://{s3_folder}/step-1/kept", str(tmp_path / "kept-back"))
    assert (tmp_path / "kept-back").read_bytes() == kept
    s3_server.s5cmd("cp", str(tmp_path / "big"), f"s3://{s3_folder}/{key}")
    s3_server.s5cmd("cp", f"s3://{s3_folder}/{key}", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data


def test_the_client_retries_through_a_gateway_restart(s3_server: S3Server, s3_folder: str, tmp_path: Path) -> None:
    """With its own retries (s5cmd's default: 10), an upload cut by a radosgw restart of about a second ends whole."""
    data = _random_file(tmp_path / "big", 50 * MiB)
    key = "step-4/model/weights.safetensors"
    upload = _upload_cut_by_a_kill(s3_server, s3_folder, tmp_path / "big", key)
    s3.start_gateway(s3_server.spec)
    output, _ = upload.communicate(timeout=120)
    assert upload.returncode == 0, output
    s3_server.s5cmd("cp", f"s3://{s3_folder}/{key}", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data


def test_down_and_up_keep_what_was_stored(
    s3_server: S3Server, s3_folder: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`down` stops the three daemons; `up` starts them on the same ports and the objects are there (the OSD's store
    is on disk); the command line's `status` and `env` say so, and `env` prints no secret."""
    data = _random_file(tmp_path / "a", 2 * MiB)
    s3_server.s5cmd("cp", str(tmp_path / "a"), f"s3://{s3_folder}/step-1/a")
    s3.down(s3_server.spec)
    assert not s3.is_up(s3_server.spec)
    assert s3.up(S3Spec(s3_server.spec.dir)) == s3_server.spec
    s3_server.s5cmd("cp", f"s3://{s3_folder}/step-1/a", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data
    capsys.readouterr()
    assert main(["s3", "status", "--dir", str(s3_server.spec.dir)]) == 0
    assert main(["s3", "env", "--dir", str(s3_server.spec.dir)]) == 0
    out = capsys.readouterr().out
    assert "rgw  running" in out and f"S3_ENDPOINT_URL={s3_server.spec.endpoint}" in out
    assert s3_server.user.secret_key not in out


def test_a_new_server_passes_over_a_slot_whose_port_is_taken(tmp_path: Path) -> None:
    spec = S3Spec(tmp_path / "server")
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("", spec.gateway_port))
        held.listen()
        settled = s3.settle_ports(spec, made=False)
    assert settled.slot != spec.slot and spec.gateway_port not in settled.ports
