"""The DRAFT batch script (templates/sbatch_supervisor.sh.j2: a header and one exec of the Python supervisor) run
on the real local Slurm cluster, with real srun and torchrun: a run that completes, and a failing one that the
supervisor restarts in its allocation until the decision stops it. Not the launcher's script yet
(docs/supervisor.md): the bundle is written here from the same renderer."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from launcher_helpers import spec_for
from test_slurm_e2e import ALLREDUCE, FAIL, script

from launcher import protocol as P
from launcher.bundle import render
from launcher.bundle.files import paths_for

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def submit_draft(tmp_path: Path, env: dict, train: str, *flags: str) -> tuple[str, str, str]:
    """The bundle written with the draft as its batch script, submitted, followed to its end: (state, exit code,
    log)."""
    spec, problems = spec_for("--run_name", "sup", "--nodes", "2", "--gpus_per_node", "2", "--run_train_script",
                              train, "--dataset", "none", "--time_limit", "5:00", *flags, cwd=tmp_path)  # fmt: skip
    assert not problems, problems
    logs = tmp_path / "logs"
    paths = paths_for("sup", "20260101-000000", logs / "configs", logs / "scripts", logs / "out", tmp_path / "ck")
    for folder in (paths.bundle_dir, paths.script.parent, paths.log.parent):
        folder.mkdir(parents=True)
    paths.config.write_text(render.config_yaml(spec, paths))
    paths.node_script.write_text(render.node_script(spec, paths))
    paths.script.write_text(render.supervisor_script_draft(spec, paths))
    job = subprocess.run(["sbatch", "--parsable", str(paths.script)], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.strip().split(";")[0]  # fmt: skip
    deadline, state, code = time.monotonic() + 240, "", ""
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job, "-o"], env=env, capture_output=True, text=True).stdout
        fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
        state, code = fields.get("JobState", ""), fields.get("ExitCode", "")
        if state in TERMINAL:
            break
        time.sleep(1)
    time.sleep(1)  # the log's last lines
    return state, code, paths.log.read_text() if paths.log.exists() else ""


def lines(log: str, name: str) -> list[str]:
    return [line for line in log.splitlines() if P.pattern(name, whole=False).match(line)]


def test_the_supervisor_runs_a_training_step_to_its_end(tmp_path: Path, slurm_env: dict):
    state, code, log = submit_draft(tmp_path, slurm_env, script(tmp_path, "allreduce.py", ALLREDUCE))
    assert (state, code) == ("COMPLETED", "0:0"), log
    for rank in range(4):
        assert f"rank {rank}/4 sum=10 expected=10" in log, log
    assert len(lines(log, "attempt_started")) == 1 and len(lines(log, "rendezvous")) == 1, log
    assert lines(log, "outcome") and lines(log, "attempt_ended")[0].endswith("exit code 0"), log


def test_the_supervisor_restarts_a_failing_step_until_the_decision_stops(tmp_path: Path, slurm_env: dict):
    state, code, log = submit_draft(tmp_path, slurm_env, script(tmp_path, "fail.py", FAIL), "--max_restarts", "2")
    restarts = lines(log, "restart")
    assert len(restarts) == 2 and "restart 2 of 2 in the allocation" in restarts[1], log
    assert len(lines(log, "rendezvous")) == 3 and lines(log, "no_restart"), log
    assert state == "FAILED" and lines(log, "attempt_ended")[0].endswith(f"exit code {code.split(':')[0]}"), log
