"""--config: the user's nanotron YAML (either dialect, partial or whole) read, checked against the project's base
(configs/nanotron-0.4-base.yaml, a complete nanotron 0.4 config) and laid onto it, section by section: the YAML a run
starts from, and the flag values the YAML sets (`schema.FLAG_PATHS`), each of its flag's type.

Every value of it that no typed flag overrides reaches the written config (docs/validation.md's order: a flag you
typed, then --config, then the default): those the flag table reads become flag values; the others stay in the base
the config is built on. Two are the run's own beside the table: its checkpoints folder (`checkpoints.checkpoints_path`,
nanotron's: the run's folder itself, not a parent of it) and the positions (`max_position_embeddings`, which follows
the sequence length where the YAML does not state it).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import NamedTuple

import yaml

from launcher.config import dialect_rules as rules
from launcher.config import ranges
from launcher.config.flags import flag_types
from launcher.nanotron_config import dialect, nanoset_yaml, schema
from launcher.nanotron_config.presets import BASE_CONFIG, YAML_LOADER
from launcher.problems import Problem

WARMUP_STYLES = ("linear", "constant")  # what nanotron's LRSchedulerArgs takes


class Read(NamedTuple):
    """--config, read: the YAML the run starts from, its path, the flag values it sets, its problems, what resolution
    noted of it, and the run's checkpoints folder it names (absolute; None where it names none)."""

    base: dict
    path: str
    values: dict
    problems: list[Problem]
    notes: list[str]
    checkpoints: Path | None


def absolute(path: str, cwd: Path) -> str:
    return str((cwd / os.path.expanduser(path)).resolve()) if path else path


def _read_yaml(target: Path) -> tuple[dict, list[Problem]]:
    try:
        with open(target, encoding="utf-8") as f:
            data = yaml.load(f, Loader=YAML_LOADER)
    except OSError as e:
        return {}, [Problem("config", f"cannot read {target}: {e.strerror}", "give a readable YAML")]
    except yaml.YAMLError as e:
        return {}, [Problem("config", f"{target} is not valid YAML ({e})", "fix the file")]
    if not isinstance(data, dict):
        return {}, [Problem("config", f"{target} is not a nanotron config", "give a nanotron YAML")]
    return data, []


REPLACED_WHOLE = {"init_method"}  # nanotron unions ({std} or {path}): the YAML's choice replaces the base's


def _merge(base: dict, over: dict) -> dict:
    """`over` laid onto `base` section by section: a partial YAML keeps the base's other settings, and a null
    where the base has a section keeps the base's (the launcher writes into every section it has)."""
    out = dict(base)
    for key, value in over.items():
        if value is None and isinstance(base.get(key), dict):
            continue
        both = isinstance(value, dict) and isinstance(base.get(key), dict) and key not in REPLACED_WHOLE
        if key == "dataset" and nanoset_yaml.is_section(value) != nanoset_yaml.is_section(base.get(key)):
            both = False  # a Nanoset's section and a hub dataset's: nanotron reads one or the other, never both
        out[key] = _merge(base[key], value) if both else value
    return out


def _load_base(path: str | None, explicit: set[str], cwd: Path) -> tuple[dict, dict, str, list[Problem], list[str]]:
    """The YAML the run starts from (the project's base, or --config laid onto it, checked against it), and the
    --config YAML alone (empty without one; its Nanoset sections as main reads them, their folders absolute)."""
    base, problems = _read_yaml(BASE_CONFIG)
    assert not problems, problems  # the project's own file
    if not path:
        return base, {}, str(BASE_CONFIG), [], []
    target = Path(os.path.expanduser(path))  # (os.path's: `~nobody/x` stays as typed, not RuntimeError)
    user, problems = _read_yaml(target)
    if problems:
        return {}, {}, str(target), problems, []
    user, notes, unread = nanoset_yaml.normalize(dialect.to_canonical(user), lambda f: absolute(f, cwd))
    problems = rules.model_problems(user, target)
    problems += [Problem("config", f"{where}: {what}", f"fix it in {target}") for where, what in unread]
    replaced = {schema.FLAG_PATHS[f] for f in explicit if f in schema.FLAG_PATHS}
    for keys, what in schema.shape_problems(user, base):
        if keys not in replaced:
            flag = next((f for f, p in schema.FLAG_PATHS.items() if p == keys), None)
            fix = f"fix it in {target}" + (f" or give --{flag}" if flag else "")
            problems.append(Problem("config", f"{'.'.join(keys)} {what}", fix, key=".".join(keys)))
    return _merge(base, user), user, str(target.resolve()), problems, notes


