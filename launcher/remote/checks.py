"""--checkpoints_remote, --s3_endpoint and --keep_last_remote checked (pure; docs/checkpoints.md#in-a-bucket), and
nanotron main's `s3_upload:` section of a --config read as these flags: the launcher's supervisor copies the
checkpoints (never training's rank 0, as nanotron's S3Mover does), so the section maps to --checkpoints_remote (its
upload_s3_path less the run's folder, which the launcher adds) and, with remove_after_upload, to --keep_last 1 (the
newest stays on disk to resume from; a step leaves the disk only once it is in the bucket). Its s5cmd settings reach
the job's client (`plan.settings_of`). What asks the world (the endpoint, the bucket, the keys, the client) is
launcher/remote/probe.py's, before the queue."""

from __future__ import annotations

import re
from collections.abc import Mapping

from launcher.config.spec import RunSpec
from launcher.problems import Problem
from launcher.remote.settings import SCHEME, split_url

SECTION = "s3_upload"
ENDPOINT = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d+)?(/[\w./%-]*)?")
GLOB = re.compile(r"[*?\[\]]")  # s5cmd reads them as wildcards in a local path
OTHER_SCHEMES = {"gs://": "https://storage.googleapis.com", "r2://": "https://ACCOUNT_ID.r2.cloudflarestorage.com"}


def parent_url(url: str) -> str:
    """s3://b/p/run -> s3://b/p (s3://b/run -> s3://b)."""
    head, _, _ = url.rstrip("/").rpartition("/")
    return head if len(head) > len(SCHEME) else url


def from_section(section: object, explicit: set[str]) -> tuple[dict[str, object], list[str]]:
    """A --config's `s3_upload:` section as flag values (a typed flag wins) and what resolution notes of it."""
    if not isinstance(section, Mapping):
        return {}, []
    values: dict[str, object] = {}
    notes = []
    path = section.get("upload_s3_path")
    if isinstance(path, str) and path.startswith(SCHEME) and "checkpoints_remote" not in explicit:
        values["checkpoints_remote"] = parent_url(path)
        notes.append(f"{SECTION}.upload_s3_path {path}: copied by the job's supervisor, not by training's rank 0 "
                     f"(--checkpoints_remote {parent_url(path)})")  # fmt: skip
    if section.get("remove_after_upload") is True and "keep_last" not in explicit:
        values["keep_last"] = 1
        notes.append(f"{SECTION}.remove_after_upload: --keep_last 1 (the newest stays on disk to resume from; a step "
                     "leaves the disk once it is in the bucket)")  # fmt: skip
    return values, notes


def _resume_problems(spec: RunSpec) -> list[Problem]:
    """A --config's checkpoints.resume_checkpoint_path in a bucket: nanotron main would fetch it from training's ranks
    (with the s3_upload: section's client, which the written config no longer has); the launcher resumes from a
    bucket itself, before training."""
    section = spec.base_config.get("checkpoints")
    start = section.get("resume_checkpoint_path") if isinstance(section, Mapping) else None
    if not (isinstance(start, str) and start.startswith(SCHEME)):
        return []
    return [Problem("config", f"checkpoints.resume_checkpoint_path in {spec.base_config_path} is {start}: nanotron "
                    "would download it from training's ranks; the launcher's job fetches a run's steps from its "
                    "bucket itself, before training", f"give --checkpoints_remote {parent_url(parent_url(start))} "
                    f"where {start} is a step of that run's folder (it resumes from the folder's newest complete "
                    "step), or download the step and give its local path")]  # fmt: skip


