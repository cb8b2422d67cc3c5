"""--eval_tasks' checks before the queue that ask the job's Python (launcher/evals/probe.py, launcher/evals/tasks.py):
every task known to its lm-eval or defined in --eval_include (the nearest names and presets offered), the include YAMLs
loading and each task defined once, no two names standing for one task, every task built by lm-eval with its data
offline as the eval job runs (a YAML it refuses named with the task, data missing with its dataset, once), lm-eval
missing from that Python; all at once, each naming its flag. A dry run with --eval_tasks imports neither torch nor
lm-eval in the launcher, and the job's Python answers without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import ROOT, run_launcher
from test_dry_run import HEAVY

from launcher.config.flags import EvalArgs
from launcher.evals import checks as eval_checks
from launcher.evals import lighteval, taskbuild, taskindex, tasks


def own_tasks(where: Path) -> Path:
    folder = where / "mine"
    folder.mkdir()
    data = where / "rows.jsonl"
    data.write_text('{"q": "a", "choices": ["x", "y"], "label": 0}\n')
    (folder / "good.yaml").write_text(json.dumps({
        "task": "mine_mc", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{q}}", "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}"}))  # fmt: skip
    return folder


def launched(where: Path, demo, *flags: str) -> subprocess.CompletedProcess:
    return run_launcher("--run_name", "chk", "--nodes", "1", "--gpus_per_node", "2", "--dataset", str(demo.dataset),
                        "--tokenizer", str(demo.tokenizer), "--dry_run", *flags, cwd=where, block=HEAVY)  # fmt: skip


def test_a_dry_run_with_eval_tasks_imports_nothing_heavy_and_writes_the_eval_script(tmp_path: Path, demo_data):
    out = launched(tmp_path, demo_data, "--eval_tasks", "mine_mc,hellaswag", "--eval_include", str(own_tasks(tmp_path)),
                   "--extra_env", f"HF_HOME={tmp_path / 'hf'}")  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr  # hellaswag's data is not here
    assert "--eval_tasks: hellaswag: its Hub dataset Rowan/hellaswag is not in the job's datasets cache" in out.stderr
    assert str(tmp_path / "hf" / "hub" / "datasets--Rowan--hellaswag") in out.stderr and "HF_HOME" in out.stderr
    empty = tmp_path / "hf" / "hub" / "datasets--Rowan--hellaswag"
    empty.mkdir(parents=True)  # a cache folder without a data file is no cached dataset
    out = launched(tmp_path, demo_data, "--eval_tasks", "mine_mc,hellaswag", "--eval_include", str(tmp_path / "mine"),
                   "--extra_env", f"HF_HOME={tmp_path / 'hf'}")  # fmt: skip
    assert out.returncode == 2 and f"{empty} holds no data file" in out.stderr, out.stderr
    out = launched(tmp_path, demo_data, "--eval_tasks", "mine_mc", "--eval_include", str(tmp_path / "mine"))
    assert out.returncode == 0, out.stderr
    assert "evals        lm-eval on mine_mc: step 10000, the last" in out.stdout
    (script,) = tmp_path.glob("logs/configs/chk/*/eval.sbatch")
    subprocess.run(["shellcheck", "-S", "warning", str(script)], check=True)
    assert f"-m launcher.evals.evaljob {script.parent}" in script.read_text()


def test_every_problem_the_jobs_python_finds_is_said_at_once(tmp_path: Path, demo_data):
    mine = own_tasks(tmp_path)
    (mine / "broken.yaml").write_text("task: broken\ndoc_to_text: !function nowhere.doc_to_text\n")
    (mine / "copy.yaml").write_text((mine / "good.yaml").read_text())  # mine_mc again: lm-eval would drop one
    (tmp_path / "rows.jsonl").rename(tmp_path / "moved.jsonl")  # the good task's data is gone
    tasks = "mine_mc,hellaswg,arc_easy,early-signl,mmlu_continuation,mmlu_anatomy_continuation"
    out = launched(tmp_path, demo_data, "--eval_tasks", tasks, "--eval_include", str(mine),
                   "--extra_env", f"HF_HOME={tmp_path / 'hf'}")  # fmt: skip
    said = out.stderr
    assert out.returncode == 2 and "Traceback" not in said
    assert "--eval_tasks: 'hellaswg' is not a task, group, tag or preset lm-eval 0.4.13 nor --eval_include knows; " \
           "did you mean hellaswag" in said  # fmt: skip
    assert (
        "--eval_tasks: 'early-signl' is not a task, group, tag or preset" in said
        and "did you mean early-signal" in said
    )
    assert f"--eval_include: {mine / 'broken.yaml'} does not load" in said
    assert f"--eval_include: mine_mc is defined by {mine / 'copy.yaml'} and {mine / 'good.yaml'}" in said
    assert (
        "--eval_tasks: mmlu_continuation and mmlu_anatomy_continuation both stand for mmlu_anatomy_continuation" in said
    )
    assert f"mine_mc: its data_files {tmp_path / 'rows.jsonl'} do not exist" in said
    assert "arc_easy: its Hub dataset allenai/ai2_arc is not in the job's datasets cache" in said
    assert not (tmp_path / "logs").exists()  # nothing written


def cached_hub_dataset(hf: Path, repo: str, rows: dict) -> None:
    """`repo` as the datasets cache holds a Hub dataset it prepared (HF_HOME/datasets/ORG___NAME/default/...: what
    `load_dataset(repo)` reads offline), made from `rows` here, no network: its test split."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet

    source = hf.parent / f"{repo.replace('/', '_')}.parquet"
    pq.write_table(pa.table(rows), source)
    org, name = repo.split("/")
    builder = Parquet(cache_dir=str(hf / "datasets"), dataset_name=f"{org}___{name}", hash="0" * 16,
                      data_files=DataFilesDict.from_patterns({"test": [str(source)]}))  # fmt: skip
    builder.download_and_prepare()
    made = Path(builder.cache_dir)  # .../ORG___NAME/default-HASH/0.0.0/0000...: the cache's own names, as a Hub load
    (made / f"{org}___{name}-test.arrow").rename(made / f"{name}-test.arrow")
    made.parent.parent.rename(made.parent.parent.with_name("default"))
    for lock in hf.rglob("*.lock"):
        lock.unlink()


