"""Values no run takes, refused before any check works with them: counts far beyond any cluster, model or schedule
(the layout check lists divisors, the planner walks layouts, the memory model turns counts into floats: a count
with 20 digits would never finish or would overflow), numbers that are not finite, paths no filesystem holds (a
name longer than NAME_MAX, a path longer than PATH_MAX), and text that is not UTF-8 (the bundle's files are).

Pure, and first: `launcher.config.validate` says these, and the checks that would choke on them wait until they
are fixed; `launcher.runs.launch` asks the same before `--layout auto` and `--plan` plan anything, and the cluster's
checkpoint-space check waits for them too.
"""

from __future__ import annotations

import dataclasses
import math
import os

from launcher.config.flags import GROUPS, LaunchArgs
from launcher.config.hostlist import MAX_NODES
from launcher.problems import Problem

# The most each count may be: far beyond today's largest runs (100k GPUs, 1M-token contexts, 256k vocabularies),
# and small enough that every check stays quick.
MOST: dict[str, float] = {
    "nodes": MAX_NODES, "gpus_per_node": 1024, "cpus_per_node": 1 << 20,
    "hidden_size": 1 << 20, "intermediate_size": 1 << 22, "num_layers": 1 << 16, "num_heads": 1 << 16,
    "num_kv_heads": 1 << 16, "vocab_size": 1 << 24, "max_seq_len": 1 << 24, "rope_theta": 1e12,
    "dp": 1 << 20, "tp": 1 << 12, "pp": 1 << 12, "cp": 1 << 12, "zero_stage": 3,
    "micro_batch_size": 1 << 16, "grad_accum_steps": 1 << 20, "train_steps": 1 << 40, "warmup_steps": 1 << 40,
    "save_interval": 1 << 40, "log_interval": 1 << 40, "max_requeues": 10_000, "signal_grace": 1 << 31,
    "hang_timeout": 1 << 31, "startup_timeout": 1 << 31, "hang_factor": 1e6, "gpu_memory_gb": 1 << 20,
    "spare_nodes": MAX_NODES, "max_restarts": 10_000, "keep_last": 1 << 40, "keep_every": 1 << 40,
    "learning_rate": 1e6, "min_lr": 1e6, "weight_decay": 1e6, "grad_clip": 1e12,
}  # fmt: skip
LEAST = -(1 << 40)  # below any count's check: what a negative count is told by its own check (must be positive)
# Where the flags' paths lie: each name in them at most NAME_MAX bytes (ext4, xfs, Lustre, GPFS: 255), and the
# whole within PATH_MAX (4096) less what the launcher adds under it (<run>/<stamp>/<file>: NAME_MAX at most).
NAME_MAX, PATH_MAX = 255, 4096 - 256
PATH_FLAGS = (
    "configs_path", "slurm_logs_path", "checkpoints_path", "slurm_scripts_dir", "run_train_script", "tmp_dir",
    "profiler_export_path", "config", "python", "dataset", "tokenizer", "container_image", "container_workdir",
    "eval_include", "eval_heldout",
)  # fmt: skip


def values(args: LaunchArgs) -> dict[str, object]:
    """Every flag's value by name."""
    out: dict[str, object] = {"run_name": args.run_name}
    for name in GROUPS:
        group = getattr(args, name)
        out.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group)})
    return out


def _number(flag: str, value: float) -> Problem | None:
    most = MOST.get(flag)
    if isinstance(value, float) and not math.isfinite(value):
        return Problem(flag, f"must be a finite number, got {value}", f"give a number to --{flag}")
    if most is not None and not LEAST <= value <= most:
        shown = str(value) if len(str(value)) <= 24 else f"a number of {len(str(abs(int(value))))} digits"
        bound = f" (at most {_plain(most)} here)" if value > most else ""  # (below: no flag's own bound is that)
        return Problem(flag, f"{shown} is beyond any run{bound}", f"give --{flag} a realistic value")
    return None


def _plain(number: float) -> str:
    """1048576, 1e+06 as 1,048,576 and 1,000,000."""
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


def _path(flag: str, value: str) -> Problem | None:
    """A path whose name or length no filesystem takes (each of a mixture's or stage list's parts is a path)."""
    for part in value.replace(",", ":").split(":") if flag == "dataset" else [value]:
        longest = max(os.fsencode(part).split(b"/"), key=len)
        if len(longest) > NAME_MAX:
            name = os.fsdecode(longest[:24])
            return Problem(flag, f"a name in it is {len(longest)} bytes long ({name}...), longer than a filesystem "
                           f"allows ({NAME_MAX})", f"give --{flag} a path of shorter names")  # fmt: skip
        if len(os.fsencode(part)) > PATH_MAX:
            return Problem(flag, f"it is {len(os.fsencode(part))} bytes long, longer than a path may be here "
                           f"(at most {PATH_MAX})", f"give --{flag} a shorter path")  # fmt: skip
    return None


def _text(flag: str, value: str) -> Problem | None:
    """Text the bundle's UTF-8 files cannot hold: bytes of another encoding (Python keeps them as surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        renamed = " (rename the file or directory it names)" if flag in PATH_FLAGS else ""
        return Problem(flag, f"it holds bytes that are not UTF-8 (at character {e.start + 1})",
                       f"give --{flag} as UTF-8 text{renamed}")  # fmt: skip
    return None


def unusable_path(flag: str, value: str) -> Problem | None:
    """A path that no filesystem holds or that is not UTF-8 text (`python -m launcher.jobs` asks it too)."""
    return _text(flag, value) or _path(flag, value)


def problems(args: LaunchArgs) -> list[Problem]:
    """Every flag whose value no run takes (see the module's docstring); dp not where it was derived from a job
    size no run takes (that is said)."""
    out: list[Problem] = []
    for flag, value in values(args).items():
        found = None
        if flag == "dp" and any(p.flag in ("nodes", "gpus_per_node") for p in out):
            continue  # (after them: the flags' order is the groups')
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found = _number(flag, value)
        elif isinstance(value, str):
            found = _text(flag, value) or (_path(flag, value) if flag in PATH_FLAGS else None)
        if found is not None:
            out.append(found)
    return out
