"""--keep_last and --keep_every, checked (pure; docs/checkpoints.md): a count of 1 or more, and kept multiples that
are saved steps. The rules themselves are the job's supervisor's (launcher/node/retention.py); their forecast on
disk is the cluster's checks' (launcher/bundle/storage.py)."""

from __future__ import annotations

from launcher.config.flags import PathArgs
from launcher.problems import Problem


def problems(paths: PathArgs) -> list[Problem]:
    out = []
    if paths.keep_last is not None and paths.keep_last < 1:
        out.append(
            Problem(
                "keep_last",
                f"--keep_last {paths.keep_last} would keep no checkpoint to resume from",
                "give --keep_last 1 or more (the newest checkpoint always stays), or leave it out to keep every "
                "checkpoint",
            )
        )
    every, interval = paths.keep_every, paths.save_interval
    if every is not None and every < 1:
        example = f"--keep_every {max(interval, 1) * 10}"
        out.append(
            Problem(
                "keep_every", f"must be positive, got {every}", f"give a multiple of --save_interval, e.g. {example}"
            )
        )
    elif every is not None and interval > 0 and every % interval:
        below, above = every // interval * interval, (every // interval + 1) * interval
        multiples = f"--keep_every {below} or {above}" if below else f"--keep_every {above}"
        out.append(
            Problem(
                "keep_every",
                f"--keep_every {every} is not a multiple of --save_interval {interval}: the steps it would keep are "
                "not all saved",
                f"use {multiples} (multiples of --save_interval)",
            )
        )
    return out
