"""Submitted runs, later: re-attach to a run or a sweep, show its status, cancel it, say where its GPU-hours went,
run it again, or compare two runs.

python -m launcher.jobs status|attach|cancel BUNDLE_DIR_OR_JOB_ID
python -m launcher.jobs ledger [BUNDLE_OR_SWEEP_DIR] [--since 2026-11-01] [--configs_path logs/configs]
python -m launcher.jobs rerun BUNDLE_DIR_OR_JOB_ID [--run_name NAME] [--dry_run] [--strict] [--resume] [--show_logs]
python -m launcher.jobs diff A B [--json] [--tolerance 1e-6]      (bundle directories or job ids)
python -m launcher.jobs export BUNDLE_DIR_OR_JOB_ID [--step N] [--output DIR] [--dtype bfloat16|float32]
python -m launcher.jobs checkpoints BUNDLE_DIR_OR_JOB_ID    (every step on disk, why it stays, what was removed)
python -m launcher.jobs evals BUNDLE_OR_SWEEP_DIR_OR_JOB_ID [--rank_by TASK[:METRIC]]   (--eval_tasks' scores)
python -m launcher.jobs verdict SWEEP_DIR|BUNDLE... --task TASK[:METRIC] [--at tokens|gpu_hours|step N|last] [--json]
python -m launcher.jobs evaluate BUNDLE_OR_SWEEP_DIR --eval_tasks TASKS [--steps all|N,M] [--again]   (kept steps)
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from launcher import protocol as P
from launcher.bundle import manifest, sweep_record
from launcher.config import ranges
from launcher.errors import ConfigError, LauncherError, SlurmUnavailable, SubmissionError, as_command
from launcher.evals import arms, evaluate
from launcher.evals import report as evals_report
from launcher.export.exporter import export
from launcher.ledger.report import ledger_command, run_ledger_line, sweep_ledger_line
from launcher.report import compare
from launcher.retention import report as checkpoints_report
from launcher.runs import rerun, sweep
from launcher.runs.submission import export_lines, follow_to_end, record_export, report_end
from launcher.slurm import client, follow


def _resolve_target(target: str) -> tuple[str, Path, str, manifest.Manifest | None]:
    """A bundle directory (or its manifest) or a job id -> (job id, log path, target to show, manifest or None)."""
    path = Path(target)
    if path.name == P.MANIFEST:
        path = path.parent
    if (path / P.MANIFEST).is_file():
        try:
            run = manifest.load(path)
            job_id, log_path = run.job_id, run.log
        except (OSError, ValueError, KeyError) as e:
            raise LauncherError(f"cannot read the manifest of {path}: {e}") from None
        if not job_id:
            raise LauncherError(f"{path} was never submitted ({run.not_submitted})")
        return job_id, log_path, str(path), run
    if client.JOB_ID.match(target):
        log = client.job_log_path(target)
        if log is None:
            raise LauncherError(f"Slurm does not know job {target}; give its bundle directory instead")
        return target, log, target, None
    raise LauncherError(f"{target} is neither a bundle directory nor a job id")


def _sweep_action(action: str, directory: Path) -> int:
    """status, attach or cancel for every run of a sweep."""
    if action == "attach":
        return sweep.follow(directory)
    record = sweep_record.load(directory)
    job_ids = [p.job_id for p in record.submitted if p.job_id]
    states = client.job_states_many(job_ids)  # one controller query for them all
    if action == "cancel":
        live = [job_id for job_id, state in states.items() if not state.terminal]
        for job_id in live:
            client.cancel(job_id)
        print(f"Cancelled {len(live)} job(s): {' '.join(live) or 'none was still running'}.")
        return 0
    for point in record.submitted:
        if (state := states.get(point.job_id or "")) is not None and state.terminal:
            sweep.judge_point(point, state)  # as `status` of one run does
    print(sweep.results(directory, {k: v.state for k, v in states.items()}, plot=False))
    print(sweep_ledger_line(record))
    return 0


def _status(job_id: str, log: Path, run: manifest.Manifest | None) -> int:
    """The job's state; once it has ended, the verdict on why (recorded in the manifest) too."""
    state = client.job_state(job_id)
    if state is None:
        raise SubmissionError(f"Slurm no longer knows job {job_id}")
    if state.terminal:
        report_end(state, log, run)
    else:
        print(follow.describe(state))
    print(f"  log: {log}")
    if run is not None:
        print(run_ledger_line(run, state))
        if run.export_job_id is not None:  # --export_hf
            export = client.job_state(run.export_job_id)
            said = follow.describe(export) if export and not export.terminal else (export.state if export else "gone")
            print(f"  export: job {run.export_job_id}, {said}")
            if export is not None and export.terminal and "export" not in run.data:
                record_export(run, export)
            for line in export_lines(run):
                print(line)
    return 0


