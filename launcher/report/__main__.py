"""Draw a run's pictures into its bundle: training.png (loss, learning rate, gradient norm, throughput over steps)
and gpus.png (GPU utilisation, memory, power and temperature of every node over time).

python -m launcher.report RUN_OR_BUNDLE   a bundle (logs/configs/RUN/STAMP), a run (logs/configs/RUN: its newest
                                          bundle) or a sweep's directory (every point's bundle)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher import protocol as P
from launcher.bundle import manifest, sweep_record
from launcher.errors import LauncherError, as_command
from launcher.report import pictures

SWEEP_RECORD = sweep_record.RECORD


def bundles(target: Path) -> list[Path]:
    """The bundles a path names: itself, a run's newest, or a sweep's points."""
    if target.name in (P.MANIFEST, SWEEP_RECORD):
        target = target.parent
    if (target / P.MANIFEST).is_file():
        return [target]
    if (target / SWEEP_RECORD).is_file():
        return [p.bundle for p in sweep_record.load(target).points if (p.bundle / P.MANIFEST).is_file()]
    if target.is_dir():  # a run's directory: bundles are named by launch time, so the newest sorts last
        stamps = sorted((d for d in target.iterdir() if (d / P.MANIFEST).is_file()), key=_stamp_order)
        if stamps:
            return [stamps[-1]]
    raise LauncherError(f"{target} is neither a bundle (logs/configs/RUN/STAMP), a run's directory nor a sweep's")


def _stamp_order(bundle: Path) -> tuple[str, int]:
    """20261123-144147, then 20261123-144147-2 (the second launch that second), ..., -10."""
    suffix = bundle.name[16:]
    return bundle.name[:15], int(suffix) if suffix.isdigit() else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.report", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="a bundle directory, a run's directory (its newest bundle) or a sweep's")
    args = parser.parse_args(argv)
    return as_command(lambda: _draw(Path(args.target)))


def _draw(target: Path) -> int:
    found = bundles(target)
    for bundle in found:
        drawn = pictures.render(manifest.load(bundle))
        if len(found) > 1:
            print(f"{bundle}:")
        for name, png in drawn.items():
            print(f"  {name:<9} {png}")
        if not drawn:
            print(f"  nothing to draw yet: no metrics.jsonl steps or GPU samples for {bundle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
