"""Checkpoint retention through the real job on the local cluster (docs/checkpoints.md): a run saving every 10 steps
to 200 with --keep_last 2 --keep_every 50 ends with steps 50, 100, 150, 190 and 200 on disk, straight through and
preempted in the middle, with either engine; and a process SIGKILLed at each point of a save and of a purge, then
the run launched again, resumes from a complete checkpoint at the step and sample it names, with nothing the rules
promised lost.

The kills are deterministic: the job's Python is a wrapper that loads tests/fault_points/sitecustomize.py, which
kills the process that reaches the point asked for (LAUNCHER_TEST_KILL_AT), once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_runs import assert_continuous, bundles, finish, launch, manifest, paced, submitted_job_id, wait_for
from launcher_helpers import ROOT
from test_preemption import last_logged_step

from launcher import checkpoint_layout as ckpt
from launcher import jsonl
from launcher import protocol as P

pytestmark = pytest.mark.slurm

FAULTS = Path(__file__).resolve().parent / "fault_points"
RULES = ("--train_steps", "200", "--save_interval", "10", "--keep_last", "2", "--keep_every", "50")
KEPT = {50, 100, 150, 190, 200}


def faulty_python(tmp_path: Path, at: str, env: dict[str, str] | None = None) -> Path:
    """A --python that kills the process reaching `at` (POINT@STEP) once; `env`: more of its variables (another
    sitecustomize's folder goes after FAULTS on its PYTHONPATH)."""
    more = dict(env or {})
    paths = [str(FAULTS), *filter(None, more.pop("PYTHONPATH", "").split(os.pathsep)), str(ROOT)]
    exports = {"PYTHONPATH": os.pathsep.join(paths), "LAUNCHER_TEST_KILL_AT": at,
               "LAUNCHER_TEST_KILL_ONCE": str(tmp_path / "killed"), **more}  # fmt: skip
    wrapper = tmp_path / "python-faulty"
    wrapper.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in exports.items())
                       + f'exec {sys.executable} "$@"\n')  # fmt: skip
    wrapper.chmod(0o755)
    return wrapper


def purging_left(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(P.PURGING))


def assert_kept_as_promised(root: Path, bundle_dirs: list[Path]) -> None:
    """On disk: 50, 100, 150, 190, 200, nothing partial, nothing a purge left; the records: every step removed is
    one the rules do not keep, each purge with its bytes."""
    assert set(ckpt.complete_steps(root)) == KEPT, sorted(ckpt.complete_steps(root))
    assert ckpt.partial_steps(root) == [] and purging_left(root) == []
    removed = [r for b in bundle_dirs for row in jsonl.read(b / P.CHECKPOINTS_RECORD) if row["event"] == "purge"
               for r in row["removed"]]  # fmt: skip
    assert removed and not {r["step"] for r in removed} & KEPT and all(r["bytes"] > 0 for r in removed)


def test_a_run_keeps_the_last_2_and_every_50th(tmp_path: Path, slurm_env: dict, demo_data: Any):
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "kept", *RULES), timeout=400)
    assert code == 0, out
    root = tmp_path / "checkpoints/kept"
    (bundle_dir,) = bundles(tmp_path, "kept")
    assert_kept_as_promised(root, [bundle_dir])
    rows = jsonl.read(bundle_dir / P.CHECKPOINTS_RECORD)
    assert [r["step"] for r in rows if r["event"] == "saved"] == list(range(10, 201, 10))  # each seen once
    removed = sorted(r["step"] for row in rows if row["event"] == "purge" for r in row["removed"])
    assert removed == sorted(set(range(10, 201, 10)) - KEPT)
    ledger = manifest(bundle_dir)["ledger"]["checkpoints"]  # the manifest counts the bytes written and freed
    written = sum(r["bytes"] for r in rows if r["event"] == "saved")
    freed = sum(r["bytes"] for row in rows if row["event"] == "purge" for r in row["removed"])
    assert ledger == {"saved": 20, "written_bytes": written, "removed": 15, "freed_bytes": freed,
                      "purges": ledger["purges"]}  # fmt: skip
    assert f"checkpoints: 20 saved ({written / 1e6:.1f} MB), 15 removed ({freed / 1e6:.1f} MB freed)" in out
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    last_purge = [line for line in log.splitlines() if "retention removed step(s) " in line][-1]
    assert last_purge.endswith("; kept 50, 100, 150, 190, 200: the last 2 and every step that is a multiple of 50")
    assert_continuous(bundle_dir, 200)


