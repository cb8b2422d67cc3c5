"""Reruns and diffs on the real local cluster (real sbatch, srun, torchrun, the torch engine on CPU): a finished run
rerun from its bundle trains to the same losses step for step, though a preset changed since (said); `--strict`
refuses a changed package version; `jobs diff` of two runs that differ in one flag names it, the config key it
changed and the first step where the losses part; the job's runtime record says what ran; and `jobs ledger`
answers from the bundle's records when no controller can be reached.

The launcher runs from a copy of the project, so that the test can change a preset file without touching the
checkout other tests read.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import jsonl
from launcher.bundle import manifest
from launcher.nanotron_config import provenance

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILES = ("launcher", "configs", "slurm_launcher.py", "run_train.py")


def project_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    copy.mkdir()
    for name in PROJECT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, copy / name)
    return copy


def flags(demo_data) -> list[str]:
    return ["--nodes", "1", "--gpus_per_node", "2", "--model_size", "tiny", "--dataset", str(demo_data.dataset),
            "--tokenizer", str(demo_data.tokenizer), "--train_steps", "8", "--grad_accum_steps", "1",
            "--learning_rate", "3e-3", "--min_lr", "3e-4", "--warmup_steps", "2", "--save_interval", "8",
            "--wandb_disabled", "true", "--time_limit", "5:00", "--show_logs"]  # fmt: skip


def losses(bundle: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in jsonl.read(bundle / "metrics.jsonl")}


def only(directory: Path) -> Path:
    (found,) = directory.iterdir()
    return found


def test_a_rerun_trains_to_the_same_losses_and_a_diff_finds_where_runs_part(tmp_path: Path, slurm_env, demo_data):
    project = project_copy(tmp_path)
    env = {**slurm_env, "PYTHONPATH": str(project)}

    def launcher(*argv: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(project / "slurm_launcher.py"), *argv], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def jobs(*argv: str, conf: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher.jobs", *argv], cwd=tmp_path, env={**env, **(conf or {})},
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    # the original, and a run that differs from it in one flag, side by side on the cluster
    first = launcher("--run_name", "orig", *flags(demo_data))
    other = launcher("--run_name", "other", *flags(demo_data), "--learning_rate", "1e-3")
    for proc in (first, other):
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0 and "ended COMPLETED" in out, out
    orig, lower = only(tmp_path / "logs/configs/orig"), only(tmp_path / "logs/configs/other")
    assert sorted(losses(orig)) == list(range(1, 9))

    # what the job recorded at its start
    run = manifest.load(orig)
    (record,) = run.runtime
    release = subprocess.run(["sbatch", "--version"], env=env, capture_output=True, text=True).stdout.split()[-1]
    assert (record["job_id"], record["attempt"], record["slurm"], record["engine"]) == (run.job_id, 1, release, "torch")
    assert record["nodes"] in ("node1", "node2") and record["world_size"] == 2
    assert record["data"] == {str(demo_data.dataset): provenance.local_fingerprint(demo_data.dataset)}
    assert record["tokenizer"] == provenance.local_fingerprint(demo_data.tokenizer)
    assert record["nanotron"]["version"] == "0.4" and record["torch"]["gpu"] is None
    assert record["took_s"] < 5  # well under 1 s on a quiet machine: this catches a blow-up, at any load

    # jobs diff of the two: the flag, the config key it changed, the first step where the losses part
    a, b = losses(orig), losses(lower)
    parted = next(s for s in sorted(a) if a[s] != b[s])
    assert parted > 1  # the same weights and data: the first step's loss is the same
    diff = jobs("diff", str(orig), str(lower))
    assert diff.returncode == 0, diff.stderr
    assert "learning_rate  0.003  0.001" in diff.stdout
    assert "optimizer.learning_rate_scheduler.learning_rate  0.003  0.001" in diff.stdout
    assert f"they part at step {parted}" in diff.stdout and "environment and versions: the same" in diff.stdout

    # a preset changed since: the rerun says so, keeps the bundle's values, and trains to the same losses
    tiny = project / "configs/presets/tiny.yaml"
    preset = yaml.safe_load(tiny.read_text())
    preset["model"]["hidden_size"] = 96
    tiny.write_text(yaml.safe_dump(preset))
    again = jobs("rerun", str(orig), "--show_logs")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{tiny} (the run's preset) has changed since the launch" in again.stdout
    assert "--hidden_size 96 (the bundle's 64, which the rerun keeps)" in again.stdout
    assert "  differs  " not in again.stdout and "ended COMPLETED" in again.stdout
    (rerun,) = set((tmp_path / "logs/configs/orig").iterdir()) - {orig}
    assert losses(rerun) == losses(orig)  # step for step, to the last bit
    rerun_run = manifest.load(rerun)
    assert rerun_run.rerun_of is not None and rerun_run.rerun_of["bundle"] == str(orig)
    assert rerun_run.checkpoints != run.checkpoints and (run.checkpoints / "latest").read_text().strip() == "8"
    same = jobs("diff", str(orig), str(rerun), "--json")
    found = json.loads(same.stdout)
    assert found["losses"]["parted_at"] is None and found["losses"]["common"] == 8
    assert found["groups"]["environment"] == [] and found["groups"]["data"] == []
    assert [r["name"] for r in found["groups"]["config"]] == []

    # --strict refuses a changed package version (recorded in a copy of the manifest), writing nothing
    edited = orig.with_name("edited")
    shutil.copytree(orig, edited)
    data = json.loads((edited / "manifest.json").read_text())
    data["versions"]["torch"] = "0.0.1"
    (edited / "manifest.json").write_text(json.dumps(data))
    bundles = sorted((tmp_path / "logs/configs").rglob("manifest.json"))
    checkpoints = sorted((tmp_path / "checkpoints").iterdir())
    strict = jobs("rerun", str(edited), "--strict")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "--strict" in strict.stderr and "package torch: 0.0.1 (the original) -> " in strict.stderr
    assert sorted((tmp_path / "logs/configs").rglob("manifest.json")) == bundles
    assert sorted((tmp_path / "checkpoints").iterdir()) == checkpoints

    # the ledger without a controller: the bundle's records, and what they could not confirm
    conf = Path(env["SLURM_CONF"]).read_text()
    dead = tmp_path / "dead.conf"  # the same cluster, but a port no controller listens on
    dead.write_text("\n".join("SlurmctldPort=6999" if x.startswith("SlurmctldPort=") else x for x in conf.splitlines()))
    ledger = jobs("ledger", str(orig), conf={"SLURM_CONF": str(dead)})
    assert ledger.returncode == 0 and "Traceback" not in ledger.stderr, ledger.stderr
    assert "GPU-hours of" in ledger.stdout and "job records" in ledger.stdout
    assert "Not confirmed:" in ledger.stdout and "cannot be reached" in ledger.stdout
    assert "the job's end (COMPLETED) is the manifest's record" in ledger.stdout
    live = jobs("ledger", str(orig))
    assert live.returncode == 0 and "Not confirmed" not in live.stdout