def bundle_of(target: str, configs_path: Path) -> manifest.Manifest:
    """A run's manifest, from its bundle directory (or manifest), or its job id: the newest bundle under
    `configs_path` that names the job, else the bundle of the script Slurm runs for it."""
    path = Path(target)
    path = path.parent if path.name == P.MANIFEST else path
    unasked = ""
    if not (path / P.MANIFEST).is_file() and client.JOB_ID.match(target):
        found = [b for b in configs_path.glob(f"*/*/{P.MANIFEST}") if _job_of(b) == target]
        try:
            script = None if found else client.job_script(target)
        except SlurmUnavailable as e:
            script, unasked = None, f" (and Slurm could not be asked: {e})"
        if found:
            path = max(found, key=lambda b: b.stat().st_mtime).parent
        elif script is not None:
            path = _bundle_of_script(script) or path
    if not (path / P.MANIFEST).is_file():
        raise LauncherError(
            f"{target} is neither a bundle directory nor a job id with a bundle under {configs_path}{unasked}: give "
            "the run's bundle directory (logs/configs/RUN/STAMP), or --configs_path"
        )
    try:
        return manifest.load(path)
    except (OSError, ValueError) as e:
        raise LauncherError(f"cannot read the manifest of {path}: {e}") from None


def _job_of(manifest_path: Path) -> str | None:
    try:
        return manifest.load(manifest_path).job_id
    except (OSError, ValueError):
        return None


FORMER_NODE_SCRIPT = "LAUNCHER_NODE_SCRIPT="  # a batch script written before job.json exported its node script's path


def _bundle_of_script(script: Path) -> Path | None:
    """The bundle directory a launcher's batch script runs: where its supervisor's job.json lies (in a script
    written before job.json: its node script)."""
    try:
        for line in script.read_text(encoding="utf-8").splitlines():
            if line.startswith("#"):
                continue
            if "launcher.node.supervisor" in line:
                found = [Path(w) for w in shlex.split(line) if Path(w).name == P.JOB_FILE]
                if found:
                    return found[0].parent
            if line.removeprefix("export ").startswith(FORMER_NODE_SCRIPT):
                return Path(shlex.split(line.partition("=")[2], comments=True)[0]).parent
    except (OSError, ValueError, IndexError):
        return None
    return None


def _diff(a: str, b: str, configs_path: Path, as_json: bool, tolerance: float) -> int:
    runs = bundle_of(a, configs_path), bundle_of(b, configs_path)
    found = compare.diff(*runs, (compare.name_of(runs[0], a), compare.name_of(runs[1], b)), tolerance)
    print(json.dumps(found.record(), indent=2) if as_json else compare.render(found))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobs", description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    target = "a bundle or sweep directory (logs/configs/RUN/STAMP) or a Slurm job id"
    for name, what in (("status", "a run's or a sweep's state"), ("attach", "follow it to its end"),
                       ("cancel", "cancel its job(s)")):  # fmt: skip
        actions.add_parser(name, help=what).add_argument("target", help=target)
    ledger = actions.add_parser("ledger", help="where the GPU-hours of a run, a sweep or a period's runs went")
    ledger.add_argument("target", nargs="?", help=target + "; none: every run under --configs_path since --since")
    ledger.add_argument("--since", help="runs launched since this date (YYYY-MM-DD[THH:MM]; default: 7 days)")
    rerun_ = actions.add_parser("rerun", help="the run again, from its bundle's own config and resolved flags")
    rerun_.add_argument("target", help="a run's bundle directory or job id")
    rerun_.add_argument("--run_name", help="the rerun's name (default: the original's)")
    rerun_.add_argument("--dry_run", action="store_true", help="write the rerun's bundle, do not submit")
    rerun_.add_argument("--strict", action="store_true", help="refuse where the environment differs at all")
    rerun_.add_argument("--resume", action="store_true", help="continue the original's checkpoints")
    rerun_.add_argument("--show_logs", action="store_true", help="follow the rerun to its end")
    diff = actions.add_parser("diff", help="what differs between two runs, and where their losses part")
    diff.add_argument("a", help="a run's bundle directory or job id")
    diff.add_argument("b", help="another run's bundle directory or job id")
    diff.add_argument("--json", action="store_true", help="the differences as JSON, for scripts")
    diff.add_argument("--tolerance", type=_tolerance, default=compare.TOLERANCE,
                      help="losses part where |a - b| > this x max(1, |a|, |b|) (default: %(default)g)")  # fmt: skip
    export_ = actions.add_parser("export", help="a checkpoint of the run as a transformers Llama folder")
    export_.add_argument("target", help="a run's bundle directory or job id")
    export_.add_argument("--step", type=_step, help="the checkpoint's step (default: the newest complete one)")
    export_.add_argument("--output", type=Path, help="the folder to write (default: CHECKPOINTS/hf-step-N); never "
                         "overwritten")  # fmt: skip
    export_.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                         help="the weights' type (default: %(default)s)")  # fmt: skip
    checkpoints_ = actions.add_parser("checkpoints", help="every checkpoint on disk, why it stays, what was removed")
    checkpoints_.add_argument("target", help="a run's bundle directory or job id")
    evals = actions.add_parser("evals", help="the eval scores of a run or a sweep (--eval_tasks), and their picture")
    evals.add_argument("target", help=target)
    evals.add_argument("--rank_by", help="a sweep: rank its points by this task's score (TASK or TASK:METRIC)")
    verdict = actions.add_parser("verdict", help="which arm of a sweep is better, by how much, and how sure")
    arms.add_arguments(verdict)
    evaluate_ = actions.add_parser("evaluate", help="score checkpoints already on disk (the run's eval job)")
    evaluate.add_arguments(evaluate_)
    for sub in (ledger, rerun_, diff, export_, checkpoints_, evals, verdict, evaluate_):
        sub.add_argument("--configs_path", type=Path, default=Path("logs/configs"), help="where the runs' bundles are")
    return parser


