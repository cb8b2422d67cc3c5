"""The flags' own checks, pure: every problem with a resolved spec, each naming the flag and the fix.

It reads the spec and local files (a dataset, a tokenizer, the training script), never the cluster: the cluster's
checks, `launcher.slurm.checks`, ask the world as it is now (output directories, disk, the jobs a dependency
names, Slurm's verdict). `launcher.runs.launch.check` runs both and reports every problem at once.

The model/parallelism rules live in `launcher.nanotron_config.parallel`, shared with the training job, so the launcher
and the trainer cannot disagree about what nanotron accepts. Patterns are matched whole (`fullmatch`): a trailing
line break is not a safe run name.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess

from launcher.config import (
    container,
    datacheck,
    dialect_rules,
    extra_env,
    hostlist,
    nanosetcheck,
    ranges,
    runtime,
)
from launcher.config.flags import GROUPS
from launcher.config.slurm_values import (
    EMAIL,
    NO_TIME_LIMIT,
    PLACEMENT,
    RUN_NAME,
    SBATCH_UNSAFE,
    TIME_LIMIT,
    time_limit_seconds,
)
from launcher.config.spec import RunSpec
from launcher.evals import checks as eval_checks
from launcher.nanotron_config import mixture, stages
from launcher.nanotron_config.datasource import is_local_path
from launcher.nanotron_config.parallel import check_layout
from launcher.nanotron_config.schema import train_split
from launcher.problems import Problem
from launcher.retention import checks as retention_checks
from launcher.secrets_guard import has_secret_value, secret_assignments

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
SEED_MAX = 2**32 - 1  # numpy's seed range


def _check_training(spec: RunSpec) -> list[Problem]:
    t, out = spec.args.training, []
    for flag in ("train_steps", "micro_batch_size", "grad_accum_steps"):
        if getattr(t, flag) <= 0:
            out.append(Problem(flag, f"must be positive, got {getattr(t, flag)}", f"give --{flag} >= 1"))
    if not 0 <= t.seed <= SEED_MAX:
        out.append(Problem("seed", f"must be within [0, {SEED_MAX}], got {t.seed}", "e.g. --seed 42"))
    for flag in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if not math.isfinite(getattr(t, flag)):
            out.append(Problem(flag, f"must be a finite number, got {getattr(t, flag)}", f"give a number to --{flag}"))
    if any(p.flag != "seed" for p in out):
        return out  # comparisons with nan or inf would say nothing useful
    if t.learning_rate <= 0:
        out.append(Problem("learning_rate", f"must be positive, got {t.learning_rate}", "e.g. --learning_rate 3e-4"))
    if t.min_lr < 0 or t.min_lr > t.learning_rate:
        out.append(
            Problem(
                "min_lr",
                f"--min_lr {t.min_lr} must be within [0, --learning_rate {t.learning_rate}]",
                f"use --min_lr {t.learning_rate / 10:g}",
            )
        )
    if t.warmup_steps < 0 or t.warmup_steps > t.train_steps:
        out.append(
            Problem(
                "warmup_steps",
                f"--warmup_steps {t.warmup_steps} must be within [0, --train_steps {t.train_steps}]",
                f"use --warmup_steps {max(t.train_steps // 10, 0)}",
            )
        )
    if t.weight_decay < 0:
        out.append(Problem("weight_decay", f"must be >= 0, got {t.weight_decay}", "e.g. --weight_decay 0.01"))
    if t.grad_clip < 0:
        out.append(Problem("grad_clip", f"must be >= 0, got {t.grad_clip}", "use 0 to disable clipping"))
    if t.lr_decay_style not in ("cosine", "linear"):
        out.append(Problem("lr_decay_style", f"unknown style {t.lr_decay_style!r}", "use cosine or linear"))
    if spec.shape.max_seq_len <= 0:
        out.append(Problem("max_seq_len", f"must be positive, got {spec.shape.max_seq_len}", "e.g. 2048"))
    return out


def _check_slurm(spec: RunSpec) -> list[Problem]:
    s = spec.args.slurm
    out = _check_allocation(spec) + _check_time(spec)
    out += _check_names(spec) + _check_requeue(spec) + extra_env.problems(spec) + _check_pre_launch(spec)
    if not os.path.isabs(s.tmp_dir):
        out.append(Problem("tmp_dir", f"{s.tmp_dir!r} is not an absolute path", "e.g. --tmp_dir /tmp"))
    image = spec.args.container.container_image
    if s.python and os.sep in s.python and not os.access(s.python, os.X_OK) and not (image and os.path.isabs(s.python)):
        out.append(Problem("python", f"{s.python} is not an executable", "give the path of a python"))
    out += container.problems(spec.args.container, s.python)
    return out


def _check_allocation(spec: RunSpec) -> list[Problem]:
    s, out = spec.args.slurm, []
    for flag in ("nodes", "gpus_per_node"):
        if getattr(s, flag) <= 0:
            out.append(Problem(flag, f"must be positive, got {getattr(s, flag)}", f"give --{flag} >= 1"))
    for flag in ("spare_nodes", "max_restarts"):
        if getattr(s, flag) < 0:
            out.append(Problem(flag, f"must be 0 or more, got {getattr(s, flag)}", f"give --{flag} >= 0"))
    if s.spare_nodes and not s.max_restarts:
        why = f"--spare_nodes {s.spare_nodes} with --max_restarts 0: the spares would never be used"
        out.append(Problem("spare_nodes", why, "leave out --spare_nodes, or give --max_restarts >= 1"))
    if s.spare_nodes > 0 and spec.args.execution.interactive:  # a shell's node step runs on the layout's nodes
        why = "--interactive allocates the nodes for a shell, where no batch script restarts training on a spare"
        out.append(Problem("spare_nodes", why, "leave out --spare_nodes with --interactive"))
    if s.cpus_per_node is not None and s.cpus_per_node <= 0:
        out.append(Problem("cpus_per_node", f"must be positive, got {s.cpus_per_node}", "leave it out for the default"))
    return out


def _check_time(spec: RunSpec) -> list[Problem]:
    s = spec.args.slurm
    if s.time_limit.upper() in NO_TIME_LIMIT:
        return []  # no limit: the warning signal still comes before a preemption
    if not TIME_LIMIT.fullmatch(s.time_limit):
        fix = "use HH:MM:SS, e.g. 24:00:00 (or D-HH:MM:SS, minutes, UNLIMITED)"
        return [Problem("time_limit", f"{s.time_limit!r} is not a Slurm time", fix)]
    if s.max_requeues and time_limit_seconds(s.time_limit) <= s.signal_grace:
        message = f"{s.signal_grace} s is not shorter than --time_limit {s.time_limit}"
        return [Problem("signal_grace", message, "use a longer --time_limit or a shorter --signal_grace")]
    return []


def _check_names(spec: RunSpec) -> list[Problem]:
    """The e-mail, placement and account values that reach #SBATCH lines."""
    s, out = spec.args.slurm, []
    if s.email is not None and not EMAIL.fullmatch(s.email):
        out.append(Problem("email", f"{s.email!r} is not an e-mail address", "use name@example.org"))
    for name, (pattern, what, example) in PLACEMENT.items():
        value = getattr(s, name)
        if value is not None and not pattern.fullmatch(value):
            out.append(Problem(name, f"{value!r} is not {what}", f"e.g. --{name} {example}"))
    out += hostlist.nodelist_problems(s.nodelist, s.exclude, s.nodes, max(s.spare_nodes, 0))
    names = ("partition", "qos", "account", "export_partition")
    for name, value in [*((n, getattr(s, n)) for n in names), ("eval_partition", spec.args.evals.eval_partition)]:
        if value is not None and not re.fullmatch(r"[\w.-]+", value):
            what = {"qos": "QOS", "account": "account"}.get(name, "partition")  # (--export_/--eval_partition's too)
            out.append(Problem(name, f"{value!r} is not a Slurm {what} name", "use letters, digits, '.', '_', '-'"))
    x = spec.args.execution
    if x.export_hf and x.interactive:  # a shell's session is no batch job that an export could follow (afterok)
        out.append(Problem("export_hf", "--interactive submits no batch job for the export job to follow",
                           "leave out --export_hf; export by hand: python -m launcher.jobs export BUNDLE"))  # fmt: skip
    if s.export_partition is not None and not x.export_hf:
        out.append(Problem("export_partition", "it names the partition of --export_hf's job, which was not asked for",
                           "add --export_hf, or leave out --export_partition"))  # fmt: skip
    return out


