"""`python -m launcher.jobs rerun BUNDLE`: the run again, from the bundle's own config and resolved flags, not from
today's presets and defaults: a new bundle, and a new checkpoint directory unless `--resume` continues the
original's checkpoints.

Before anything is written it says what differs from the original's environment (`launcher.report.environment`:
the launcher's commit and state, package versions, nanotron's commit, the Slurm release, the data and tokenizer
fingerprints, the GPU planned for), which input files of the original's resolution have changed since (a preset,
the base config) and what today's would have made of its command line, and whether the config it writes is the
bundle's; `--strict` refuses on any difference. The rerun's manifest names the bundle it came from (`rerun_of`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from launcher import protocol as P
from launcher.bundle import manifest
from launcher.config import cli
from launcher.config.flags import GROUPS, flag_names
from launcher.config.resolve import resolve
from launcher.config.spec import RunSpec
from launcher.errors import ConfigError, LauncherError
from launcher.nanotron_config import mixture, provenance, schema
from launcher.problems import report
from launcher.report import compare
from launcher.report import environment as env
from launcher.runs import launch
from launcher.slurm import client

ORIGINAL, RERUN = "the original", "the rerun"
DROPPED = {"execution"}  # what to do with a bundle is the rerun's to say, not the original's
PROJECT = Path(__file__).resolve().parents[1]


def _flag(name: str, value: Any) -> str:
    """One flag as the command line takes it (`--x=VALUE`, so a value may start with a dash; alone for None)."""
    if value is None:
        return f"--{name}"
    if isinstance(value, bool):
        return f"--{name}={'true' if value else 'false'}"
    return f"--{name}={value!r}" if isinstance(value, float) else f"--{name}={value}"


def command_line(run: manifest.Manifest, run_name: str, dry_run: bool, resume: bool, show_logs: bool) -> list[str]:
    """The launcher's command line that makes the bundle's run again: every resolved flag typed (so no preset or
    default decides anything), the bundle's config.yaml as --config (what no flag sets), layout manual (the layout
    the original resolved)."""
    resolved = run.data.get("resolved") or {}
    known = set(flag_names())
    argv = ["--run_name", run_name, f"--config={run.bundle_dir / P.CONFIG}"]
    for group, values in resolved.items():
        if group in DROPPED or not isinstance(values, dict):
            continue
        argv += [_flag(k, v) for k, v in values.items() if k in known and k not in ("resume", "layout")]
    kept = (resolved.get("execution") or {}).get("skip_memory_check", False)
    flags = {"layout": "manual", "resume": resume, "dry_run": dry_run, "show_logs": show_logs}
    return argv + [_flag(k, v) for k, v in {**flags, "skip_memory_check": kept}.items()]


def not_carried(run: manifest.Manifest) -> list[str]:
    """Flags of today's launcher the bundle does not record (added since): today's defaults decide them."""
    resolved = run.data.get("resolved") or {}
    recorded = {k for group, values in resolved.items() if isinstance(values, dict) for k in values}
    skipped = {f.name for f in dataclasses.fields(GROUPS["execution"])}
    return [name for name in flag_names() if name not in recorded | skipped | {"run_name"}]


def no_longer_flags(run: manifest.Manifest) -> list[str]:
    """Flags the bundle recorded that today's launcher no longer has: the rerun cannot set them as the original."""
    resolved = run.data.get("resolved") or {}
    known = set(flag_names())
    return [k for group, values in resolved.items() if group not in DROPPED and isinstance(values, dict)
            for k in values if k not in known]  # fmt: skip


def parsed_line(argv: list[str]) -> cli.Parsed:
    """The rerun's command line parsed. --model_size only labels the run: the bundle's values are all typed, and
    the preset must not win over the bundle's config for what no flag sets (tie_word_embeddings)."""
    try:
        args, explicit = cli.parse(argv)
    except SystemExit:
        raise ConfigError("the bundle's resolved flags no longer parse with this launcher (above)") from None
    return cli.Parsed(args, explicit - {"model_size"})


