"""`python -m launcher.export.chained BUNDLE RESULT`: the export job of a run launched with --export_hf (its batch
script, templates/export.sh.j2, runs it once the run has COMPLETED). The run's newest complete checkpoint is
exported as `jobs export` exports it (bfloat16, beside the checkpoints), and RESULT (the bundle's export.json) says
where: {"output", "step", "engine", "dtype"}; the job's evaluation (`launcher.train.evaluate`) adds its held-out
loss there. A refusal is one line (`error: ...`) and exit 1, as `jobs export`'s."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher import atomic
from launcher.bundle import manifest
from launcher.errors import LauncherError
from launcher.export import checkpoints as found
from launcher.export.exporter import DEFAULT_DTYPE, default_output, export, run_config


def main(argv: list[str]) -> int:
    bundle, result = Path(argv[0]), Path(argv[1])
    try:
        run = manifest.load(bundle)
        checkpoint = found.find(run.checkpoints, None, run_config(run))
        output = default_output(run, checkpoint.step)
        export(run, checkpoint.step, output, DEFAULT_DTYPE, ["export", str(bundle), "--step", str(checkpoint.step)])
    except (LauncherError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    record = {"output": str(output), "step": checkpoint.step, "engine": checkpoint.engine, "dtype": DEFAULT_DTYPE}
    atomic.replace(result, json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
