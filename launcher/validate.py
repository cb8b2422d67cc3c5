"""Validation: pure functions that return every problem at once, each naming the flag and the fix.

The model/parallelism checks (`check_layout`) are shared with the training job (`check_train_config`), so the
launcher and the trainer cannot disagree about what nanotron accepts.
"""

from __future__ import annotations

import os
import re

from launcher.problems import Problem
from launcher.spec import RunSpec, is_local_path
from launcher.train.config import TrainConfig

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# Slurm --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME_LIMIT = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2})$")
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
SECRET_NAME = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
SECRET_ASSIGNMENT = re.compile(r"\b\w*(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD)\w*\s*=\s*\S", re.IGNORECASE)
SBATCH_UNSAFE = re.compile(r'["%\\\n\r]')  # characters an #SBATCH --output path cannot carry


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def _choices(values: list[int]) -> str:
    return ", ".join(map(str, values[:-1])) + (" or " if len(values) > 1 else "") + str(values[-1])


def _nodes_for(replica: int, world: int, nodes: int) -> int:
    """The smallest node count whose GPUs hold a whole number of model replicas."""
    per_node = max(world // max(nodes, 1), 1)
    return next(n for n in range(1, replica + 1) if (n * per_node) % replica == 0)


def time_limit_seconds(text: str) -> int:
    """Seconds in a valid Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]])."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = parts
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def check_layout(
    *,
    world: int,
    dp: int,
    tp: int,
    pp: int,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    grad_accum: int,
    world_flags: str = "--nodes x --gpus_per_node",
    nodes_hint: int = 1,
) -> list[Problem]:
    """nanotron's constraints on model shape and parallelism (what it asserts at start-up, after the queue)."""
    out: list[Problem] = []
    sizes = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "vocab_size": vocab,
        "dp": dp,
        "tp": tp,
        "pp": pp,
    }
    for flag, value in sizes.items():
        if value <= 0:
            out.append(Problem(flag, f"must be a positive integer, got {value}", f"give --{flag} >= 1"))
    if out:
        return out
    if dp * tp * pp != world:
        if world % (tp * pp):
            out.append(
                Problem(
                    "tp",
                    f"--tp {tp} x --pp {pp} = {tp * pp} GPUs per model replica does not divide the job's "
                    f"{world} GPUs ({world_flags})",
                    f"make the job a multiple of {tp * pp} GPUs "
                    f"(e.g. --nodes {_nodes_for(tp * pp, world, nodes_hint)}) or lower --tp/--pp",
                )
            )
        else:
            out.append(
                Problem(
                    "dp",
                    f"--dp {dp} x --tp {tp} x --pp {pp} = {dp * tp * pp}, but the job has {world} GPUs "
                    f"({world_flags}); nanotron requires them equal",
                    f"use --dp {world // (tp * pp)} or leave --dp out to derive it",
                )
            )
    if heads % tp:
        ok = [d for d in divisors(heads) if d <= world]
        out.append(Problem("tp", f"--tp {tp} does not divide --num_heads {heads}", f"use --tp {_choices(ok)}"))
    if kv_heads % tp:
        ok = [d for d in divisors(kv_heads) if d <= world]
        out.append(Problem("tp", f"--tp {tp} does not divide --num_kv_heads {kv_heads}", f"use --tp {_choices(ok)}"))
    if heads % kv_heads:
        out.append(
            Problem(
                "num_kv_heads",
                f"--num_kv_heads {kv_heads} does not divide --num_heads {heads}",
                f"use --num_kv_heads {_choices(divisors(heads))}",
            )
        )
    if hidden % heads or (hidden // heads) % 2:
        out.append(
            Problem(
                "hidden_size",
                f"--hidden_size {hidden} / --num_heads {heads} is not an even head size",
                f"use a hidden size that is a multiple of {2 * heads}",
            )
        )
    if layers < pp:
        out.append(Problem("pp", f"--pp {pp} is more than --num_layers {layers}", f"use --pp <= {layers}"))
    if intermediate % tp:
        out.append(
            Problem(
                "intermediate_size",
                f"--intermediate_size {intermediate} is not divisible by --tp {tp}",
                f"use a multiple of {tp}, e.g. {-(-intermediate // tp) * tp}",
            )
        )
    if vocab % tp:
        out.append(
            Problem(
                "vocab_size",
                f"--vocab_size {vocab} is not divisible by --tp {tp}",
                f"use a multiple of {tp}, e.g. {-(-vocab // tp) * tp}",
            )
        )
    if pp > 1 and grad_accum < pp - 1:
        out.append(
            Problem(
                "grad_accum_steps",
                f"nanotron's 1F1B pipeline needs --grad_accum_steps >= --pp - 1 = {pp - 1}, got {grad_accum}",
                f"use --grad_accum_steps {pp - 1} or more",
            )
        )
    return out


def check_train_config(cfg: TrainConfig, world_size: int) -> list[Problem]:
    """The training job's start-up check: the same layout rules, against the processes actually started."""
    m = cfg.model
    return check_layout(
        world=world_size,
        dp=cfg.dp,
        tp=cfg.tp,
        pp=cfg.pp,
        hidden=m.hidden_size,
        intermediate=m.intermediate_size,
        layers=m.num_hidden_layers,
        heads=m.num_attention_heads,
        kv_heads=m.num_key_value_heads,
        vocab=m.vocab_size,
        grad_accum=cfg.grad_accum_steps,
        world_flags="processes started by torchrun",
    )


def _check_training(spec: RunSpec) -> list[Problem]:
    t, out = spec.args.training, []
    for flag in ("train_steps", "micro_batch_size", "grad_accum_steps"):
        if getattr(t, flag) <= 0:
            out.append(Problem(flag, f"must be positive, got {getattr(t, flag)}", f"give --{flag} >= 1"))
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
    if spec.shape.seq <= 0:
        out.append(Problem("max_seq_len", f"must be positive, got {spec.shape.seq}", "e.g. 2048"))
    return out


def _check_slurm(spec: RunSpec) -> list[Problem]:
    s, out = spec.args.slurm, []
    for flag in ("nodes", "gpus_per_node"):
        if getattr(s, flag) <= 0:
            out.append(Problem(flag, f"must be positive, got {getattr(s, flag)}", f"give --{flag} >= 1"))
    if not TIME_LIMIT.match(s.time_limit):
        out.append(Problem("time_limit", f"{s.time_limit!r} is not a Slurm time", "use HH:MM:SS, e.g. 24:00:00"))
    elif s.max_requeues and time_limit_seconds(s.time_limit) <= s.signal_grace:
        out.append(
            Problem(
                "signal_grace",
                f"{s.signal_grace} s is not shorter than --time_limit {s.time_limit}",
                "use a longer --time_limit or a shorter --signal_grace",
            )
        )
    if s.email is not None and not EMAIL.match(s.email):
        out.append(Problem("email", f"{s.email!r} is not an e-mail address", "use name@example.org"))
    for name, value in (("partition", s.partition), ("qos", s.qos), ("account", s.account)):
        if value is not None and not re.fullmatch(r"[\w.-]+", value):
            out.append(Problem(name, f"{value!r} is not a Slurm {name} name", "use letters, digits, '.', '_', '-'"))
    if s.max_requeues < 0 or s.signal_grace < 10:
        out.append(
            Problem(
                "max_requeues" if s.max_requeues < 0 else "signal_grace",
                f"got --max_requeues {s.max_requeues}, --signal_grace {s.signal_grace}",
                "use --max_requeues >= 0 and --signal_grace >= 10",
            )
        )
    secrets = [k for k in spec.extra_env if SECRET_NAME.search(k)]
    if secrets:
        out.append(
            Problem(
                "extra_env",
                f"{', '.join(secrets)} looks like a secret; flags are written to the bundle",
                "export it in your shell instead: the job inherits your environment without a file",
            )
        )
    if s.pre_launch_commands and SECRET_ASSIGNMENT.search(s.pre_launch_commands):
        out.append(
            Problem(
                "pre_launch_commands",
                "it assigns what looks like a secret, which would be written to the bundle",
                "export the secret in your shell before launching instead",
            )
        )
    if not os.path.isabs(s.tmp_dir):
        out.append(Problem("tmp_dir", f"{s.tmp_dir!r} is not an absolute path", "e.g. --tmp_dir /tmp"))
    if s.python and os.sep in s.python and not os.access(s.python, os.X_OK):
        out.append(Problem("python", f"{s.python} is not an executable", "give the path of a python"))
    return out


def _check_data_and_paths(spec: RunSpec) -> list[Problem]:
    a, out = spec.args, []
    if not RUN_NAME.match(a.run_name):
        out.append(
            Problem(
                "run_name",
                f"{a.run_name!r} is not safe as a file and job name",
                "use letters, digits, '.', '_', '-' (at most 64, starting with a letter or digit)",
            )
        )
    for flag, value in (("dataset", a.data.dataset), ("tokenizer", a.data.tokenizer)):
        if value is None:
            continue
        if is_local_path(value) and not os.path.exists(value):
            out.append(Problem(flag, f"local path {value} does not exist", "give an existing path or a hub name"))
        elif not is_local_path(value) and not HUB_NAME.match(value):
            out.append(Problem(flag, f"{value!r} is neither an existing path nor a hub name", "check the spelling"))
    vocab = spec.tokenizer_vocab
    if vocab and vocab > spec.shape.vocab:
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
    if a.paths.save_interval <= 0 or a.logging.log_interval <= 0:
        out.append(
            Problem(
                "save_interval" if a.paths.save_interval <= 0 else "log_interval",
                "must be positive",
                "give a number of steps >= 1",
            )
        )
    if a.logging.profiler_export_path and a.training.train_steps >= 10:
        out.append(
            Problem(
                "profiler_export_path",
                "nanotron only profiles runs of fewer than 10 steps",
                "use --train_steps 9 or less with the profiler",
            )
        )
    return out


def validate(spec: RunSpec) -> list[Problem]:
    """Every problem with a resolved spec, in flag order."""
    s, p, t = spec.shape, spec.args.parallelism, spec.args.training
    layout = (
        check_layout(
            world=spec.world_size,
            dp=p.dp or 0,
            tp=p.tp or 0,
            pp=p.pp or 0,
            hidden=s.hidden,
            intermediate=s.intermediate,
            layers=s.layers,
            heads=s.heads,
            kv_heads=s.kv_heads,
            vocab=s.vocab,
            grad_accum=t.grad_accum_steps,
            nodes_hint=spec.args.slurm.nodes,
        )
        if spec.world_size > 0
        else []
    )
    return _check_slurm(spec) + layout + _check_training(spec) + _check_data_and_paths(spec)
