"""The launch, straight down: flags parsed -> the cluster's facts asked once -> resolved (pure) -> --layout auto's
choice -> every problem checked at once -> rendered -> Slurm's verdict on the script -> the bundle written ->
submitted -> followed. Each arrow is a package's door (config, slurm, perf, bundle, report); this module calls them
in that order, for one run or for every point of a sweep (all or none)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from launcher import checkpoint_layout
from launcher import protocol as P
from launcher.bundle import files, manifest, render
from launcher.config import cli, container, ranges, validate
from launcher.config.flags import EvalArgs
from launcher.config.resolve import resolve
from launcher.config.spec import RunSpec
from launcher.errors import ConfigError, LauncherError, SlurmUnavailable, SubmissionError, as_command
from launcher.evals import checks as eval_checks
from launcher.evals import probe as eval_probe
from launcher.evals import script as eval_script
from launcher.perf import fit, sizes
from launcher.problems import Problem, report
from launcher.report import summary
from launcher.slurm import checks, client, facts, interactive

OUTPUT_FLAGS = "give --configs_path, --slurm_scripts_dir and --slurm_logs_path where you can write"


class Prepared(NamedTuple):
    spec: RunSpec
    paths: files.BundlePaths
    sizes: dict  # perf.sizes.derived
    forecast: str | None  # Slurm's verdict (checks.judge: its forecast, or held until nodes return); None: dry run


def check(
    argv: list[str], parsed: cli.Parsed | None = None, checkpoints: Path | None = None, fresh: bool = False
) -> tuple[RunSpec, list[Problem]]:
    """One run's flags, resolved and checked: what "every problem at once" means, in one place. The cluster's facts
    (unless a dry run) -> resolution -> --layout auto's choice -> the flags' own checks and local files
    (`config.validate`) -> the memory fit (`perf.fit`) -> the cluster's checks (`slurm.checks`: directories, disk,
    the jobs a --dependency names, ...). Slurm's verdict on the script comes once there is a script: in
    `prepare_all`, when these found nothing. `parsed`: argv's flags, where the caller has parsed them already;
    `checkpoints`, `fresh`: where a rerun puts its checkpoints, before anything checks them."""
    args, explicit = parsed or cli.parse(argv)
    spec, problems = resolve(args, explicit, facts.ask(args), checkpoints=checkpoints, fresh=fresh)
    if spec.args.parallelism.layout == "auto" and fit.checkable(spec, problems):
        spec, chosen = fit.auto_layout(spec, explicit)
        problems += chosen
    problems += validate.validate(spec)
    problems += fit.problems(spec, problems)
    problems += checks.problems(spec, problems, ask_slurm=not args.execution.dry_run)
    problems += eval_probe.problems(spec, problems, ask_slurm=not args.execution.dry_run)  # --eval_tasks'
    return spec, problems


def plan_run(parsed: cli.Parsed) -> int:
    """`--plan`: the layouts that fit, best first; nothing written or submitted."""
    from launcher.report import plan  # imported here only for speed: a dry run never needs it

    args, explicit = parsed
    spec, problems = resolve(args, explicit, facts.ask(args))
    if not fit.checkable(spec, problems):  # a value no run takes among them: said, as the planner waits for it
        raise ConfigError(report(list(dict.fromkeys(problems + ranges.problems(spec.args)))))
    fixed = {k: v for k, v in fit.current_values(spec).items() if k in explicit}
    found = fit.plans(spec, fixed)
    if not found:
        raise ConfigError(report(validate.validate(spec) or [_no_layout(spec, fixed)]))
    print(plan.render(spec, found, fixed))
    return 0


def _no_layout(spec: RunSpec, fixed: dict) -> Problem:
    kept = " with " + " ".join(f"--{k} {v}" for k, v in fixed.items()) if fixed else ""
    return Problem(
        "nodes", f"nanotron accepts no layout of this model on {spec.world_size} GPUs{kept}", "resize the job"
    )


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
    paths: files.BundlePaths
    config_text: str
    script_text: str
    job_text: str  # job.json: the job's settings
    export_text: str | None  # --export_hf: the export job's batch script


def _draft(spec: RunSpec, argv: list[str]) -> _Draft:
    """Claim the run's bundle directory and render its files (nothing written into it yet)."""
    a = spec.args
    fresh = not a.paths.resume and (spec.fresh or checkpoint_layout.pointer_step(spec.checkpoints_dir) is not None)
    try:  # validation checked the directories; a full disk, a quota or root on /proc can still say no
        paths = files.claim(
            a.run_name,
            a.paths.configs_path,
            a.paths.slurm_scripts_dir,
            a.paths.slurm_logs_path,
            a.paths.checkpoints_path,
            fresh,
            checkpoints_dir=spec.checkpoints_dir,
        )
    except OSError as e:
        raise ConfigError(f"cannot create the bundle's directories: {e}; {OUTPUT_FLAGS}") from None
    return _Draft(
        spec,
        argv,
        paths,
        render.config_yaml(spec, paths),
        render.sbatch_script(spec, paths),
        render.job_settings(spec, paths).to_json(),
        render.export_script(spec, paths) if a.execution.export_hf else None,
    )


