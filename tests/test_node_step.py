"""The node step (launcher/node/step.py) on its own, on this machine: training's environment and torchrun's command as
pure functions, then a real torchrun of a tiny training stand-in started by `python -m launcher.node.step JOB run`,
SIGTERM kept blocked for training, its stacks dumped and its processes stopped by the step's handle, as the supervisor
does it through `srun --overlap` (the cluster's own runs: tests/test_supervisor_slurm.py, test_e2e_training.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from launcher_helpers import free_port

from launcher import protocol as P
from launcher.node import step
from launcher.node.job import Job

ROOT = Path(__file__).resolve().parent.parent
# Training as far as the step sees it: each rank records whether SIGTERM came blocked, unblocks it once it can "save"
# (as launcher/train/stop.py does), and ends on SIGTERM or on the stop file, rank 0 writing its word.
TRAINING = r"""
import os, pathlib, signal, sys, time
rank, folder = int(os.environ["RANK"]), pathlib.Path(os.environ["TMPDIR"])
blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
bundle = pathlib.Path(os.environ["LAUNCHER_BUNDLE"])
stop, outcome = bundle / "stop-requested", bundle / "outcome"
told = []
signal.signal(signal.SIGTERM, lambda *_: told.append(1))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
(folder / f"rank{rank}").write_text(f"{os.getpid()} {blocked} {os.environ['LAUNCHER_NODE_TAG']} {sys.argv[1:]}")
while not told and not stop.exists():
    time.sleep(0.1)
if rank == 0:
    outcome.write_text("stopped 5\n")
"""


def job_in(tmp_path: Path, **changes: object) -> Job:
    (tmp_path / "bundle").mkdir(exist_ok=True)
    (tmp_path / "train.py").write_text(TRAINING)
    bundle = tmp_path / "bundle"
    job = Job("t", bundle, tmp_path / "logs/t.out", tmp_path / "ck", Path(sys.executable), ROOT, tmp_path / "train.py",
              bundle / "config.yaml", "auto", 1, 2, tmp_path, node_check=False)  # fmt: skip
    job = replace(job, **changes)  # type: ignore[arg-type]
    (tmp_path / "job.json").write_text(job.to_json())
    return job


def test_trainings_environment_names_the_runs_bundle_and_lets_extra_env_have_the_last_word(tmp_path: Path):
    job = job_in(tmp_path, wandb_disabled=True, signal_grace=120, extra_env={"WANDB_MODE": "offline", "X": "y z"})
    env = step.environment(job, {"PATH": "/usr/bin:/bin", "SLURM_CPUS_PER_TASK": "8", "NCCL_DEBUG": "TRACE"}, "7", "n1")
    assert env[P.ENV_BUNDLE] == str(tmp_path / "bundle") and env[P.ENV_NODE_TAG] == "7:n1"
    assert not [k for k in env if k.startswith("LAUNCHER_") and k.endswith("_FILE")]  # the bundle names them all
    assert env[P.ENV_SIGNAL_GRACE] == "120"
    assert (env["WANDB_MODE"], env["X"], env["NCCL_DEBUG"], env["OMP_NUM_THREADS"]) == ("offline", "y z", "TRACE", "4")
    assert env["TMPDIR"] == str(tmp_path) and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    debug = step.environment(replace(job, debug=True, signal_grace=0), {"PATH": str(tmp_path)}, "7", "n1")
    assert (debug["NCCL_DEBUG"], debug["TORCH_DISABLE_ADDR2LINE"]) == ("INFO", "1") and P.ENV_SIGNAL_GRACE not in debug


def test_torchruns_command_by_the_rendezvous_backend(tmp_path: Path):
    job = job_in(tmp_path, nodes=2, gpus_per_node=8, engine="nanotron")
    c10d = step.torchrun_argv(job, "7", "10.0.0.1:21234", None)
    assert c10d[1:] == ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=8", "--rdzv_backend=c10d",
                        "--rdzv_endpoint=10.0.0.1:21234", "--rdzv_id=7", "--max_restarts=0", str(job.train_script),
                        "--config-file", str(job.config), "--engine", "nanotron"]  # fmt: skip
    static = step.torchrun_argv(job, "7", "10.0.0.1:21234", 1)
    assert static[5:8] == ["--node_rank=1", "--master_addr=10.0.0.1", "--master_port=21234"]
    assert step.main([str(tmp_path / "job.json"), "run", "10.0.0.1:1"]) == 1  # a usage error: said, exit 1


def start_step(tmp_path: Path, job: Job) -> tuple[subprocess.Popen[str], list[int]]:
    """`python -m launcher.node.step JOB run` on this machine (node n1 of job 7), once both ranks run: the step and
    the training processes' pids."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "launcher.node.step", str(tmp_path / "job.json"), "run", f"127.0.0.1:{free_port()}",
            "n1"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"rank{r}").exists() for r in range(job.gpus_per_node)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    return proc, [int((tmp_path / f"rank{r}").read_text().split()[0]) for r in range(job.gpus_per_node)]


