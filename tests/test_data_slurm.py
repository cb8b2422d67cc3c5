"""`tokenize --slurm` on the real local cluster: datatrove's SlurmPipelineExecutor submits the array, the command
follows it to its end; the files are those the login node makes; a rerun submits only the unfinished task. The
session's Slurm-made folder (`slurm_nanoset`) is the one checked here and trained on by the torch engine's preemption
test; the nanotron one (tests/test_nanoset_slurm.py) makes its own on its 8-slot cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import DemoData
from test_data_hub import NAME, cache_as_hub
from test_data_tokenize import _documents, _expected, _texts

from launcher.data import on_slurm
from launcher.data.__main__ import main
from launcher.data.tokenize import RECORD, RECORD_DIR
from launcher.nanotron_config import nanoset

pytestmark = pytest.mark.slurm


def _on_slurm(demo: DemoData, output: Path, *extra: str) -> int:
    return main(
        ["tokenize", "--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer), "--output", str(output),
         "--tasks", "2", "--slurm", "--partition", "debug", "--time_limit", "10", "--show_logs", *extra]
    )  # fmt: skip


def test_a_tokenization_as_a_slurm_array_job_and_its_continuation(
    slurm_env: dict[str, str], slurm_nanoset: Path, demo_data: DemoData, tmp_path: Path, capsys
):
    """The session's folder (`slurm_nanoset`, which the torch engine's preemption test trains on) is the login
    node's tokenization; a copy of it with one task lost is continued by the same command."""
    assert _documents(slurm_nanoset) == _expected(demo_data, _texts(demo_data))
    script = (slurm_nanoset / RECORD_DIR / "logs" / "launch_script.slurm").read_text()
    assert "#SBATCH --partition=debug" in script and "--qos" not in script  # no QOS the cluster lacks
    record = json.loads((slurm_nanoset / RECORD_DIR / RECORD).read_text())
    assert record["status"] == "complete" and len(record["slurm_jobs"]) == 1 and record["documents"] == 150

    # task 1 lost (no completion record, no files): the same command resubmits it alone
    output = tmp_path / "out"
    shutil.copytree(slurm_nanoset, output)
    logs = output / RECORD_DIR / "logs"
    (logs / "completions" / "00001").unlink()
    for path in output.glob("00001_*"):
        path.unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in output.glob("00000_*")}
    assert _on_slurm(demo_data, output) == 0, capsys.readouterr().err[-3000:]
    assert json.loads((logs / "ranks_to_run.json").read_text()) == [1]
    assert {p.name: p.stat().st_mtime_ns for p in output.glob("00000_*")} == kept
    assert len(json.loads((output / RECORD_DIR / RECORD).read_text())["slurm_jobs"]) == 2
    assert _documents(output) == _expected(demo_data, _texts(demo_data))


def test_an_output_whose_job_still_runs_is_not_written_twice(
    slurm_env: dict[str, str], demo_data: DemoData, tmp_path: Path, capsys
):
    output = tmp_path / "out"
    local = ["tokenize", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--output",
             str(output), "--tasks", "2"]  # fmt: skip
    argv = [*local, "--slurm", "--partition", "debug", "--time_limit", "10"]
    # the partition down while we look: the array is accepted and stays pending (a hold after submission races
    # with the scheduler)
    partition = ["scontrol", "update", "PartitionName=debug"]
    subprocess.run([*partition, "State=DOWN"], check=True, env=slurm_env)
    try:
        assert main(argv) == 0  # submitted, not followed
        job = json.loads((output / RECORD_DIR / RECORD).read_text())["slurm_jobs"][-1]
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--output: job {job} (PENDING) is still tokenizing into {output}" in err and "scancel" in err
        assert main(local) == 2  # nor on the login node
        assert "is still tokenizing" in capsys.readouterr().err
    finally:
        subprocess.run([*partition, "State=UP"], check=True, env=slurm_env)
    assert set(on_slurm.follow(job, show=False)) == {"COMPLETED"}
    assert main([*argv, "--show_logs"]) == 0  # all tasks done: nothing submitted, the record completed
    assert "every task had finished" in capsys.readouterr().out
    assert json.loads((output / RECORD_DIR / RECORD).read_text())["status"] == "complete"
    assert _documents(output) == _expected(demo_data, _texts(demo_data))


def test_slurm_flags_are_checked_with_the_rest(demo_data: DemoData, tmp_path: Path, capsys):
    code = main(
        ["tokenize", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--output",
         str(tmp_path / "out"), "--slurm", "--qos", "a b", "--time_limit", "soon", "--tasks", "0"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for flag in ("--partition", "--qos", "--time_limit", "--tasks"):
        assert f"  - {flag}:" in err
    assert not (tmp_path / "out").exists()


def test_an_output_path_datatrove_would_write_unquoted_is_refused(demo_data: DemoData, tmp_path: Path, capsys):
    weird = tmp_path / "a'; touch pwned; echo 'b"
    argv = ["tokenize", "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--output",
            str(weird), "--slurm", "--partition", "debug"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "  - --output:" in err and "datatrove's batch script unquoted" in err
    assert not weird.exists()
    assert main(argv[:-3]) == 0  # on the login node nothing reaches a shell: the same path is fine there
    assert nanoset.inspect(weird)[0] is not None
    assert not (Path.cwd() / "pwned").exists()


def test_a_hub_name_is_tokenized_on_slurm_from_the_cache_this_machine_read(
    slurm_env: dict[str, str], demo_data: DemoData, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    """A hub name checked in this machine's datasets cache is read by the array's tasks from that same cache,
    offline: here a cache that only this process knows (no HF_DATASETS_CACHE in the environment sbatch passes on, as
    a cache set in a Python session or a site's profile on the login node alone), which the tasks are told of."""
    import datasets

    cache = tmp_path / "hf" / "datasets"
    cache_as_hub(demo_data, cache, NAME)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))  # the tasks' default cache: empty
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # tokenize sets it: restored after the test
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])  # read by the sbatch datatrove runs
    output = tmp_path / "out"
    argv = ["tokenize", "--dataset", NAME, "--tokenizer", str(demo_data.tokenizer), "--output", str(output),
            "--tasks", "2", "--slurm", "--partition", "debug", "--time_limit", "10", "--show_logs"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    script = (output / RECORD_DIR / "logs" / "launch_script.slurm").read_text()
    assert f"HF_DATASETS_CACHE={cache}" in script and "HF_HUB_OFFLINE=1" in script
    assert _documents(output) == _expected(demo_data, _texts(demo_data))  # every document, through the cache
    record = json.loads((output / RECORD_DIR / RECORD).read_text())
    assert record["dataset"]["hub"] == NAME and record["status"] == "complete" and len(record["slurm_jobs"]) == 1
