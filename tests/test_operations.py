"""Operating runs on the real local cluster: CPUs for every process, a site that exports nothing
(SBATCH_EXPORT=NONE), a hang caught by the watchdog, unhealthy nodes caught before training and left out of the
requeue, --debug, and the launcher's verdict on runs that end badly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_runs import (
    bundles,
    finish,
    launch,
    leftover_processes,
    manifest,
    paced,
    steps_of_attempts,
    submitted_job_id,
    wait_for,
)
from launcher_helpers import ROOT

from launcher.localcluster import ClusterSpec, down, up
from launcher.slurm.parse import parse_scontrol

pytestmark = pytest.mark.slurm

# run_train.py itself, except that in the first attempt one rank stops answering after a few steps: the other
# waits for it in its next all_reduce, and nothing moves. (The test's stand-in for a dead GPU or a deadlocked loader.)
HANGS_ON = """
import os, runpy, sys, time
sys.path.insert(0, {root!r})
from launcher.train.torch_engine import engine as torch_engine

step = torch_engine.TorchTrainer.train_step

def stuck(self, ddp):
    if self.step == {at} and os.environ.get("SLURM_RESTART_COUNT", "0") == "0" and self.where.rank == 1:
        while True:
            time.sleep(1)  # what a hung rank looks like from the outside
    return step(self, ddp)

torch_engine.TorchTrainer.train_step = stuck
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def fields(job_id: str, env: dict) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
    return parse_scontrol(out.stdout)


def test_every_process_gets_a_cpu_and_a_site_exporting_nothing_still_runs(tmp_path: Path, slurm_env: dict, demo_data):
    env = {**slurm_env, "SBATCH_EXPORT": "NONE"}  # srun inside the job would then pass not even PATH
    proc = launch(tmp_path, env, demo_data, "cpus", "--train_steps", "5", "--debug", "true")
    code, out = finish(proc, timeout=300)
    assert code == 0, out
    assert (
        "cpus         2 per node: 1 per process (OMP_NUM_THREADS=1); the partition's nodes have 2 CPUs for 2 GPUs"
        in out
    )
    (bundle_dir,) = bundles(tmp_path, "cpus")
    job = fields(submitted_job_id(bundle_dir), slurm_env)
    assert job["NumCPUs"] == "4" and job["CPUs/Task"] == "2"  # 2 per node: every process has one
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert "--debug: the node step prints each command it runs" in log
    assert "torch.distributed.run" in log and "+ " in log  # the node step's trace of its commands reached the log
    assert "hf_" not in log and "WANDB_API_KEY" not in log  # the step traces commands, never the environment
    data = json.loads((bundle_dir / "manifest.json").read_text())
    assert data["files"]["job"]["sha256"] and Path(data["files"]["job"]["path"]).is_file()


def assert_caught_fast_and_named(log: str, bundle_dir: Path, job_id: str, at: int, limit: int) -> None:
    """The watchdog's verdict, held to the run's own records: the hung rank stopped in step `at`, so the first
    attempt logged every step before it (metrics.jsonl); the step the verdict names is where rank 0's progress
    last stood (written every 5 s or on a change of phase), so one of those, no earlier than the checkpoint the
    requeue resumed from; and it was caught at the between-steps limit, within a few of its polls."""
    found = re.search(r"hung at step (\d+): no progress for (\d+) s \(limit (\d+) s\); stacks in", log)
    assert found, log[-3000:]
    step, idle, allowed = map(int, found.groups())
    last_first, resumed = steps_of_attempts(bundle_dir, log, job_id)
    assert last_first == at - 1 and resumed <= step <= last_first, (step, resumed, last_first)
    assert allowed == limit and limit <= idle <= limit + 10, found.group(0)