def _typed(values: dict, explicit: set[str]) -> tuple[dict, list[Problem]]:
    """Drop --config values of the wrong type for their flag, each one a problem (unless the flag replaces it)."""
    if not values:
        return {}, []
    kinds = flag_types()
    kept, problems = {}, []
    for flag, value in values.items():
        kind = kinds.get(flag)
        fits = (
            kind is None
            or (kind is bool and isinstance(value, bool))
            or (kind is int and isinstance(value, int) and not isinstance(value, bool))
            or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (kind is str and isinstance(value, str))
        )
        if fits or flag in explicit:
            kept[flag] = value
            continue
        forms = " (one name, or a mixture {name: weight}: --dataset a:0.7,b:0.3)" if flag == "dataset" else ""
        where = ".".join(schema.FLAG_PATHS[flag])
        name = getattr(kind, "__name__", str(kind))
        problems.append(Problem("config", f"{where} is {value!r}, not a {name}", f"give --{flag}{forms}", key=where))
    return kept, problems


def read(path: str | None, explicit: set[str], cwd: Path) -> Read:
    """--config read (the project's base alone without one): each problem's key path once, though both the shape
    check and the type check may find it. The positions follow the sequence length unless the YAML states them and no
    typed flag sets the shape (--max_seq_len, or a --model_size you type, whose shape wins over the YAML's)."""
    base, user, base_path, problems, notes = _load_base(path, explicit, cwd)
    from_config, type_problems = _typed(schema.flags_from_config(user), explicit)
    said = {p.key for p in problems}
    problems += [p for p in type_problems if p.key not in said]
    from_config.pop("dp", None)  # dp is derived from this job's size, whatever job the YAML was made for
    if schema.get_path(user, schema.POSITIONS) is None or explicit & {"max_seq_len", "model_size"}:
        base = copy.deepcopy(base)  # (build_config writes the sequence length there)
        model_config = schema.get_path(base, schema.POSITIONS[:-1])
        if isinstance(model_config, dict) and schema.POSITIONS[-1] in model_config:
            model_config[schema.POSITIONS[-1]] = None  # (in its place: the written YAML's order stays)
    style = schema.get_path(user, schema.WARMUP_STYLE)
    if style is not None and style not in WARMUP_STYLES:
        problems.append(Problem("config", f"{'.'.join(schema.WARMUP_STYLE)} is {style!r}, which nanotron does not take",
                                f"use {' or '.join(WARMUP_STYLES)} in {base_path}"))  # fmt: skip
    folder = schema.get_path(user, schema.CHECKPOINTS_PATH)
    checkpoints = None
    if isinstance(folder, str) and folder.strip() and "checkpoints_path" not in explicit:  # (else the flag's)
        unusable = ranges.unusable_path("config", folder) or ("\0" in folder or None)
        if unusable:
            why = unusable.message if isinstance(unusable, Problem) else "it holds a NUL character"
            problems.append(Problem("config", f"{'.'.join(schema.CHECKPOINTS_PATH)}: {why}",
                                    f"fix it in {base_path}, or give --checkpoints_path"))  # fmt: skip
        else:
            checkpoints = Path(absolute(folder, cwd))
    return Read(base, base_path, from_config, problems, notes, checkpoints)
