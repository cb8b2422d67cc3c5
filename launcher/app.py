"""The launch, start to end: flags -> resolved spec -> validated -> rendered -> bundle written -> submitted ->
followed. Each step is one module; this one only wires them together."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from launcher import bundle, cli, dependency, nanotron_schema, sbatch, slurm, summary
from launcher.errors import ConfigError, SlurmUnavailable, SubmissionError
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


def check(argv: list[str]) -> tuple[RunSpec, list[Problem]]:
    """One run's flags resolved and validated; when it is to be submitted, also the jobs its --dependency names,
    as Slurm sees them now."""
    args, explicit = cli.parse(argv)
    spec, problems = resolve(args, explicit)
    problems += validate(spec)
    a = spec.args
    # Asked whatever else is wrong, so that every mistake is reported at once; only a dependency that does not
    # parse (already a problem) is not looked up. A dry run does not talk to Slurm.
    if a.slurm.dependency and not a.execution.dry_run and not dependency.syntax_problems(a.slurm.dependency):
        try:
            problems += dependency.state_problems(a.slurm.dependency, slurm.job_states)
        except SlurmUnavailable as e:
            if not problems:
                raise
            # Slurm being down is not a mistake in the flags: say so beside the mistakes, not instead of them
            asked = f"Slurm could not be asked about its jobs: {e}"
            problems.append(Problem("dependency", asked, "they are checked once Slurm answers"))
    return spec, problems


def labelled(problems_per_point: list[list[Problem]], labels: list[str]) -> list[Problem]:
    """Every point's problems, once: a problem all points share is said plainly, others name their points."""
    where: dict[Problem, list[str]] = {}
    for problems, label in zip(problems_per_point, labels, strict=True):
        for problem in problems:
            where.setdefault(problem, []).append(label)
    out = []
    for problem, points in where.items():
        if len(points) < len(labels):
            problem = Problem(problem.flag, f"({'; '.join(points)}) {problem.message}", problem.fix)
        out.append(problem)
    return out


class _Draft(NamedTuple):
    spec: RunSpec
    argv: list[str]
    paths: bundle.BundlePaths
    config_text: str
    script_text: str


def _draft(spec: RunSpec, argv: list[str]) -> _Draft:
    """Claim the run's bundle directory and render its files (nothing written into it yet)."""
    a = spec.args
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
    return _Draft(spec, argv, paths, config_text, script_text)


def _write(draft: _Draft, forecast: str | None) -> Prepared:
    figures = summary.derived(draft.spec)
    paths = draft.paths
    try:
        bundle.make_room(paths)
        hashes = {
            "config": bundle.write_new(paths.config, draft.config_text),
            "script": bundle.write_new(paths.script, draft.script_text, mode=0o755),
        }
        manifest = bundle.manifest(draft.spec.args, draft.argv, paths, hashes, figures)
        bundle.write_manifest(paths.manifest, manifest, new=True)
    except OSError as e:
        raise ConfigError(f"cannot write the bundle ({paths.bundle_dir}): {e}; {OUTPUT_FLAGS}") from None
    return Prepared(draft.spec, paths, figures, forecast)


def prepare_all(points: list[list[str]], labels: list[str] | None = None) -> list[Prepared]:
    """Several runs' bundles (a sweep's points), all or none: every point is checked, then every point's script
    is put to Slurm (unless a dry run), and only then is anything written. Raises ConfigError listing every
    problem of every point, or Slurm's refusal of any."""
    checked = [check(argv) for argv in points]
    problems = labelled([p for _, p in checked], labels or [f"point {i + 1}" for i in range(len(points))])
    if problems:
        raise ConfigError(report(problems))
    drafts: list[_Draft] = []
    try:
        for (spec, _), argv in zip(checked, points, strict=True):
            drafts.append(_draft(spec, argv))
        forecasts = [None if d.spec.args.execution.dry_run else slurm.check_submission(d.script_text) for d in drafts]
    except BaseException as e:  # a refusal, or Ctrl-C while Slurm is asked: nothing of this launch stays behind
        for draft in drafts:
            bundle.release(draft.paths)  # claimed, nothing written yet
        if isinstance(e, SubmissionError):
            raise ConfigError(f"{e}\nNothing was written or submitted.") from None
        raise
    return [_write(draft, forecast) for draft, forecast in zip(drafts, forecasts, strict=True)]


def prepare(argv: list[str]) -> Prepared:
    """Resolve, validate, render and write one run's bundle. Raises ConfigError listing every problem; when the
    run is to be submitted, that includes Slurm's refusal of the rendered script."""
    return prepare_all([argv])[0]


def launch(argv: list[str]) -> int:
    """The whole command; returns the process exit code."""
    args, _ = cli.parse(argv)
    if args.execution.sweep is not None:
        from launcher import sweep

        return sweep.launch(argv, args.execution.sweep, args.run_name)
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