def _write(draft: _Draft, forecast: str | None) -> Prepared:
    derived = sizes.derived(draft.spec)
    backend, why = draft.spec.rendezvous
    derived["rendezvous"] = {"backend": backend, "why": why}
    if draft.spec.facts.asked:  # the Slurm the run was launched on, as the cluster said it before resolution
        derived["cluster"] = {"slurm": draft.spec.facts.release, "gpu_types": list(draft.spec.facts.gpu_types)}
    paths = draft.paths
    try:
        image = draft.spec.args.container.container_image
        if image:  # what ran: the image's path and sha256 (a file), or its reference
            derived["container"] = container.record(image)
        files.make_room(paths)
        hashes = {
            "config": files.write_new(paths.config, draft.config_text),
            "script": files.write_new(paths.script, draft.script_text, mode=0o755),
            "job": files.write_new(paths.job, draft.job_text),
        }
        data = manifest.at_launch(draft.spec.args, draft.argv, paths, hashes, derived)
        if draft.export_text is not None:
            export_script = paths.bundle_dir / P.EXPORT_SCRIPT
            sha = files.write_new(export_script, draft.export_text, mode=0o755)
            data["files"]["export_script"] = {"path": str(export_script), "sha256": sha}
            data["outputs"]["export_log"] = str(render.export_log(paths))
        eval_script.write(draft.spec, paths, data)  # --eval_tasks: the eval job's script, its record
        manifest.write_manifest(paths.manifest, data, new=True)
    except OSError as e:
        raise ConfigError(f"cannot write the bundle ({paths.bundle_dir}): {e}; {OUTPUT_FLAGS}") from None
    return Prepared(draft.spec, paths, derived, forecast)


def prepare_all(
    points: list[list[str]],
    labels: list[str] | None = None,
    parsed: list[cli.Parsed | None] | None = None,
    checked: list[tuple[RunSpec, list[Problem]]] | None = None,
) -> list[Prepared]:
    """Several runs' bundles (a sweep's points), all or none: every point is checked, then every point's script
    is put to Slurm (unless a dry run), and only then is anything written. Raises ConfigError listing every
    problem of every point, or Slurm's refusal of any. `parsed`: the points' flags, where parsed already;
    `checked`: what `check` made of them, where the caller has checked them already."""
    if checked is None:
        checked = [check(argv, p) for argv, p in zip(points, parsed or [None] * len(points), strict=True)]
    problems = labelled([p for _, p in checked], labels or [f"point {i + 1}" for i in range(len(points))])
    problems += _shared_checkpoints([spec for spec, _ in checked])
    if problems:
        raise ConfigError(report(problems))
    drafts: list[_Draft] = []
    try:
        for (spec, _), argv in zip(checked, points, strict=True):
            drafts.append(_draft(spec, argv))
        forecasts = [None if d.spec.args.execution.dry_run else checks.judge(d.spec, d.script_text) for d in drafts]
    except BaseException as e:  # a refusal, or Ctrl-C while Slurm is asked: nothing of this launch stays behind
        for draft in drafts:
            files.release(draft.paths)  # claimed, nothing written yet
        if isinstance(e, SubmissionError):
            raise ConfigError(f"{e}\nNothing was written or submitted.") from None
        raise
    return [_write(draft, forecast) for draft, forecast in zip(drafts, forecasts, strict=True)]


def _shared_checkpoints(specs: list[RunSpec]) -> list[Problem]:
    """A sweep's points that would train into one checkpoints folder (a --config's checkpoints_path names one folder,
    whatever the point's name): each would resume the other's checkpoints."""
    by_folder: dict[Path, list[str]] = {}
    for spec in specs:
        by_folder.setdefault(spec.checkpoints_dir, []).append(spec.args.run_name)
    return [
        Problem(
            "checkpoints_path",
            f"{', '.join(names)} would all train into {folder} (--config's "
            "checkpoints.checkpoints_path names one folder)",
            "give --checkpoints_path: each point trains into PATH/ITS_NAME",
        )  # fmt: skip
        for folder, names in by_folder.items()
        if len(names) > 1
    ]


def prepare(argv: list[str], parsed: cli.Parsed | None = None) -> Prepared:
    """Resolve, validate, render and write one run's bundle. Raises ConfigError listing every problem; when the
    run is to be submitted, that includes Slurm's refusal of the rendered script."""
    return prepare_all([argv], parsed=[parsed])[0]


def launch_run(argv: list[str], parsed: cli.Parsed) -> int:
    """One run: its bundle written, summarised, submitted and (--show_logs) followed; returns the exit code."""
    with client.fail_fast():  # the checks' questions to Slurm; following the job is outside
        prepared = prepare(argv, parsed)
    return submit_prepared(prepared)


