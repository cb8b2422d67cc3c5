"""--export_hf: the run's export as a CPU job chained to it (`--dependency=afterok`), its script rendered into the
bundle; on the real local cluster a run ends with a Hugging Face model transformers loads and a perplexity in the
summary, and a run that fails takes its export with it (Slurm cancels it)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_runs import bundles, finish, launch, wait_for
from test_slurm_e2e import FAIL, script

from launcher import protocol as P
from launcher.bundle import manifest
from launcher.errors import ConfigError
from launcher.runs import launch as launcher_launch
from launcher.slurm import client as slurm

pytestmark = pytest.mark.slurm


def test_the_export_script_is_rendered_into_the_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data):
    monkeypatch.chdir(tmp_path)
    argv = ["--run_name", "chained", "--nodes", "1", "--gpus_per_node", "2", "--dataset", str(demo_data.dataset),
            "--tokenizer", str(demo_data.tokenizer), "--partition", "debug", "--dry_run"]  # fmt: skip
    plain = launcher_launch.prepare(argv)
    assert not (plain.paths.bundle_dir / P.EXPORT_SCRIPT).exists()
    assert "export_script" not in manifest.load(plain.paths.bundle_dir).data["files"]

    prepared = launcher_launch.prepare([*argv, "--export_hf"])
    run = manifest.load(prepared.paths.bundle_dir)
    script_path = prepared.paths.bundle_dir / P.EXPORT_SCRIPT
    text = script_path.read_text()
    assert run.data["files"]["export_script"]["path"] == str(script_path)
    assert "#SBATCH --partition=debug\n" in text  # the run's, by default
    assert (
        run.output("export_log").name.endswith(P.EXPORT_LOG_SUFFIX) and f'--output="{run.output("export_log")}"' in text
    )
    assert f"-m launcher.export.chained {prepared.paths.bundle_dir}" in text and "-m launcher.train.evaluate" in text
    assert "--gpus" not in text and "srun" not in text  # one node's CPUs
    subprocess.run(["shellcheck", "-S", "warning", str(script_path)], check=True)

    other = launcher_launch.prepare([*argv, "--export_hf", "--export_partition", "urgent"])
    assert "#SBATCH --partition=urgent\n" in (other.paths.bundle_dir / P.EXPORT_SCRIPT).read_text()
    with pytest.raises(Exception, match="export_partition"):
        launcher_launch.prepare([*argv, "--export_hf", "--export_partition", "a b"])


def test_a_run_with_export_hf_ends_with_a_model_transformers_loads_and_its_perplexity(
    tmp_path: Path, slurm_env: dict, demo_data
):
    flags = ("--train_steps", "8", "--save_interval", "8", "--export_hf", "--export_partition", "urgent")
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "exported", *flags, nodes="1"), timeout=420)
    assert code == 0, out
    (bundle,) = bundles(tmp_path, "exported")
    run = manifest.load(bundle)
    job, export_job = run.job_id, run.export_job_id
    assert export_job is not None and export_job != job
    assert f"Its export (--export_hf): job {export_job}" in out and f"Export job {export_job} ended COMPLETED" in out
    assert out.index(f"Job {job} ended COMPLETED") < out.index(f"Export job {export_job} ended")
    result = run.data["export"]
    assert result["state"] == "COMPLETED" and result["step"] == 8 and result["job_id"] == export_job
    assert f"perplexity   {result['perplexity']:.4g}" in out and f"hf model     {result['output']}" in out
    assert math.isclose(result["perplexity"], math.exp(result["loss"])) and 1 < result["perplexity"] < demo_data.vocab
    log = run.output("export_log").read_text()
    assert f"export: job {export_job}" in log and "held-out loss" in log

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(result["output"])
    assert model.config.vocab_size >= demo_data.vocab and model.config.num_hidden_layers > 0  # (the run's: 77 -> 128)
    card = (Path(result["output"]) / "README.md").read_text()
    assert f"perplexity {result['perplexity']:.4g}" in card and str(bundle.resolve()) in card

    status = subprocess.run([sys.executable, "-m", "launcher.jobs", "status", str(bundle)], env=slurm_env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0 and f"export: job {export_job}, COMPLETED" in status.stdout, status.stdout
    assert f"perplexity   {result['perplexity']:.4g}" in status.stdout


def test_a_failed_run_takes_its_export_with_it(tmp_path: Path, slurm_env: dict, demo_data):
    flags = ("--run_train_script", script(tmp_path, "fail.py", FAIL), "--export_hf")
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "unexported", *flags, nodes="1"), timeout=300)
    assert code == 1 and "ended FAILED" in out, out
    (bundle,) = bundles(tmp_path, "unexported")
    export_job = manifest.load(bundle).export_job_id
    assert export_job is not None and f"export       job {export_job} will not run" in out
    state = wait_for(lambda: (s := slurm.job_state(export_job)) is not None and s.terminal and s, timeout=60)
    assert state.state == "CANCELLED"  # --kill-on-invalid-dep: afterok can no longer be met
    assert not (bundle / P.EXPORT_RESULT).exists()


def test_export_flags_out_of_place_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data):
    monkeypatch.chdir(tmp_path)
    argv = ["--run_name", "x", "--nodes", "1", "--gpus_per_node", "2", "--dataset", str(demo_data.dataset),
            "--tokenizer", str(demo_data.tokenizer), "--dry_run"]  # fmt: skip
    with pytest.raises(ConfigError) as e:
        launcher_launch.prepare([*argv, "--export_partition", "cpu"])
    assert "--export_partition" in str(e.value) and "add --export_hf" in str(e.value)
    with pytest.raises(ConfigError) as e:
        launcher_launch.prepare([*argv, "--export_hf", "--interactive"])
    assert "--interactive submits no batch job" in str(e.value)
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").rglob("*.sbatch"))


def test_the_evaluation_takes_the_validation_split_where_there_is_one(tmp_path: Path, demo_data):
    import datasets

    from launcher.train import evaluate

    train = datasets.load_from_disk(str(demo_data.dataset))
    split = datasets.DatasetDict({"train": train, "validation": datasets.Dataset.from_dict({"text": ["held out"] * 3})})
    split.save_to_disk(str(tmp_path / "dict"))
    cfg = SimpleNamespace(dataset=str(tmp_path / "dict"), mixture=(), dataset_split="train", text_column="text")
    texts, where = evaluate.held_out(cfg)  # type: ignore[arg-type]
    assert texts == ["held out"] * 3 and where == f"the 'validation' split of {tmp_path / 'dict'}"
    cfg.dataset = str(demo_data.dataset)  # one split only: its last documents, said so
    texts, where = evaluate.held_out(cfg)  # type: ignore[arg-type]
    assert texts == [t for t in train["text"][-evaluate.DOCUMENTS :] if t] and "held out only where" in where


def test_each_point_of_a_sweep_gets_its_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data):
    monkeypatch.chdir(tmp_path)
    argv = ["--run_name", "sw", "--nodes", "1", "--gpus_per_node", "2", "--dataset", str(demo_data.dataset),
            "--tokenizer", str(demo_data.tokenizer), "--export_hf", "--sweep", "seed=1,2", "--dry_run"]  # fmt: skip
    assert launcher_launch.main(argv) == 0
    scripts = sorted(tmp_path.glob(f"logs/configs/sw-*/*/{P.EXPORT_SCRIPT}"))
    assert [s.parts[-3] for s in scripts] == ["sw-1", "sw-2"]
    assert all(f"-m launcher.export.chained {s.parent}" in s.read_text() for s in scripts)