def _check_requeue(spec: RunSpec) -> list[Problem]:
    s = spec.args.slurm
    if s.max_requeues >= 0 and s.signal_grace >= 10:
        return []
    return [
        Problem(
            "max_requeues" if s.max_requeues < 0 else "signal_grace",
            f"got --max_requeues {s.max_requeues}, --signal_grace {s.signal_grace}",
            "use --max_requeues >= 0 and --signal_grace >= 10",
        )
    ]


def _check_pre_launch(spec: RunSpec) -> list[Problem]:
    """--pre_launch_commands: no literal secret, and shell that parses."""
    commands, out = spec.args.slurm.pre_launch_commands, []
    assigned = secret_assignments(commands or "")
    if assigned:
        out.append(
            Problem(
                "pre_launch_commands",
                f"it assigns {', '.join(assigned)} a literal value, which would be written to the bundle",
                "export the secret in your shell before launching instead (a $reference is fine)",
            )
        )
    if commands:
        out += _check_shell(commands)
    return out


def _check_job(spec: RunSpec) -> list[Problem]:
    j, out = spec.args.job, []
    if j.hang_timeout != 0 and j.hang_timeout < 10:
        out.append(
            Problem("hang_timeout", f"{j.hang_timeout} s is too short to start a run", "use 0 (no watchdog) or >= 10")
        )
    if j.startup_timeout is not None and j.hang_timeout == 0:
        fix = "give --hang_timeout (seconds), or leave --startup_timeout out"
        out.append(Problem("startup_timeout", "has no effect with --hang_timeout 0 (no watchdog)", fix))
    elif j.startup_timeout is not None and j.startup_timeout < 10:
        out.append(
            Problem("startup_timeout", f"{j.startup_timeout} s is too short to start a run", "use >= 10, e.g. 600")
        )
    if not j.hang_factor >= 2:  # (nan too)
        out.append(Problem("hang_factor", f"{j.hang_factor} would call a slow step a hang", "use 2 or more, e.g. 10"))
    return out + runtime.problems(j, spec.args.parallelism)