@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_a_hang_is_caught_dumped_and_the_run_goes_on_without_the_node(
    rdzv: str, tmp_path: Path, slurm_env: dict, demo_data
):
    """Under either rendezvous (auto takes c10d at this size; static is what thousands of nodes get)."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_ON.format(root=str(ROOT), at=5, script=str(ROOT / "run_train.py")))
    # 20 s without a step between steps is a hang; start-up (each attempt's, to its first step) has 300 s: on a
    # loaded machine it takes longer than 20 (torch's import, data, the resume), which is no hang
    proc = launch(tmp_path, slurm_env, demo_data, "hang", "--train_steps", "30", "--hang_timeout", "20",
                  "--startup_timeout", "300", "--save_interval", "3", "--run_train_script", str(script),
                  "--rdzv_backend", rdzv, nodes="1")  # fmt: skip
    code, out = finish(proc, timeout=600)
    (bundle_dir,) = bundles(tmp_path, "hang")
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0, out + log[-3000:]
    first = log.split(" attempt 1 started ")[1].split(" on ")[1].split()[0]
    job_id = submitted_job_id(bundle_dir)
    assert_caught_fast_and_named(log, bundle_dir, job_id, at=5, limit=20)
    stacks = Path(log.split("stacks in ")[1].split()[0])
    dumps = {p.name: p.read_text() for p in stacks.glob(f"{first}-*.txt")}
    assert len(dumps) == 2 and all("Thread" in text for text in dumps.values()), dumps  # py-spy, one a rank
    # the hung rank where it hangs; the other waiting in a collective (DDP's gradient all-reduce, inside backward)
    assert sum("stuck (hangs.py:11)" in text for text in dumps.values()) == 1
    assert sum("_engine_run_backward" in text or "all_reduce" in text for text in dumps.values()) == 1
    assert f"suspected: {first}" in log and f"requeueing without {first}" in log
    assert f"job {job_id} attempt 2 started" in log and "resumed from checkpoint step 3 " in log
    assert f"({rdzv}), 1 node x 2 processes" in log  # the rendezvous line says which
    second = log.split(" attempt 2 started ")[1].split(" on ")[1].split()[0]
    assert second != first and "could not exclude" not in log, log[-3000:]
    assert fields(job_id, slurm_env)["ExcNodeList"] == first and "ended COMPLETED" in out
    ledger = manifest(bundle_dir)["ledger"]  # the hang's cost: step 4 done again, the hang until the watchdog fired
    assert ledger["causes"] == {"hang": 1} and ledger["steps_thrown_away"] == 1
    assert ledger["attempts"][0]["wind_down"] >= 2 * 20  # 2 GPUs, at least the 20 s the watchdog waited


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], ClusterSpec, Path]]:
    """A 3-node cluster whose node2 sees one directory read-only (its slurmd runs in a mount namespace of its own)
    and that notices a silent slurmd after 10 s."""
    shared = tmp_path_factory.mktemp("shared")
    spec = ClusterSpec(tmp_path_factory.mktemp("three"), nodes=3, gpus_per_node=2, slurmd_timeout_s=10,
                       read_only=(("node2", str(shared)),))  # fmt: skip
    yield up(spec), spec, shared
    down(spec)


FAKE_SMI = """#!/bin/bash
# stands in for nvidia-smi: node1 has lost a GPU
if [[ "$1" == "-L" ]]; then
  echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"
  [[ "$SLURMD_NODENAME" == node1 ]] || echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"
  exit 0
