"""The eval job's batch script (templates/eval.sh.j2), written into every bundle beside the run's: the run's
supervisor submits it for each step --eval_tasks evaluates, and `python -m launcher.jobs evaluate` for the steps it
is asked to. A pure function of the job's settings (job.json) and the run's eval flags; what it scores is the
step's record's (launcher/evals/record.py), named by the script's second argument."""

from __future__ import annotations

from launcher import protocol as P
from launcher.bundle import files, render
from launcher.bundle.files import BundlePaths
from launcher.config.spec import RunSpec
from launcher.evals import plan
from launcher.evals.settings import EvalSettings


def text(spec: RunSpec, paths: BundlePaths) -> str:
    """The eval job's batch script: its #SBATCH defaults are the run's eval flags (without --eval_tasks: one node's
    CPUs on the run's partition, the default time limit)."""
    a = spec.args
    unasked = EvalSettings((), partition=a.slurm.partition or "", time_limit=plan.time_limit(spec))
    evals = plan.settings_of(spec) or unasked
    values = {
        "job": render.job_settings(spec, paths),
        "job_file": paths.job,
        "evals": evals,
        "default_time_limit": plan.time_limit(spec),
        "qos": a.slurm.qos,
        "account": a.slurm.account,
    }
    return render.environment().get_template("eval.sh.j2").render(**values)


def write(spec: RunSpec, paths: BundlePaths, data: dict) -> None:
    """The eval job's script, written new into the bundle, and the manifest's (`data`'s) record of it. Raises OSError
    as the bundle's other files do."""
    script = paths.bundle_dir / P.EVAL_SCRIPT
    sha = files.write_new(script, text(spec, paths), mode=0o755)
    data["files"]["eval_script"] = {"path": str(script), "sha256": sha}