def test_a_preempted_run_keeps_the_same(tmp_path: Path, slurm_env: dict, demo_data: Any):
    """Preempted past step 100 (the notice's save is an off-interval step), requeued, resumed: the same five."""
    flags = (*RULES, "--run_train_script", paced(tmp_path, 0.05), "--extra_env", f"{P.ENV_STOP_FILE_EVERY}=0.2")
    proc = launch(tmp_path, slurm_env, demo_data, "preempted", *flags)
    (bundle_dir,) = wait_for(lambda: list((tmp_path / "logs/configs/preempted").glob("*")), timeout=30)
    job_id = wait_for(lambda: submitted_job_id(bundle_dir), timeout=60)
    wait_for(lambda: last_logged_step(bundle_dir) >= 100, timeout=300)
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "2",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 3"]  # fmt: skip
    subprocess.run(urgent, env=slurm_env, capture_output=True, text=True, check=True)
    code, out = finish(proc, timeout=600)
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0 and f"job {job_id} attempt 2 started" in log, out + log[-4000:]
    saved = int(log.split("stop requested: checkpoint saved at step ")[1].split(";")[0])
    assert 100 <= saved < 200 and f"resumed from checkpoint step {saved} " in log
    assert_kept_as_promised(tmp_path / "checkpoints/preempted", [bundle_dir])
    assert_continuous(bundle_dir, 200)


def meta(root: Path, step: int) -> dict:
    return json.loads((root / str(step) / ckpt.TORCH_META).read_text())


@pytest.mark.parametrize(
    ("point", "step", "resumes_at"),
    [("save-mid-write", 60, 50), ("save-before-pointer", 60, 60), ("purge-mid-delete", 40, None)],
)
def test_a_kill_at_each_point_of_a_save_and_a_purge_loses_nothing_promised(
    tmp_path: Path, slurm_env: dict, demo_data: Any, point: str, step: int, resumes_at: int | None
):
    """The torch engine; 40 is purged once 60 is complete (the last 2 are 50 and 60)."""
    flags = (*RULES, "--python", str(faulty_python(tmp_path, f"{point}@{step}")), "--max_restarts", "0")
    code, out = finish(launch(tmp_path, slurm_env, demo_data, "fault", *flags, nodes="1"), timeout=300)
    root = tmp_path / "checkpoints/fault"
    assert code != 0 and (tmp_path / "killed").exists(), out
    complete, pointer = set(ckpt.complete_steps(root)), ckpt.pointer_step(root)
    newest = max(complete)
    assert {s for s in (50, 100, 150) if s <= newest} <= complete  # the multiples so far, whatever was cut
    if point == "save-mid-write":
        assert [p.step for p in ckpt.partial_steps(root)] == [60] and newest == pointer == 50
    elif point == "save-before-pointer":
        assert newest == 60 and pointer == 50
    else:
        assert 40 not in complete and [n.split("-")[1] for n in purging_left(root)] == ["40"]
        resumes_at = newest
    assert resumes_at is not None and meta(root, resumes_at)["data_position"] == resumes_at  # one micro-batch a step
    first = jsonl.read(bundles(tmp_path, "fault")[0] / P.METRICS)

    code, out = finish(launch(tmp_path, slurm_env, demo_data, "fault", *flags, nodes="1"), timeout=300)
    assert code == 0, out
    assert f"resumed from checkpoint step {resumes_at} " in out
    first_bundle, second_bundle = bundles(tmp_path, "fault")
    again = jsonl.read(second_bundle / P.METRICS)
    assert [r["step"] for r in again] == list(range(resumes_at + 1, 201))
    redone = {r["step"]: r["loss"] for r in first if r["step"] > resumes_at}
    assert all(abs(r["loss"] - redone[r["step"]]) < 1e-6 for r in again if r["step"] in redone)  # the same samples
    assert_kept_as_promised(root, [first_bundle, second_bundle])


TWO_RANKS = ("--nodes", "1", "--gpus_per_node", "2", "--tp", "1", "--pp", "1")  # dp 2: the default cluster's node


