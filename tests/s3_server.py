"""The session's S3 server: a real one on this machine (launcher/localcluster/s3.py: a one-node Ceph cluster behind
radosgw), started at its first use, one per pytest-xdist worker (`.s3`, `.s3-gw0`...), made anew each session and
stopped at its end. Loaded as a plugin by conftest.py (`pytest_plugins`), with the hook that marks the tests using it
`s3`.

One per worker, not one shared by all: the fault tests kill its radosgw, which would cut another worker's transfers
in the middle; and it is made anew (about 5 s) so that no bucket or upload of an earlier session is seen. Each test
gets a folder of its own (`s3_folder`) in the session's bucket, not a bucket: a bucket made within 30 s of a radosgw
kill waits that long (the new radosgw's cache notice waits for the killed one's watch to time out), an object not.
Outside CI, the tests that need it skip with the reason where it cannot be had (not root, the root filesystem cannot
be built, s5cmd missing); under CI=true they fail instead. The root filesystem is built the first time
(scripts/s3_root.sh, one to three minutes), then cached for every checkout.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.localcluster import s3, s3_access
from launcher.localcluster.s3_conf import S3Spec, default_dir

IN_CI = os.environ.get("CI") == "true"
S5CMD_TIMEOUT_S = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the session's S3 server is marked `s3` (`-m s3`)."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)


@dataclass(frozen=True)
class S3Server:
    """The running server, its user (whose keys the client's environment carries), and how to reach it."""

    spec: S3Spec
    user: s3_access.S3User
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with the client's variables (the secret key among them: never print it)."""
        return {**os.environ, **s3_access.client_env(self.spec, self.user)}

    def command(self, *argv: str) -> list[str]:
        """`s5cmd --endpoint-url ENDPOINT ARGV...` (run it with `env`)."""
        return [s3_access.s5cmd(), "--endpoint-url", self.spec.endpoint, *argv]

    def s5cmd(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """s5cmd ARGV... as the user; its output (checked, unless `check` is False)."""
        proc = subprocess.run(self.command(*argv), env=self.env, capture_output=True, text=True,
                              timeout=S5CMD_TIMEOUT_S)  # fmt: skip
        if check and proc.returncode != 0:
            pytest.fail(f"s5cmd {' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc

    def requests(self, pattern: str) -> list[str]:
        """The lines of radosgw's log (one per S3 request, with its status) matching `pattern` (a regex)."""
        log = self.spec.dir / "log" / s3.LOGS["rgw"]
        return [line for line in log.read_text(errors="replace").splitlines() if re.search(pattern, line)]

    def wait_for_requests(self, pattern: str, count: int, timeout_s: float = 60) -> None:
        """Wait until radosgw's log has `count` lines matching `pattern` (a request it has answered)."""
        deadline = time.monotonic() + timeout_s
        while len(self.requests(pattern)) < count:
            assert time.monotonic() < deadline, f"radosgw's log has no {count} lines matching {pattern!r}"
            time.sleep(0.05)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"the local S3 server cannot be had under CI=true: {reason}")
    pytest.skip(f"the local S3 server cannot be had: {reason}")


def _directory() -> Path:
    """`<project>/.s3`, one per pytest-xdist worker (`.s3-gw0`...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return default_dir() if worker is None else default_dir().with_name(f".s3-{worker}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The session's S3 server, made anew and answering, with a user of its own keys."""
    if os.geteuid() != 0:
        _unavailable("it runs as root (chroot, mount namespaces)")
    try:
        s3_access.s5cmd()
        s3.root()
    except s3.S3Error as e:
        _unavailable(str(e))
    spec = S3Spec(_directory())
    s3.down(spec)  # what a session that ended abruptly left running
    shutil.rmtree(spec.dir, ignore_errors=True)
    spec = s3.up(spec)
    user = s3_access.S3User("TESTS" + os.urandom(6).hex().upper(), os.urandom(20).hex())
    s3_access.add_user(spec, user)
    s3_access.create_bucket(spec, user, "tests")
    yield S3Server(spec, user, "tests")
    s3.down(spec)


_folders = itertools.count()


@pytest.fixture
def s3_folder(s3_server: S3Server) -> str:
    """`BUCKET/test-N`: a new, empty folder of the session's bucket, for one test (`s3://BUCKET/test-N/KEY`);
    radosgw started first where an earlier test left it killed."""
    s3.start_gateway(s3_server.spec)
    return f"{s3_server.bucket}/test-{next(_folders)}"
