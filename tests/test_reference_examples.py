"""Every example of the nanotron launcher's documentation (shared/reference/004, "Basic Usage" and "Examples") does
what the documentation says, through the real command line, as a dry run (hub datasets and tokenizers are names
here, never fetched). Where an example is impossible by nanotron's rules (16 GPUs of 64), the message names the
layouts that work, and following it works."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from launcher_helpers import run_launcher

pytestmark = pytest.mark.slurm

BASIC = ["--run_name", "my_experiment", "--nodes", "4", "--model_size", "base"]
SMALL = ["--run_name", "quick_test", "--nodes", "2", "--model_size", "tiny", "--train_steps", "100",
         "--dataset", "stas/openwebtext-10k"]  # fmt: skip
PRODUCTION = ["--run_name", "production_run", "--nodes", "8", "--model_size", "large", "--dp", "4", "--pp", "2",
              "--tp", "2", "--train_steps", "50000", "--learning_rate", "2e-4", "--warmup_steps", "2000",
              "--dataset", "my_dataset", "--tokenizer", "my_tokenizer", "--email", "researcher@example.com",
              "--time_limit", "72:00:00"]  # fmt: skip
CUSTOM_ARCH = ["--run_name", "custom_arch", "--nodes", "4", "--hidden_size", "1536", "--num_layers", "24",
               "--num_heads", "16", "--num_kv_heads", "4", "--train_steps", "20000"]  # fmt: skip
DRY_RUN = ["--run_name", "test_config", "--model_size", "base", "--dry_run"]
CUSTOM_SCRIPT = ["--run_name", "custom_script", "--nodes", "2", "--model_size", "base", "--run_train_script",
                 "path/to/my_custom_train.py", "--slurm_scripts_dir", "slurm_scripts"]  # fmt: skip
MONITORED = ["--run_name", "monitored_run", "--nodes", "2", "--model_size", "base", "--show_logs"]


def dry(flags: list[str], cwd: Path):
    out = run_launcher(*flags, *([] if "--dry_run" in flags else ["--dry_run"]), cwd=cwd)
    assert "Traceback" not in out.stderr
    return out


def bundle(cwd: Path, run: str) -> tuple[dict, str, dict]:
    """The config, the script and the manifest a launch wrote."""
    (stamp,) = (cwd / "logs/configs" / run).iterdir()
    (script,) = (p for d in (cwd / "logs/slurm_scripts", cwd / "slurm_scripts") for p in d.glob(f"{run}/*.sbatch"))
    manifest = yaml.safe_load((stamp / "manifest.json").read_text())
    return yaml.safe_load((stamp / "config.yaml").read_text()), script.read_text(), manifest


def test_basic_usage_generates_config_script_and_manifest(tmp_path: Path):
    out = dry(BASIC, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "dp 32 x tp 1 x pp 1 = 32 GPUs (4 nodes x 8)" in out.stdout
    config, script, manifest = bundle(tmp_path, "my_experiment")
    assert config["model"]["model_config"]["hidden_size"] == 1024 and config["parallelism"]["dp"] == 32
    assert "#SBATCH --nodes=4" in script and "--run_name my_experiment --nodes 4" in manifest["command"]
    assert manifest["derived"]["memory"]["fits"] and manifest["files"]["config"]["sha256"]


def test_a_small_model_for_testing_adapts_the_default_warmup(tmp_path: Path):
    out = dry(SMALL, tmp_path)
    assert out.returncode == 0, out.stderr  # the default warmup (1000) no longer refuses a 100-step run
    assert "100 steps" in out.stdout and "10 warmup, a tenth of the run, as the default 1000" in out.stdout
    config, _, _ = bundle(tmp_path, "quick_test")
    assert config["tokens"]["train_steps"] == 100
    assert config["optimizer"]["learning_rate_scheduler"]["lr_warmup_steps"] == 10
    assert config["data"]["dataset"]["hf_dataset_or_datasets"] == "stas/openwebtext-10k"


def test_a_warmup_you_chose_beyond_the_run_is_still_an_error(tmp_path: Path):
    out = dry([*SMALL, "--warmup_steps", "500"], tmp_path)
    assert out.returncode == 2 and "--warmup_steps 500 must be within [0, --train_steps 100]" in out.stderr


def test_the_production_example_names_the_layouts_that_work(tmp_path: Path):
    out = dry(PRODUCTION, tmp_path)
    assert out.returncode == 2 and not (tmp_path / "logs").exists()
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("  - --dp:")]
    assert "= 16, but the job has 64 GPUs" in line and "--dp 16" in line and "--nodes 2" in line
    on_two_nodes = [*PRODUCTION[:3], "2", *PRODUCTION[4:]]  # as the message says: --nodes 2
    out = dry(on_two_nodes, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "dp 4 x tp 2 x pp 2 = 16 GPUs (2 nodes x 8)" in out.stdout
    derived = [f for i, f in enumerate(PRODUCTION) if f != "--dp" and PRODUCTION[i - 1] != "--dp"]
    out = dry([*derived, "--run_name", "production_all"], tmp_path)  # or --dp 16, derived
    assert out.returncode == 0, out.stderr
    assert "dp 16 x tp 2 x pp 2 = 64 GPUs (8 nodes x 8)" in out.stdout
    config, script, _ = bundle(tmp_path, "production_all")
    assert config["optimizer"]["learning_rate_scheduler"]["lr_warmup_steps"] == 2000
    assert "#SBATCH --mail-user=researcher@example.com" in script and "#SBATCH --time=72:00:00" in script


def test_a_custom_model_architecture(tmp_path: Path):
    out = dry(CUSTOM_ARCH, tmp_path)
    assert out.returncode == 0, out.stderr
    model = bundle(tmp_path, "custom_arch")[0]["model"]["model_config"]
    assert (model["hidden_size"], model["num_hidden_layers"]) == (1536, 24)
    assert (model["num_attention_heads"], model["num_key_value_heads"]) == (16, 4)


def test_the_dry_run_example_submits_nothing(tmp_path: Path):
    out = dry(DRY_RUN, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Dry run: nothing submitted" in out.stdout and bundle(tmp_path, "test_config")[0]


def test_a_custom_training_script(tmp_path: Path):
    custom = tmp_path / "path/to/my_custom_train.py"
    custom.parent.mkdir(parents=True)
    custom.write_text("print('mine')\n")
    out = dry(CUSTOM_SCRIPT, tmp_path)
    assert out.returncode == 0, out.stderr
    _, script, _ = bundle(tmp_path, "custom_script")  # in --slurm_scripts_dir
    assert (tmp_path / "slurm_scripts/custom_script").is_dir() and str(custom) in script


def test_monitoring_output_in_real_time_parses_and_renders(tmp_path: Path):
    out = dry(MONITORED, tmp_path)  # following the job itself needs the cluster (tests/test_slurm_e2e.py)
    assert out.returncode == 0, out.stderr and bundle(tmp_path, "monitored_run")


@pytest.mark.parametrize("example", [BASIC, SMALL, CUSTOM_ARCH, DRY_RUN, MONITORED])
def test_every_example_fits_its_gpus_and_says_so(example: list[str], tmp_path: Path):
    out = dry(example, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr  # a CI run once saw no memory line, and not why
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("memory"))
    assert "of 79.6 GiB per GPU" in line and "H100 80GB SXM" in line


def test_the_small_model_example_trains_on_the_local_cluster(tmp_path: Path, slurm_env: dict, demo_data):
    """ "Training a Small Model for Testing", run for real where it can be: on the local cluster (2 GPUs a node, not
    8) with a local dataset and tokenizer in place of the hub's (nothing downloads here); its other flags as
    documented, the default warmup included."""
    import subprocess
    import sys

    from launcher_helpers import LAUNCHER

    flags = [f for f in SMALL if f not in ("--dataset", "stas/openwebtext-10k")]
    argv = [sys.executable, str(LAUNCHER), *flags, "--gpus_per_node", "2", "--dataset", str(demo_data.dataset),
            "--tokenizer", str(demo_data.tokenizer), "--wandb_disabled", "true", "--show_logs"]  # fmt: skip
    out = subprocess.run(argv, cwd=tmp_path, env=slurm_env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "10 warmup, a tenth of the run" in out.stdout and "step 100/100" in out.stdout
    assert "ended COMPLETED" in out.stdout
