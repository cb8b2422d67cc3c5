"""`python -m launcher.evals.tasks` (run with the job's Python, by launcher/evals/checks.py): what that Python's
lm-eval makes of the run's tasks, before the queue, without torch. Reads {"tasks": [...], "include": [...]} on stdin;
prints {"lm_eval": version or null, "unknown": {task: [close names]}, "broken": [why], "data": [why]}.

- **Known**: lm-eval's own task, group and tag names are read from its task YAMLs' `task:`/`group:`/`tag:` lines (a
  second's scan; lm-eval's own index parses ~14,000 YAMLs in ~25 s); a name the scan does not find is looked up in
  that index before it is called unknown. --eval_include's folders are lm-eval's own to index.
- **Loads**: each YAML of the include folders, through lm-eval's own YAML loader (`!function` and `include:` too).
- **Data offline** (the eval job runs with HF_DATASETS_OFFLINE=1): a task over local files (`dataset_path: json` and
  `dataset_kwargs.data_files`) needs the files; one over a Hub dataset needs it in the datasets cache the job reads
  (HF_HOME's `hub/datasets--ORG--NAME` or `datasets/ORG___NAME`). Include tasks over local files are built by
  lm-eval (their data read once).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

NAME_LINE = re.compile(r"^['\"]?(task|group|tag)['\"]?:[ \t]*['\"]?([^\s'\"#\[\]{}]+)", re.M)
TAG_LIST = re.compile(r"^['\"]?tag['\"]?:[ \t]*\n((?:[ \t]+-[ \t]*\S+[ \t]*\n)+)", re.M)
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow"}


def lm_eval_dir() -> Path | None:
    spec = importlib.util.find_spec("lm_eval")
    return Path(spec.origin).parent if spec and spec.origin else None


def scan(folder: Path) -> dict[str, list[Path]]:
    """name -> the YAMLs that define it (a task, a group) or carry it (a tag), from their lines."""
    index: dict[str, list[Path]] = {}
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


def _loader() -> Callable[..., dict]:
    try:
        from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own (0.4.13), `!function` and `include:`

        return load_yaml
    except ImportError:  # another lm-eval: a plain reading, tags ignored
        import yaml

        class Loose(yaml.SafeLoader):
            pass

        Loose.add_multi_constructor("!", lambda loader, suffix, node: None)
        return lambda path, **_: yaml.load(Path(path).read_text(encoding="utf-8"), Loader=Loose)  # noqa: S506


def datasets_of(name: str, index: dict[str, list[Path]], load: Callable[..., dict], seen: set[str]) -> list[dict]:
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
        if config.get("task") == name or config.get("group") == name or name in _tags(config):
            listed = config.get("task")
            if "group" in config and isinstance(listed, list):
                configs += _members(listed, index, load, seen)
            elif config.get("task") == name or name in _tags(config):
                configs.append(config)
    return configs


def _tags(config: dict) -> list[str]:
    tag = config.get("tag")
    return [tag] if isinstance(tag, str) else [t for t in tag or [] if isinstance(t, str)]


def _members(listed: list, index: dict[str, list[Path]], load: Callable[..., dict], seen: set[str]) -> list[dict]:
    out = []
    for item in listed:
        if isinstance(item, str):
            out += datasets_of(item, index, load, seen)
        elif isinstance(item, dict) and isinstance(item.get("task"), list):
            out += _members(item["task"], index, load, seen)
        elif isinstance(item, dict) and isinstance(item.get("task"), str):
            out += [item] if "dataset_path" in item else datasets_of(item["task"], index, load, seen)
    return out


def caches(env: dict[str, str]) -> tuple[Path, Path]:
    """(the Hub's cache, the datasets cache), where the job's datasets looks."""
    home = Path(os.path.expanduser(env.get("HF_HOME") or "~/.cache/huggingface"))
    hub = Path(os.path.expanduser(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or home / "hub"))
    return hub, Path(os.path.expanduser(env.get("HF_DATASETS_CACHE") or home / "datasets"))


def data_problem(task: str, config: dict, env: dict[str, str]) -> str | None:
    """Why the job, offline, would not find the task's data; None where it would."""
    path = str(config.get("dataset_path") or "")
    if not path:
        return None
    if path in LOCAL_BUILDERS:
        files = (config.get("dataset_kwargs") or {}).get("data_files")
        listed = files.values() if isinstance(files, dict) else [files]
        paths = [str(p) for group in listed for p in (group if isinstance(group, list) else [group]) if p]
        missing = [p for p in paths if not Path(os.path.expanduser(p)).exists()]
        if missing:
            return f"{task}: its data_files {', '.join(missing)} do not exist (absolute paths, as the job reads them)"
        return None
    if Path(os.path.expanduser(path)).exists():
        return None
    hub, datasets_cache = caches(env)
    repo = path.strip("/")
    cached = [hub / f"datasets--{repo.replace('/', '--')}", datasets_cache / repo.replace("/", "___")]
    if any(c.exists() for c in cached):
        return None
    return (f"{task}: its Hub dataset {repo} is not in the job's datasets cache ({cached[0]} or {cached[1]}), and "
            "the eval job reads offline")  # fmt: skip


def check(tasks: Iterable[str], include: Iterable[str], env: dict[str, str]) -> dict[str, Any]:
    tasks, include = list(tasks), list(include)
    root = lm_eval_dir()
    answer: dict[str, Any] = {"lm_eval": None, "unknown": {}, "broken": [], "data": []}
    if root is None:
        return answer
    from importlib import metadata

    answer["lm_eval"] = metadata.version("lm_eval")
    index = scan(root / "tasks")
    own: dict[str, list[Path]] = {}  # --eval_include's names, from its YAMLs as lm-eval's loader reads them
    load = _loader()
    for folder in include:
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                config = load(path, resolve_func=True)
            except Exception as e:  # noqa: BLE001  lm-eval's loader's word, whatever it is
                answer["broken"].append(f"{path} does not load: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                continue
            named = [config.get("task"), config.get("group"), *_tags(config)]
            for name in (n for n in named if isinstance(n, str)):
                own.setdefault(name, []).append(path)
    unknown = [t for t in tasks if t not in own and t not in index]
    if unknown:  # the scan found no line naming them: lm-eval's own index is the judge
        from lm_eval.tasks import TaskManager

        names = set(TaskManager(include_path=include or None).all_tasks)
        for name in unknown:
            if name not in names:
                answer["unknown"][name] = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
    local = []
    for task in (t for t in tasks if t not in answer["unknown"]):
        for config in datasets_of(task, {**index, **own}, load, set()):
            why = data_problem(str(config.get("task") or task), config, env)
            if why and why not in answer["data"]:
                answer["data"].append(why)
            elif not why and task in own and config.get("dataset_path") in LOCAL_BUILDERS:
                local.append(str(config.get("task") or task))
    if local and not answer["broken"]:
        answer["data"] += _built(local, include)
    return answer


def _built(names: list[str], include: list[str]) -> list[str]:
    """Include tasks over local files, built by lm-eval (their data read): what failed."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include, include_defaults=False)
    out = []
    for name in dict.fromkeys(names):
        try:
            manager.load([name])
        except Exception as e:  # noqa: BLE001  lm-eval's and datasets' word, whatever it is
            out.append(f"{name}: lm-eval cannot build it: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return out


def main() -> int:
    asked = json.loads(sys.stdin.read())
    answer = check(asked.get("tasks", []), asked.get("include", []), dict(os.environ))
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