def _check_data_and_paths(spec: RunSpec) -> list[Problem]:
    a, out = spec.args, []
    if not RUN_NAME.fullmatch(a.run_name):
        out.append(
            Problem(
                "run_name",
                f"{a.run_name!r} is not safe as a file and job name",
                "use letters, digits, '.', '_', '-' (at most 64, starting with a letter or digit)",
            )
        )
    inputs = [*(("dataset", n) for n in mixture.names(spec.datasets)), ("tokenizer", a.data.tokenizer)]
    later = [("data_stages", n) for n in stages.dataset_names(spec.stages)]
    later = later or [("config", n) for n in stages.config_dataset_names(spec.base_config)]  # a --config's stages
    for flag, value in [*inputs, *later]:
        if not value or (flag != "tokenizer" and value.lower() == "none") or value in spec.nanosets:
            continue  # (a tokenized folder was read whole by resolution: `nanosetcheck`)
        if is_local_path(value) and not os.path.exists(os.path.expanduser(value)):  # as datacheck and the job read it
            out.append(Problem(flag, f"local path {value} does not exist", "give an existing path or a hub name"))
        elif is_local_path(value) and flag != "tokenizer":
            said = datacheck.dataset_problems(value, a.data.text_column, train_split(spec.base_config))
            out += [dataclasses.replace(p, flag=flag) if p.flag == "dataset" else p for p in said]  # a stage's too
        elif is_local_path(value):
            out += datacheck.tokenizer_problems(value)
        elif not is_local_path(value) and not HUB_NAME.fullmatch(value):
            out.append(Problem(flag, f"{value!r} is neither an existing path nor a hub name", "check the spelling"))
    vocab = spec.tokenizer_vocab
    if vocab and vocab > spec.shape.vocab_size:
        out.append(
            Problem(
                "vocab_size",
                f"the tokenizer at {a.data.tokenizer} has {vocab} tokens, more than --vocab_size {a.model.vocab_size}",
                f"use --vocab_size {-(-vocab // 64) * 64}",
            )
        )
    if not os.path.isfile(a.paths.run_train_script):
        out.append(
            Problem(
                "run_train_script",
                f"{a.paths.run_train_script} does not exist",
                "give the training script's path (default: run_train.py of this project)",
            )
        )
    if SBATCH_UNSAFE.search(a.paths.slurm_logs_path):
        out.append(
            Problem(
                "slurm_logs_path",
                "it contains a character that Slurm's #SBATCH --output cannot carry (\" % \\ or a line break)",
                "use a directory name without them",
            )
        )
    for flag, steps in (("save_interval", a.paths.save_interval), ("log_interval", a.logging.log_interval)):
        if steps <= 0:
            out.append(Problem(flag, f"must be positive, got {steps}", "give a number of steps >= 1"))
    profiling = a.logging.profiler_export_path or spec.base_config.get("profiler")  # the flag, or --config's
    flag = "profiler_export_path" if a.logging.profiler_export_path else "config"
    if profiling and spec.dialect.dialect == "0.4" and a.training.train_steps >= 10:
        why = "nanotron 0.4 only profiles runs of fewer than 10 steps (it asserts so at start-up)"
        out.append(Problem(flag, why, "use --train_steps 9 or less with the profiler"))
    if profiling and spec.dialect.dialect == "main":
        section = spec.base_config.get("profiler") or {}
        p = {
            k: section.get(k, d)
            for k, d in (("skip_first", 3), ("repeat", 1), ("wait", 1), ("warmup", 1), ("active", 1))
        }
        needed = p["skip_first"] + p["repeat"] * (p["wait"] + p["warmup"] + p["active"])
        if a.training.train_steps < needed:
            why = f"nanotron main profiles {needed} steps (skip_first + repeat x (wait + warmup + active))"
            out.append(Problem(flag, why, f"use --train_steps {needed} or more with the profiler"))
    return out


