"""`--interactive` without a container, through a real terminal (tmux) on the local cluster: the allocation of a
2-node run, a shell on its first node with the run's environment, the node step started by hand on both nodes with
the srun line the banner prints, and Ctrl-D releasing the allocation (the job then ends COMPLETED, not cancelled).
The same in a container is in test_containers.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cluster_runs import latest_step, wait_for
from terminal import launcher_in_terminal

from launcher.slurm.parse import parse_scontrol

pytestmark = pytest.mark.slurm


def settled(job_id: str, env: dict) -> dict[str, str]:
    """The job's `scontrol show job` fields once it has left COMPLETING (its nodes' cleanup: a container's takes
    seconds at load ~15, and CI once read COMPLETING right after the shell's exit)."""

    def read() -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
        return parse_scontrol(out.stdout)

    return wait_for(lambda: (f := read()).get("JobState") not in (None, "COMPLETING") and f, timeout=60)


def test_interactive_shell_on_the_first_node_runs_the_node_step_on_both(tmp_path: Path, slurm_env: dict, demo_data):
    terminal = launcher_in_terminal(tmp_path, slurm_env, demo_data, "inter2", "--nodes", "2", "--train_steps", "6",
                                    "--extra_env", "RUN_SAYS='hello there'")  # fmt: skip
    try:
        terminal.wait("Ctrl-D releases the allocation", timeout=120)
        terminal.wait("[inter2 interactive]", timeout=30)
        job_id = terminal.shown().split("Job ", 1)[1].split()[0]
        # the run's environment: --extra_env, TMPDIR, the allocation's own variables; the host's Python
        terminal.send('echo "says=$RUN_SAYS on=$SLURMD_NODENAME nodes=$LAUNCHER_NODES tmp=$TMPDIR"', "Enter")
        terminal.wait("says=hello there on=node1 nodes=node1,node2 tmp=/tmp", timeout=30)
        # the line the banner prints for every node, as a user would copy it (no container: no options)
        banner = terminal.shown().split("on every node:  ", 1)[1].split("\n", 1)[0].strip()
        assert banner.startswith(f"srun --jobid={job_id} --overlap --nodes=2 --ntasks=2 --export=ALL "), banner
        step = 'srun --jobid="$SLURM_JOB_ID" --overlap --nodes=2 --ntasks=2 --export=ALL '
        step += '"$LAUNCHER_PYTHON" -m launcher.node.step "$LAUNCHER_JOB" run "$LAUNCHER_RDZV" "$LAUNCHER_NODES"'
        terminal.send(f'{step}; printf "STEP-%s=%s\\n" EXIT $?', "Enter")  # the echoed command lacks what it prints
        terminal.wait("STEP-EXIT=", timeout=300)
        shown = terminal.shown()
        assert "STEP-EXIT=0" in shown and "training finished at step 6" in shown, shown[-3000:]
        terminal.send("C-d")
        terminal.wait("LAUNCHER-EXIT=0", timeout=60)
    finally:
        terminal.close()
    fields = settled(job_id, slurm_env)
    assert fields.get("JobState") == "COMPLETED" and fields.get("NumNodes") == "2", fields
    assert latest_step(tmp_path / "checkpoints/inter2") == 6