def test_a_hub_task_is_built_as_lm_eval_builds_it(tmp_path: Path, demo_data):
    """Tasks over a Hub dataset (in the job's datasets cache, offline) are built with their data: a YAML lm-eval
    refuses before the data (an output_type it has not) or after (a template a document does not render) is named
    with the task; a dataset not in the cache with its dataset."""
    hf = tmp_path / "hf"
    cached_hub_dataset(hf, "me/tiny", {"q": ["a", "b"], "choices": [["x", "y"], ["x", "y"]], "label": [0, 1]})
    mine = tmp_path / "mine"
    mine.mkdir()
    task = {"dataset_path": "me/tiny", "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{q}}",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}"}  # fmt: skip
    changes = {"tiny_good": {}, "tiny_type": {"output_type": "no_such_type"},
               "tiny_template": {"doc_to_text": "{{question}}"}, "tiny_gone": {"dataset_path": "me/gone"}}  # fmt: skip
    for name, changed in changes.items():
        (mine / f"{name}.yaml").write_text(json.dumps({**task, "task": name, **changed}))
    env = ("--extra_env", f"HF_HOME={hf}")
    out = launched(tmp_path, demo_data, "--eval_tasks", "tiny_good", "--eval_include", str(mine), *env)
    assert out.returncode == 0, out.stderr
    out = launched(tmp_path, demo_data, "--eval_tasks", "tiny_good,tiny_type,tiny_template,tiny_gone",
                   "--eval_include", str(mine), *env)  # fmt: skip
    said = out.stderr
    assert out.returncode == 2 and "Traceback" not in said and said.count("  - --") == 3, said
    assert f"--eval_include: tiny_type: lm-eval cannot build it from its YAML ({mine / 'tiny_type.yaml'}): " \
           "ValueError: Got invalid output_type 'no_such_type'" in said  # fmt: skip
    assert "--eval_include: tiny_template: lm-eval cannot build it from its YAML" in said and "question" in said
    assert "--eval_tasks: tiny_gone: its Hub dataset me/gone is not in the job's datasets cache" in said