def _check_shell(commands: str) -> list[Problem]:
    """`bash -n` on --pre_launch_commands: a syntax error is found now, not when the job starts. A warning is a
    problem too: an unterminated here-document (`cat <<EOF` without its EOF) parses, with a warning, and swallows
    the rest of the batch script, so the job would end COMPLETED without training."""
    text = commands.encode("utf-8", "surrogateescape")  # bytes typed that are not UTF-8: as typed (`ranges` says)
    out = subprocess.run(["bash", "-n"], input=text, capture_output=True)
    said = out.stderr.decode("utf-8", "replace").strip()
    if out.returncode == 0 and not said:
        return []
    first = said.splitlines()[0].removeprefix("bash: ") if said else "syntax error"
    return [Problem("pre_launch_commands", f"the commands do not parse cleanly ({first})", "fix their shell syntax")]


def _check_secrets(spec: RunSpec) -> list[Problem]:
    """Any flag whose value looks like a token or key: it would be written to the bundle."""
    out = []
    for name in GROUPS:
        group = getattr(spec.args, name)
        for field in dataclasses.fields(group):
            value = getattr(group, field.name)
            if isinstance(value, str) and has_secret_value(value):
                out.append(
                    Problem(
                        field.name,
                        "it holds what looks like a token or key, and flags are written to the bundle",
                        "export the secret in your shell before launching (the job inherits it; no file holds it)",
                    )
                )
    return out


def validate(spec: RunSpec) -> list[Problem]:
    """Every problem with a resolved spec, in flag order; values no run takes first (`ranges`: the layout's
    rules wait until they are fixed, and what other checks say of such a flag is left unsaid), each problem once."""
    bounded = ranges.problems(spec.args)
    layout = check_layout(spec.shape, spec.dims) if spec.world_size > 0 and not bounded else []
    layout += _check_modes(spec) + dialect_rules.written_problems(spec)
    checks = _check_slurm(spec) + layout + _check_training(spec) + _check_data_and_paths(spec) + _check_job(spec)
    checks += retention_checks.problems(spec.args.paths)
    checks += nanosetcheck.problems(spec) + eval_checks.problems(spec)
    said = {p.flag for p in bounded}
    return list(dict.fromkeys(_check_secrets(spec) + bounded + [p for p in checks if p.flag not in said]))


MODES = {  # flag -> (what nanotron 0.4 takes, the fix)
    "zero_stage": ((0, 1), "use --zero_stage 1 to shard the optimizer states over dp, or 0"),
    "pp_engine": (("1f1b", "afab"), "use --pp_engine 1f1b (afab holds every micro-batch's activations)"),
    "tp_mode": (("REDUCE_SCATTER", "ALL_REDUCE"), "use --tp_mode REDUCE_SCATTER (sequence parallel) or ALL_REDUCE"),
    "layout": (("manual", "auto"), "use --layout auto for the planner's best, or manual (--plan shows the table)"),
}


def _check_modes(spec: RunSpec) -> list[Problem]:
    p, out = spec.args.parallelism, []
    for flag, (allowed, fix) in MODES.items():
        value = getattr(p, flag)
        if value not in allowed:
            out.append(Problem(flag, f"{value!r} is not one of {', '.join(map(str, allowed))}", fix))
    return out
