"""The node step in a container, for real: NVIDIA pyxis + enroot (built from ../shared/vendor) on a local Slurm
cluster of their own (`ClusterSpec(containers=True)`), and an image made without a registry (mmdebstrap).

Training learns and checkpoints in the image; a real preemption inside it checkpoints, requeues and resumes; a
container without the job's Python fails with a verdict that says so; a missing image (and a cluster without pyxis)
is refused before the queue; `--interactive` opens a shell in the container through a real terminal (tmux), where
the node step is started by hand, and Ctrl-D releases the allocation. Where ../shared/vendor is absent (a user's
clone) the tests that need pyxis skip, saying so.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_runs import (
    bundles,
    finish,
    latest_step,
    launch,
    leftover_processes,
    manifest,
    submitted_job_id,
    wait_for,
    with_fake_nvidia_smi,
)
from launcher_helpers import ROOT
from terminal import launcher_in_terminal
from test_evals_job import TASKS, write_tasks
from test_interactive import settled
from test_operations import HANGS_ON, assert_caught_fast_and_named
from test_preemption import assert_saved_by_the_notice, preempt_and_follow

from launcher import jsonl
from launcher.config import container
from launcher.evals import record as eval_record
from launcher.localcluster import ClusterSpec, containers, down, up

IN_CI = os.environ.get("CI") == "true"
MISSING = containers.missing_sources()
needs_vendor = pytest.mark.skipif(
    bool(MISSING), reason=f"the vendored pyxis and enroot sources are absent ({', '.join(MISSING)})"
)
pytestmark = [pytest.mark.slurm, pytest.mark.containers]


@pytest.fixture(scope="module")
def boxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path, ClusterSpec]]:
    """A 2-node cluster whose srun has pyxis, and its image: (environment, image, spec)."""
    if shutil.which("slurmctld") is None and not IN_CI:
        pytest.skip("Slurm is not installed (run scripts/install_slurm.sh or make test)")
    spec = ClusterSpec(tmp_path_factory.mktemp("containers"), nodes=2, gpus_per_node=2, containers=True)
    env = {**os.environ, **up(spec)}
    yield env, containers.image(), spec
    down(spec)


def in_container(spec: ClusterSpec, job_id: str) -> list[str]:
    """The nodes whose slurmd started a pyxis container for the job's steps."""
    return [n for n in spec.node_names
            if f"[{job_id}.0] pyxis: starting container" in (spec.dir / f"log/slurmd.{n}.log").read_text()]  # fmt: skip


@needs_vendor
def test_training_in_a_container_learns_checkpoints_and_monitors_the_gpus(tmp_path: Path, boxed, demo_data):
    """nvidia-smi reaches the image as enroot's NVIDIA hook brings it on a GPU node: mounted from the host (here the
    end-to-end tests' stand-in). The node check lists the GPUs and the GPU monitor samples, inside the container."""
    env, image, spec = boxed
    smi = with_fake_nvidia_smi(tmp_path, env)["PATH"].split(":")[0] + "/nvidia-smi"
    tasks = write_tasks(tmp_path)  # the eval job of its last step runs in the container too
    proc = launch(tmp_path, env, demo_data, "boxed", "--train_steps", "20", "--container_image", str(image),
                  "--container_mounts", f"{smi}:/usr/bin/nvidia-smi:ro", "--eval_tasks", ",".join(TASKS),
                  "--eval_include", str(tasks))  # fmt: skip
    code, out = finish(proc, timeout=400)
    assert code == 0 and "ended COMPLETED" in out, out
    assert f"container    {image} (sha256 " in out  # the summary names the image
    (bundle_dir,) = bundles(tmp_path, "boxed")
    record = manifest(bundle_dir)
    assert record["derived"]["container"] == container.record(str(image))  # path and sha256 of the file
    job_id = record["slurm"]["job_id"]
    assert in_container(spec, job_id) == ["node1", "node2"]
    losses = [r["loss"] for r in jsonl.read(bundle_dir / "metrics.jsonl")]
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.3, losses
    assert latest_step(tmp_path / "checkpoints/boxed") == 20
    monitors = {p.name: p.read_text() for p in (tmp_path / "logs/slurm_logs/boxed").glob(f"gpu-{job_id}-*.log")}
    assert sorted(monitors) == [f"gpu-{job_id}-node1.log", f"gpu-{job_id}-node2.log"], monitors
    assert all("# gpu sample" in text for text in monitors.values()), monitors
    wait_for(lambda: leftover_processes(job_id) == [], timeout=15)  # the monitor ended with the container
    result = wait_for(lambda: [r for r in eval_record.results(bundle_dir).values() if r["state"] in ("done", "failed")],
                      timeout=300)  # fmt: skip
    assert [r["state"] for r in result] == ["done"], result
    assert in_container(spec, result[0]["job"]) != []  # its one step: srun with the node step's pyxis options


