"""`jobs diff A B` from two bundles (no cluster): the groups, the losses, the text a terminal shows (a snapshot) and the
JSON. (Two real runs on the local cluster: tests/test_rerun_e2e.py.)"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from launcher import jobs
from launcher.bundle import manifest
from launcher.report import compare
from launcher.runs import launch

GOLDEN = Path(__file__).resolve().parent / "golden" / "jobs-diff.txt"
DATA = {"path": "/data/owt", "files": 3, "bytes": 1234, "sha256": "ab" * 32, "hashed": 3}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _losses(steps: int, lr: float) -> list[float]:
    """A made-up curve: the same first step (the same weights), then each learning rate its own way."""
    return [5.0 if s == 1 else 5.0 - lr * 100 * math.log(s) for s in range(1, steps + 1)]


def _run(job_id: str, learning_rate: str, torch: str = "2.13.0") -> manifest.Manifest:
    """A launched bundle (run "lr", 1 node x 2 GPUs, random data), made as if its job ran: a runtime record,
    metrics, Slurm's final word; the launch's machine-dependent records fixed."""
    argv = ["--run_name", "lr", "--nodes", "1", "--gpus_per_node", "2", "--dataset", "none", "--dry_run",
            "--train_steps", "10", "--learning_rate", learning_rate]  # fmt: skip
    run = manifest.load(launch.prepare(argv).paths.bundle_dir)
    run.data.update(project={"commit": "c0ffee" * 6 + "abcd", "dirty": False}, verdict=None,
                    slurm={"submitted": True, "job_id": job_id},
                    ended={"state": "COMPLETED", "exit_code": 0, "restarts": 0})  # fmt: skip
    run.data["versions"] = {k: "1.0" for k in run.data["versions"]}
    run.data["derived"]["nanotron_dialect"]["why"] = "fixed"
    manifest.write_manifest(run.path, run.data)
    record = {"job_id": job_id, "attempt": 1, "nodes": "node1", "engine": "torch", "slurm": "22.05.8",
              "nanotron": {"found": True, "version": "0.4", "commit": None, "dirty": None},
              "torch": {"version": torch, "cuda": None, "nccl": None, "gpu": None},
              "data": {"(random tokens)": {"random": True}},
              "tokenizer": {"hub": "org/tok", "revision": "1234abcd"}}  # fmt: skip
    (run.bundle_dir / "runtime.jsonl").write_text(json.dumps(record) + "\n")
    rows = [{"step": s, "loss": x, "lr": 0.0, "time": 0.0} for s, x in enumerate(_losses(10, float(learning_rate)), 1)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest.load(run.bundle_dir)


def _normalised(text: str, root: Path) -> str:
    text = text.replace(str(root), "<tmp>")
    return re.sub(r"\d{8}-\d{6}(-\d+)?", "<stamp>", text)


def test_two_runs_that_differ_in_one_flag(workdir: Path, capsys):
    a, _ = _run("101", "3e-3"), _run("102", "1e-3")
    assert jobs.main(["diff", str(a.bundle_dir), "102"]) == 0  # a bundle and a job id (its bundle under logs/configs)
    text = _normalised(capsys.readouterr().out, workdir)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"{GOLDEN.name} changed; review and run UPDATE_GOLDEN=1 pytest {__file__}"
    assert "flags: 1 differs" in text and "learning_rate  0.003  0.001" in text  # the flag
    assert "optimizer.learning_rate_scheduler.learning_rate  0.003  0.001" in text  # the config key it changed
    assert "they part at step 2" in text  # where the losses part
    assert "2      4.792056      4.930685       0.139  <- part" in text


def test_the_json_says_the_same_for_scripts(workdir: Path, capsys):
    a, b = _run("101", "3e-3"), _run("102", "3e-3", torch="2.14.0")
    assert jobs.main(["diff", str(a.bundle_dir), str(b.bundle_dir), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["groups"]["flags"] == [] and found["groups"]["environment"] == [
        {"name": "torch (job)", "a": "2.13.0", "b": "2.14.0"}
    ]
    assert found["losses"]["parted_at"] is None and found["losses"]["common"] == 10
    assert [r["name"] for r in found["groups"]["outcome"]] == ["job"]
    assert found["same"]["data"] == 2  # the random data and the tokenizer's revision


def test_losses_part_by_a_relative_tolerance_and_nan_parts_from_a_number():
    assert compare.losses({1: 5.0, 2: 4.0}, {1: 5.0, 2: 4.0 + 5e-6}, 1e-6)["parted_at"] == 2
    assert compare.losses({1: 5.0, 2: 4.0}, {1: 5.0, 2: 4.0 + 5e-6}, 1e-5)["parted_at"] is None
    assert compare.losses({1: float("nan")}, {1: float("nan")}, 1e-6)["parted_at"] is None
    assert compare.losses({1: float("nan"), 2: 1.0}, {1: 1.0, 2: 1.0}, 1e-6)["parted_at"] == 1
    found = compare.losses({s: 1.0 for s in range(1, 101)}, {s: 1.0 if s < 50 else 2.0 for s in range(1, 101)}, 0)
    assert [r[0] for r in found["rows"]] == [1, 2, 3, 49, 50, 51, 100]  # the first, around the parting, the last
    assert compare.losses({1: 1.0}, {2: 1.0}, 1e-6)["common"] == 0


def test_a_run_that_never_ran_has_no_losses_and_its_job_side_is_unconfirmed(workdir: Path, capsys):
    ran = _run("101", "3e-3")
    dry = launch.prepare(["--run_name", "dry", "--nodes", "1", "--gpus_per_node", "2", "--dataset", "none",
                          "--dry_run"]).paths.bundle_dir  # fmt: skip
    assert jobs.main(["diff", str(ran.bundle_dir), str(dry)]) == 0
    out = capsys.readouterr().out
    assert "losses: not compared (a run has logged no step)" in out
    assert "nanotron (job): A has it, B does not" in out and "(dry run)" in out
    assert jobs.main(["diff", str(ran.bundle_dir), "99999"]) == 1
    assert "neither a bundle directory nor a job id" in capsys.readouterr().err