def _unusable_paths(args: argparse.Namespace) -> int:
    """The runs named and --configs_path, where no filesystem holds them: one line each, before any look."""
    lines = []
    for name, shown in (("target", "BUNDLE"), ("a", "A"), ("b", "B"), ("configs_path", "--configs_path"),
                        ("output", "--output")):  # fmt: skip
        value = getattr(args, name, None)
        if isinstance(value, list):  # argparse's reading of `--configs_path=--`: nothing
            lines.append(f"{shown}: no path given; give one")
            continue
        problem = None if value is None else ranges.unusable_path(name, str(value))
        if problem is not None:
            lines.append(f"{shown}: {problem.message}; {problem.fix.replace(f'--{name}', shown)}")
    if lines:
        raise ConfigError("\n".join(lines))
    return 0


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite number of 0 or more (the default is {compare.TOLERANCE:g})"
        )
    return value


def _step(text: str) -> int:
    if not text.isdigit() or len(text) > 12:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number (0 or more)")
    return int(text)


def _evals(target: str, configs_path: Path, rank_by: str | None) -> int:
    sweep_dir = sweep_record.directory_of(Path(target))
    if sweep_dir is None:
        return evals_report.command(bundle_of(target, configs_path), rank_by)
    from launcher.evals import decide  # numpy: only where a sweep is ranked

    ranked = evals_report.ranking_lines
    return evals_report.command(sweep_dir, rank_by, lambda p, by, d: decide.ranking_lines(p, by, ranked, d))


def _verdict(args: argparse.Namespace) -> int:
    from launcher.evals import decide  # numpy: only where a verdict is asked for

    targets = [sweep_record.directory_of(Path(t)) or bundle_of(t, args.configs_path).bundle_dir for t in args.targets]
    asked = arms.asked_of(targets, args)
    return decide.command(asked, args.json, decide.hours_from_ledger if asked.at == "gpu_hours" else None)


def _evaluate(args: argparse.Namespace) -> int:
    sweep_dir = sweep_record.directory_of(Path(args.target))
    if sweep_dir is not None:
        return evaluate.command([p.bundle for p in sweep_record.load(sweep_dir).points], args)
    return evaluate.command([bundle_of(args.target, args.configs_path).bundle_dir], args)


def _checkpoints(target: str, configs_path: Path) -> int:
    sweep_dir = sweep_record.directory_of(Path(target))
    if sweep_dir is not None:
        return checkpoints_report.command(sweep_dir)
    return checkpoints_report.show(bundle_of(target, configs_path))


def _rerun(args: argparse.Namespace) -> int:
    run = bundle_of(args.target, args.configs_path)
    try:
        return rerun.rerun(run, args.run_name, args.dry_run, args.strict, args.resume, args.show_logs)
    except SlurmUnavailable as e:  # (a dry run asks Slurm nothing)
        raise SlurmUnavailable(f"{e} Or give `jobs rerun --dry_run`: the rerun's bundle written, nothing submitted.") \
            from None  # fmt: skip


def _export(args: argparse.Namespace, argv: list[str]) -> int:
    return export(bundle_of(args.target, args.configs_path), args.step, args.output, args.dtype, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    problem = as_command(lambda: _unusable_paths(args))
    if problem:
        return problem
    if args.action == "ledger":
        return as_command(lambda: ledger_command(args.target, args.since, args.configs_path))
    if args.action == "export":
        return as_command(lambda: _export(args, argv))
    if args.action == "checkpoints":
        return as_command(lambda: _checkpoints(args.target, args.configs_path))
    if args.action == "evals":
        return as_command(lambda: _evals(args.target, args.configs_path, args.rank_by))
    if args.action == "verdict":
        return as_command(lambda: _verdict(args))
    if args.action == "evaluate":
        return as_command(lambda: _evaluate(args))
    if args.action == "diff":
        return as_command(lambda: _diff(args.a, args.b, args.configs_path, args.json, args.tolerance))
    if args.action == "rerun":
        return as_command(lambda: _rerun(args))
    return as_command(lambda: _act(args.action, args.target))


def _act(action: str, target_text: str) -> int:
    sweep_dir = sweep_record.directory_of(Path(target_text))
    if sweep_dir is not None:
        return _sweep_action(action, sweep_dir)
    job_id, log, target, run = _resolve_target(target_text)
    if action == "attach":
        return follow_to_end(job_id, log, target, run)
    if action == "cancel":
        client.cancel(job_id)
        print(f"Cancelled job {job_id}.")
        return 0
    return _status(job_id, log, run)
