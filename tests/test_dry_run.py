"""The command line end to end in a subprocess: a dry run imports no heavy library, errors never trace back."""

from __future__ import annotations

import shutil
from pathlib import Path

from launcher_helpers import run_launcher

HEAVY = ("torch", "nanotron", "transformers", "datasets", "wandb", "matplotlib")


def test_dry_run_imports_no_heavy_library(tmp_path: Path):
    out = run_launcher("--run_name", "x", "--nodes", "4", "--dry_run", cwd=tmp_path, block=HEAVY)
    assert out.returncode == 0, out.stderr
    assert "dp 32 x tp 1 x pp 1 = 32 GPUs" in out.stdout
    assert len(list((tmp_path / "logs/configs/x").iterdir())) == 1
    assert len(list((tmp_path / "logs/slurm_scripts/x").glob("*.sbatch"))) == 1


def test_user_errors_exit_2_with_every_problem_and_no_traceback(tmp_path: Path):
    out = run_launcher(
        "--run_name", "x y", "--nodes", "2", "--tp", "3", "--time_limit", "soon", "--dry_run", cwd=tmp_path, block=HEAVY
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    for flag in ("--run_name", "--tp", "--time_limit"):
        assert f"  - {flag}:" in out.stderr
    assert not (tmp_path / "logs").exists()  # nothing written


def test_bad_flag_value_is_an_argparse_error(tmp_path: Path):
    out = run_launcher("--run_name", "x", "--nodes", "many", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "--nodes" in out.stderr


def test_submission_without_slurm_names_dry_run_and_local_cluster(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash"))
    out = run_launcher(
        "--run_name", "x", "--nodes", "1", "--gpus_per_node", "1", cwd=tmp_path, env={"PATH": str(bin_dir)}
    )  # a machine without Slurm's commands
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--dry_run" in out.stderr and "launcher.localcluster" in out.stderr
    assert not (tmp_path / "logs/configs/x").exists()  # Slurm is asked before writing: nothing stays behind
