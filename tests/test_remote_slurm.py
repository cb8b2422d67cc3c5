"""Checkpoints in a bucket through the real job on the local cluster, against the real local S3 server (Ceph's radosgw
over a one-node cluster, tests/s3_server.py) with the real client (s5cmd): issue 53's "done when".

- A run with --keep_last 1 and the bucket keeping every step, its supervisor SIGKILLed in the middle of step 30's
  upload (one file copied, no marker: the fault point `upload-mid-copy`), its checkpoints folder then wiped: launched
  again, it resumes from the bucket's newest complete step (20: 30 is not taken for a checkpoint), at the exact step
  and samples (the redone steps' losses are the first attempt's), finishes the cut step, and ends with every step in
  the bucket, each as its marker says, the disk's newest byte for byte; `jobs export --step 10` and an eval job of step
  10 read the step that is only in the bucket (the eval's scores are lm-eval's own on that export); `jobs
  checkpoints` shows both sides; the ledger counts the uploads.
- nanotron main's trainer with 2 ranks, its `s3_upload:` section of a --config mapped to --checkpoints_remote (the
  trainer's own uploader never started), radosgw SIGKILLed in the middle of an upload and started again: every step
  in the bucket byte for byte as on disk, no incomplete upload left, training never failed.
- Bad credentials, a missing bucket and an endpoint that is down, refused before the queue, each named.

Costs (this machine, 2 cores shared): see each test's docstring."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_runs import bundles, finish, launch, manifest, paced, wait_for
from s3_server import S3Server
from test_evals_job import TASKS, write_tasks
from test_retention_slurm import faulty_python

from launcher import checkpoint_layout as ckpt
from launcher import jsonl
from launcher import protocol as P
from launcher.evals import record as eval_record
from launcher.localcluster import s3, s3_access
from launcher.node import job as job_file
from launcher.remote import fetch, marker
from launcher.remote.client import Client, run
from launcher.remote.multipart import Multipart
from launcher.remote.settings import split_url

pytestmark = pytest.mark.slurm


class Env:
    """The client's commands in the server's user's environment (a test's Runner)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def s3(self, argv, timeout):
        return run(argv, timeout, env=self.env)


def with_keys(slurm_env: dict, server: S3Server) -> dict[str, str]:
    """The cluster's environment with the S3 user's keys, endpoint and region: what a user exports before launching
    (sbatch hands it to the job)."""
    return {**slurm_env, **s3_access.client_env(server.spec, server.user)}


def bucket_of(server: S3Server, url: str) -> Any:
    from launcher.remote.bucket import Bucket
    from launcher.remote.settings import RemoteSettings

    settings = RemoteSettings(url)
    return Bucket(settings, Client(s3_access.s5cmd(), server.spec.endpoint), Env(server.env))


def assert_whole_as_marked(server: S3Server, url: str, tmp: Path) -> dict[int, marker.Marker]:
    """Every complete step of the run's folder in the bucket downloaded and checked against its marker (a step taken
    as whole is whole); no incomplete multipart upload left under the folder. The markers, by step."""
    bucket = bucket_of(server, url)
    found = {}
    for step in sorted(bucket.listing().complete):
        folder, there = fetch.download(bucket, step, tmp)  # (raises where a file is not as the marker says)
        shutil.rmtree(folder)
        found[step] = there
    bucket_name, prefix = split_url(url)
    assert Multipart(server.spec.endpoint, bucket_name, server.env).uploads(prefix + "/") == []
    return found


def assert_as_on_disk(server: S3Server, url: str, root: Path, step: int, tmp: Path) -> None:
    """The bucket's step, byte for byte the disk's."""
    server.s5cmd("cp", f"{url}/{step}/*", f"{tmp}/{step}/")
    here = {p.relative_to(root / str(step)): p.read_bytes() for p in (root / str(step)).rglob("*") if p.is_file()}
    there = {p.relative_to(tmp / str(step)): p.read_bytes() for p in (tmp / str(step)).rglob("*") if p.is_file()}
    assert here == there and here, (sorted(map(str, here)), sorted(map(str, there)))


