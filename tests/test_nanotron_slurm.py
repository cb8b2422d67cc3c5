"""nanotron's own trainer with 8 ranks (dp 2 x tp 2 x pp 2) through `slurm_launcher.py` on the local cluster: 2 nodes
x 4 slots, torchrun's c10d rendezvous, `--engine nanotron`, the job's Python a wrapper that loads the test-side CPU
patches (tests/cpu_nanotron/). Each run starts from the weights of a one-process run (its step 0, through a
`--config` that sets `model.init_method.path`) and is held to that run's losses at every step, in either dialect:
0.4's here across the time-limit notice (the stop file, the sharded checkpoint, the requeue); main's across a real
preemption in tests/test_nanoset_slurm.py, on a folder tokenized on Slurm, held to its own 8-rank run. A run straight
through would hold to less (it was a test of its own, ~3 minutes of CI's 2 cores for no check these lack), and so
would each dialect through both the notice and a preemption (~4 minutes more: the batch script turns both into the
same stop file, tests/test_preemption.py). A failure inside nanotron is named by the launcher's verdict.

Marked `nanotron_cpu`: the 22.05 cluster runs them (a second Slurm release changes nothing nanotron does).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_runs import bundles, finish, manifest, saved_by_the_stop, submitted_job_id, wait_for
from cpu_nanotron import launcher_config, parameters_line, python, train
from launcher_helpers import ROOT
from test_preemption import last_logged_step

from launcher import jsonl
from launcher.localcluster import ClusterSpec, down, up

pytestmark = [pytest.mark.slurm, pytest.mark.nanotron_cpu]
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def four_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local cluster of 2 nodes with 4 (fake) GPUs each: the 8 slots of dp 2 x tp 2 x pp 2."""
    spec = ClusterSpec(tmp_path_factory.mktemp("four"), nodes=2, gpus_per_node=4)
    yield {**os.environ, **up(spec)}
    down(spec)


def reference(tmp_path: Path, demo: Any, dialect: str, steps: int) -> tuple[Path, dict[int, dict]]:
    """The one-process run (torchrun, no Slurm) of the same flags: its step-0 weights and its metrics."""
    where = tmp_path / "reference"
    where.mkdir()
    config = launcher_config(where, "one", demo, dialect, 1, 1, 1, **{
        "checkpoints.save_initial_state": True, "tokens.train_steps": steps})  # fmt: skip
    return where / "ckpt" / "one" / "0", train(config, 1, dialect)


EIGHT = ("--nodes", "2", "--gpus_per_node", "4", "--tp", "2", "--pp", "2")  # dp 2 x tp 2 x pp 2


