"""--container_* before the queue (pure and local checks), pyxis's options as rendered, what the bundle records of
the image, --interactive's salloc options: no cluster needed (the end-to-end tests are in test_containers.py)."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

from launcher_helpers import all_problems, fixed_paths, spec_for

from launcher import protocol
from launcher.bundle import render
from launcher.config import container
from launcher.node import nodecheck
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.effects import Node
from launcher.node.supervisor.state import Allocation
from launcher.slurm import interactive, triage

BASE = ["--nodes", "2", "--gpus_per_node", "2", "--dataset", "none", "--wandb_disabled", "true"]


def flagged(*flags: str) -> dict[str, list[str]]:
    spec, problems = spec_for(*BASE, *flags)
    out: dict[str, list[str]] = {}
    for p in all_problems(spec, problems):
        out.setdefault(p.flag, []).append(p.message)
    return out


def test_every_container_mistake_at_once(tmp_path: Path):
    found = flagged(
        "--container_image", str(tmp_path / "missing.sqsh"), "--container_mounts", f"{tmp_path}/nope:/x,rel:/y:zz",
        "--container_env", "OK,NOT-A-NAME", "--container_workdir", "work", "--python", "python3",
    )  # fmt: skip
    assert found["container_image"] == [f"{tmp_path}/missing.sqsh does not exist"]
    assert len(found["container_mounts"]) == 3 and f"{tmp_path}/nope does not exist" in found["container_mounts"][0]
    assert "NOT-A-NAME" in found["container_env"][0] and "OK" not in found["container_env"][0]
    assert "not an absolute path" in found["container_workdir"][0]
    assert "image's PATH" in found["python"][0]


def test_images_and_references(tmp_path: Path):
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"squash")
    for ok in (str(image), "nvcr.io#nvidia/pytorch:24.01-py3", "ubuntu:24.04", "docker://user@ghcr.io#org/img:v1"):
        assert container.image_problems(ok) == [], ok
    for bad in ("not an image!", str(tmp_path), "./nowhere.sqsh"):
        assert container.image_problems(bad), bad


def test_companions_need_an_image():
    found = flagged("--container_writable", "true", "--container_env", "PATH")
    assert set(found) == {"container_writable", "container_env"}


def test_a_python_only_in_the_image_is_accepted(tmp_path: Path):
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"squash")
    assert flagged("--container_image", str(image), "--python", "/opt/conda/bin/python") == {}
    assert "python" in flagged("--python", "/opt/conda/bin/python")  # without an image it must exist here


def test_every_path_the_node_step_touches_is_mounted(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "a b c"}\n')
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"squash")
    spec, problems = spec_for(*BASE, "--container_image", str(image), "--tmp_dir", "/scratch/tmp", "--dataset",
                              str(data / "train.jsonl"), "--container_mounts", "/etc:/host-etc:ro")  # fmt: skip
    assert all_problems(spec, problems) == []
    paths = fixed_paths("t", Path("/project"))
    options = render.container_options(spec, paths)
    assert options[0] == f"--container-image={image}"
    mounts = options[1].removeprefix("--container-mounts=").split(",")
    assert mounts[-1] == "/etc:/host-etc:ro"  # the user's, after the launcher's
    sources = [m.split(":")[0] for m in mounts[:-1]]
    assert all(m.split(":")[0] == m.split(":")[1] for m in mounts[:-1])  # at the same path
    touched = [paths.bundle_dir, paths.log.parent, paths.script.parent, paths.checkpoints, Path("/scratch/tmp"),
               data / "train.jsonl", Path(spec.args.paths.run_train_script)]  # fmt: skip
    for path in touched:
        assert any(path == Path(s) or Path(s) in path.parents for s in sources), path
    for prefix in container.python_prefixes(sys.executable):  # this Python, unless the system's own
        assert prefix in sources
    # the node step runs with them: the job's settings carry them to the supervisor's srun line
    job = render.job_settings(spec, paths)
    assert job.container_options == tuple(options) and "--container-writable" not in options


def test_mounts_nest_once():
    assert container.needed_mounts(["/a/b", "/a", "/a/b/c", "/ab", "/x/"]) == ["/a", "/ab", "/x"]
    # the caller's order, not the names': the checkout's place must not hang on where it was cloned
    assert container.needed_mounts(["/z/run", "/check/main", "/a"]) == ["/z/run", "/check/main", "/a"]
    assert container.python_prefixes("/usr/bin/python3") == []


def test_the_image_is_recorded(tmp_path: Path):
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"squash" * 1000)
    assert container.record(str(image)) == {
        "path": str(image),
        "sha256": hashlib.sha256(image.read_bytes()).hexdigest(),
    }
    assert container.record("ubuntu:24.04") == {"reference": "ubuntu:24.04"}


def test_interactive_asks_salloc_for_the_scripts_resources():
    spec, _ = spec_for(*BASE, "--partition", "gpu", "--time_limit", "2:00:00", "--exclude", "gpu7")
    options = interactive.salloc_options(render.sbatch_script(spec, fixed_paths("t")))
    assert {"--job-name=t", "--nodes=2", "--gpus-per-node=2", "--partition=gpu", "--exclude=gpu7"} <= set(options)
    assert "--time=2:00:00" in options and not any(o.startswith(("--output", "--signal", "--requeue")) for o in options)


def test_a_container_without_the_jobs_python_is_said_per_node_and_triaged(tmp_path: Path):
    """srun cannot start the node step in an image without the job's Python (exit 2, execve's ENOENT): the
    supervisor says so of every node of the step, in the node check's line, before the verdict (every node failed its
    check); triage reads that line as the container's fault. And the node check's words for missing modules."""
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"squash")
    spec, _ = spec_for(*BASE, "--container_image", str(image), "--python", str(tmp_path / "none/bin/python3"))
    paths = fixed_paths("t", tmp_path)
    paths.bundle_dir.mkdir(parents=True)
    heard = Heard()
    attempt = Attempt(render.job_settings(spec, paths), Allocation("7", 1, "node[1-2]", "node1"), heard)
    attempt.state.step_nodes = ["node1", "node2"]
    end = attempt.judge(2)
    said = f"the container {image} has no Python at {tmp_path}/none/bin/python3"
    out = heard.out.getvalue()  # type: ignore[union-attr]
    assert out.count(said) == 2 and "node check failed on node2: " in out and end.verdict.value == "unhealthy"
    assert attempt.state.suspects == ["node1", "node2"]
    found = triage.verdict("FAILED", out, exit_code=5)
    assert found is not None and found.cause == "container" and said in found.message, found
    lacks = nodecheck.module_problems(["torch", "no_such_module_here"], str(image))
    assert lacks == [f"the container {image}: {sys.executable} lacks no_such_module_here"]
    assert triage.verdict("FAILED", protocol.line("node_check_failed", node="n2", what=lacks[0])).cause == "container"


class Heard(Node):
    def __init__(self) -> None:
        super().__init__(out=io.StringIO())

    def job_field(self, job: str, name: str) -> str:
        return ""


def test_the_interactive_shells_start_up_file_parses(tmp_path: Path):
    spec, _ = spec_for(*BASE, "--extra_env", "A='x y'")
    rc = tmp_path / "rc"
    rc.write_text(interactive.rc_text(spec, fixed_paths("t")))
    assert subprocess.run(["bash", "-n", str(rc)]).returncode == 0
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5", "LAUNCHER_RDZV": "h:1", "LAUNCHER_NODES": "n1,n2"}
    out = subprocess.run(
        ["bash", "-c", f'. {rc}; printf \'%s|%s\' "$A" "$TMPDIR"'], env=env, capture_output=True, text=True
    )
    assert out.stdout.endswith("x y|/tmp") and "--nodes=2 --ntasks=2" in out.stdout