def jobs(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher.jobs", *args], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_run_wiped_resumes_from_the_bucket_at_the_exact_step_and_its_remote_steps_are_read(
    tmp_path: Path, slurm_env: dict, demo_data: Any, s3_server: S3Server, s3_folder: str
) -> None:
    """Two launches of 40 steps (torch engine, 1 node x 2 ranks), with an eval job and an export beside the second:
    ~2.5-3 minutes."""
    env = with_keys(slurm_env, s3_server)
    remote = f"s3://{s3_folder}"
    url = f"{remote}/up"
    flags = ("--train_steps", "40", "--checkpoints_remote", remote, "--keep_last", "1", "--max_restarts", "0",
             "--run_train_script", paced(tmp_path, 0.2))  # fmt: skip
    evals = ("--eval_tasks", TASKS[0], "--eval_include", str(write_tasks(tmp_path)), "--dry_run")
    code, out = finish(launch(tmp_path, env, demo_data, "up", *flags, *evals, nodes="1", follow=False), 120)
    assert code == 0, out  # a bundle with the eval job's script, for a step only the bucket will have (below)
    faulty = faulty_python(tmp_path, "upload-mid-copy@30")
    code, out = finish(launch(tmp_path, env, demo_data, "up", *flags, "--python", str(faulty), nodes="1"), 600)
    root = tmp_path / "checkpoints/up"
    assert code != 0 and (tmp_path / "killed").exists(), out[-4000:]
    evaluator, first = bundles(tmp_path, "up")
    assert [(r["event"], r["step"]) for r in jsonl.read(first / P.REMOTE_RECORD)] == [("uploaded", 10),
                                                                                      ("uploaded", 20)]  # fmt: skip
    listing = bucket_of(s3_server, url).listing()
    assert listing.complete == {10, 20} and 30 in listing.folders  # 30: one file, no marker
    purged = [r for row in jsonl.read(first / P.CHECKPOINTS_RECORD) if row["event"] == "purge" for r in row["removed"]]
    assert {r["step"] for r in purged} <= {10, 20}  # (never a step not yet in the bucket)
    before = {r["step"]: r["loss"] for r in jsonl.read(first / P.METRICS)}
    assert max(before) >= 30

    shutil.rmtree(root)  # a wiped scratch
    proc = launch(tmp_path, env, demo_data, "up", *flags, nodes="1")
    job = job_file.load(evaluator)  # step 10, only in the bucket: an eval job (the bundle's own script, as `jobs
    assert job.evals is not None  # evaluate` submits it) and `jobs export --step 10`, beside the run
    eval_job = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path / 'eval-10.out'}",
                               str(evaluator / P.EVAL_SCRIPT), "10", job.evals.key], env=env, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    exported = jobs(env, "export", str(evaluator), "--step", "10", "--output", str(tmp_path / "hf-10"))
    assert f"Step 10 is not on disk: fetched from {url}/10/" in exported, exported
    assert f"{url}/10/" in (tmp_path / "hf-10" / "README.md").read_text()
    assert (tmp_path / "hf-10" / "config.json").is_file() and not list(Path("/tmp").glob("launcher-fetch-*"))

    code, out = finish(proc, 600)
    *_, second = bundles(tmp_path, "up")
    log = Path(manifest(second)["outputs"]["log"]).read_text()
    assert code == 0 and "ended COMPLETED" in out, out[-4000:] + log[-4000:]
    assert f"step 20 downloaded from {url}/20/" in log and "the checkpoints folder had no complete step" in log
    assert "resumed from checkpoint step 20 " in log
    again = jsonl.read(second / P.METRICS)
    assert [r["step"] for r in again] == list(range(21, 41))
    redone = [r for r in again if r["step"] in before]
    assert len(redone) >= 10 and all(abs(r["loss"] - before[r["step"]]) < 1e-6 for r in redone)  # the same samples
    rows = jsonl.read(second / P.REMOTE_RECORD)
    assert [(r["event"], r["step"]) for r in rows] == [("downloaded", 20), ("uploaded", 30), ("uploaded", 40)]
    markers = assert_whole_as_marked(s3_server, url, tmp_path / "check")
    assert sorted(markers) == [10, 20, 30, 40] and set(ckpt.complete_steps(root)) == {40}  # --keep_last 1 here
    assert_as_on_disk(s3_server, url, root, 40, tmp_path / "b40")
    assert "; bucket: 2 uploaded (" in out and "1 downloaded" in out  # the ledger's line (this launch's record)
    ledger = manifest(second)["ledger"]["uploads"]
    assert ledger["uploaded"] == 2 and ledger["uploaded_bytes"] == markers[30].bytes + markers[40].bytes

    shown = jobs(env, "checkpoints", str(second))
    assert f"in the bucket {url}: it keeps every checkpoint" in shown
    assert "in the bucket: 4 complete step(s)" in shown and "uploaded by the run's jobs: 4 step(s)" in shown

    result = wait_for(lambda: (r := eval_record.result(evaluator, 10, job.evals.key)) and r.get("state") in (
        "done", "failed") and r, timeout=600, every=2)  # fmt: skip
    assert result["state"] == "done" and result["job"] == eval_job, result
    assert set(result["tasks"][TASKS[0]]) >= {"acc", "acc_norm"}
    assert f"eval: step 10 is not on disk: fetched from {url}/10/" in (tmp_path / "eval-10.out").read_text()
    assert 10 not in ckpt.complete_steps(root)  # read from the bucket, never put on disk


