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


def _changed(tree: dict) -> dict:
    """Every leaf of a nanotron config changed to another value of its kind (a flag's default would differ)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _changed(value)
        elif isinstance(value, bool):
            out[key] = not value
        elif isinstance(value, int):
            out[key] = value + 1 if value > 1 else value
        elif isinstance(value, float):
            out[key] = value * 1.5
        else:
            out[key] = value
    return out


def _leaves(tree: dict, path: tuple = ()) -> dict:
    out = {}
    for key, value in (tree or {}).items():
        out.update(_leaves(value, (*path, key)) if isinstance(value, dict) else {(*path, key): value})
    return out


def test_every_value_of_a_config_no_typed_flag_overrides_reaches_the_written_config(tmp_path: Path):
    """docs/validation.md's order, a flag you typed, then --config, then the default: for every value of a --config
    (the base's every leaf changed, the checkpoints' folder, the warmup's style, the positions), whichever dialect."""
    import yaml

    from launcher.nanotron_config import dialect
    from launcher.nanotron_config.presets import BASE_CONFIG

    config = _changed(yaml.safe_load(BASE_CONFIG.read_text()))
    config["parallelism"].update(dp=1, tp=1, pp=1, expert_parallel_size=1)
    config["model"]["model_config"].update(hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                                           num_hidden_layers=2, max_position_embeddings=4096)  # fmt: skip
    config["optimizer"]["learning_rate_scheduler"]["lr_warmup_style"] = "constant"
    config["checkpoints"]["checkpoints_path"] = str(tmp_path / "mine" / "ckpt")
    config["data"] = None  # random tokens
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(config))
    for written_as in ("0.4", "main"):
        out = run_launcher("--run_name", f"c{written_as}", "--nodes", "1", "--gpus_per_node", "1", "--config",
                           "mine.yaml", "--nanotron_dialect", written_as, "--dry_run", cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr
        (path,) = tmp_path.glob(f"logs/configs/c{written_as}/*/config.yaml")
        written = _leaves(dialect.to_canonical(yaml.safe_load(path.read_text())))
        typed = {("general", "run"): f"c{written_as}"}  # --run_name
        lost = {k: (v, written.get(k)) for k, v in _leaves(config).items() if written.get(k, typed.get(k)) != v
                and k not in typed and v is not None}  # fmt: skip
        assert lost == {}, written_as
        assert "checkpoints  mine/ckpt (" in out.stdout  # (the summary's: relative to where it was launched)
    typed = ("--checkpoints_path", "elsewhere", "--max_seq_len", "512")
    out = run_launcher("--run_name", "typed", "--nodes", "1", "--gpus_per_node", "1", "--config", "mine.yaml", *typed,
                       "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (path,) = tmp_path.glob("logs/configs/typed/*/config.yaml")
    written = dialect.to_canonical(yaml.safe_load(path.read_text()))
    assert written["checkpoints"]["checkpoints_path"] == str(tmp_path / "elsewhere" / "typed")  # the typed flag's
    assert written["model"]["model_config"]["max_position_embeddings"] == 512


def test_a_sweep_never_trains_two_points_into_one_configs_checkpoints_folder(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text("checkpoints:\n  checkpoints_path: ckpt/one\n")
    flags = ("--run_name", "sw", "--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--config", "mine.yaml",
             "--sweep", "seed=1,2", "--dry_run")  # fmt: skip
    out = run_launcher(*flags, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"--checkpoints_path: sw-1, sw-2 would all train into {tmp_path / 'ckpt' / 'one'}" in out.stderr
    assert not (tmp_path / "logs").exists()
    assert run_launcher(*flags, "--checkpoints_path", "ckpt", cwd=tmp_path).returncode == 0  # PATH/sw-1, PATH/sw-2


def test_the_summary_names_the_step_a_resume_really_starts_from(tmp_path: Path):
    """A pointer that names a step not complete (being written, or cut short): the torch engine resumes from the newest
    complete step whatever the pointer says; nanotron loads the step its pointer names, which it cannot."""
    root = tmp_path / "checkpoints" / "r"
    for step in (100, 200):
        (root / str(step)).mkdir(parents=True)
        (root / str(step) / "state.pt").write_bytes(b"x")
    (root / "100" / "meta.json").write_text("{}")  # 200: state.pt without meta.json, a save cut short
    (root / "latest").write_text("200\n")
    flags = ("--run_name", "r", "--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--dry_run")
    out = run_launcher(*flags, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "resume       from the checkpoint at step 100 (the newest complete one; the pointer names step 200: " \
           f"{root / '200'} has state.pt but no meta.json)" in out.stdout  # fmt: skip
    (root / "latest").unlink()
    for step in (100, 200):
        (root / str(step) / "state.pt").unlink()
        (root / str(step) / "model").mkdir()
    (root / "100" / "checkpoint_metadata.json").write_text("{}")
    (root / "latest.txt").write_text("200")
    out = run_launcher(*flags, cwd=tmp_path)
    assert "resume       the pointer names step 200, which is not complete (" in out.stdout, out.stdout + out.stderr
    assert "nanotron cannot load it: step 100 is the newest complete one" in out.stdout


def test_the_jobs_commands_advise_only_what_they_have(tmp_path: Path):
    """Without Slurm, `jobs status` advises the local cluster, not a --dry_run it does not have; `jobs rerun` (which
    has one) its own; the launcher its own. `jobs --help` says what it does whole."""
    import os
    import subprocess
    import sys

    from launcher_helpers import ROOT

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash"))
    env = {**os.environ, "PATH": str(bin_dir), "PYTHONPATH": str(ROOT)}

    def jobs(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher.jobs", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    said = jobs("status", "123")
    assert said.returncode != 0 and "Traceback" not in said.stderr and "launcher.localcluster" in said.stderr
    assert "--dry_run" not in said.stderr
    assert run_launcher("--run_name", "x", "--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--dry_run",
                        cwd=tmp_path).returncode == 0  # fmt: skip
    (bundle,) = (tmp_path / "logs" / "configs" / "x").iterdir()
    said = jobs("rerun", str(bundle))
    assert said.returncode != 0 and "Traceback" not in said.stderr and "jobs rerun --dry_run" in said.stderr
    helped = jobs("--help").stdout
    first = helped.split("\n\n")[1].replace("\n", " ")
    assert first.endswith(".") and "compare two runs" in first, first


def test_the_layout_line_counts_in_words_that_agree(tmp_path: Path):
    out = run_launcher("--run_name", "one", "--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--dry_run",
                       cwd=tmp_path)  # fmt: skip
    assert "dp 1 x tp 1 x pp 1 = 1 GPU (1 node x 1)" in out.stdout, out.stdout + out.stderr
    out = run_launcher("--run_name", "two", "--nodes", "2", "--gpus_per_node", "2", "--dataset", "none", "--dry_run",
                       cwd=tmp_path)  # fmt: skip
    assert "= 4 GPUs (2 nodes x 2)" in out.stdout, out.stdout + out.stderr


def test_a_configs_checkpoints_folder_no_filesystem_holds_is_a_named_problem(tmp_path: Path):
    (tmp_path / "long.yaml").write_text(f"checkpoints:\n  checkpoints_path: /tmp/{'x' * 300}\n")
    out = run_launcher("--run_name", "r", "--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--config",
                       "long.yaml", "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--config: checkpoints.checkpoints_path: a name in it is 300 bytes long" in out.stderr
