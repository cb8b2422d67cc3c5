"""The run's tasks built as the eval job's lm-eval builds them (in the job's Python, offline as the eval job runs;
for launcher/evals/tasks.py, nothing of the launcher imported): every task a name stands for (a group's, a tag's),
each built alone through lm-eval's TaskManager over the folders of its YAMLs (a second, where lm-eval's own index of
every task takes ~20 s), its data loaded. What fails is said once per dataset where it is the data (the Hub dataset
not in the job's datasets cache: a cache folder without data files is none; local files missing or unreadable), or
per task where it is the YAML (an output_type lm-eval has not, a metric it does not know, a template that does not
render a document); and the metrics each name's score holds, for --rank_by."""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launcher.evals.taskindex import Index, Loader, lm_eval_dir, loader, own_config, reach, scan

LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow"}
SHOWN = 3  # a dataset's tasks named in its line; the rest counted


def caches(env: dict[str, str]) -> tuple[Path, Path]:
    """(the Hub's cache, the datasets cache), where the job's datasets looks."""
    home = Path(os.path.expanduser(env.get("HF_HOME") or "~/.cache/huggingface"))
    hub = Path(os.path.expanduser(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or home / "hub"))
    return hub, Path(os.path.expanduser(env.get("HF_DATASETS_CACHE") or home / "datasets"))


def cache_folders(repo: str, env: dict[str, str]) -> list[Path]:
    hub, datasets_cache = caches(env)
    return [hub / f"datasets--{repo.replace('/', '--')}", datasets_cache / repo.replace("/", "___")]


def holds_data(folder: Path) -> bool:
    """Whether a cache folder holds a data file (an empty folder, or one of locks only, is no cached dataset)."""
    for _, _, names in os.walk(folder):
        if any(not name.endswith(".lock") and not name.startswith(".") for name in names):
            return True
    return False


def manager(tasks: list[str], include: list[str]) -> Any:
    """lm-eval's TaskManager for an eval job of `tasks`: its index over the `--eval_include` folders and the folders
    of lm-eval's own YAMLs the names reach (under a second), where its index over all its ~14,700 tasks takes ~7 s of
    every eval job (a third of a small model's). The whole index where the narrow one could read a name otherwise:
    a name no YAML's lines define, one that two YAMLs define (lm-eval's walk order picks one), a name both a task
    and a tag. A tag's YAMLs are indexed from the one folder above them all: lm-eval's index takes a tag from the
    last folder that carries it, not from all of them."""
    from lm_eval.tasks import TaskManager

    def whole() -> Any:
        return TaskManager(include_path=list(include) or None)

    root = lm_eval_dir()
    if root is None:
        return whole()
    index: Index = scan(root / "tasks")
    for folder in include:
        index.update(scan(Path(folder)))  # the include's names over lm-eval's (its index takes them last)
    reached = reach(list(tasks), index, loader())
    folders: set[Path] = set()
    for defined, carried in reached.values():
        if len(defined) + bool(carried) != 1:
            return whole()
        folders |= {path.parent for path in defined}
        folders |= {Path(os.path.commonpath(carried))} if len(carried) > 1 else {p.parent for p in carried}
    own = [Path(f) for f in include]
    folders = {f for f in folders if not any(f.is_relative_to(o) for o in own)}
    outer = sorted(str(f) for f in folders if not any(f != g and f.is_relative_to(g) for g in folders))
    narrow = TaskManager(include_path=[*outer, *include] or None, include_defaults=False)
    return narrow if set(reached) <= set(narrow.all_tasks) else whole()


def metrics(name: str, index: Index, load: Loader) -> list[str]:
    """The metrics `name`'s own score holds in lm-eval's results (as the eval record keeps them: `acc`, its
    `acc_stderr`, a filter's `exact_match,strict-match`): a task's metric_list (else its output_type's defaults), a
    group's aggregate_metric_list; none for a tag or a group without one (its tasks are scored, not it)."""
    config = own_config(name, index, load)
    if config is None:
        return []
    if "group" in config:
        listed = config.get("aggregate_metric_list") or []
        return [str(m["metric"]) for m in listed if isinstance(m, dict) and "metric" in m]
    from lm_eval.api.registry import DEFAULT_METRIC_REGISTRY

    listed = config.get("metric_list")
    names = [str(m["metric"]) for m in listed if isinstance(m, dict) and "metric" in m] if listed else list(
        DEFAULT_METRIC_REGISTRY.get(config.get("output_type") or "generate_until", []))  # fmt: skip
    filters = [str(f.get("name")) for f in config.get("filter_list") or [] if isinstance(f, dict)] or ["none"]
    out = []
    for metric in names:
        for kept in filters:
            suffix = "" if kept == "none" else f",{kept}"
            out += [f"{metric}{suffix}", f"{metric}_stderr{suffix}"]
    return out