def main_config(tmp_path: Path, upload_to: str) -> Path:
    """A --config with nanotron main's `s3_upload:` section (as its examples/config_tiny_llama_with_s3_upload.yaml
    has it) and the LR schedule test_nanotron_slurm's runs use."""
    path = tmp_path / "with-s3-upload.yaml"
    path.write_text(yaml.safe_dump({
        "optimizer": {"learning_rate_scheduler": {"lr_decay_steps": 7}},
        "s3_upload": {"upload_s3_path": upload_to, "remove_after_upload": False, "s5cmd_numworkers": 8,
                      "s5cmd_concurrency": 2, "s5cmd_path": None},
    }))  # fmt: skip
    return path


@pytest.mark.nanotron_cpu
def test_nanotron_mains_trainer_with_two_ranks_uploads_every_checkpoint_through_a_gateway_kill(
    tmp_path: Path, slurm_env: dict, demo_data: Any, s3_server: S3Server, s3_folder: str
) -> None:
    """nanotron main on 2 CPU ranks, 20 steps saved every 10, radosgw SIGKILLed at step 20's first upload and started
    again at once (s5cmd's own retries carry the upload through): ~2-3 minutes."""
    from test_nanotron_slurm import launch as nanotron_launch

    env = with_keys(slurm_env, s3_server)
    url = f"s3://{s3_folder}/nanomain"
    layout = ("--nodes", "1", "--gpus_per_node", "2", "--tp", "1", "--pp", "1")
    killed = threading.Event()

    def kill_at_step_20() -> None:
        try:
            s3_server.wait_for_requests(rf'"PUT /{s3_folder}/nanomain/20/', 1, timeout_s=600)
        except AssertionError:
            return
        s3.kill_gateway(s3_server.spec)
        killed.set()
        s3.start_gateway(s3_server.spec)

    killer = threading.Thread(target=kill_at_step_20, daemon=True)
    killer.start()
    proc = nanotron_launch(tmp_path, env, demo_data, "main", "nanomain", None, 20, "--save_interval", "10",
                           "--config", str(main_config(tmp_path, url)), layout=layout)  # fmt: skip
    code, out = finish(proc, timeout=900)
    killer.join(timeout=60)
    (bundle,) = bundles(tmp_path, "nanomain")
    log = Path(manifest(bundle)["outputs"]["log"]).read_text()
    assert code == 0 and killed.is_set(), out[-4000:] + log[-4000:]
    written = yaml.safe_load((bundle / "config.yaml").read_text())
    assert written["s3_upload"] is None  # the trainer's own uploader (rank 0's S3Mover) never started
    assert json.loads((bundle / P.JOB_FILE).read_text())["remote"] == {
        "url": url, "endpoint": "", "keep_last": None, "client": "", "numworkers": 8, "concurrency": 2}  # fmt: skip
    assert f"--checkpoints_remote s3://{s3_folder}" in out  # the section, said as the flag it became
    root = tmp_path / "checkpoints/nanomain"
    assert set(ckpt.complete_steps(root)) == {10, 20}
    markers = assert_whole_as_marked(s3_server, url, tmp_path / "check")
    assert sorted(markers) == [10, 20] and {m.engine for m in markers.values()} == {"nanotron"}
    assert {m.dialect for m in markers.values()} == {"main"}
    for step in (10, 20):
        assert_as_on_disk(s3_server, url, root, step, tmp_path / "back")
    assert [(r["event"], r["step"]) for r in jsonl.read(bundle / P.REMOTE_RECORD)] == [("uploaded", 10),
                                                                                       ("uploaded", 20)]  # fmt: skip
    assert log.count("is in the bucket: ") == 2 and "S3Mover" not in log


def test_bad_credentials_a_missing_bucket_and_an_endpoint_down_are_refused_before_the_queue(
    tmp_path: Path, slurm_env: dict, demo_data: Any, s3_server: S3Server, s3_folder: str
) -> None:
    """Three launches refused before anything is submitted: ~15 s."""
    good = with_keys(slurm_env, s3_server)
    cases = [
        ({**good, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}, f"s3://{s3_folder}", (),
         "refuses this environment's credentials for s3://tests (ERROR"),
        (good, "s3://no-such-bucket/x", (), "the bucket no-such-bucket does not exist at http://"),
        (good, f"s3://{s3_folder}", ("--s3_endpoint", "http://127.0.0.1:9"),
         "the S3 endpoint http://127.0.0.1:9 does not answer"),
    ]  # fmt: skip
    for env, remote, more, said in cases:
        code, out = finish(launch(tmp_path, env, demo_data, "refused", "--checkpoints_remote", remote, *more,
                                  nodes="1", follow=False), timeout=120)  # fmt: skip
        assert code == 2 and said in out and "nothing was written or submitted" in out, out
        assert good["AWS_SECRET_ACCESS_KEY"] not in out
    assert not (tmp_path / "logs/configs/refused").exists()
