"""The two nanotron config dialects, which one the job's Python speaks, and the moves between them.

nanotron 0.4 (the one PyPI release) and nanotron's git main both call themselves version "0.4", but their
configs differ (docs/nanotron-dialects.md):

- 0.4: one `data` section; Adam's settings directly under `optimizer`; a Llama with interleaved RoPE and theta
  10000 hard-coded; no context parallelism.
- main: `data_stages` (a list of {name, start_training_step, data}); `optimizer.optimizer_factory` ({name: adamW,
  adam_eps, adam_beta1, adam_beta2, torch_adam_is_fused}); `rope_interleaved` and `rope_theta` in the Llama config
  (interleaved defaults to false); `parallelism.context_parallel_size`.

The launcher's flag table (`schema.FLAG_PATHS`) is written in 0.4's paths; `to_main` moves a 0.4-shaped config to
main's, `to_canonical` moves main's back (so `--config` reads either). `probe(python)` finds the nanotron of the
job's Python by its schema (its config source), without importing it: main's `nanotron.config` imports flash_attn
and triton, which a login node may not have.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import checkpoint_layout
from launcher import protocol as P

DIALECTS = ("0.4", "main")
# What the job's Python runs when it has no nanotron: main's is what nanotron's README installs (pip install -e
# from a clone), and both engines of the job read it.
DEFAULT = "main"
STAGE_NAME = "stable"  # the one data stage a single dataset is trained in
ADAM_KEYS = ("adam_eps", "adam_beta1", "adam_beta2", "torch_adam_is_fused")
# 0.4's Llama rotates interleaved pairs (GPT-J) with theta 10000 and has no field for either.
ROPE_THETA_04 = 10000.0
# main's keys that 0.4 cannot hold, with the value that means what 0.4 does anyway (None: any value is lost).
MAIN_ONLY: dict[tuple[str, ...], Any] = {
    ("model", "model_config", "rope_theta"): ROPE_THETA_04,
    ("model", "model_config", "rope_interleaved"): True,
    ("model", "model_config", "attention_bias"): False,
    ("model", "model_config", "z_loss_enabled"): False,
    ("model", "model_config", "z_loss_coefficient"): None,
    ("model", "model_config", "_attn_implementation"): None,
    ("parallelism", "context_parallel_size"): 1,
    ("parallelism", "recompute_layer"): False,
    ("parallelism", "tp_recompute_allgather"): None,
    ("checkpoints", "save_final_state"): None,  # the launcher's engines save the last step in 0.4 too
    ("checkpoints", "load_lr_scheduler"): True,
    ("checkpoints", "load_optimizer"): True,
    ("optimizer", "weight_decay_exclude_named_params"): [],
    ("metrics_logging",): None,
    ("s3_upload",): None,
}

RECORD = P.DIALECT_RECORD  # beside a run's checkpoints: the dialect of the config that wrote them (the job's)
METADATA = P.NANOTRON_METADATA  # in a nanotron checkpoint: its format version, 1.2 (0.4) or 1.5 (main)


def of_checkpoints(root: Path) -> tuple[str | None, str]:
    """(the dialect a run's checkpoints in `root` were written from, how that is known); (None, "") when nothing
    says: no checkpoint, or one saved before the record by the torch engine."""
    try:
        recorded = (root / RECORD).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    if recorded in DIALECTS:
        return recorded, f"{root / RECORD} says {recorded}"
    step = checkpoint_layout.pointer_step(root)
    if step is None:
        return None, ""
    try:
        version = json.loads((root / str(step) / METADATA).read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, ""
    found = "0.4" if str(version) in ("1.0", "1.1", "1.2") else "main"
    return found, f"nanotron's checkpoint format {version} in {root / str(step) / METADATA}"


def saved_layout(root: Path) -> tuple[dict[str, int] | None, str]:
    """The layout (dp, tp, pp, zero_stage) of the newest nanotron checkpoint in `root` (its own config.yaml), and
    where it was read; (None, "") where there is none."""
    import yaml

    step = checkpoint_layout.pointer_step(root)
    if step is None:
        return None, ""
    try:
        where = root / str(step) / "config.yaml"
        config = yaml.safe_load(where.read_text(encoding="utf-8"))
        p = config["parallelism"]
        layout = {"dp": int(p["dp"]), "tp": int(p["tp"]), "pp": int(p["pp"])}
        layout["zero_stage"] = int((config.get("optimizer") or {}).get("zero_stage") or 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None, ""
    return layout, str(where)


PROBE = r"""
import importlib.util, json, os, sys
out = {"python": sys.executable}
try:
    spec = importlib.util.find_spec("nanotron")
except Exception as e:
    spec, out["error"] = None, repr(e)
if spec is not None and spec.submodule_search_locations:
    where = list(spec.submodule_search_locations)[0]
    out["where"] = where
    try:
        with open(os.path.join(where, "config", "config.py"), encoding="utf-8") as f:
            source = f.read()
        out["data_stages"] = "class DatasetStageArgs" in source and "data_stages" in source
        out["optimizer_factory"] = "optimizer_factory" in source
        out["data_args"] = "data: DataArgs" in source or "data: Optional[DataArgs]" in source
    except OSError as e:
        out["error"] = str(e)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Choice:
    """The dialect a run's config is written in, and why (the summary and the manifest say both)."""

    dialect: str
    why: str
    found: str | None = None  # the job's nanotron: "0.4", "main", or None when there is none (or it is unknown)


@functools.lru_cache(maxsize=8)
def probe(python: str) -> tuple[str | None, str]:
    """(dialect of `python`'s nanotron or None, what was found), by reading its config source (stdlib only)."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=30, check=False)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None, f"{python} could not be run here to look for nanotron"
    where = found.get("where")
    if not where:
        return None, f"{python} has no nanotron"
    if found.get("data_stages") and found.get("optimizer_factory"):
        return "main", f"{python} has nanotron at {where} with main's schema (data_stages, optimizer_factory)"
    if found.get("data_args"):
        return "0.4", f"{python} has nanotron at {where} with 0.4's schema (one data section)"
    return None, f"{python}'s nanotron at {where} has a config schema the launcher does not know"


def choose(flag: str, python: str | None) -> Choice:
    """The dialect for `--nanotron_dialect FLAG` ("auto", "0.4" or "main") and the job's Python."""
    python = python or sys.executable
    found, what = probe(python)
    if flag in DIALECTS:
        differs = f"; the job's Python says otherwise: {what}" if found and found != flag else ""
        return Choice(flag, f"--nanotron_dialect {flag}{differs}", found)
    if found:
        return Choice(found, what, found)
    why = f"{what}: writing nanotron {DEFAULT}'s, what nanotron's README installs (--nanotron_dialect 0.4 for PyPI's)"
    return Choice(DEFAULT, why, None)


def is_main(config: dict) -> bool:
    """Whether a config (or a part of one) is written in main's dialect."""
    optimizer = config.get("optimizer")
    return "data_stages" in config or (isinstance(optimizer, dict) and "optimizer_factory" in optimizer)


def stages_of(config: dict) -> list[dict]:
    """main's data stages, by starting step."""
    stages = [s for s in config.get("data_stages") or [] if isinstance(s, dict)]
    return sorted(stages, key=_start)


def _start(stage: dict) -> int:
    step = stage.get("start_training_step")
    return step if isinstance(step, int) else 0


def to_canonical(config: dict) -> dict:
    """A config in either dialect, in 0.4's paths (what the flag table reads): main's first data stage as `data`,
    its optimizer factory's Adam settings under `optimizer`. main's other keys stay, and so does `data_stages`
    (the later stages are main's alone)."""
    if not is_main(config):
        return config
    out = copy.deepcopy(config)
    stages = stages_of(out)
    if stages:
        out["data"] = stages[0].get("data")
    optimizer = out.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("optimizer_factory"), dict):
        factory = optimizer.pop("optimizer_factory")
        optimizer.update({k: v for k, v in factory.items() if k != "name"})
        optimizer["optimizer_name"] = factory.get("name", "adamW")
    return out


