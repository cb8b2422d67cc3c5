"""`python -m launcher.jobs ledger`: where the GPU-hours of a run, a sweep or a period's runs went.

    python -m launcher.jobs ledger logs/configs/RUN/STAMP      one run: every attempt of its requeue chain
    python -m launcher.jobs ledger logs/configs/RUN/STAMP      a sweep's directory (sweep.json): every point
    python -m launcher.jobs ledger --since 2026-11-01          every run under --configs_path launched since

Each run's ledger comes from sacct where the cluster keeps accounting, else from the job's own records
(launcher.ledger.usage; how each figure is computed: launcher.ledger.breakdown, docs/ledger.md). A sweep's and a
period's are drawn as gpu-hours.png (in the sweep's directory; in the configs path for a period).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from launcher import protocol as P
from launcher.bundle import manifest, sweep_record
from launcher.errors import ConfigError, LauncherError
from launcher.ledger import usage
from launcher.ledger.breakdown import table
from launcher.slurm.parse import JobState

DEFAULT_DAYS = 7


def _since(text: str | None) -> float:
    if text is None:
        return time.time() - DEFAULT_DAYS * 86400
    try:
        return datetime.fromisoformat(text).astimezone().timestamp()
    except ValueError:
        raise ConfigError(f"--since {text!r} is not a date: give YYYY-MM-DD or YYYY-MM-DDTHH:MM") from None


def _sweep_points(record: sweep_record.SweepRecord) -> list[tuple[str, Path]]:
    return [(p.run_name, p.bundle) for p in record.submitted]


def run_ledger_line(run: manifest.Manifest, state: JobState | None = None) -> str:
    """`gpu-hours` for `jobs status` of a run: its one line."""
    return "  gpu-hours " + usage.line(run, state)


def sweep_ledger_line(record: sweep_record.SweepRecord) -> str:
    """`gpu-hours` for `jobs status` of a sweep: its total."""
    return "  gpu-hours " + usage.several(_sweep_points(record), None, record.name)[-1].strip()


def ledger_command(target: str | None, since: str | None, configs_path: Path) -> int:
    if target is None:
        start = _since(since)
        bundles = usage.bundles_since(configs_path, start)
        title = f"runs since {time.strftime('%Y-%m-%d %H:%M', time.localtime(start))}"
        if not bundles:
            raise LauncherError(f"no submitted run under {configs_path} ({title}): give --configs_path or --since")
        print(f"GPU-hours of {len(bundles)} run(s) under {configs_path}, {title}:")
        named = [(f"{b.parent.name}/{b.name}", b) for b in bundles]
        print("\n".join(usage.several(named, configs_path / "gpu-hours.png", title)))
        return 0
    sweep_dir = sweep_record.directory_of(Path(target))
    if sweep_dir is not None:
        record = sweep_record.load(sweep_dir)
        print(f"GPU-hours of sweep {record.name} ({sweep_dir}):")
        print("\n".join(usage.several(_sweep_points(record), sweep_dir / "gpu-hours.png", record.name)))
        return 0
    directory = Path(target).parent if Path(target).name == P.MANIFEST else Path(target)
    if not (directory / P.MANIFEST).is_file():
        raise LauncherError(f"{target} is neither a bundle nor a sweep directory")
    run = manifest.load(directory)
    final, unconfirmed = usage.final_state(run) if run.job_id else (None, [])
    from_sacct, from_records = usage.ledgers(run, final, ask_sacct=not unconfirmed, asked=True)
    if from_sacct is None and from_records is None:
        raise LauncherError(f"{directory}: no attempt of its job has started yet (or it was never submitted)")
    if not unconfirmed:  # (a ledger Slurm could not confirm is said, not recorded)
        usage.kept(run, from_sacct or from_records)  # type: ignore[arg-type]
    print(f"GPU-hours of {directory} (GPU-hours per attempt):")
    for found in (from_sacct, from_records):
        if found is not None:
            print(table(found))
    if from_sacct is not None and from_records is not None and (off := usage.agree(from_sacct, from_records)):
        print("  sacct and the job's records disagree beyond the tolerance: " + "; ".join(off))
    if unconfirmed:
        print("Not confirmed:\n" + "\n".join(f"  - {note}" for note in unconfirmed))
    return 0
