"""The bundle: never overwritten, hashes match the files, no secrets, the manifest says what ran."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from launcher import protocol as P
from launcher.bundle import files as bundle
from launcher.bundle import manifest, render
from launcher.errors import ConfigError
from launcher.node import job
from launcher.runs import launch

ROOT = Path(__file__).resolve().parent.parent
SECRET = "hf_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h"  # the shape of a Hugging Face token


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    return tmp_path


def flags(*extra: str) -> list[str]:
    return [
        "--run_name",
        "r",
        "--nodes",
        "1",
        "--gpus_per_node",
        "2",
        "--dataset",
        "none",
        "--dry_run",
        "true",
        "--run_train_script",
        "train.py",
        *extra,
    ]


def test_same_second_launches_get_distinct_bundles(tmp_path: Path):
    a = bundle.claim(
        "r",
        str(tmp_path / "c"),
        str(tmp_path / "s"),
        str(tmp_path / "l"),
        str(tmp_path / "k"),
        False,
        now=1_700_000_000,
    )
    b = bundle.claim(
        "r",
        str(tmp_path / "c"),
        str(tmp_path / "s"),
        str(tmp_path / "l"),
        str(tmp_path / "k"),
        False,
        now=1_700_000_000,
    )
    assert a.bundle_dir != b.bundle_dir and a.script != b.script and a.log != b.log
    assert b.bundle_dir.name == a.bundle_dir.name + "-2"


def test_write_new_never_replaces(tmp_path: Path):
    target = tmp_path / "f"
    bundle.write_new(target, "first")
    with pytest.raises(FileExistsError):
        bundle.write_new(target, "second")
    assert target.read_text() == "first"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["f"]  # no temporary file left behind


def test_write_new_appears_whole_with_its_mode(tmp_path: Path):
    target = tmp_path / "job.sbatch"
    digest = bundle.write_new(target, "#!/bin/bash\n" * 10_000, mode=0o755)
    assert target.stat().st_mode & 0o777 == 0o755
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    assert sorted(f.name for f in tmp_path.iterdir()) == ["job.sbatch"]


def test_two_launches_keep_both_bundles(workdir: Path):
    _, first, _, _ = launch.prepare(flags())
    _, second, _, _ = launch.prepare(flags("--learning_rate", "1e-3"))
    assert first.bundle_dir != second.bundle_dir
    assert first.config.read_text() != second.config.read_text()


def test_manifest_describes_the_launch(workdir: Path):
    argv = flags("--extra_env", "NCCL_DEBUG=INFO")
    _, paths, figures, _ = launch.prepare(argv)
    data = json.loads(paths.manifest.read_text())
    assert data["files"]["config"]["sha256"] == hashlib.sha256(paths.config.read_bytes()).hexdigest()
    assert data["files"]["script"]["sha256"] == hashlib.sha256(paths.script.read_bytes()).hexdigest()
    assert data["command"].endswith(" ".join(argv[-2:]))
    assert data["resolved"]["parallelism"] == {
        "dp": 2, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 0, "pp_engine": "1f1b", "tp_mode": "REDUCE_SCATTER",
        "layout": "manual",
    }  # fmt: skip
    assert data["derived"]["nanotron_dialect"]["dialect"] == data["resolved"]["slurm"]["nanotron_dialect"] == "0.4"
    assert "0.4's schema" in data["derived"]["nanotron_dialect"]["why"]  # this Python's nanotron is PyPI's
    assert data["derived"]["parameters"] == figures["parameters"] > 0
    assert data["derived"]["memory"]["fits"] and data["derived"]["memory"]["gpu"] == "H100 80GB SXM"
    assert data["versions"]["pyyaml"] and "commit" in data["project"] and "dirty" in data["project"]
    assert data["slurm"] == {"submitted": False}
    assert data["outputs"]["log"] == str(paths.log)
    preset = ROOT / "configs" / "presets" / "tiny.yaml"  # the files the flags were resolved from, as they were
    assert data["inputs"]["preset"] == {"path": str(preset), "sha256": hashlib.sha256(preset.read_bytes()).hexdigest()}
    assert data["inputs"]["base_config"]["sha256"] and "config" not in data["inputs"]


def test_the_jobs_settings_are_one_file_of_the_bundle_that_reads_back_as_written(workdir: Path):
    spec, paths, _, _ = launch.prepare(flags("--extra_env", "A='x y'", "--max_requeues", "2", "--hang_timeout", "0"))
    data = json.loads(paths.manifest.read_text())
    sha = hashlib.sha256(paths.job.read_bytes()).hexdigest()
    assert data["files"]["job"] == {"path": str(paths.job), "sha256": sha}
    written = job.load(paths.bundle_dir)  # the bundle's directory, or the file itself
    assert written == job.load(paths.job) == render.job_settings(spec, paths)
    assert (written.bundle, written.config, written.checkpoints) == (paths.bundle_dir, paths.config, paths.checkpoints)
    assert (written.nodes, written.gpus_per_node, written.max_requeues, written.extra_env) == (1, 2, 2, {"A": "x y"})
    assert written.file(P.STOP_FILE) == paths.stop_file and written.watchdog_options() == []
    assert written.python.is_absolute() and (written.project / "launcher/node/job.py").is_file()


def test_a_job_file_of_another_format_is_refused_in_words(tmp_path: Path):
    settings = job.Job("r", tmp_path, tmp_path / "r.out", tmp_path / "ck", Path("/usr/bin/python3"), ROOT,
                       tmp_path / "train.py", tmp_path / "config.yaml", "auto", 2, 8, Path("/tmp"))  # fmt: skip
    assert job.from_json(settings.to_json()) == settings
    data = json.loads(settings.to_json())
    for changed, said in (
        ({"version": 99}, f"format 99, where this launcher reads format {job.VERSION}"),
        ({"nodes_typo": 2}, "unknown settings nodes_typo"),
        ({"version": None}, "format None"),
    ):
        with pytest.raises(job.JobFileError, match=said):
            job.from_json(json.dumps({**data, **changed}))
    with pytest.raises(job.JobFileError, match="missing 1 required"):
        job.from_json(json.dumps({k: v for k, v in data.items() if k != "engine"}))
    with pytest.raises(job.JobFileError, match=f"cannot read {tmp_path}/none.json"):
        job.load(tmp_path / "none.json")


def test_the_jobs_runtime_record_is_read_beside_the_manifest(workdir: Path):
    _, paths, _, _ = launch.prepare(flags())
    run = manifest.load(paths.bundle_dir)
    assert run.runtime == [] and run.rerun_of is None
    lines = [{"job_id": "5", "attempt": 1, "slurm": "a"}, {"job_id": "5", "attempt": 2, "slurm": "b"},
             {"job_id": "5", "attempt": 1, "slurm": "c"}]  # fmt: skip
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"job_id": "5", "att'  # a line cut by a kill
    paths.runtime.write_text(text)
    assert [r["slurm"] for r in run.runtime] == ["b", "c"]  # one per attempt, its last record
    manifest.record_origin(run, {"bundle": "/x"})
    assert manifest.load(paths.bundle_dir).rerun_of == {"bundle": "/x"}
    assert json.loads(paths.manifest.read_text())["files"] == run.data["files"]  # the rest as it was


def test_no_secret_reaches_the_bundle(workdir: Path):
    """Every way a secret can come near a launch: the shell's environment (the fixture exports it), a reference to
    it in the commands, a --config YAML that holds it. The bundle carries none of them."""
    argv = flags("--pre_launch_commands", 'export HF_TOKEN="$HF_TOKEN"')
    _, paths, _, _ = launch.prepare(argv)
    for f in (paths.config, paths.script, paths.job, paths.manifest):
        assert SECRET not in f.read_text()
    assert 'export HF_TOKEN="$HF_TOKEN"' in paths.script.read_text()  # the reference, for the job's shell
    leaky = workdir / "leaky.yaml"
    leaky.write_text(f"general:\n  project: {SECRET}\n")
    with pytest.raises(ConfigError) as refused:
        launch.prepare(flags("--config", str(leaky)))
    assert SECRET not in str(refused.value) and "--project: it holds what looks like a token" in str(refused.value)
    assert len(list((workdir / "logs/configs/r").iterdir())) == 1  # the refused launch wrote nothing


def test_resume_false_gets_its_own_checkpoints(workdir: Path):
    ckpt = workdir / "checkpoints" / "r"
    ckpt.mkdir(parents=True)
    (ckpt / "latest").write_text("10\n")
    _, resumed, _, _ = launch.prepare(flags())
    _, fresh, _, _ = launch.prepare(flags("--resume", "false"))
    assert resumed.checkpoints == ckpt
    assert fresh.checkpoints != ckpt and fresh.checkpoints.name.startswith("r-")


@pytest.mark.parametrize("pointer", ["latest", "latest.txt"])  # the torch engine's, nanotron's
def test_relaunch_says_it_resumes_from_either_engines_checkpoints(workdir: Path, pointer: str, capsys):
    root = workdir / "checkpoints" / "r"
    (root / "70" / "model").mkdir(parents=True)
    (root / "70" / ("meta.json" if pointer == "latest" else "checkpoint_metadata.json")).write_text("{}")
    (root / "70" / "state.pt").write_bytes(b"x")  # (the torch engine's, beside; nanotron's reads its own files)
    (root / pointer).write_text("70\n")
    assert launch.main(flags()) == 0
    assert "resume       from the checkpoint at step 70; --resume false starts afresh" in capsys.readouterr().out
    (root / pointer).write_text("90\n")  # a step not on disk: neither engine resumes from it
    assert launch.main(flags()) == 0
    said = capsys.readouterr().out
    assert "at step 90" not in said and "the pointer names step 90" in said and "not on disk" in said
    assert ("from the checkpoint at step 70 (the newest complete one" in said) == (pointer == "latest")


def test_a_released_claim_leaves_other_launches_of_the_run_alone(workdir: Path):
    """A launch that stops before writing removes its own empty bundle directory, never the run's script or log
    directory: a pending job of the same run still has to write its log there."""
    pending = launch.prepare(flags())  # written (a dry run: its log directory waits, empty, for the job)
    assert pending.paths.log.parent.is_dir() and not any(pending.paths.log.parent.iterdir())
    stopped = bundle.claim("r", "logs/configs", "logs/slurm_scripts", "logs/slurm_logs", "ckpt", False)
    bundle.release(stopped)
    assert not stopped.bundle_dir.exists()
    assert pending.paths.log.parent.is_dir() and pending.paths.bundle_dir.is_dir() and pending.paths.script.is_file()

    alone = bundle.claim("other", "logs/configs", "logs/slurm_scripts", "logs/slurm_logs", "ckpt", False)
    assert not alone.script.parent.exists() and not alone.log.parent.exists()  # made only when writing
    bundle.release(alone)
    assert not (workdir / "logs/configs/other").exists()


def test_interrupted_while_slurm_judges_nothing_stays(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    def interrupted(spec: object, script: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(launch.checks, "judge", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch.prepare(flags("--dry_run", "false"))
    assert [p for p in (workdir / "logs").rglob("*") if p.is_file() or p.name == "r"] == []