def to_main(config: dict, stage_name: str = STAGE_NAME) -> dict:
    """A config in 0.4's paths, written in main's dialect (data stages kept where the config had them)."""
    out = copy.deepcopy(config)
    data = out.pop("data", None)
    stages = stages_of(out)
    first = {"name": stage_name, "start_training_step": 1}
    if stages:
        first = {**stages[0], "start_training_step": 1}
    out["data_stages"] = [{**first, "data": data}, *stages[1:]]
    optimizer = out.get("optimizer")
    if isinstance(optimizer, dict):
        name = optimizer.pop("optimizer_name", "adamW")
        factory = {"name": name, **{k: optimizer.pop(k) for k in ADAM_KEYS if k in optimizer}}
        optimizer["optimizer_factory"] = factory
    return _ordered(out)


def to_04(config: dict) -> tuple[dict, list[tuple[tuple[str, ...], Any]]]:
    """A config in 0.4's paths with main's keys taken out: (config, [(path, value)] of main's keys whose value
    0.4 cannot mean). A main key at the value 0.4 behaves as anyway is dropped quietly."""
    out = copy.deepcopy(config)
    lost: list[tuple[tuple[str, ...], Any]] = []
    for stage in stages_of(out)[1:]:
        lost.append((("data_stages", str(stage.get("name"))), stage.get("start_training_step")))
    out.pop("data_stages", None)
    if out.get("optimizer", {}) and out["optimizer"].get("optimizer_name", "adamW") != "adamW":
        lost.append((("optimizer", "optimizer_factory", "name"), out["optimizer"]["optimizer_name"]))
    if isinstance(out.get("optimizer"), dict):
        out["optimizer"].pop("optimizer_name", None)
    for path, same in MAIN_ONLY.items():
        parent = _parent(out, path)
        if parent is None or path[-1] not in parent:
            continue
        value = parent.pop(path[-1])
        if same is None or value is None or value == same:
            continue
        lost.append((path, value))
    return out, lost


