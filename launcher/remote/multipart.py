"""Incomplete multipart uploads, listed and aborted (S3's ListMultipartUploads and AbortMultipartUpload). An upload
cut by a kill, a preemption or a network fault leaves its parts on the server, unseen by any listing of objects and
billed until aborted; s5cmd has no command for either call, and the job's supervisor imports only the standard
library, so the two requests are made here, signed with AWS's Signature Version 4 (the one every S3 interface
answers: AWS, GCS's XML API, R2, Ceph's radosgw). A bucket lifecycle rule (AbortIncompleteMultipartUpload) does the
same on the server's side, days later; docs/checkpoints.md says how.

The credentials are found as s5cmd finds them (AWS's order, its common part): AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), else the profile (AWS_PROFILE, else `default`) of the shared credentials
file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials). Where they come from elsewhere (an instance role, SSO),
nothing is aborted and the caller says so. Standard library only."""

from __future__ import annotations

import configparser
import datetime
import hashlib
import hmac
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

TIMEOUT_S = 30
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class MultipartError(Exception):
    """A request that failed: the server's code and message, or the connection's error (never a credential)."""


@dataclass(frozen=True)
class Credentials:
    key: str
    secret: str = field(repr=False)
    token: str = field(default="", repr=False)


def _profile_file(env: Mapping[str, str], variable: str, default: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(os.path.expanduser(env.get(variable) or default))
    return parser


def credentials(env: Mapping[str, str]) -> Credentials | None:
    """The keys the environment gives (its variables, else the credentials file's profile); None where neither."""
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN", ""))
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    try:
        section = _profile_file(env, "AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")[profile]
    except (KeyError, configparser.Error):
        return None
    key, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
    return Credentials(key, secret, section.get("aws_session_token", "")) if key and secret else None


def region(env: Mapping[str, str]) -> str:
    """AWS_REGION, AWS_DEFAULT_REGION, the config file's profile's, else us-east-1 (S3-compatible servers take any)."""
    if env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"):
        return env.get("AWS_REGION") or env["AWS_DEFAULT_REGION"]
    profile = env.get("AWS_PROFILE") or "default"
    try:
        config = _profile_file(env, "AWS_CONFIG_FILE", "~/.aws/config")
        section = config["default" if profile == "default" else f"profile {profile}"]
        return section.get("region") or "us-east-1"
    except (KeyError, configparser.Error):
        return "us-east-1"


def _url(endpoint: str, bucket: str, key: str, area: str) -> str:
    """Path-style on a given endpoint (every S3-compatible server takes it); AWS's own: its virtual-hosted form."""
    path = urllib.parse.quote(key, safe="/~-_.")
    if endpoint:
        return f"{endpoint.rstrip('/')}/{bucket}/{path}"
    return f"https://{bucket}.s3.{area}.amazonaws.com/{path}"


def signed(method: str, url: str, query: Mapping[str, str], creds: Credentials, area: str,
           now: datetime.datetime | None = None) -> urllib.request.Request:  # fmt: skip
    """A request signed with Signature Version 4 (no body: these calls have none)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    parts = urllib.parse.urlsplit(url)
    quoted = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                      for k, v in sorted(query.items()))  # fmt: skip
    headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
    if creds.token:
        headers["x-amz-security-token"] = creds.token
    names = ";".join(sorted(headers))
    canonical = "\n".join([method, parts.path or "/", quoted, "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                           names, EMPTY_SHA256])  # fmt: skip
    scope = f"{day}/{area}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds.secret).encode()
    for part in (day, area, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = f"AWS4-HMAC-SHA256 Credential={creds.key}/{scope}, SignedHeaders={names}, " + (
        f"Signature={signature}"
    )
    del headers["host"]
    return urllib.request.Request(f"{url}?{quoted}" if quoted else url, method=method, headers=headers)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


class Multipart:
    """A bucket's incomplete multipart uploads, by prefix."""

    def __init__(self, endpoint: str, bucket: str, env: Mapping[str, str]) -> None:
        self.endpoint, self.bucket, self.creds, self.area = endpoint, bucket, credentials(env), region(env)
        bundle = env.get("AWS_CA_BUNDLE")
        self.tls = ssl.create_default_context(cafile=bundle) if bundle and Path(bundle).is_file() else None

    def _send(self, method: str, key: str, query: Mapping[str, str]) -> bytes:
        assert self.creds is not None
        for _ in range(2):  # AWS answers a request to the wrong region with the bucket's: asked again there
            request = signed(method, _url(self.endpoint, self.bucket, key, self.area), query, self.creds, self.area)
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.tls) as answer:
                    return answer.read()
            except urllib.error.HTTPError as e:
                moved = e.headers.get("x-amz-bucket-region")
                if moved and moved != self.area:
                    self.area = moved
                    continue
                body = e.read().decode("utf-8", "replace")
                code = next((el.text for el in _elements(body) if _local(el.tag) == "Code"), "")
                raise MultipartError(f"{method} {e.code} {code or e.reason}") from None
            except (urllib.error.URLError, OSError) as e:
                raise MultipartError(f"{method}: {getattr(e, 'reason', e)}") from None
        raise MultipartError(f"{method}: redirected between regions")

    def uploads(self, prefix: str) -> list[tuple[str, str]]:
        """Every incomplete upload under `prefix`: (key, upload id), page by page."""
        found: list[tuple[str, str]] = []
        marker: dict[str, str] = {}
        while True:
            body = self._send("GET", "", {"uploads": "", "prefix": prefix, **marker})
            root = ET.fromstring(body)
            for upload in (el for el in root if _local(el.tag) == "Upload"):
                fields = {_local(el.tag): el.text or "" for el in upload}
                found.append((fields.get("Key", ""), fields.get("UploadId", "")))
            fields = {_local(el.tag): el.text or "" for el in root}
            if fields.get("IsTruncated") != "true":
                return found
            marker = {"key-marker": fields.get("NextKeyMarker", ""),
                      "upload-id-marker": fields.get("NextUploadIdMarker", "")}  # fmt: skip

    def abort(self, prefix: str) -> int:
        """Every incomplete upload under `prefix` aborted (its parts freed): how many; MultipartError where the server
        cannot be asked, None-free: without credentials it is the caller's to say (`self.creds`)."""
        if self.creds is None:
            return 0
        count = 0
        for key, upload in self.uploads(prefix):
            self._send("DELETE", key, {"uploadId": upload})
            count += 1
        return count


def _elements(body: str) -> list[ET.Element]:
    try:
        return list(ET.fromstring(body).iter())
    except ET.ParseError:
        return []
