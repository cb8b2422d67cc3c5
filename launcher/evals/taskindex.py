"""lm-eval's task YAMLs read quickly, in the job's Python (for launcher/evals/tasks.py; nothing of the launcher is
imported): the names they define (a task, a group) or carry (a tag), from their lines, in a second where lm-eval's own
index parses ~14,000 YAMLs in ~20 s; the configs a name stands for (a task's own, a group's or a tag's tasks'), read
with lm-eval's own YAML loader (`include:` and `!function` too)."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

NAME_LINE = re.compile(r"^['\"]?(task|group|tag)['\"]?:[ \t]*['\"]?([^\s'\"#\[\]{}]+)", re.M)
TAG_LIST = re.compile(r"^['\"]?tag['\"]?:[ \t]*\n((?:[ \t]+-[ \t]*\S+[ \t]*\n)+)", re.M)

Index = dict[str, list[Path]]  # name -> the YAMLs that define or carry it
Loader = Callable[..., dict]


def lm_eval_dir() -> Path | None:
    spec = importlib.util.find_spec("lm_eval")
    return Path(spec.origin).parent if spec and spec.origin else None


def scan(folder: Path) -> Index:
    """name -> the YAMLs that define it (a task, a group) or carry it (a tag), from their lines."""
    index: Index = {}
    for where, _, names in os.walk(folder):
        for name in names:
            if not name.endswith(".yaml") and "yaml" not in name:
                continue
            path = Path(where) / name
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            found = [m[2] for m in NAME_LINE.finditer(text)]
            found += [w.strip().lstrip("-").strip() for m in TAG_LIST.finditer(text) for w in m[1].splitlines()]
            for word in found:
                index.setdefault(word, []).append(path)
    return index


def loader() -> Loader:
    try:
        from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own (0.4.13), `!function` and `include:`

        return load_yaml
    except ImportError:  # another lm-eval: a plain reading, tags ignored
        import yaml

        class Loose(yaml.SafeLoader):
            pass

        Loose.add_multi_constructor("!", lambda loader, suffix, node: None)
        return lambda path, **_: yaml.load(Path(path).read_text(encoding="utf-8"), Loader=Loose)  # noqa: S506


def tags(config: dict) -> list[str]:
    tag = config.get("tag")
    return [tag] if isinstance(tag, str) else [t for t in tag or [] if isinstance(t, str)]


def own_config(name: str, index: Index, load: Loader) -> dict | None:
    """The config that defines `name` (a task's or a group's); None for a tag (or a name no YAML reads as defined)."""
    for path in index.get(name, []):
        try:
            config = load(path, resolve_func=False)
        except Exception:  # noqa: BLE001  lm-eval's own YAML: what it cannot read, it does not run
            continue
        if config.get("task") == name and "group" not in config or config.get("group") == name:
            return config
    return None


def datasets_of(name: str, index: Index, load: Loader, seen: set[str]) -> list[dict]:
    """The task configs `name` stands for (a task's own, a group's tasks', a tag's tasks'), as far as they read."""
    if name in seen:
        return []
    seen.add(name)
    configs = []
    for path in index.get(name, []):
        try:
            config = load(path, resolve_func=False)
        except Exception:  # noqa: BLE001  lm-eval's own YAML: what it cannot read, it does not run
            continue
        if config.get("task") == name or config.get("group") == name or name in tags(config):
            listed = config.get("task")
            if "group" in config and isinstance(listed, list):
                configs += _members(listed, index, load, seen)
            elif config.get("task") == name or name in tags(config):
                configs.append(config)
    return configs


def _members(listed: list, index: Index, load: Loader, seen: set[str]) -> list[dict]:
    out = []
    for item in _listed(listed):
        out += [item] if isinstance(item, dict) else datasets_of(item, index, load, seen)
    return out


def reach(names: list[str], index: Index, load: Loader) -> dict[str, tuple[list[Path], list[Path]]]:
    """Every name `names` reach (a group's tasks, a tag's, theirs in turn), each with the YAMLs that define it (a
    task's, a group's) and those that carry it (a tag's tasks'), as far as they read."""
    reached: dict[str, tuple[list[Path], list[Path]]] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        defined, carried = reached.setdefault(name, ([], []))
        for path in index.get(name, []):
            try:
                config = load(path, resolve_func=False)
            except Exception:  # noqa: BLE001  lm-eval's own YAML: what it cannot read, it does not run
                continue
            if config.get("task") == name and "group" not in config or config.get("group") == name:
                defined.append(path)
                if "group" in config and isinstance(config.get("task"), list):
                    todo += [item for item in _listed(config["task"]) if isinstance(item, str)]
            elif name in tags(config) and isinstance(config.get("task"), str):
                carried.append(path)
                todo.append(config["task"])
    return reached


def _listed(listed: list) -> Iterator[str | dict]:
    """A group's `task:` list walked in its order, nested groups' lists included: each task or group it names, and
    each task it defines inline (a dict with its own dataset_path)."""
    for item in listed:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict) and isinstance(item.get("task"), list):
            yield from _listed(item["task"])
        elif isinstance(item, dict) and isinstance(item.get("task"), str):
            yield item if "dataset_path" in item else item["task"]