def _sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def changed_inputs(run: manifest.Manifest) -> list[str]:
    """The files the original's flags were resolved from that differ today (the preset, the base config)."""
    out = []
    for name, found in (run.data.get("inputs") or {}).items():
        if isinstance(found, dict) and found.get("path") and _sha256(found["path"]) != found.get("sha256"):
            out.append(f"{found['path']} (the run's {name.replace('_', ' ')}) has changed since the launch")
    return out


def today_would(run: manifest.Manifest) -> list[str]:
    """What today's presets and defaults make of the original's command line, where it differs from the bundle."""
    try:
        argv = shlex.split(run.data["command"])[2:]
        args, explicit = cli.parse(argv)
        spec, _ = resolve(args, explicit, cwd=Path(run.data["cwd"]))
    except (KeyError, ValueError, SystemExit, OSError, LauncherError):
        return []
    today = dataclasses.asdict(spec.args)
    resolved = run.data.get("resolved") or {}
    auto = (resolved.get("parallelism") or {}).get("layout") == "auto"  # the planner's choices: not resolution's
    later = {"cpus_per_node"} | ({"micro_batch_size", "grad_accum_steps"} if auto else set())  # the launch decides
    out = []
    for group, values in resolved.items():
        if group in {*DROPPED, "paths"} or (auto and group == "parallelism") or not isinstance(values, dict):
            continue
        for name, value in values.items():
            now = (today.get(group) or {}).get(name, value)
            if now != value and name not in later:
                out.append(f"--{name} {now!r} (the bundle's {value!r}, which the rerun keeps)")
    return out


def config_changes(spec: RunSpec, run: manifest.Manifest) -> list[tuple[str, str, str]]:
    """Where the config the rerun writes differs from the bundle's (besides the run's name and place)."""
    written = compare.flatten(schema.written(spec.config, spec.dialect.dialect, str(spec.checkpoints_dir)))
    rows, _ = compare.rows_of(compare.config_of(run), written, compare.PLACE_KEYS)
    return [("config " + r.name, r.a, r.b) for r in rows]


PROBE = (
    "import json, sys; from importlib import metadata; from launcher.nanotron_config.provenance import "
    "nanotron_install as n\ntry:\n    t = metadata.version('torch')\nexcept metadata.PackageNotFoundError:\n"
    "    t = None\nprint(json.dumps({'nanotron': n(sys.path[1:]), 'torch': t}))"
)


