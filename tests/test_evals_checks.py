"""--eval_tasks' checks before the queue that ask the job's Python (launcher/evals/checks.py, launcher/evals/tasks.py):
every task known to its lm-eval or defined in --eval_include (close names offered), the include YAMLs loading, each
task's data where the job reads it offline (local files; a Hub dataset in the datasets cache), lm-eval missing from
that Python; all at once, each naming its flag. A dry run with --eval_tasks imports neither torch nor lm-eval in the
launcher, and the job's Python answers without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import ROOT, run_launcher
from test_dry_run import HEAVY

from launcher.evals import tasks


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
    (tmp_path / "hf" / "hub" / "datasets--Rowan--hellaswag").mkdir(parents=True)  # as the Hub's cache holds it
    out = launched(tmp_path, demo_data, "--eval_tasks", "mine_mc,hellaswag", "--eval_include", str(tmp_path / "mine"),
                   "--extra_env", f"HF_HOME={tmp_path / 'hf'}")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "evals        lm-eval on mine_mc, hellaswag: step 10000, the last" in out.stdout
    (script,) = tmp_path.glob("logs/configs/chk/*/eval.sbatch")
    subprocess.run(["shellcheck", "-S", "warning", str(script)], check=True)
    assert f"-m launcher.evals.evaljob {script.parent}" in script.read_text()


def test_every_problem_the_jobs_python_finds_is_said_at_once(tmp_path: Path, demo_data):
    mine = own_tasks(tmp_path)
    (mine / "broken.yaml").write_text("task: broken\ndoc_to_text: !function nowhere.doc_to_text\n")
    (tmp_path / "rows.jsonl").rename(tmp_path / "moved.jsonl")  # the good task's data is gone
    out = launched(tmp_path, demo_data, "--eval_tasks", "mine_mc,hellaswg,arc_easy", "--eval_include", str(mine),
                   "--extra_env", f"HF_HOME={tmp_path / 'hf'}")  # fmt: skip
    said = out.stderr
    assert out.returncode == 2 and "Traceback" not in said
    assert "--eval_tasks: 'hellaswg' is not a task, group or tag lm-eval 0.4.13 nor --eval_include knows; did you " \
           "mean hellaswag" in said  # fmt: skip
    assert f"--eval_include: {mine / 'broken.yaml'} does not load" in said
    assert f"mine_mc: its data_files {tmp_path / 'rows.jsonl'} do not exist" in said
    assert "arc_easy: its Hub dataset allenai/ai2_arc is not in the job's datasets cache" in said
    assert not (tmp_path / "logs").exists()  # nothing written


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
    root = tasks.lm_eval_dir()
    if root is None:
        pytest.fail("lm-eval is not installed: the project's eval extra (make test installs it)")
    index = tasks.scan(root / "tasks")
    configs = tasks.datasets_of("mmlu_continuation", index, tasks._loader(), set())
    assert len(configs) == 57 and {c["dataset_path"] for c in configs} == {"cais/mmlu"}
    assert {c["dataset_path"] for c in tasks.datasets_of("social_iqa", index, tasks._loader(), set())} == {
        "lighteval/siqa"
    }
    hub, datasets_cache = tasks.caches({"HF_HOME": "/shared/hf"})
    assert (hub, datasets_cache) == (Path("/shared/hf/hub"), Path("/shared/hf/datasets"))
