"""--sweep: the grid (pure), all-or-none bundles, and a real sweep on the local cluster followed to its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import ROOT, run_launcher

from launcher.bundle import sweep_record
from launcher.config import cli
from launcher.problems import Problem
from launcher.runs import launch, sweep

pytestmark = pytest.mark.slurm

BASE = ["--run_name", "lr", "--dataset", "none", "--learning_rate", "1e-2", "--train_steps", "20", "--warmup_steps",
        "2", "--sweep", "learning_rate=1e-3,3e-3 seed=1,2"]  # fmt: skip


def test_axes_and_the_grid() -> None:
    axes, problems = sweep.parse("learning_rate=1e-3,3e-3\nseed=1,2 --exclusive=true")
    assert problems == []
    assert axes == [("learning_rate", ["1e-3", "3e-3"]), ("seed", ["1", "2"]), ("exclusive", ["true"])]
    grid = sweep.points(BASE, "lr", axes)
    assert [p.run_name for p in grid] == ["lr-1", "lr-2", "lr-3", "lr-4"]
    assert [p.values for p in grid][1] == {"learning_rate": "1e-3", "seed": "2", "exclusive": "true"}
    for point in grid:
        assert "--sweep" not in point.argv and point.argv.count("--learning_rate") == 1
        args, explicit = cli.parse(point.argv)  # each point's argv is the single run it is
        assert args.run_name == point.run_name and args.training.learning_rate == float(point.values["learning_rate"])
        assert args.training.seed == int(point.values["seed"]) and args.slurm.exclusive is True
        assert args.training.train_steps == 20 and {"learning_rate", "seed", "train_steps"} <= explicit


@pytest.mark.parametrize(
    "text,words",
    [
        ("learning_rate", "is not FLAG=VALUE"),
        ("learning_rate=1e-3,", "is not FLAG=VALUE"),
        ("lr=1e-3", "'lr' is not a flag"),
        ("run_name=a,b", "--run_name cannot be swept"),
        ("seed=1 seed=2", "seed is given twice"),
        ("learning_rate=1e-3,x", "learning_rate: x is not of type float"),
        ("nodes=1,2.5", "nodes: 2.5 is not of type int"),
        ("exclusive=true,maybe", "exclusive: maybe is not of type bool"),
        ("seed=0,1,2,3,4,5,6,7,8 learning_rate=" + ",".join(["1e-3"] * 8), "72 points, more than 64"),
        ("", "it names no flag"),
    ],
)
def test_sweep_mistakes(text: str, words: str) -> None:
    _, problems = sweep.parse(text)
    assert any(p.flag == "sweep" and words in p.message for p in problems), problems


def test_problems_of_some_points_name_them() -> None:
    shared, odd = Problem("time_limit", "bad", "fix"), Problem("warmup_steps", "too many", "fewer")
    out = launch.labelled([[shared], [shared, odd]], ["lr-1: a=1", "lr-2: a=2"])
    assert [str(p) for p in out] == ["--time_limit: bad; fix", "--warmup_steps: (lr-2: a=2) too many; fewer"]


def test_dry_run_writes_every_point_and_the_record(tmp_path: Path) -> None:
    out = run_launcher(*BASE, "--dry_run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (record_dir,) = (tmp_path / "logs/configs/lr").iterdir()
    record = sweep_record.load(record_dir)
    assert [p.run_name for p in record.points] == ["lr-1", "lr-2", "lr-3", "lr-4"] and record.name == "lr"
    assert record.sweep == "learning_rate=1e-3,3e-3 seed=1,2" and record.submitted == []  # a dry run
    for point in record.points:
        manifest = json.loads((point.bundle / "manifest.json").read_text())
        assert manifest["resolved"]["training"]["learning_rate"] == float(point.values["learning_rate"])
        assert "--sweep" not in manifest["command"] and f"--run_name {point.run_name}" in manifest["command"]
    assert "lr-3: learning_rate=3e-3, seed=1" in out.stdout


def test_one_bad_point_writes_nothing(tmp_path: Path) -> None:
    out = run_launcher(*BASE[:-1], "warmup_steps=2,50", "--dry_run", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--warmup_steps: (lr-2: warmup_steps=50) --warmup_steps 50 must be within [0, --train_steps 20]" in (
        out.stderr
    )
    assert not (tmp_path / "logs").exists()


def test_a_sweep_on_the_cluster_ends_with_its_results(tmp_path: Path, slurm_env: dict, demo_data) -> None:
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "sw", "--nodes", "1", "--gpus_per_node",
            "2", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--train_steps", "12",
            "--warmup_steps", "2", "--grad_accum_steps", "1", "--save_interval", "100", "--wandb_disabled", "true",
            "--time_limit", "5:00", "--sweep", "learning_rate=1e-4,1e-2"]  # fmt: skip

    refused = subprocess.run([*argv[:-1], "nodes=1,3"], cwd=tmp_path, env=slurm_env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "Slurm would reject the job" in refused.stderr  # nodes=3: 2 nodes exist
    assert not any(p.is_file() for p in (tmp_path / "logs").rglob("*"))  # the accepted point left nothing either

    out = subprocess.run([*argv, "--show_logs"], cwd=tmp_path, env=slurm_env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[follow] sw-1: job " in out.stderr and "[follow] sw-2: job " in out.stderr
    table = out.stdout[out.stdout.index("Sweep sw: lowest final loss first") :].splitlines()
    first, second = table[2].split(), table[3].split()
    assert (first[0], first[1], first[3], first[4]) == ("sw-2", "learning_rate=1e-2", "COMPLETED", "12")
    assert second[0] == "sw-1" and float(first[5]) < float(second[5])  # a 100x larger LR learns more in 12 steps
    (record_dir,) = [d for d in (tmp_path / "logs/configs/sw").iterdir() if (d / sweep.RECORD).exists()]
    assert (record_dir / "loss.png").stat().st_size > 0

    status = subprocess.run([sys.executable, "-m", "launcher.jobs", "status", str(record_dir)], cwd=ROOT,
                            env=slurm_env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0 and "sw-2" in status.stdout and "COMPLETED" in status.stdout, status.stderr
    for action, words in (("attach", "Sweep sw: lowest final loss first"), ("cancel", "none was still running")):
        done = subprocess.run([sys.executable, "-m", "launcher.jobs", action, str(record_dir)], cwd=ROOT,
                              env=slurm_env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and words in done.stdout, done.stdout + done.stderr


DIVERGES = """
import sys
import torch.distributed as dist
import yaml
dist.init_process_group("gloo")
config = yaml.safe_load(open(sys.argv[sys.argv.index("--config-file") + 1]))
lr = config["optimizer"]["learning_rate_scheduler"]["learning_rate"]
if lr > 1e-3 and dist.get_rank() == 0:
    raise FloatingPointError(f"loss is nan at step 3 with learning rate {lr}")
