"""The launch, start to end: flags -> resolved spec -> validated -> rendered -> bundle written -> submitted ->
followed. Each step is one module; this one only wires them together."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from launcher import bundle, cli, dependency, nanotron_schema, sbatch, slurm, summary
from launcher.errors import ConfigError, LauncherError, SubmissionError
from launcher.problems import Problem, report
from launcher.spec import RunSpec, resolve
from launcher.validate import validate


def latest_checkpoint_step(checkpoints: Path) -> int | None:
    """The step of a run's newest checkpoint: the torch engine's `latest` pointer or nanotron's `latest.txt`."""
    for pointer in ("latest", "latest.txt"):
        try:
            return int((checkpoints / pointer).read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def _shell_problems(script: str) -> list[Problem]:
    """`bash -n` on the rendered script: only --pre_launch_commands can make it fail."""
    out = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    if out.returncode == 0:
        return []
    return [
        Problem(
            "pre_launch_commands",
            f"the batch script does not parse: {out.stderr.strip()}",
            "fix the shell syntax of the commands",
        )
    ]


OUTPUT_FLAGS = "give --configs_path, --slurm_scripts_dir and --slurm_logs_path where you can write"


class Prepared(NamedTuple):
    spec: RunSpec
    paths: bundle.BundlePaths
    figures: dict  # summary.derived
    forecast: str | None  # Slurm's answer to `sbatch --test-only` (None for a dry run)


def _ask_slurm(script_text: str, paths: bundle.BundlePaths) -> str:
    """Slurm's forecast for the script, or an error, before anything is written (the bundle's directory is
    removed again on an error: nothing of this launch stays behind)."""
    try:
        return slurm.check_submission(script_text)
    except SubmissionError as e:
        bundle.release(paths)
        raise ConfigError(f"{e}\nNothing was written or submitted.") from None
    except LauncherError:
        bundle.release(paths)
        raise


def prepare(argv: list[str]) -> Prepared:
    """Resolve, validate, render and write the bundle. Raises ConfigError listing every problem; when the run is
    to be submitted, that includes Slurm's refusal of the rendered script."""
    args, explicit = cli.parse(argv)
    spec, problems = resolve(args, explicit)
    problems += validate(spec)
    a = spec.args
    if a.slurm.dependency and not a.execution.dry_run and not problems:  # the jobs it names, as Slurm sees them now
        problems += dependency.state_problems(a.slurm.dependency, slurm.job_state)
    if problems:
        raise ConfigError(report(problems))
    run_ckpt = Path(a.paths.checkpoints_path) / a.run_name
    fresh = not a.paths.resume and latest_checkpoint_step(run_ckpt) is not None
    try:  # validation checked the directories; a full disk, a quota or root on /proc can still say no
        paths = bundle.claim(
            a.run_name,
            a.paths.configs_path,
            a.paths.slurm_scripts_dir,
            a.paths.slurm_logs_path,
            a.paths.checkpoints_path,
            fresh,
        )
    except OSError as e:
        raise ConfigError(f"cannot create the bundle's directories: {e}; {OUTPUT_FLAGS}") from None
    config_text = nanotron_schema.dump(nanotron_schema.build_config(spec, str(paths.checkpoints)))
    script_text = sbatch.render(spec, paths)
    # Only --pre_launch_commands puts unquoted shell text in the script (everything else is quoted, and tests run
    # bash -n and shellcheck on every preset's script): parse the whole script then, once more, as rendered.
    problems = _shell_problems(script_text) if a.slurm.pre_launch_commands else []
    if problems:
        bundle.release(paths)  # still empty: nothing of this launch stays behind
        raise ConfigError(report(problems))
    forecast = None if a.execution.dry_run else _ask_slurm(script_text, paths)
    figures = summary.derived(spec)
    try:
        hashes = {
            "config": bundle.write_new(paths.config, config_text),
            "script": bundle.write_new(paths.script, script_text, mode=0o755),
        }
        bundle.write_manifest(paths.manifest, bundle.manifest(a, argv, paths, hashes, figures), new=True)
    except OSError as e:
        raise ConfigError(f"cannot write the bundle ({paths.bundle_dir}): {e}; {OUTPUT_FLAGS}") from None
    return Prepared(spec, paths, figures, forecast)


def launch(argv: list[str]) -> int:
    """The whole command; returns the process exit code."""
    spec, paths, figures, forecast = prepare(argv)
    print(f"Run {spec.args.run_name}: bundle written")
    print(summary.render(spec, paths, figures))
    if forecast:
        print(f"  slurm        accepts it (sbatch --test-only): {forecast}")
    step = latest_checkpoint_step(paths.checkpoints)
    if step is not None:
        print(f"  resume       from the checkpoint at step {step} (--resume false starts afresh)")
    if spec.args.execution.dry_run:
        print(f"Dry run: nothing submitted. Submit it with: sbatch {paths.script}")
        return 0
    from launcher import jobs  # the Slurm side is only needed past a dry run

    return jobs.submit_and_follow(paths, follow=spec.args.execution.show_logs)


def main(argv: list[str] | None = None) -> int:
    return launch(sys.argv[1:] if argv is None else argv)
