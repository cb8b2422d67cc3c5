"""`python -m launcher.evals.tasks` (run with the job's Python, by launcher/evals/probe.py): what that Python's lm-eval
makes of the run's tasks, before the queue, without torch. Reads {"tasks": [...], "include": [...], "presets": [...],
"ask": [...]} on stdin; prints one JSON line:

    {"lm_eval": version or null, "unknown": {name: [nearest names]}, "broken": [why], "twice": {task: [YAMLs]},
     "overlap": [why], "yaml": [[flag, why]], "data": [why], "metrics": {name: [metric]}, "known": {name: bool}}

- **Known**: lm-eval's own task, group and tag names are read from its task YAMLs' lines (launcher/evals/taskindex.py,
  a second); a name the scan does not find is looked up in lm-eval's own index (~20 s) before it is called unknown,
  with the nearest of its names and of the presets' (`presets`). `ask`: other names to look up so (nanotron main's
  `lighteval:` section's tasks).
- **Loads**: each YAML of the include folders, through lm-eval's own YAML loader; a task two of them define (lm-eval
  would take the first and drop the other).
- **Overlap**: two names standing for one task (a group and one of its tasks): lm-eval refuses the pair.
- **Builds**: every task each name stands for, built by lm-eval with its data, offline as the eval job runs
  (launcher/evals/taskbuild.py): the YAML's problems a task each, the data's a dataset each.
- **Metrics**: what each name's score holds (--rank_by's TASK:METRIC).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launcher.evals import taskbuild
from launcher.evals.taskindex import Index, datasets_of, lm_eval_dir, loader, scan, tags


def check(
    tasks: Iterable[str], include: Iterable[str], env: dict[str, str], presets: Iterable[str] = (),
    ask: Iterable[str] = (),
) -> dict[str, Any]:  # fmt: skip
    tasks, include = list(tasks), list(include)
    root = lm_eval_dir()
    answer: dict[str, Any] = {"lm_eval": None, "unknown": {}, "broken": [], "twice": {}, "overlap": [], "yaml": [],
                              "data": [], "metrics": {}, "known": {}}  # fmt: skip
    if root is None:
        return answer
    from importlib import metadata

    answer["lm_eval"] = metadata.version("lm_eval")
    index, load = scan(root / "tasks"), loader()
    own = _own(include, load, answer)
    everything = {**index, **own}
    asked = list(dict.fromkeys([*tasks, *ask]))
    missing = [t for t in asked if t not in everything]
    if missing:  # the scan found no line naming them: lm-eval's own index is the judge
        from lm_eval.tasks import TaskManager

        names = set(TaskManager(include_path=include or None).all_tasks)
        for name in missing:
            if name not in names and name in tasks:
                close = sorted(names | set(presets))
                answer["unknown"][name] = difflib.get_close_matches(name, close, n=3, cutoff=0.6)
        missing = [n for n in missing if n not in names]
    answer["known"] = {name: name not in missing for name in ask}
    leaves = {t: datasets_of(t, everything, load, set()) for t in tasks if t not in answer["unknown"]}
    answer["overlap"] = _overlaps(leaves)
    answer["metrics"] = {t: taskbuild.metrics(t, everything, load) for t in leaves}
    answer.update(taskbuild.build(leaves, own, index, include, env))  # (each task alone: the others' problems aside)
    return answer


def _own(include: list[str], load: Any, answer: dict[str, Any]) -> Index:
    """--eval_include's names, from its YAMLs as lm-eval's loader reads them; a YAML that does not load is `broken`,
    a task two YAMLs define is `twice`."""
    own: Index = {}
    defined: dict[str, list[str]] = {}
    for folder in include:
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                config = load(path, resolve_func=True)
            except Exception as e:  # noqa: BLE001  lm-eval's loader's word, whatever it is
                answer["broken"].append(f"{path} does not load: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                continue
            if not isinstance(config, dict):
                continue
            named = [config.get("task"), config.get("group"), *tags(config)]
            for name in (n for n in named if isinstance(n, str)):
                own.setdefault(name, []).append(path)
            task = config.get("task")
            if isinstance(task, str) and "group" not in config:
                defined.setdefault(task, []).append(str(path))
    answer["twice"] = {task: paths for task, paths in defined.items() if len(paths) > 1}
    return own


def _overlaps(leaves: dict[str, list[dict]]) -> list[str]:
    """Names that stand for one task between them (a group and one of its tasks, two groups sharing one)."""
    out: list[str] = []
    seen: dict[str, str] = {}
    for name, configs in leaves.items():
        for task in dict.fromkeys(str(c.get("task")) for c in configs):
            if task in seen and seen[task] != name:
                out.append(f"{seen[task]} and {name} both stand for {task} (lm-eval refuses a task in two of them)")
                break
            seen.setdefault(task, name)
    return out


def main() -> int:
    asked = json.loads(sys.stdin.read())
    answer = check(asked.get("tasks", []), asked.get("include", []), dict(os.environ), asked.get("presets", []),
                   asked.get("ask", []))  # fmt: skip
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