def _section_problems(spec: RunSpec) -> list[Problem]:
    section = spec.base_config.get(SECTION)
    if section is None:
        return _resume_problems(spec)
    where = spec.base_config_path
    if not isinstance(section, Mapping):
        return [Problem("config", f"{SECTION} in {where} is not a section", "remove it, or give --checkpoints_remote")]
    out = _resume_problems(spec)
    path, run = section.get("upload_s3_path"), spec.checkpoints_dir.name
    remote = spec.args.paths.checkpoints_remote
    if isinstance(path, str) and path.startswith(SCHEME) and remote == parent_url(path):
        if path.rstrip("/").rsplit("/", 1)[-1] != run:
            out.append(Problem("config", f"{SECTION}.upload_s3_path {path} in {where} ends in another folder than "
                               f"the run's checkpoints ({run}): the launcher copies a run's steps to "
                               f"--checkpoints_remote/{run}/", f"remove the section and give --checkpoints_remote "
                               f"{parent_url(path)} (the steps then go to {parent_url(path)}/{run}/)"))  # fmt: skip
    elif not remote and path is not None:
        out.append(Problem("config", f"{SECTION}.upload_s3_path in {where} is {path!r}, not an s3:// URL",
                           "remove the section and give --checkpoints_remote s3://BUCKET/PREFIX"))  # fmt: skip
    for key in ("s5cmd_numworkers", "s5cmd_concurrency"):
        value = section.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            out.append(Problem("config", f"{SECTION}.{key} in {where} is {value!r}, not a count of 1 or more",
                               "fix it, or set it to null (s5cmd's default)"))  # fmt: skip
    if section.get("s5cmd_path") is not None and not isinstance(section.get("s5cmd_path"), str):
        out.append(Problem("config", f"{SECTION}.s5cmd_path in {where} is not a path", "give s5cmd's path, or null"))
    return out


def problems(spec: RunSpec) -> list[Problem]:
    p, out = spec.args.paths, _section_problems(spec)
    if not p.checkpoints_remote:
        for flag in ("s3_endpoint", "keep_last_remote"):
            if getattr(p, flag) is not None:
                out.append(Problem(flag, "it is the bucket's, and no --checkpoints_remote names one",
                                   f"add --checkpoints_remote s3://BUCKET/PREFIX, or leave out --{flag}"))  # fmt: skip
        return out
    other = next((s for s in OTHER_SCHEMES if p.checkpoints_remote.startswith(s)), None)
    if other:
        out.append(Problem("checkpoints_remote", f"{p.checkpoints_remote}: the launcher speaks S3's interface only",
                           f"give s3://{p.checkpoints_remote[len(other):]} with --s3_endpoint {OTHER_SCHEMES[other]} "
                           "(HMAC keys as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY: docs/checkpoints.md)"))  # fmt: skip
    else:
        try:
            split_url(p.checkpoints_remote)
        except ValueError as e:
            out.append(
                Problem("checkpoints_remote", str(e), "give s3://BUCKET/PREFIX, e.g. s3://my-bucket/checkpoints")
            )
    if p.s3_endpoint is not None and not ENDPOINT.fullmatch(p.s3_endpoint):
        out.append(Problem("s3_endpoint", f"{p.s3_endpoint!r} is not an http(s) URL of a host",
                           "e.g. --s3_endpoint https://storage.googleapis.com, or leave it out for AWS's"))  # fmt: skip
    if p.keep_last_remote is not None and p.keep_last_remote < 1:
        out.append(Problem("keep_last_remote", f"--keep_last_remote {p.keep_last_remote} would keep no checkpoint in "
                           "the bucket", "give 1 or more, or leave it out to keep every one there"))  # fmt: skip
    if GLOB.search(str(spec.checkpoints_dir)):
        out.append(Problem("checkpoints_path", f"{spec.checkpoints_dir} holds a character the S3 client reads as a "
                           "wildcard (* ? [ ])", "give a --checkpoints_path (and run name) without them"))  # fmt: skip
    if spec.args.execution.interactive:
        out.append(Problem("checkpoints_remote", "--interactive runs a shell, and no job supervisor that would copy "
                           "the checkpoints", "leave out --checkpoints_remote with --interactive"))  # fmt: skip
    return out