def launch(  # fmt: skip
    tmp_path: Path,
    env: dict,
    demo: Any,
    dialect: str,
    run_name: str,
    init: Path | None,
    steps: int,
    *flags: str,
    layout: tuple[str, ...] = EIGHT,
) -> subprocess.Popen:
    """slurm_launcher.py with the flags `cpu_nanotron.layout_spec` resolves, on 2 nodes x 4 (`layout`), following
    the job; from the reference's weights `init` (None: nanotron's own initialisation)."""
    user = tmp_path / f"{run_name}-start.yaml"  # the reference's weights, and its LR schedule (decay over 7 steps)
    start = {"optimizer": {"learning_rate_scheduler": {"lr_decay_steps": 7}}}
    user.write_text(yaml.safe_dump(start if init is None else {"model": {"init_method": {"path": str(init)}}, **start}))
    argv = [
        sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", run_name, *layout,
        "--model_size", "tiny", "--hidden_size", "64", "--num_layers", "2",
        "--max_seq_len", "64", "--micro_batch_size", "2", "--grad_accum_steps", "2", "--train_steps", str(steps),
        "--warmup_steps", "1", "--learning_rate", "1e-3", "--log_interval", "1", "--nanotron_dialect", dialect,
        "--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer), "--engine", "nanotron",
        "--python", str(python(tmp_path, main=dialect == "main")), "--config", str(user), "--wandb_disabled",
        "true", "--time_limit", "15:00", "--cpus_per_node", "2", "--show_logs", *flags,  # the 2 cores of this machine
    ]  # fmt: skip
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_as_the_reference(bundle_dir: Path, ref: dict[int, dict]) -> None:
    """Every step logged once, each with the reference's LR, its loss within bf16's noise, its grad norm within 1%."""
    rows = [r for r in jsonl.read(bundle_dir / "metrics.jsonl")]
    steps = [r["step"] for r in rows]
    assert sorted(steps) == sorted(ref) and len(steps) == len(set(steps)), steps
    for r in rows:
        step = r["step"]
        assert r["lr"] == pytest.approx(ref[step]["lr"], rel=1e-9), step
        assert r["loss"] == pytest.approx(ref[step]["loss"], abs=TOLERANCE), (step, r, ref[step])
        assert r["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=1e-2), step


def training(tmp_path: Path, run_name: str) -> tuple[Path, str]:
    """The bundle and job id of a launched run, once its ranks have logged step 4."""
    (bundle_dir,) = wait_for(lambda: bundles(tmp_path, run_name) if (tmp_path / "logs/configs" / run_name).exists()
                             else [], timeout=60)  # fmt: skip
    job_id = wait_for(lambda: submitted_job_id(bundle_dir), timeout=60)
    wait_for(lambda: last_logged_step(bundle_dir) >= 4, timeout=400)
    return bundle_dir, job_id


def assert_launched_as_eight(out: str, log: str, bundle_dir: Path) -> None:
    """What the launcher said of the 8-rank job: c10d on 2 nodes x 4, nanotron's engine, its ranks' parameters."""
    assert "rendezvous" in out and "(c10d), 2 nodes x 4 processes" in log and "engine: nanotron (requested)" in log
    assert manifest(bundle_dir)["derived"]["rendezvous"]["backend"] == "c10d"
    assert "parameters per rank (pipeline stage x tensor shard)" in log and "ended COMPLETED" in out


def preempt_to_the_end(tmp_path: Path, four_slots: dict, proc: Any, bundle_dir: Path, job_id: str, steps: int):  # type: ignore[no-untyped-def]
    """A job in `urgent` takes the 8 slots of the run `proc` follows: Slurm's SIGTERM, the save at the next step,
    the requeue, the run to its end. The job's log, the launcher's output and the step the stop saved."""
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "4",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 3"]  # fmt: skip
    subprocess.run(urgent, env=four_slots, capture_output=True, text=True, check=True)
    code, out = finish(proc, timeout=900)
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0 and "stop requested: checkpoint saved at step " in log, out + log[-6000:]
    saved = saved_by_the_stop(log)
    assert 4 <= saved < steps and f"job {job_id} attempt 2 started" in log and "requeued 1x" in out
    return log, out, saved


def test_the_time_limit_notice_stops_an_8_rank_04_run_which_saves_its_shards_requeues_and_resumes(
    tmp_path: Path, slurm_env: dict, four_slots: dict, demo_data: Any
):
    """Slurm's warning before the time limit (USR1 to the batch script) makes the stop file: nanotron 0.4's ranks
    save the sharded model and optimizer at the next step, the job requeues itself and resumes at that step, every
    step as the one-process run's, the LR and the loss continuing. (main's trainer through a real preemption, from
    its own 8-rank run's weights: tests/test_nanoset_slurm.py.)"""
    steps = 16
    init, ref = reference(tmp_path, demo_data, "0.4", steps)
    proc = launch(tmp_path, four_slots, demo_data, "0.4", "warned", init, steps, "--save_interval", "100000",
                  "--max_requeues", "2", "--extra_env", "LAUNCHER_STOP_FILE_EVERY_S=0.2")  # fmt: skip
    bundle_dir, job_id = training(tmp_path, "warned")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=four_slots, check=True)
    code, out = finish(proc, timeout=900)
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0 and "stop requested: checkpoint saved at step " in log, out + log[-6000:]
    saved = saved_by_the_stop(log)
    assert 4 <= saved < steps and f"job {job_id} attempt 2 started" in log and "requeued 1x" in out
    assert "requeueing after the time-limit notice (1 of 2)" in log
    assert f"resuming from the run's own checkpoints in {Path(manifest(bundle_dir)['outputs']['checkpoints'])}" in log
    assert f"(latest: {saved})" in log
    shards = Path(manifest(bundle_dir)["outputs"]["checkpoints"]) / str(saved) / "optimizer"
    assert len(list(shards.glob("optimizer_pp-*-of-2_tp-*-of-2*.pt"))) == 4  # each pp x tp rank's own
    assert_launched_as_eight(out, log, bundle_dir)
    assert_as_the_reference(bundle_dir, ref)  # every step, before the notice and after it
    # the memory model's parameters per rank are what nanotron built on each of the 8, at each attempt
    said = {line.strip() for line in log.splitlines() if "parameters per rank (" in line}
    assert said == {parameters_line(tmp_path, demo_data, "0.4")}, said


RAISES_IN_NANOTRON = """
# run_train.py itself, with nanotron's pipeline engine raising at its third micro-batch forward (a failure inside
# nanotron's own code, for the verdict to name)
import runpy, sys
sys.path.insert(0, {root!r})
from launcher.train.nanotron_engine import engine

real = engine.nanotron_mends.apply

def apply(dialect):
    real(dialect)
    from nanotron.parallel.pipeline_parallel.engine import PipelineEngine
    forward, calls = PipelineEngine.forward, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("shape '[2, 64, 4, 16]' is invalid for input of size 4096")
        return forward(self, *args, **kwargs)

    PipelineEngine.forward = failing

engine.nanotron_mends.apply = apply
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def test_a_failure_inside_nanotron_is_named(tmp_path: Path, slurm_env: dict, four_slots: dict, demo_data: Any):
    """Two ranks, one pipeline stage each, are enough to fail inside nanotron's pipeline engine (8 took ~3 minutes
    of CI's 2 cores for the same verdict)."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES_IN_NANOTRON.format(root=str(ROOT), script=str(ROOT / "run_train.py")))
    two = ("--nodes", "1", "--gpus_per_node", "2", "--tp", "1", "--pp", "2")
    proc = launch(tmp_path, four_slots, demo_data, "0.4", "fails", None, 5, "--run_train_script", str(script),
                  "--max_requeues", "0", layout=two)  # fmt: skip
    code, out = finish(proc, timeout=900)
    assert code != 0
    verdict = out[out.rindex("ended FAILED") :]
    assert "raised RuntimeError: shape '[2, 64, 4, 16]' is invalid for input of size 4096" in verdict, out[-3000:]
    assert "inside nanotron's own code, at nanotron/parallel/pipeline_parallel/engine.py" in verdict
    assert "report it to nanotron" in verdict