def submit_prepared(prepared: Prepared) -> int:
    """A written bundle summarised, then submitted and (--show_logs) followed, unless a dry run; the exit code."""
    spec, paths, derived, forecast = prepared
    print(f"Run {spec.args.run_name}: bundle written")
    print(summary.render(spec, paths, derived))
    if forecast:
        print(f"  slurm        {forecast}")
    if spec.args.execution.export_hf:
        where = spec.args.slurm.export_partition or spec.args.slurm.partition or "the default partition"
        print(f"  export       after the run, a CPU job on {where} exports it as a Hugging Face model and prints its "
              f"held-out perplexity: {paths.bundle_dir / P.EXPORT_SCRIPT}")  # fmt: skip
    step, note = checkpoint_layout.resume_point(paths.checkpoints)
    if step is not None or note:
        said = f"from the checkpoint at step {step}" + (f" ({note})" if note else "") if step is not None else note
        print(f"  resume       {said}; --resume false starts afresh")
    if spec.args.execution.dry_run:
        print(f"Dry run: nothing submitted. Submit it with: sbatch {paths.script}")
        return 0
    if spec.args.execution.interactive:
        return interactive.run(spec, paths)
    from launcher.runs import submission  # imported here only for speed: a dry run never submits (~40 ms)

    sys.stdout.flush()  # the summary out before sbatch, which may retry for minutes at a full queue (into a pipe too)
    return submission.submit_and_follow(paths, follow=spec.args.execution.show_logs)


def launch_sweep(argv: list[str], sweep_text: str, run_name: str, evals: EvalArgs | None = None) -> int:
    """A sweep: every point's bundle (all or none), the sweep's record, every point submitted and followed;
    `evals`: the command's eval flags, whose --rank_by its points do not carry (the sweep's record does)."""
    from launcher.runs import submission, sweep  # imported here only for speed: a single run's dry run needs neither

    axes, problems = sweep.parse(sweep_text)
    rank_by = evals.rank_by if evals is not None else None
    if problems:
        raise ConfigError(report(problems))
    grid = sweep.points(argv, run_name, axes)
    parsed: list[cli.Parsed | None] = [cli.parse(p.argv) for p in grid]
    with client.fail_fast():
        checked = [check(p.argv, one) for p, one in zip(grid, parsed, strict=True)]
        if evals is not None and rank_by:  # by a task every point evaluates (a sweep of --eval_tasks too), its metric
            ranked = eval_checks.rank_by_problems(evals, swept=True, points=[s.args.evals for s, _ in checked])
            checked = [(spec, said + (ranked or eval_probe.rank_by_problems(spec, rank_by))) for spec, said in checked]
        prepared = prepare_all([p.argv for p in grid], [p.label for p in grid], parsed, checked)
    a = prepared[0].spec.args
    record_dir = sweep.write_record(
        a.paths.configs_path, run_name, sweep_text, grid, [prep.paths.bundle_dir for prep in prepared], rank_by
    )
    print(f"Sweep {run_name}: {len(grid)} runs, bundles written ({record_dir})")
    for p, prep in zip(grid, prepared, strict=True):
        print(f"  {p.label}")
        print(f"      {prep.paths.bundle_dir}" + (f"  [slurm {prep.forecast}]" if prep.forecast else ""))
    if a.execution.dry_run:
        print("Dry run: nothing submitted. Submit each script with sbatch, or launch again without --dry_run.")
        return 0
    failed, submitted = 0, []
    for p, prep in zip(grid, prepared, strict=True):
        try:
            job_id = str(submission.submit(prep.paths).job_id)
        except LauncherError as e:
            failed += 1
            print(f"error: {p.run_name}: {e}", file=sys.stderr)
            continue
        sweep.record_job(record_dir, p, job_id)
        submitted.append(f"{p.run_name} as job {job_id}")
    print("Submitted " + ", ".join(submitted))
    if not a.execution.show_logs:
        print(submission.how_to(str(record_dir)))
        return 1 if failed else 0
    code = sweep.follow(record_dir, rank_by=rank_by)
    return 1 if failed else code


def main(argv: list[str] | None = None) -> int:
    """The whole command (`slurm_launcher.py`); returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parsed = cli.parse(argv)  # once: each command takes it (a sweep's points are command lines of their own)
    args = parsed.args
    try:
        if args.execution.plan:
            return plan_run(parsed)
        if args.execution.sweep is not None:
            return launch_sweep(argv, args.execution.sweep, args.run_name, args.evals)
        return launch_run(argv, parsed)
    except SlurmUnavailable as e:  # (a dry run asks Slurm nothing)
        raise SlurmUnavailable(f"{e} Or give --dry_run: the bundle written, nothing submitted.") from None


def command() -> int:
    """`slurm-launcher` (pyproject.toml's console script), as `python slurm_launcher.py`: errors as exit codes."""
    return as_command(main)