def job_python(python: str | None) -> dict[str, Any]:
    """The job's Python's nanotron and torch, as the job would record them (this process, or that Python run)."""
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        return {"nanotron": provenance.nanotron_install(sys.path), "torch": manifest.versions().get("torch")}
    try:
        done = subprocess.run([python, "-c", f"import sys; sys.path.insert(0, {str(PROJECT)!r})\n{PROBE}"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def now(spec: RunSpec) -> env.Facets:
    """The facets a rerun of `spec` launched now would have, as far as the login node can see them."""
    out: env.Facets = {"launcher": env.launcher_facet(manifest.project_state())}
    out.update({f"package {k}": env.Facet(v, "-" if v is None else str(v)) for k, v in manifest.versions().items()})
    out["gpu planned for"] = env.Facet(spec.gpu.gpu.name, spec.gpu.gpu.name)
    # the job's Python as this login node sees it; in a container, the image's: not seen here (unconfirmed)
    job = {} if spec.args.container.container_image else job_python(spec.args.slurm.python)
    if "nanotron" in job:
        out["nanotron (job)"] = env.nanotron_facet(job["nanotron"])
        out["torch (job)"] = env.Facet(job.get("torch"), str(job.get("torch")))
    try:
        release = client.release()
    except LauncherError:
        release = None
    if release:
        out["slurm"] = env.Facet(release, release)
    cache = provenance.hub_cache({**os.environ, **spec.extra_env})  # the job's HF_HOME where --extra_env sets it
    names: list[str | None] = [*mixture.names(spec.datasets)] or [None]
    names += [n for s in spec.stages for n in mixture.names(s.dataset)]
    for name in dict.fromkeys(names):
        out[env.DATA + (name or provenance.RANDOM)] = env.data_facet(provenance.fingerprint(name, "datasets", cache))
    out[env.TOKENIZER] = env.data_facet(provenance.fingerprint(spec.args.data.tokenizer, "models", cache))
    return out


def _lines(label: str, items: list[str]) -> list[str]:
    return [f"  {label if n == 0 else '':<12} {item}" for n, item in enumerate(items)]


def rerun(run: manifest.Manifest, run_name: str | None, dry_run: bool, strict: bool, resume: bool,
          show_logs: bool) -> int:  # fmt: skip
    """Launch the bundle's run again (see the module's docstring); the launch's exit code."""
    name = run_name or str(run.data.get("run_name") or run.bundle_dir.parent.name)
    argv = command_line(run, name, dry_run, resume, show_logs)
    parsed = parsed_line(argv)
    placed: dict[str, Any] = {"checkpoints": run.checkpoints} if resume else {"fresh": True}
    with client.fail_fast():  # the checks' questions to Slurm; following the job is outside
        prepared = _checked_and_prepared(run, name, argv, parsed, placed, strict)
    return launch.submit_prepared(prepared)


def _checked_and_prepared(run: manifest.Manifest, name: str, argv: list[str], parsed: cli.Parsed,
                          placed: dict[str, Any], strict: bool) -> launch.Prepared:  # fmt: skip
    """The rerun's checks, what it says of the original, and its bundle written."""
    spec, problems = launch.check(argv, parsed, **placed)
    if problems:
        raise ConfigError(report(problems))
    compared = env.compare(env.of_run(run), now(spec), ORIGINAL, RERUN)
    differ = [f"{n}: {a} (the original) -> {b} (now)" for n, a, b in compared.differ + config_changes(spec, run)]
    pending = [n for n, why in compared.unconfirmed if why.startswith(ORIGINAL)]
    unrecorded = [n for n, why in compared.unconfirmed if why.startswith(RERUN)]
    unconfirmed = [f"{n}: {why}" for n, why in compared.unconfirmed if n not in pending + unrecorded]
    if pending:
        unconfirmed.append(f"{', '.join(pending)}: known once the rerun's job records them (jobs diff compares them)")
    if unrecorded:
        unconfirmed.append(f"{', '.join(unrecorded)}: the original's job recorded nothing to compare with (it never "
                           "started, or it was launched before the launcher recorded them)")  # fmt: skip
    lines = [f"Rerun of {run.bundle_dir}" + (f" (job {run.job_id})" if run.job_id else "") + f" as {name}:"]
    lines += _lines("from", [f"the bundle's resolved flags and {run.bundle_dir / P.CONFIG}, not today's presets"])
    lines += _lines("the same", [f"{len(compared.agree)} of the original's facets (launcher, packages, data, ...)"])
    if gone := no_longer_flags(run):
        differ.append(", ".join(f"--{n}" for n in gone) + ": recorded by the original, no flag of today's launcher")
    lines += _lines("differs", differ) + _lines("unconfirmed", unconfirmed)
    lines += _lines("changed", changed_inputs(run)) + _lines("today", today_would(run))
    if missing := not_carried(run):
        lines += _lines("not in it", [", ".join(f"--{n}" for n in missing) + ": today's defaults decide them"])
    print("\n".join(lines))
    if strict and differ:
        raise ConfigError(
            "--strict: the rerun would not run as the original did:\n"
            + "\n".join(f"  - {d}" for d in differ)
            + "\nNothing was written or submitted."
        )
    prepared = launch.prepare_all([argv], parsed=[parsed], checked=[(spec, problems)])[0]
    origin = {"bundle": str(run.bundle_dir.absolute()), "bundle_id": run.data.get("bundle_id"), "job_id": run.job_id,
              "differs": differ, "unconfirmed": unconfirmed, "changed_inputs": changed_inputs(run)}  # fmt: skip
    manifest.record_origin(manifest.load(prepared.paths.bundle_dir), origin)
    return prepared
