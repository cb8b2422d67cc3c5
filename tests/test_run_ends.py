"""Every way a run ends is explained (docs/operations.md keeps the table): the ends that need the batch script are
run for real on the local cluster; the rest are triaged from the lines the job and Slurm print."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_runs import bundles, finish, launch
from launcher_helpers import START

from launcher import protocol as P
from launcher.slurm import triage

pytestmark = pytest.mark.slurm


def ended(tmp_path: Path, slurm_env: dict, demo_data, name: str, *flags: str) -> tuple[int, str, dict]:
    code, out = finish(launch(tmp_path, slurm_env, demo_data, name, *flags, nodes="1"), timeout=180)
    (bundle,) = bundles(tmp_path, name)
    return code, out, json.loads((bundle / P.MANIFEST).read_text())


def test_a_pre_launch_exit_is_not_a_success(tmp_path: Path, slurm_env: dict, demo_data):
    code, out, data = ended(tmp_path, slurm_env, demo_data, "early", "--pre_launch_commands", "echo ready; exit 0")
    assert "ended COMPLETED, exit code 0" in out, out  # Slurm's word: the batch script exited 0
    assert code == 1, out  # the launcher's: training never ran
    assert "why: the pre-launch commands ended the job before training, at: exit 0 (exit code 0)" in out, out
    assert "fix: correct --pre_launch_commands" in out
    assert data["verdict"]["cause"] == "pre_launch"


def test_a_failing_pre_launch_command_is_named_with_what_the_shell_said(tmp_path: Path, slurm_env: dict, demo_data):
    venv = tmp_path / "no-such-venv" / "bin" / "activate"
    code, out, data = ended(tmp_path, slurm_env, demo_data, "venv", "--pre_launch_commands", f"source {venv}")
    assert code == 1 and "ended FAILED, exit code 1" in out, out
    assert f"at: source {venv} (exit code 1)" in out and "No such file or directory" in out, out
    assert data["verdict"]["cause"] == "pre_launch"


def test_completed_without_finishing_is_not_a_success():
    stopped = START + "step 12/40 | loss 3.1\n" + P.line("outcome", word="none") + "\n"
    verdict = triage.verdict("COMPLETED", stopped)
    assert verdict is not None and verdict.cause == "not_trained"
    assert "did not reach its last step at step 12 of 40: it never said how it ended" in verdict.message
    finished = START + "step 40/40 | loss 1.1\n" + P.line("outcome", word="finished 40") + "\n"
    assert triage.verdict("COMPLETED", finished) is None
    stand_in = START + "all_reduce ok\n" + P.line("outcome", word="none") + "\n"  # a script that trains nothing
    assert triage.verdict("COMPLETED", stand_in) is None


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "ran out of GPU memory"),
        ("terminate called after throwing an instance of 'c10::OutOfMemoryError'", "ran out of GPU memory"),
        ("RuntimeError: CUDA error: out of memory", "ran out of GPU memory"),
    ],
)
def test_an_oom_without_a_traceback_is_named(line: str, words: str):
    summary = (
        "E1124 08:00:00 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: -6) local_rank: 1\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "run_train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2026-11-24_08:00:00\n"
        "  host      : node1\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -6 (pid: 4242)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 4242\n"
        "============================================================\n"
    )
    verdict = triage.verdict("FAILED", START + line + "\n" + summary, exit_code=1)
    assert verdict is not None and verdict.cause == "cuda_oom" and words in verdict.message, verdict
    assert "--micro_batch_size" in verdict.fix