def test_one_problem_a_dataset_however_many_tasks_read_it(tmp_path: Path, demo_data):
    """early-signal with an empty cache: a line per dataset its tasks read (MMLU's 57 subjects one line), as many as
    lm-eval's YAMLs name."""
    index, load = taskindex.scan(taskindex.lm_eval_dir() / "tasks"), taskindex.loader()  # type: ignore[operator]
    found, _ = eval_checks.tasks_of(EvalArgs(eval_tasks="early-signal"))
    assert found is not None
    own = {name: paths for folder in found.include for name, paths in taskindex.scan(Path(folder)).items()}
    read = {c["dataset_path"] for t in found.tasks for c in taskindex.datasets_of(t, {**index, **own}, load, set())}
    out = launched(tmp_path, demo_data, "--eval_tasks", "early-signal", "--extra_env", f"HF_HOME={tmp_path / 'hf'}")
    lines = [line for line in out.stderr.splitlines() if "is not in the job's datasets cache" in line]
    assert out.returncode == 2 and len(lines) == len(read) == 8, out.stderr
    (mmlu,) = [line for line in lines if "cais/mmlu" in line]
    assert mmlu.startswith("  - --eval_tasks: mmlu_continuation (57 tasks: ")
    arc = "  - --eval_tasks: arc_easy, arc_challenge: its Hub dataset allenai/ai2_arc"
    assert any(line.startswith(arc) for line in lines)


def test_lm_eval_missing_from_the_jobs_python_is_named_before_the_queue(tmp_path: Path, demo_data):
    bare = tmp_path / "bare-python"  # a Python without site-packages: no lm-eval there
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    out = launched(tmp_path, demo_data, "--eval_tasks", "hellaswag", "--python", str(bare))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"--eval_tasks: lm-eval is not installed in the job's Python ({bare})" in out.stderr
    assert "pip install 'nanotron-slurm-launcher[eval]'" in out.stderr


def test_the_jobs_python_answers_without_torch(tmp_path: Path):
    asked = f"['hellaswag', 'mmlu_continuation', 'mine_mc'], [{str(own_tasks(tmp_path))!r}], {{}}"
    heavy = "sorted(m for m in ('torch', 'transformers') if m in sys.modules)"
    code = f"import json, sys\nfrom launcher.evals import tasks\na = tasks.check({asked})\n"
    code += f"print(json.dumps([a['unknown'], {heavy}]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [{}, []]


def test_a_groups_tasks_are_followed_to_their_datasets():
    root = taskindex.lm_eval_dir()
    if root is None:
        pytest.fail("lm-eval is not installed: the project's eval extra (make test installs it)")
    index = taskindex.scan(root / "tasks")
    configs = taskindex.datasets_of("mmlu_continuation", index, taskindex.loader(), set())
    assert len(configs) == 57 and {c["dataset_path"] for c in configs} == {"cais/mmlu"}
    assert {c["dataset_path"] for c in taskindex.datasets_of("social_iqa", index, taskindex.loader(), set())} == {
        "lighteval/siqa"
    }
    hub, datasets_cache = taskbuild.caches({"HF_HOME": "/shared/hf"})
    assert (hub, datasets_cache) == (Path("/shared/hf/hub"), Path("/shared/hf/datasets"))