fi
while :; do sleep 5; done  # dmon
"""


def test_a_node_that_cannot_write_is_left_out(tmp_path: Path, slurm_env: dict, three_nodes, demo_data):
    env, _, shared = three_nodes
    env = {**slurm_env, **env}
    # A 2-node run lands on node[1-2] first; node2 cannot write the checkpoints there.
    proc = launch(tmp_path, env, demo_data, "readonly", "--train_steps", "5",
                  "--checkpoints_path", str(shared / "ckpt"))  # fmt: skip
    code, out = finish(proc, timeout=300)
    (bundle_dir,) = bundles(tmp_path, "readonly")
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0, out + log[-3000:]
    assert f"node check failed on node2: cannot write {shared / 'ckpt' / 'readonly'} (Read-only file system)" in log
    assert log.index("node check failed") < log.index("requeueing without node2") < log.index("step 1/")
    assert fields(submitted_job_id(bundle_dir), env)["ExcNodeList"] == "node2" and "ended COMPLETED" in out


def test_a_node_short_of_gpus_is_left_out(tmp_path: Path, slurm_env: dict, three_nodes, demo_data):
    env = {**slurm_env, **three_nodes[0]}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = launch(tmp_path, env, demo_data, "gpus", "--train_steps", "5")
    code, out = finish(proc, timeout=300)
    (bundle_dir,) = bundles(tmp_path, "gpus")
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0, out + log[-3000:]
    assert "node check failed on node1: sees 1 GPU (nvidia-smi -L), the job runs 2 processes on it" in log
    assert "requeueing without node1" in log and "ended COMPLETED" in out


def test_a_node_failure_is_named(tmp_path: Path, slurm_env: dict, three_nodes, demo_data):
    env, spec, _ = three_nodes
    env = {**slurm_env, **env}
    proc = launch(tmp_path, env, demo_data, "nodefail", "--nodelist", "node3", "--train_steps", "100000",
                  "--max_requeues", "0", "--run_train_script", paced(tmp_path), nodes="1")  # fmt: skip
    (bundle_dir,) = wait_for(lambda: (tmp_path / "logs/configs/nodefail").is_dir() and bundles(tmp_path, "nodefail"),
                             timeout=60)  # fmt: skip
    job_id = wait_for(lambda: submitted_job_id(bundle_dir), timeout=60)
    log = Path(manifest(bundle_dir)["outputs"]["log"])
    wait_for(lambda: log.exists() and "step 2/" in log.read_text(), timeout=120)
    os.kill(int((spec.dir / "run/slurmd.node3.pid").read_text()), 9)  # node3's slurmd dies; SlurmdTimeout 10 s
    try:
        code, out = finish(proc, timeout=180)
        assert code == 1 and "ended NODE_FAIL" in out, out
        assert "node3" in out.split("ended NODE_FAIL")[1]  # the verdict names the node
    finally:
        for pid in leftover_processes(job_id, env["SLURM_CONF"]):  # training ran on without its slurmd
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid.split()[0]), 9)
        up(spec)  # node3's slurmd back for the other tests


RAISES = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(1)
if dist.get_rank() == 1:
    raise ValueError("bad shard index 7 in the data")
dist.barrier()
"""
OOM = """
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.23 GiB "
        "is free."
    )
dist.barrier()
"""


@pytest.mark.parametrize(
    "name,body,said",
    [
        ("raises", RAISES, ["ValueError: bad shard index 7 in the data", "rank 1"]),
        ("oom", OOM, ["ran out of GPU memory", "--micro_batch_size"]),
    ],
)
def test_a_failed_run_says_why(tmp_path: Path, slurm_env: dict, demo_data, name: str, body: str, said: list[str]):
    script = tmp_path / f"{name}.py"
    script.write_text(body)
    proc = launch(tmp_path, slurm_env, demo_data, name, "--run_train_script", str(script))
    code, out = finish(proc, timeout=300)
    assert code == 1 and "ended FAILED" in out, out
    ending = out.split("ended FAILED")[1]
    assert all(words in ending for words in said), ending
    verdict = json.loads((bundles(tmp_path, name)[0] / "manifest.json").read_text())["verdict"]
    assert verdict["cause"] in ("exception", "cuda_oom") and verdict["fix"]


def test_a_time_limit_with_no_requeue_left_says_so(tmp_path: Path, slurm_env: dict, demo_data):
    proc = launch(tmp_path, slurm_env, demo_data, "short", "--train_steps", "100000", "--time_limit", "1",
                  "--signal_grace", "30", "--max_requeues", "0", "--run_train_script", paced(tmp_path),
                  nodes="1")  # fmt: skip
    code, out = finish(proc, timeout=300)
    assert code == 1 and "ended TIMEOUT" in out, out
    assert "--time_limit" in out.split("ended TIMEOUT")[1]