@needs_vendor
def test_preemption_inside_a_container_resumes(tmp_path: Path, boxed, demo_data):
    env, image, spec = boxed
    job_id, seen, out, log = preempt_and_follow(tmp_path, env, demo_data, "boxed-pre", "--container_image", str(image))
    assert "preemption notice: Slurm preempted this job at" in log
    (bundle_dir,) = bundles(tmp_path, "boxed-pre")
    assert_saved_by_the_notice(bundle_dir, job_id, seen, out, log, env)
    assert in_container(spec, job_id) == ["node1", "node2"]


@needs_vendor
def test_a_container_without_the_python_fails_with_the_cause(tmp_path: Path, boxed, demo_data):
    env, image, _ = boxed  # /usr/bin/python3 is the host's; the image has none (and the system's is not mounted)
    proc = launch(tmp_path, env, demo_data, "nopython", "--container_image", str(image), "--python", "/usr/bin/python3")
    code, out = finish(proc, timeout=300)
    assert code != 0, out
    verdict = manifest(bundles(tmp_path, "nopython")[0])["verdict"]
    assert verdict["cause"] == "container", verdict
    assert f"the container {image} has no Python at /usr/bin/python3" in verdict["message"]
    assert f"the container {image} has no Python at /usr/bin/python3" in out and "an image that holds it" in out


@needs_vendor
def test_a_hang_inside_a_container_is_caught_dumped_and_requeued_without_the_node(tmp_path: Path, boxed, demo_data):
    """The watchdog and its dumps run on the host (srun --overlap, no image); the training processes they find by
    their tag and read with py-spy live in the container."""
    env, image, spec = boxed
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_ON.format(root=str(ROOT), at=5, script=str(ROOT / "run_train.py")))
    proc = launch(tmp_path, env, demo_data, "boxed-hang", "--train_steps", "12", "--hang_timeout", "20",
                  "--startup_timeout", "300", "--save_interval", "3", "--run_train_script", str(script),
                  "--container_image", str(image), nodes="1")  # fmt: skip
    code, out = finish(proc, timeout=600)
    (bundle_dir,) = bundles(tmp_path, "boxed-hang")
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0 and "ended COMPLETED" in out, out + log[-3000:]
    first = log.split(" attempt 1 started ")[1].split(" on ")[1].split()[0]
    job_id = submitted_job_id(bundle_dir)
    assert_caught_fast_and_named(log, bundle_dir, job_id, at=5, limit=20)
    stacks = Path(log.split("stacks in ")[1].split()[0])
    dumps = {p.name: p.read_text() for p in stacks.glob(f"{first}-*.txt")}
    assert len(dumps) == 2 and sum("stuck (hangs.py:11)" in text for text in dumps.values()) == 1, dumps
    assert f"suspected: {first}" in log and f"requeueing without {first}" in log
    assert "resumed from checkpoint step 3 " in log and f"job {job_id} attempt 2 started" in log
    assert in_container(spec, job_id) == ["node1", "node2"]  # each attempt in the image, on its own node


def test_a_missing_image_is_refused_before_the_queue(tmp_path: Path, slurm_env: dict, demo_data):
    """On a cluster without pyxis: both problems at once, nothing written or submitted."""
    proc = launch(tmp_path, slurm_env, demo_data, "noimage", "--container_image", str(tmp_path / "gone.sqsh"))
    code, out = finish(proc, timeout=120)
    assert code == 2, out
    assert f"--container_image: {tmp_path / 'gone.sqsh'} does not exist" in out
    assert "--container_image: this cluster's srun has no --container-image" in out
    assert not (tmp_path / "logs/configs/noimage").exists() and "Submitted" not in out


@needs_vendor
def test_interactive_shell_in_the_container_through_a_terminal(tmp_path: Path, boxed, demo_data):
    env, image, spec = boxed
    terminal = launcher_in_terminal(tmp_path, env, demo_data, "inter", "--nodes", "1", "--train_steps", "8",
                                    "--container_image", str(image))  # fmt: skip
    try:
        terminal.wait("Ctrl-D releases the allocation", timeout=120)
        terminal.wait("[inter interactive]", timeout=30)
        job_id = terminal.shown().split("Job ", 1)[1].split()[0]
        terminal.send("echo system-python-$(test -e /usr/bin/python3 && echo yes || echo no) tmp-$TMPDIR", "Enter")
        terminal.wait("system-python-no tmp-/tmp", timeout=30)  # the image's /usr (no python3), the run's TMPDIR
        terminal.send("node_step", "Enter")  # the bundle's node step, by hand, on this node
        terminal.wait("training finished at step 8", timeout=240)
        # node_step returned, and 0 (typed ahead: the shell runs it then; its echo shows "$?", its output the code).
        # A count of the prompts taken once training had finished missed one shown before it was taken.
        terminal.send("echo node-step-returned-$?", "Enter")
        terminal.wait("node-step-returned-0", timeout=60)
        terminal.send("C-d")
        terminal.wait("LAUNCHER-EXIT=0", timeout=60)
    finally:
        terminal.close()
    assert in_container(spec, job_id) == ["node1"]
    state = settled(job_id, env)
    assert state.get("JobState") == "COMPLETED", state  # released, not cancelled
    assert latest_step(tmp_path / "checkpoints/inter") == 8