def test_the_lighteval_table_names_only_what_lm_eval_has_under_another_name(tmp_path: Path):
    """configs/evals/lighteval.yaml: each lighteval name there differs from its lm-eval name, and lm-eval (with the
    presets' own tasks) has every name it maps to, asked as the refusal asks it."""
    named = lighteval.table()
    assert named and all(k != v for k, v in named.items())
    every, _ = eval_checks.tasks_of(EvalArgs(eval_tasks=",".join(eval_checks.preset_names())))
    assert every is not None
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    known = tasks.check([], every.include, env, ask=sorted(set(named.values())))["known"]
    assert known == dict.fromkeys(sorted(set(named.values())), True)


def test_the_docs_pre_download_command_fetches_every_dataset_the_preset_reads():
    """docs/evals.md's command that fills a shared cache for early-signal: the datasets its tasks read (lm-eval's
    YAMLs, the preset's own) are the datasets the preset's tasks read."""
    import ast
    import re

    command = re.search(r'^HF_HOME=\S+ python -c "(.+)"$', (ROOT / "docs" / "evals.md").read_text(), re.M)
    assert command is not None
    include = re.search(r"include_path='([^']+)'", command.group(1))
    listed = re.search(r"\.load\((\[.*?\])\)", command.group(1))
    assert include is not None and listed is not None
    index, load = taskindex.scan(taskindex.lm_eval_dir() / "tasks"), taskindex.loader()  # type: ignore[operator]

    def read(names: list[str], folders: list[str]) -> set[str]:
        own = {n: p for folder in folders for n, p in taskindex.scan(ROOT / folder).items()}
        return {c["dataset_path"] for t in names for c in taskindex.datasets_of(t, {**index, **own}, load, set())}

    found, _ = eval_checks.tasks_of(EvalArgs(eval_tasks="early-signal"))
    assert found is not None
    assert read(ast.literal_eval(listed.group(1)), [include.group(1)]) == read(list(found.tasks), list(found.include))


def test_the_eval_jobs_narrow_index_reads_every_name_as_lm_evals_whole_index_does():
    """The eval job's TaskManager indexes the folders its names reach (taskbuild.manager): every name reached, from
    the preset's tasks, groups, a tag spread over folders, to each one's leaves, is read from the YAML lm-eval's
    index over all its tasks reads it from; a name the narrow index could read otherwise gets the whole index."""
    from lm_eval.tasks import TaskManager

    every, _ = eval_checks.tasks_of(EvalArgs(eval_tasks=",".join(eval_checks.preset_names())))
    assert every is not None
    include = list(every.include)
    whole = TaskManager(include_path=include)
    index = taskindex.scan(taskindex.lm_eval_dir() / "tasks")  # type: ignore[operator]
    for folder in include:
        index.update(taskindex.scan(Path(folder)))
    asked = [*every.tasks, "mmlu", "leaderboard", "lambada", "super-glue-lm-eval-v1", "ai2_arc", "glue", "belebele"]
    narrow = {name: taskbuild.manager([name], include) for name in asked}
    for name, manager in narrow.items():
        reached = taskindex.reach([name], index, taskindex.loader())
        assert len(manager.all_tasks) < len(whole.all_tasks) / 10, name  # narrow indeed
        assert {n: manager.task_index.get(n) for n in reached} == {n: whole.task_index[n] for n in reached}, name
    tag = whole.task_index["super-glue-lm-eval-v1"]  # its 8 tasks, from 8 folders
    assert len(tag.tags) == 8 and narrow["super-glue-lm-eval-v1"].task_index["super-glue-lm-eval-v1"] == tag
    # the whole index: for a name whose YAMLs' lines name it nowhere (paws-x's), one seven YAMLs define (scrolls)
    reached = taskindex.reach(["paws-x", "scrolls"], index, taskindex.loader())
    assert reached["paws-x"] == ([], []) and len(reached["scrolls"][0]) == 7
    import lm_eval.tasks

    def whole_index(**kwargs: object) -> object:  # what lm-eval's whole index would be, not built a third time
        assert kwargs.get("include_defaults", True), kwargs
        return whole

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm_eval.tasks, "TaskManager", whole_index)
        assert all(taskbuild.manager([name], include) is whole for name in ("paws-x", "scrolls"))
