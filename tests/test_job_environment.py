"""The job's environment, read in one place into one typed value (launcher.train.environment.JobEnvironment)."""

from __future__ import annotations

import ast
from pathlib import Path

from launcher import protocol as P
from launcher.train.environment import STOP_FILE_EVERY_S, JobEnvironment

TRAIN = Path(__file__).resolve().parent.parent / "launcher" / "train"


def test_torchruns_ranks_and_the_bundles_files_are_read_typed():
    """One variable names the bundle: training's files are its files, by the protocol's names."""
    job = JobEnvironment.read(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", P.ENV_BUNDLE: "/b", P.ENV_SIGNAL_GRACE: "120",
         P.ENV_STOP_FILE_EVERY: "0.5", "TMPDIR": "/scratch", "WANDB_MODE": "Disabled"}
    )  # fmt: skip
    files = {name: f"/b/{name}" for name in (P.STOP_FILE, P.OUTCOME_FILE, P.METRICS, P.PROGRESS_FILE)}
    assert job == JobEnvironment(3, 1, 8, True, *files.values(), 120.0, 0.5, "/scratch", True,
                                 ranks_file=f"/b/{P.RANKS_FILE}", stragglers_file=f"/b/{P.STRAGGLERS_FILE}",
                                 runtime_file=f"/b/{P.RUNTIME_RECORD}")  # fmt: skip
    assert not job.is_main
    assert not {k for k in vars(P) if k.startswith("ENV_") and k.endswith("_FILE")}  # none but the bundle's one


def test_the_runtime_records_place_and_the_jobs_attempt_and_nodes():
    job = JobEnvironment.read(
        {P.ENV_BUNDLE: "/b", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2",
         "SLURM_JOB_NODELIST": "node[1-2]", "HF_HOME": "/hf"}
    )  # fmt: skip
    assert (job.runtime_file, job.job_id, job.attempt, job.nodelist) == ("/b/runtime.jsonl", "42", 3, "node[1-2]")
    assert job.hub_cache == Path("/hf/hub")
    assert JobEnvironment.read({"HF_HUB_CACHE": "/c", "HF_HOME": "/hf"}).hub_cache == Path("/c")
    alone = JobEnvironment.read({})
    assert (alone.runtime_file, alone.job_id, alone.attempt, alone.nodelist) == (None, None, 1, None)


def test_a_process_started_alone_is_rank_0_of_1_with_no_files():
    job = JobEnvironment.read({})
    assert (job.rank, job.local_rank, job.world_size, job.distributed, job.is_main) == (0, 0, 1, False, True)
    assert (job.stop_file, job.outcome_file, job.metrics_file, job.progress_file) == (None, None, None, None)
    assert (job.signal_grace, job.stop_file_every, job.tmp_dir, job.wandb_disabled) == (0.0, STOP_FILE_EVERY_S,
                                                                                          "/tmp", False)  # fmt: skip
    assert not JobEnvironment.read({"RANK": "0"}).distributed  # torchrun sets both


def test_values_that_are_not_numbers_keep_the_defaults_rather_than_failing_the_job():
    job = JobEnvironment.read({P.ENV_SIGNAL_GRACE: "soon", P.ENV_STOP_FILE_EVERY: "-1", "LOCAL_RANK": "x"})
    assert (job.signal_grace, job.stop_file_every, job.local_rank) == (0.0, STOP_FILE_EVERY_S, 0)


def environment_reads(source: str) -> int:
    """The `os.environ` and `os.getenv` in a module's code (not in its strings: the mends quote nanotron's)."""
    return sum(
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
        and node.attr in ("environ", "getenv")
        for node in ast.walk(ast.parse(source))
    )  # fmt: skip


def test_the_job_reads_its_environment_nowhere_else():
    assert environment_reads('import os\nos.environ["A"]; os.getenv("B"); x = "os.environ"') == 2
    readers = {str(path.relative_to(TRAIN)): environment_reads(path.read_text()) for path in TRAIN.rglob("*.py")}
    assert {name: n for name, n in readers.items() if n and name != "environment.py"} == {}
