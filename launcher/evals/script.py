"""--eval_tasks at launch: the eval job's script written into the bundle (templates/eval.sh.j2, beside the run's),
and what the eval jobs are to do recorded in the manifest (`evals`: the tasks, the folders of task YAMLs, the steps,
the limit, the GPUs, the held-out data), where the eval job reads it."""

from __future__ import annotations

from launcher import protocol as P
from launcher.bundle import files, render
from launcher.bundle.files import BundlePaths
from launcher.config.spec import RunSpec
from launcher.evals import checks as eval_checks


def write(spec: RunSpec, paths: BundlePaths, data: dict) -> None:
    """The eval job's script, written new into the bundle, and the manifest's (`data`'s) record of it; nothing without
    --eval_tasks. Raises OSError as the bundle's other files do."""
    found, _ = eval_checks.tasks_of(spec.args.evals)
    if found is None:
        return
    e = spec.args.evals
    script = paths.bundle_dir / P.EVAL_SCRIPT
    sha = files.write_new(script, render.eval_script(spec, paths), mode=0o755)
    data["files"]["eval_script"] = {"path": str(script), "sha256": sha}
    data["outputs"]["eval_log"] = str(render.eval_log(paths))
    data["evals"] = {
        **found.record(),
        "every": e.eval_every or 0,
        "last_step": spec.args.training.train_steps,
        "limit": e.eval_limit,
        "gpus": e.eval_gpus,
        "heldout": e.eval_heldout,
        "partition": e.eval_partition or spec.args.slurm.partition,
    }