@pytest.mark.nanotron_cpu
@pytest.mark.parametrize("point", ["save-mid-write", "save-before-pointer"])
def test_nanotrons_trainer_keeps_the_same_and_a_save_cut_at_each_point_loses_nothing(
    tmp_path: Path, slurm_env: dict, demo_data: Any, point: str
):
    """nanotron 0.4's own trainer on 2 CPU ranks (tests/cpu_nanotron), killed on rank 0 at step 60: as it would write
    checkpoint_metadata.json (every rank's weights and optimizer files are written: a <step>/ that is not a
    checkpoint), or once 60 is complete, before latest.txt names it. Launched again, it resumes from 50, the
    pointer's, at the samples 50's metadata names, and ends with the same five steps. A partial 60 stays while it
    may be a save in progress; either 60 is then saved over."""
    from cpu_nanotron import environment
    from test_nanotron_slurm import launch as nanotron_launch

    faulty = faulty_python(tmp_path, f"{point}@60", environment())
    flags = (*RULES[2:], "--python", str(faulty), "--max_restarts", "0")  # (launch says --train_steps)

    def run() -> tuple[int, str]:
        proc = nanotron_launch(tmp_path, slurm_env, demo_data, "0.4", "nano", None, 200, *flags, layout=TWO_RANKS)
        return finish(proc, timeout=900)

    code, out = run()
    root = tmp_path / "checkpoints/nano"
    assert code != 0 and (tmp_path / "killed").exists(), out[-4000:]
    complete, pointer = set(ckpt.complete_steps(root)), ckpt.pointer_step(root)
    if point == "save-mid-write":
        assert complete == {40, 50} and pointer == 50
        (partial,) = ckpt.partial_steps(root)
        assert partial.step == 60 and "no checkpoint_metadata.json" in partial.why
    else:  # 60 complete, the pointer still at 50: both kept (the pointer's, the newest), nothing partial
        assert {50, 60} <= complete <= {40, 50, 60} and pointer == 50 and ckpt.partial_steps(root) == []
    consumed = json.loads((root / "50" / P.NANOTRON_METADATA).read_text())["metas"]["consumed_train_samples"]
    assert consumed == 50 * 8  # dp 2 x micro-batch 2 x accumulation 2 a step
    first = jsonl.read(bundles(tmp_path, "nano")[0] / P.METRICS)

    code, out = run()
    assert code == 0, out[-4000:]
    assert f"resuming from the run's own checkpoints in {root} (latest: 50)" in out
    first_bundle, second_bundle = bundles(tmp_path, "nano")
    again = jsonl.read(second_bundle / P.METRICS)
    assert [r["step"] for r in again] == list(range(51, 201))
    redone = {r["step"]: r["loss"] for r in first if r["step"] > 50}
    assert redone and all(abs(r["loss"] - redone[r["step"]]) < 1e-3 for r in again if r["step"] in redone)
    assert_kept_as_promised(root, [first_bundle, second_bundle])


@pytest.mark.nanotron_cpu
def test_nanotron_mains_trainer_keeps_the_last_2_and_every_50th(tmp_path: Path, slurm_env: dict, demo_data: Any):
    """The issue's run with nanotron main's own trainer (its dialect, its checkpoint format 1.5) on 2 CPU ranks."""
    from cpu_nanotron import python
    from test_nanotron_slurm import launch as nanotron_launch

    flags = (*RULES[2:], "--python", str(python(tmp_path, main=True)))
    proc = nanotron_launch(tmp_path, slurm_env, demo_data, "main", "nanomain", None, 200, *flags, layout=TWO_RANKS)
    code, out = finish(proc, timeout=900)
    assert code == 0, out[-4000:]
    root = tmp_path / "checkpoints/nanomain"
    (bundle_dir,) = bundles(tmp_path, "nanomain")
    assert_kept_as_promised(root, [bundle_dir])
    assert json.loads((root / "200" / P.NANOTRON_METADATA).read_text())["version"] == "1.5"  # main's format
    rows = jsonl.read(bundle_dir / P.CHECKPOINTS_RECORD)
    assert [r["step"] for r in rows if r["event"] == "saved"] == list(range(10, 201, 10))
    assert {r["engine"] for r in rows if r["event"] == "saved"} == {"nanotron"}