def beside(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The step's `dump` or `stop` on the same node, as `srun --overlap` runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    argv = [sys.executable, "-m", "launcher.node.step", str(tmp_path / "job.json"), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_slurms_sigterm_is_trainings_and_the_step_waits_for_it_to_save(tmp_path: Path):
    job = job_in(tmp_path, debug=True)
    proc, ranks = start_step(tmp_path, job)
    handle = json.loads(step.handle(job, "7", "n1").read_text())
    assert handle["step"] == proc.pid and step.children(handle["torchrun"]) == sorted(ranks)
    assert all((tmp_path / f"rank{r}").read_text().split()[1:3] == ["True", "7:n1"] for r in range(2))  # blocked
    for pid in (proc.pid, handle["torchrun"], *ranks):  # as Slurm signals every process of the step at once
        os.kill(pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out  # torchrun and the step outlived the notice; training saved and ended
    assert (job.bundle / P.OUTCOME_FILE).read_text() == "stopped 5\n"
    assert "+ " in out and "torch.distributed.run --nnodes=1 --nproc_per_node=2" in out  # --debug's trace
    assert not step.handle(job, "7", "n1").exists()  # gone with its torchrun


def test_a_hangs_stacks_are_dumped_and_training_stopped_by_the_steps_handle(tmp_path: Path):
    job = job_in(tmp_path)
    proc, ranks = start_step(tmp_path, job)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    assert beside(tmp_path, "dump", str(stacks)).returncode == 0
    dumps = {p.name: p.read_text() for p in stacks.iterdir()}
    assert sorted(dumps) == sorted(f"n1-{pid}.txt" for pid in ranks), dumps
    if step.py_spy(job) is not None:  # py-spy's dumps: each rank's Python stack, waiting in the stand-in's loop
        assert all("<module> (train.py:" in text for text in dumps.values()), dumps
    else:
        assert all("py-spy not found" in text for text in dumps.values()), dumps
    assert beside(tmp_path, "stop").returncode == 0
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and not (job.bundle / P.OUTCOME_FILE).exists(), out  # killed, nothing saved
    assert beside(tmp_path, "stop").returncode == 0 and step.training_pids(job, "7", "n1") == []  # no step: no-op


def test_a_node_outside_the_node_list_has_no_static_rank(tmp_path: Path):
    job_in(tmp_path, rdzv_backend="static")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n9"}
    argv = [sys.executable, "-m", "launcher.node.step", str(tmp_path / "job.json"), "run", "127.0.0.1:1", "n1,n2"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and P.pattern("no_rank").match(out.stderr.strip()), out.stderr


def test_the_node_check_runs_in_the_step_and_its_findings_end_it(tmp_path: Path):
    """A node that cannot see an input: its line, the report for the supervisor, exit 5, no torchrun. The first node
    whose rendezvous port is taken: the port-taken file for the supervisor (another port), exit 6."""
    job_in(tmp_path, node_check=True, inputs=(str(tmp_path / "no-such-dataset"),))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    argv = [sys.executable, "-m", "launcher.node.step", str(tmp_path / "job.json"), "run"]
    out = subprocess.run([*argv, "127.0.0.1:1", "n1"], env=env, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()  # (the bundle's config is not there either)
    assert out.returncode == 5 and all(P.pattern("node_check_failed").match(line) for line in lines), out
    report = (tmp_path / "bundle" / P.NODE_CHECK_REPORT).read_text().splitlines()
    assert f"n1: cannot see {tmp_path}/no-such-dataset (not there from this node)" in report
    assert not (tmp_path / "rank0").exists()
    job_in(tmp_path, node_check=True)
    port = free_port()
    with socket.create_server(("", port)):
        out = subprocess.run([*argv, f"127.0.0.1:{port}", "n1,n2"], env=env, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert out.returncode == 6 and (tmp_path / "bundle" / P.PORT_TAKEN_FILE).exists(), out
