"""`jobs rerun` without a cluster (dry runs, in-process): the rerun writes the bundle's own config from its resolved
flags whatever today's presets say, says what differs from the original's environment, and `--strict` refuses
on any difference with nothing written. (On the local cluster, a rerun trains to the same losses:
tests/test_rerun_e2e.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from launcher_helpers import spec_for

from launcher import jobs
from launcher.bundle import manifest
from launcher.errors import ConfigError
from launcher.nanotron_config import presets, provenance
from launcher.report.compare import PLACE_KEYS, config_of
from launcher.runs import launch, rerun
from launcher.train import record
from launcher.train.environment import JobEnvironment
from launcher.train.settings import load_train_config


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return tmp_path


def original(*flags: str, run_name: str = "r") -> manifest.Manifest:
    argv = ["--run_name", run_name, "--nodes", "1", "--gpus_per_node", "2", "--dry_run", *flags]
    return manifest.load(launch.prepare(argv).paths.bundle_dir)


def rerun_of(run: manifest.Manifest, capsys: pytest.CaptureFixture, **options: bool) -> tuple[manifest.Manifest, str]:
    before = set(run.bundle_dir.parent.iterdir())
    flags = {"dry_run": True, "strict": False, "resume": False, "show_logs": False, **options}
    assert rerun.rerun(run, None, **flags) == 0
    (new,) = set(run.bundle_dir.parent.iterdir()) - before
    return manifest.load(new), capsys.readouterr().out


def assert_same_run(a: manifest.Manifest, b: manifest.Manifest) -> None:
    """The rerun's config is the original's but for its checkpoints; its resolved flags too, but for what to do."""
    ca, cb = config_of(a), config_of(b)
    assert {k: v for k, v in ca.items() if k not in PLACE_KEYS} == {k: v for k, v in cb.items() if k not in PLACE_KEYS}
    assert ca["checkpoints.checkpoints_path"] != cb["checkpoints.checkpoints_path"]  # a checkpoint directory of its own

    def kept(run: manifest.Manifest) -> dict:
        resolved = {k: v for k, v in run.data["resolved"].items() if k != "execution"}
        return {**resolved, "paths": {k: v for k, v in resolved["paths"].items() if k != "resume"},
                "parallelism": {k: v for k, v in resolved["parallelism"].items() if k != "layout"}}  # fmt: skip

    assert kept(a) == kept(b)
    assert b.rerun_of is not None and b.rerun_of["bundle"] == str(a.bundle_dir)


@pytest.mark.parametrize(
    "flags",
    [
        ("--dataset", "none"),
        ("--dataset", "none", "--model_size", "1b", "--nodes", "2", "--gpus_per_node", "8", "--tp", "2"),
        (
            "--dataset",
            "none",
            "--train_steps",
            "50",
            "--learning_rate",
            "1e-3",
            "--exclusive",
            "--pre_launch_commands",
            "-v; echo 'a b'",
            "--extra_env",
            "NCCL_DEBUG=WARN A='x y'",
        ),  # fmt: skip
        ("--dataset", "none", "--layout", "auto", "--nodes", "2", "--gpus_per_node", "8", "--model_size", "1b"),
        ("--dataset", "none", "--nanotron_dialect", "main", "--rope_theta", "500000.0", "--zero_stage", "1"),
    ],
    ids=["default", "1b-tp2", "values-to-quote", "layout-auto", "main-dialect"],
)
def test_a_rerun_writes_the_bundles_own_config(workdir: Path, capsys, flags: tuple[str, ...]):
    first = original(*flags)
    again, out = rerun_of(first, capsys)
    assert_same_run(first, again)
    assert f"Rerun of {first.bundle_dir}" in out and "Dry run: nothing submitted" in out


def test_data_stages_a_mixture_and_a_config_file_of_its_own(workdir: Path, capsys, demo_data, second_dataset):
    user = workdir / "user.yaml"
    user.write_text(yaml.safe_dump({"optimizer": {"adam_beta2": 0.95}, "data": {"seed": 9}}))
    mix = f"{demo_data.dataset}:0.7,{second_dataset}:0.3"
    first = original("--dataset", mix, "--tokenizer", str(demo_data.tokenizer), "--config", str(user),
                     "--nanotron_dialect", "main", "--data_stages", f"anneal@40={second_dataset}")  # fmt: skip
    user.write_text(yaml.safe_dump({"optimizer": {"adam_beta2": 0.5}}))  # the file changed since: not read again
    again, out = rerun_of(first, capsys)
    assert_same_run(first, again)
    assert config_of(again)["optimizer.optimizer_factory.adam_beta2"] == 0.95
    assert f"{user} (the run's config) has changed since the launch" in out


def test_a_changed_preset_is_said_and_the_bundles_values_kept(workdir: Path, capsys, monkeypatch):
    copy = workdir / "presets"
    shutil.copytree(presets.PRESETS_DIR, copy)
    monkeypatch.setattr(presets, "PRESETS_DIR", copy)
    monkeypatch.setattr(manifest, "PRESETS_DIR", copy)
    first = original("--dataset", "none")
    tiny = yaml.safe_load((copy / "tiny.yaml").read_text())
    assert tiny["model"]["hidden_size"] == 64
    tiny["model"].update(hidden_size=96, tie_word_embeddings=True)  # tied: no flag says it, the bundle's config does
    (copy / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    again, out = rerun_of(first, capsys)
    assert_same_run(first, again)
    assert config_of(again)["model.model_config.hidden_size"] == 64
    assert config_of(again)["model.model_config.tie_word_embeddings"] is False
    assert f"{copy / 'tiny.yaml'} (the run's preset) has changed since the launch" in out
    assert "--hidden_size 96 (the bundle's 64, which the rerun keeps)" in out
    today = launch.prepare(["--run_name", "r", "--dataset", "none", "--dry_run"]).paths.bundle_dir
    assert config_of(manifest.load(today))["model.model_config.hidden_size"] == 96  # the same flags today: new preset


def _copy_with(run: manifest.Manifest, name: str, edit) -> manifest.Manifest:
    """A copy of the bundle (beside it, as another launch of the run), its manifest edited."""
    copy = run.bundle_dir.with_name(name)
    shutil.copytree(run.bundle_dir, copy)
    data = json.loads((copy / "manifest.json").read_text())
    edit(data)
    (copy / "manifest.json").write_text(json.dumps(data))
    return manifest.load(copy)


def test_strict_refuses_a_changed_package_version_and_writes_nothing(workdir: Path, capsys):
    first = original("--dataset", "none")
    older = _copy_with(first, "older", lambda d: d["versions"].update(torch="1.0.0"))
    before = sorted(first.bundle_dir.parent.iterdir())
    with pytest.raises(ConfigError) as refused:
        rerun.rerun(older, None, dry_run=True, strict=True, resume=False, show_logs=False)
    assert "--strict" in str(refused.value) and "package torch: 1.0.0 (the original) -> " in str(refused.value)
    assert "Nothing was written or submitted" in str(refused.value)
    assert sorted(first.bundle_dir.parent.iterdir()) == before and not (workdir / "checkpoints").exists()
    again, out = rerun_of(older, capsys)  # without --strict: said, and rerun
    assert "differs      package torch: 1.0.0 (the original) -> " in out
    assert again.rerun_of is not None and again.rerun_of["differs"][0].startswith("package torch: 1.0.0")
    assert jobs.main(["rerun", str(first.bundle_dir), "--dry_run", "--strict"]) == 0  # nothing differs: it goes


def _ran(run: manifest.Manifest) -> None:
    """The runtime record the job's rank 0 writes, written for the bundle's config here."""
    job = JobEnvironment.read({"LAUNCHER_BUNDLE": str(run.bundle_dir), "SLURM_JOB_ID": "9"})  # its runtime.jsonl
    record.append(load_train_config(str(run.bundle_dir / "config.yaml")), job, "torch")


def test_changed_data_is_a_difference_and_strict_refuses_it(workdir: Path, capsys, demo_data):
    data = workdir / "data"
    shutil.copytree(demo_data.dataset, data)
    first = original("--dataset", str(data), "--tokenizer", str(demo_data.tokenizer))
    _ran(first)
    again, out = rerun_of(first, capsys)
    assert "  differs  " not in out and "cuda, nccl, gpu, engine: known once the rerun's job records them" in out
    arrow = next(data.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes() + b"\0")
    with pytest.raises(ConfigError) as refused:
        rerun.rerun(first, None, dry_run=True, strict=True, resume=False, show_logs=False)
    was = provenance.short(provenance.local_fingerprint(demo_data.dataset))
    assert f"data {data}: {was} (the original) -> " in str(refused.value)


def test_resume_continues_the_originals_checkpoints(workdir: Path, capsys):
    first = original("--dataset", "none", "--resume", "false")
    (first.checkpoints / "10").mkdir(parents=True)  # a complete step of the torch engine's, and its pointer
    (first.checkpoints / "10" / "state.pt").write_bytes(b"x")
    (first.checkpoints / "10" / "meta.json").write_text("{}")
    (first.checkpoints / "latest").write_text("10\n")
    fresh, _ = rerun_of(first, capsys)
    assert fresh.checkpoints != first.checkpoints and fresh.checkpoints.parent == first.checkpoints.parent
    resumed, out = rerun_of(first, capsys, resume=True)
    assert resumed.checkpoints == first.checkpoints and "from the checkpoint at step 10" in out
    (fresh.checkpoints).mkdir()
    (fresh.checkpoints / "latest").write_text("3\n")
    assert rerun_of(fresh, capsys, resume=True)[0].checkpoints == fresh.checkpoints  # a rerun's own, resumed


def test_a_rerun_is_named_as_asked_and_found_by_job_id(workdir: Path, capsys):
    first = original("--dataset", "none")
    submitted = _copy_with(first, "20260101-000000", lambda d: d["slurm"].update(submitted=True, job_id="4242"))
    assert jobs.bundle_of("4242", workdir / "logs/configs").bundle_dir == submitted.bundle_dir
    assert jobs.main(["rerun", "4242", "--run_name", "again", "--dry_run"]) == 0
    (new,) = (workdir / "logs/configs/again").iterdir()
    assert manifest.load(new).rerun_of["job_id"] == "4242"  # type: ignore[index]
    assert jobs.main(["rerun", str(workdir / "nothing-here"), "--dry_run"]) == 1
    assert "neither a bundle directory nor a job id" in capsys.readouterr().err


def test_what_the_job_sees_is_not_guessed_from_the_login_node(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    """In a container the job's nanotron and torch are the image's: not compared (unconfirmed), where this node's
    would make --strict refuse for nothing; the hub cache is the one the job's --extra_env names."""
    caches: list[Path] = []
    monkeypatch.setattr(provenance, "fingerprint", lambda name, kind, cache: caches.append(cache) or {})
    here, _ = spec_for("--dataset", "org/data", "--extra_env", f"HF_HOME={workdir / 'hf'}", cwd=workdir)
    assert "nanotron (job)" in rerun.now(here) and caches[0] == workdir / "hf" / "hub"
    boxed, _ = spec_for("--dataset", "org/data", "--container_image", str(workdir / "image.sqsh"), cwd=workdir)
    assert "nanotron (job)" not in rerun.now(boxed) and "torch (job)" not in rerun.now(boxed)


def test_a_flag_the_launcher_no_longer_has_is_a_difference(workdir: Path, capsys):
    first = original("--dataset", "none")
    older = _copy_with(first, "older", lambda d: d["resolved"]["training"].update(label_smoothing=0.1))
    with pytest.raises(ConfigError) as refused:
        rerun.rerun(older, None, dry_run=True, strict=True, resume=False, show_logs=False)
    assert "--label_smoothing: recorded by the original, no flag of today's launcher" in str(refused.value)


def test_a_damaged_manifest_is_one_line(workdir: Path, capsys):
    (workdir / "y").mkdir()
    (workdir / "y" / "manifest.json").write_text('{"resolved": 5}')
    assert jobs.main(["rerun", str(workdir / "y"), "--dry_run"]) == 1
    assert jobs.main(["diff", str(workdir / "y"), str(workdir / "y")]) == 1
    assert capsys.readouterr().err.count("is not a launcher manifest (damaged") == 2
