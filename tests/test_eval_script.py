"""The eval job's batch script (launcher/evals/script.py), rendered: in every bundle, one exec of the eval job with
the bundle's job.json, the step and the key; no job name nor log of its own (its submitter names both, as recovery
looks jobs up by that name: a script that named itself otherwise made a job recovery could not find); with
--container_image, the same image, mounts and Python as training, through srun; shell-safe for any path."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from launcher_helpers import fixed_paths, spec_for

from launcher.bundle import render
from launcher.evals import script


def rendered(tmp_path: Path, *flags: str, root: Path = Path("/project")) -> str:
    spec, problems = spec_for("--run_name", "ev", "--nodes", "1", "--gpus_per_node", "1", "--model_size", "tiny",
                              "--dataset", "none", *flags, cwd=tmp_path)  # fmt: skip
    assert [p for p in problems if p.flag.startswith("eval") or p.flag.startswith("container")] == [], problems
    text = script.text(spec, fixed_paths("ev", root))
    path = tmp_path / "eval.sbatch"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    subprocess.run(["shellcheck", "-S", "warning", str(path)], check=True)
    return text


def test_the_script_names_no_job_nor_log_and_execs_the_eval_job_with_the_bundles_job_json(tmp_path: Path):
    text = rendered(tmp_path, "--eval_tasks", "hellaswag", "--eval_gpus", "1", "--eval_partition", "gpu",
                    "--time_limit", "10:00:00")  # fmt: skip
    assert text.startswith("#!/bin/bash\n")
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert not any(line.startswith(("#SBATCH --job-name", "#SBATCH --output")) for line in header), header
    assert {"#SBATCH --gres=gpu:1", "#SBATCH --partition=gpu", "#SBATCH --time=4:00:00"} <= set(header)
    job_json = fixed_paths("ev").job
    assert text.rstrip().endswith(f'-m launcher.evals.evaljob {job_json} "${{1:?the step}}" "${{2:?the record key}}"')
    assert "python -m launcher.jobs evaluate /project/logs/configs/ev/20260101-000000 --steps" in text


def test_without_eval_tasks_the_bundle_still_has_the_script_that_jobs_evaluate_submits(tmp_path: Path):
    text = rendered(tmp_path, "--partition", "cpu")
    assert "#SBATCH --partition=cpu" in text and "#SBATCH --gres" not in text and "launcher.evals.evaljob" in text


def test_in_a_container_the_eval_job_is_the_training_steps_image_mounts_and_python(tmp_path: Path):
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"")
    tasks = tmp_path / "my tasks"
    tasks.mkdir()
    (tasks / "t.yaml").write_text("task: mine\n")
    flags = (
        "--eval_tasks",
        "mine",
        "--eval_include",
        str(tasks),
        "--container_image",
        str(image),
        "--python",
        "/opt/py/bin/python3",
        "--tmp_dir",
        "/scratch",
    )  # (the nodes' TMPDIR elsewhere: no mount of /tmp)
    text = rendered(tmp_path, *flags)
    spec, _ = spec_for("--run_name", "ev", "--nodes", "1", "--gpus_per_node", "1", "--model_size", "tiny",
                       "--dataset", "none", *flags, cwd=tmp_path)  # fmt: skip
    options = render.container_options(spec, fixed_paths("ev"))
    exec_line = next(line for line in text.splitlines() if line.startswith("exec "))
    words = shlex.split(exec_line)
    assert words[:3] == ["exec", "srun", "--ntasks=1"] and words[3 : 3 + len(options)] == options
    assert f"--container-image={image}" in options
    mounts = next(o for o in options if o.startswith("--container-mounts="))
    assert f"{tasks}:{tasks}" in mounts  # the task folder, as the eval job reads it
    assert words[3 + len(options) :][:3] == ["env", "PYTHONPATH=" + str(render.PROJECT), "/opt/py/bin/python3"]


def test_any_path_reaches_the_eval_job_as_it_is(tmp_path: Path):
    weird = tmp_path / "a'; echo $HOME `x` b"
    text = rendered(tmp_path, "--eval_tasks", "hellaswag", root=weird)
    exec_line = next(line for line in text.splitlines() if "launcher.evals.evaljob" in line and "exec" in line)
    assert str(fixed_paths("ev", weird).job) in shlex.split(exec_line.split("exec ", 1)[1])