def build(leaves: dict[str, list[dict]], own: Index, index: Index, include: list[str], env: dict[str, str]) -> dict:
    """Every task of `leaves` (a requested name -> the task configs it stands for) built by lm-eval:
    {"yaml": [[flag, why]], "data": [why]}, the data's problems one line per dataset."""
    from lm_eval.tasks import TaskManager

    names = list(dict.fromkeys(str(c.get("task")) for configs in leaves.values() for c in configs))
    folders = sorted({str(p.parent) for n in names for p in index.get(n, []) if n not in own})
    manager = TaskManager(include_path=[*folders, *include] or None, include_defaults=False)
    known = set(manager.all_tasks)
    yaml: list[list[str]] = []
    troubles: dict[str, dict[str, Any]] = {}  # dataset -> its requested names, tasks, what failed
    built: set[str] = set()
    for asked, configs in leaves.items():
        for config in configs:
            task = str(config.get("task"))
            if task in built:
                continue
            built.add(task)
            try:
                manager.load([task if task in known else config])
            except Exception as e:  # noqa: BLE001  lm-eval's and datasets' word, whatever it is
                said = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
                if not _in_download(e):
                    flag = "eval_include" if task in own or asked in own else "eval_tasks"
                    where = f" ({index.get(task, own.get(task, ['its group']))[0]})" if task in {**index, **own} else ""
                    yaml.append([flag, f"{task}: lm-eval cannot build it from its YAML{where}: {said}"])
                    continue
                key = str(config.get("dataset_path") or "")
                trouble = troubles.setdefault(key, {"asked": [], "tasks": [], "config": config, "said": said})
                trouble["asked"] += [asked] if asked not in trouble["asked"] else []
                trouble["tasks"].append(task)
    return {"yaml": yaml, "data": [_data_line(k, t, env) for k, t in troubles.items()]}


def _in_download(e: BaseException) -> bool:
    """Whether lm-eval failed loading the task's data (its `download`), not building the task from its YAML."""
    return any(f.name == "download" and "lm_eval" in f.filename for f in traceback.extract_tb(e.__traceback__))


def _who(asked: list[str], tasks: list[str]) -> str:
    if tasks == asked:
        return ", ".join(asked)
    shown = ", ".join(tasks[:SHOWN]) + (f" and {len(tasks) - SHOWN} more" if len(tasks) > SHOWN else "")
    return f"{', '.join(asked)} ({len(tasks)} tasks: {shown})"


def _data_line(path: str, trouble: dict[str, Any], env: dict[str, str]) -> str:
    who, config = _who(trouble["asked"], trouble["tasks"]), trouble["config"]
    if path in LOCAL_BUILDERS:
        files = (config.get("dataset_kwargs") or {}).get("data_files")
        missing = [p for p in _files(files) if not Path(os.path.expanduser(p)).exists()]
        if missing:
            return f"{who}: its data_files {', '.join(missing)} do not exist (absolute paths, as the job reads them)"
        return f"{who}: lm-eval cannot read its data files: {trouble['said']}"
    if Path(os.path.expanduser(path)).exists():
        return f"{who}: lm-eval cannot read its data at {path}: {trouble['said']}"
    repo = path.strip("/")
    folders = cache_folders(repo, env)
    if any(holds_data(f) for f in folders):
        return f"{who}: lm-eval cannot load its Hub dataset {repo} from the job's datasets cache: {trouble['said']}"
    empty = [str(f) for f in folders if f.is_dir()]
    held = f"; {' and '.join(empty)} hold{'s' if len(empty) == 1 else ''} no data file" if empty else ""
    return (f"{who}: its Hub dataset {repo} is not in the job's datasets cache ({folders[0]} or {folders[1]}{held}), "
            "and the eval job reads offline")  # fmt: skip


def _files(files: object) -> Iterable[str]:
    listed = files.values() if isinstance(files, dict) else [files]
    return [str(p) for group in listed for p in (group if isinstance(group, list) else [group]) if p]