def _parent(tree: dict, path: tuple[str, ...]) -> dict | None:
    for key in path[:-1]:
        tree = tree.get(key) if isinstance(tree, dict) else None  # type: ignore[assignment]
    return tree if isinstance(tree, dict) else None


ORDER = ("general", "parallelism", "model", "tokenizer", "checkpoints", "logging", "tokens", "optimizer")


def _ordered(config: dict) -> dict:
    """main's sections in the base's order, data_stages where 0.4's data was."""
    keys = [k for k in ORDER if k in config] + ["data_stages"] + [k for k in config if k not in ORDER]
    return {k: config[k] for k in dict.fromkeys(keys) if k in config}


ASYNC_04 = (
    "nanotron 0.4's asynchronous row-parallel backward gives a wrong input gradient with tp > 1 (upstream issue "
    "#46, fixed after 0.4): its tensor-parallel linears are written synchronous (tp_linear_async_communication: "
    "false)"
)


def tp_async(written: str, tp: int, tp_mode: str, configured: object) -> tuple[bool, str | None]:
    """Whether the written config asks nanotron for asynchronous tensor-parallel communication, and why not where
    the base or --config asked for it: ALL_REDUCE has none (nanotron asserts so), and nanotron 0.4 with tp > 1
    would train on a wrong gradient (`ASYNC_04`; the job mends a config written otherwise the same way)."""
    wanted = configured is not False
    if tp_mode.upper() == "ALL_REDUCE":
        return False, None
    if written == "0.4" and tp > 1 and wanted:
        return False, ASYNC_04
    return wanted, None