dist.barrier()
"""


def test_a_failed_point_says_why_after_the_table(tmp_path: Path, slurm_env: dict, demo_data) -> None:
    script = tmp_path / "diverges.py"
    script.write_text(DIVERGES)
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "dv", "--nodes", "1", "--gpus_per_node",
            "2", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--train_steps", "12",
            "--warmup_steps", "2", "--grad_accum_steps", "1", "--save_interval", "100", "--wandb_disabled", "true",
            "--time_limit", "5:00", "--run_train_script", str(script), "--sweep", "learning_rate=1e-4,1e-2",
            "--show_logs"]  # fmt: skip
    out = subprocess.run(argv, cwd=tmp_path, env=slurm_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr  # not every point completed
    after = out.stdout[out.stdout.index("Sweep dv: lowest final loss first") :]
    assert "dv-1 ended" not in after  # it completed: nothing to explain
    why = after[after.index("dv-2 ended FAILED: ") :]
    assert "FloatingPointError: loss is nan at step 3 with learning rate 0.01" in why and "rank 0" in why, after
    assert "fix: " in why
    (bundle_dir,) = (tmp_path / "logs/configs/dv-2").iterdir()
    recorded = json.loads((bundle_dir / "manifest.json").read_text())
    assert recorded["ended"]["state"] == "FAILED" and recorded["verdict"]["cause"] == "exception"

    (record_dir,) = [d for d in (tmp_path / "logs/configs/dv").iterdir() if (d / sweep.RECORD).exists()]
    status = subprocess.run([sys.executable, "-m", "launcher.jobs", "status", str(record_dir)], cwd=ROOT,
                            env=slurm_env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0 and "dv-2 ended FAILED: " in status.stdout, status.stdout + status.stderr
