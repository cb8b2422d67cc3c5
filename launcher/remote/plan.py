"""--checkpoints_remote at launch, planned purely from the resolved spec: the remote settings the job reads (job.json's
`remote`: launcher/remote/settings.py). The run's folder in the bucket is --checkpoints_remote's PREFIX and the name
of its checkpoints folder (the run's name, or the fresh folder a `--resume false` start gets), so that a sweep's
points, and a run started afresh, never share one. A --config's `s3_upload:` section gives the client's own
settings (s5cmd's path, its workers and parts in flight)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from launcher.config.spec import RunSpec
from launcher.remote.checks import SECTION
from launcher.remote.settings import RemoteSettings


def run_url(remote: str, folder: Path) -> str:
    """The run's folder in the bucket: s3://BUCKET/PREFIX/<checkpoints folder's name>."""
    return f"{remote.rstrip('/')}/{folder.name}"


def settings_of(spec: RunSpec, folder: Path | None = None) -> RemoteSettings | None:
    """The run's remote settings as the job reads them (`folder`: its checkpoints folder, the spec's by default);
    None without --checkpoints_remote."""
    p = spec.args.paths
    if not p.checkpoints_remote:
        return None
    section = spec.base_config.get(SECTION)
    section = section if isinstance(section, Mapping) else {}

    def count(key: str) -> int | None:
        value = section.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    client = section.get("s5cmd_path")
    return RemoteSettings(
        url=run_url(p.checkpoints_remote, folder or spec.checkpoints_dir),
        endpoint=p.s3_endpoint or "",
        keep_last=p.keep_last_remote,
        client=client if isinstance(client, str) else "",
        numworkers=count("s5cmd_numworkers"),
        concurrency=count("s5cmd_concurrency"),
    )
