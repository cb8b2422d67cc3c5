"""--checkpoints_remote and its flags as the job reads them (job.json's `remote`, in launcher/node/job.py's `Job`):
the run's folder in the bucket, the endpoint, the bucket's retention, the client's options. Never a credential: those
reach the job through its environment (AWS's own variables, credentials file and profiles), as they reach any S3
client. Standard library only (the supervisor's side)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

SCHEME = "s3://"
# A bucket name as S3 (and GCS's, R2's, Ceph's S3 interface) takes it: 3-63 lowercase letters, digits, dots, dashes.
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# A key prefix the launcher writes under: no empty part, no `.`/`..` part, printable, no backslash or glob character
# (s5cmd reads `*`, `?`, `[` as wildcards), no space (a key with one is legal, but every tool quotes it differently).
PREFIX_PART = re.compile(r"[A-Za-z0-9._=+,@-]+")


def split_url(url: str) -> tuple[str, str]:
    """`s3://BUCKET/PREFIX` -> (BUCKET, PREFIX without slashes at its ends); ValueError, in words, where it is not
    one the launcher writes under."""
    if not url.startswith(SCHEME):
        raise ValueError(f"{url!r} does not start with {SCHEME}")
    bucket, _, prefix = url[len(SCHEME) :].partition("/")
    prefix = prefix.strip("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"{bucket!r} is not a bucket name (3-63 lowercase letters, digits, '.' and '-')")
    for part in prefix.split("/") if prefix else []:
        if not PREFIX_PART.fullmatch(part) or part in (".", ".."):
            raise ValueError(f"the prefix part {part!r} is not one the launcher writes under (letters, digits and "
                             "._=+,@- only, no empty part)")  # fmt: skip
    return bucket, prefix


@dataclass(frozen=True)
class RemoteSettings:
    """Where the run's checkpoints are copied, and how."""

    url: str  # the run's folder in the bucket: --checkpoints_remote's s3://BUCKET/PREFIX/<checkpoints folder's name>
    endpoint: str = ""  # --s3_endpoint ("": S3_ENDPOINT_URL, else AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS's)
    keep_last: int | None = None  # --keep_last_remote: the N newest complete steps stay in the bucket (None: all)
    client: str = ""  # s5cmd ("": beside the job's Python, else on PATH; a --config's s3_upload.s5cmd_path)
    numworkers: int | None = None  # s5cmd's --numworkers (a --config's s3_upload.s5cmd_numworkers; None: s5cmd's)
    concurrency: int | None = None  # s5cmd cp's --concurrency, parts at once a file (s5cmd_concurrency; None: 5)

    @property
    def bucket(self) -> str:
        return split_url(self.url)[0]

    @property
    def prefix(self) -> str:
        """The run's folder in the bucket, as a key prefix without slashes at its ends."""
        return split_url(self.url)[1]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> RemoteSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        if unknown := set(data) - names:
            raise ValueError(f"unknown remote settings {', '.join(sorted(unknown))}")
        if "url" not in data:
            raise ValueError("the remote settings name no url")
        return cls(**dict(data))
