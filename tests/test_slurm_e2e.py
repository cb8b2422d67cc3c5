"""Submission and following against the real local Slurm cluster, with real sbatch, srun and torchrun."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher_helpers import ROOT
from slurm_cluster import slurm_release

from launcher import protocol as P
from launcher.slurm import awaited_jobs, parse
from launcher.slurm import client as slurm

pytestmark = pytest.mark.slurm

ALLREDUCE = """
import argparse, os, torch, torch.distributed as dist
argparse.ArgumentParser().add_argument("--config-file") and None
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} sum={t.item():.0f} expected={world * (world + 1) // 2}", flush=True)
dist.destroy_process_group()
"""
FAIL = 'print("about to fail", flush=True)\nraise SystemExit(7)\n'
SLEEP = 'import time\nprint("sleeping", flush=True)\ntime.sleep(300)\n'


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def launch(tmp_path: Path, env: dict, run_name: str, train_script: str, *flags: str, timeout: float = 180):
    argv = [
        sys.executable,
        str(ROOT / "slurm_launcher.py"),
        "--run_name",
        run_name,
        "--nodes",
        "2",
        "--gpus_per_node",
        "2",
        "--run_train_script",
        train_script,
        "--dataset",
        "none",
        "--time_limit",
        "5:00",
        *flags,
    ]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def only_bundle(tmp_path: Path, run_name: str) -> Path:
    (bundle_dir,) = (tmp_path / "logs/configs" / run_name).iterdir()
    return bundle_dir


def test_four_ranks_rendezvous_and_complete(tmp_path: Path, slurm_env: dict):
    out = launch(tmp_path, slurm_env, "gloo", script(tmp_path, "allreduce.py", ALLREDUCE), "--show_logs")
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in range(4):
        assert f"rank {rank}/4 sum=10 expected=10" in out.stdout
    assert "ended COMPLETED, exit code 0" in out.stdout
    manifest = json.loads((only_bundle(tmp_path, "gloo") / "manifest.json").read_text())
    job_id = manifest["slurm"]["job_id"]
    assert manifest["slurm"]["submitted"] is True and slurm.JOB_ID.match(job_id)
    # the file on disk is the file Slurm ran, and the log we followed is the one Slurm wrote
    stored = subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"], env=slurm_env, capture_output=True, text=True, check=True
    ).stdout
    assert stored == Path(manifest["files"]["script"]["path"]).read_text()
    assert slurm.job_log_path(job_id) == Path(manifest["outputs"]["log"])


def test_the_rendezvous_moves_on_from_ports_another_process_holds(tmp_path: Path, slurm_env: dict):
    """The job's rendezvous port (launcher/protocol.py: 20000 + job id % 12000, below the kernel's ephemeral range)
    and the next ones are held by another process on the first node as the job starts: the job takes the next free
    port of the window, and its four ranks meet there."""
    probe = ["sbatch", "--parsable", "--hold", "--output", "/dev/null", "--wrap", "true"]
    last = int(subprocess.run(probe, env=slurm_env, capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run(["scancel", str(last)], env=slurm_env, check=True)
    held_ports = [P.RDZV_PORT_LOW + job_id % P.RDZV_PORT_SPAN for job_id in range(last + 1, last + 11)]
    held = [socket.create_server(("127.0.0.1", port)) for port in held_ports]  # the next ten jobs' ports
    try:
        out = launch(tmp_path, slurm_env, "held", script(tmp_path, "allreduce.py", ALLREDUCE), "--show_logs")
    finally:
        for sock in held:
            sock.close()
    assert out.returncode == 0, out.stdout + out.stderr
    port = int(re.search(r"rendezvous 127\.0\.0\.1:(\d+) \(c10d\)", out.stdout).group(1))  # type: ignore[union-attr]
    assert port not in held_ports and P.RDZV_PORT_LOW <= port < P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN
    job_id = int(json.loads((only_bundle(tmp_path, "held") / "manifest.json").read_text())["slurm"]["job_id"])
    assert P.RDZV_PORT_LOW + job_id % P.RDZV_PORT_SPAN in held_ports  # its own port was among those held
    assert all(f"rank {rank}/4 sum=10 expected=10" in out.stdout for rank in range(4))


def test_failing_job_reports_failed_and_exits_nonzero(tmp_path: Path, slurm_env: dict):
    out = launch(tmp_path, slurm_env, "failing", script(tmp_path, "fail.py", FAIL), "--show_logs")
    assert out.returncode == 1
    assert "about to fail" in out.stdout
    # torchrun's code for a failed worker, via srun and the script; or, where srun stopped the other node's torchrun
    # before it ended on its own (a loaded machine: CI's at load ~4 on 26.05), srun's 143 (137), which the verdict
    # says is not a second failure
    code = re.search(r"ended FAILED, exit code (\d+)", out.stdout)
    assert code and code[1] in ("1", "137", "143"), out.stdout
    assert code[1] == "1" or f"exit code {code[1]} is srun stopping the other ranks after it" in out.stdout, out.stdout
    assert "Traceback (most recent call last)" not in out.stderr  # no launcher traceback


def test_pending_job_shows_its_reason_then_runs(tmp_path: Path, slurm_env: dict):
    holder = launch(tmp_path, slurm_env, "holder", script(tmp_path, "sleep.py", SLEEP))  # all 4 GPUs, no follow
    assert holder.returncode == 0, holder.stderr
    holder_id = json.loads((only_bundle(tmp_path, "holder") / "manifest.json").read_text())["slurm"]["job_id"]
    try:
        wait_for(lambda: slurm.job_state(holder_id).state == "RUNNING")
        argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "waiter", "--nodes", "1"]
        argv += ["--gpus_per_node", "2", "--run_train_script", script(tmp_path, "allreduce.py", ALLREDUCE)]
        argv += ["--dataset", "none", "--time_limit", "5:00", "--show_logs"]
        quick = {**slurm_env, "LAUNCHER_POLL_SECONDS": "2"}  # a pending job is looked at after 2 s, 3 s, ...
        waiter = subprocess.Popen(argv, cwd=tmp_path, env=quick, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        manifest = tmp_path / "logs/configs/waiter"
        waiter_id = wait_for(
            lambda: (
                manifest.exists()
                and any((d / "manifest.json").exists() for d in manifest.iterdir())
                and json.loads(next(manifest.glob("*/manifest.json")).read_text())["slurm"].get("job_id")
            )
        )
        wait_for(lambda: slurm.job_state(waiter_id).reason == "Resources")
        time.sleep(3.5)  # the follower's next look at the pending job
    finally:
        slurm.cancel(holder_id)
    stdout, stderr = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, stdout + stderr
    assert f"job {waiter_id} PENDING (reason: Resources" in stderr.decode()  # (and Slurm's estimate of its start)
    assert f"job {waiter_id} RUNNING" in stderr.decode() and "rank 1/2 sum=3" in stdout.decode()


@pytest.mark.parametrize(
    "flags,fix",
    [
        (("--partition", "nosuch"), "fix --partition"),
        (("--constraint", "nosuch"), "fix --constraint"),
        (("--reservation", "nosuch"), "fix --reservation"),
        (("--nodelist", "node9"), "fix --nodelist / --exclude"),
        (("--nodes", "3"), "fix --nodes, --gpus_per_node"),
    ],
)
def test_slurm_refuses_before_anything_is_written(tmp_path: Path, slurm_env: dict, flags: tuple, fix: str):
    """sbatch --test-only judges the rendered script first: Slurm's refusal is reported, nothing is left behind."""
    out = launch(tmp_path, slurm_env, "refused", script(tmp_path, "ok.py", "print(1)\n"), *flags)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "Slurm would reject the job:" in out.stderr and fix in out.stderr
    assert "Nothing was written or submitted." in out.stderr
    left = list((tmp_path / "logs").rglob("*")) if (tmp_path / "logs").exists() else []
    assert [p for p in left if p.is_file() or "refused" in p.name] == []


@pytest.mark.slurm_versions
def test_a_nodelist_longer_than_nodes_is_refused_by_the_launcher(tmp_path: Path, slurm_env: dict):
    """Slurm 22.05 refuses `--nodes 1 --nodelist node[1-2]`, 24.11 runs it on one node of the list: the launcher
    refuses it itself, the same on both, before asking Slurm."""
    out = launch(tmp_path, slurm_env, "listed", script(tmp_path, "ok.py", "print(1)\n"), "--nodes", "1",
                 "--nodelist", "node[1-2]")  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--nodelist: node[1-2] names 2 nodes, more than --nodes 1" in out.stderr, out.stderr
    assert "use --nodes 2, or name at most 1 node in --nodelist" in out.stderr
    assert "Slurm would reject" not in out.stderr and not (tmp_path / "logs").exists()
    argv = ["sbatch", "--test-only", "--nodes", "1", "--nodelist", "node[1-2]", "--wrap", "true"]
    slurm_says = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=60)
    assert (slurm_says.returncode == 0) == (slurm_release(slurm_env) >= (24, 11)), slurm_says  # why it must


def test_refusal_at_submission_keeps_the_bundle(tmp_path: Path, slurm_env: dict, monkeypatch: pytest.MonkeyPatch):
    """A bundle written by a dry run and submitted later, when Slurm refuses it then: kept, failure recorded."""
    from launcher.errors import LauncherError
    from launcher.runs import launch, submission

    monkeypatch.chdir(tmp_path)
    prepared = launch.prepare(["--run_name", "later", "--nodes", "1", "--gpus_per_node", "2", "--dataset", "none",
                            "--partition", "nosuch", "--dry_run", "true"])  # fmt: skip
    with pytest.raises(LauncherError) as refused:
        submission.submit(prepared.paths)
    assert "invalid partition" in str(refused.value).lower() and "fix --partition" in str(refused.value)
    assert f"The bundle is kept: {prepared.paths.bundle_dir}" in str(refused.value)
    manifest = json.loads(prepared.paths.manifest.read_text())
    assert manifest["slurm"]["submitted"] is False and "nosuch" in manifest["slurm"]["error"]


def test_placement_flags_reach_slurm(tmp_path: Path, slurm_env: dict):
    out = launch(tmp_path, slurm_env, "placed", script(tmp_path, "allreduce.py", ALLREDUCE), "--nodes", "1",
                 "--exclude", "node1", "--mem", "0", "--show_logs")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "slurm        accepts it (sbatch --test-only): to start at " in out.stdout
    assert "on nodes node2" in out.stdout  # Slurm's forecast already honours --exclude
    job_id = job_id_of(tmp_path, "placed")
    assert f"job {job_id} RUNNING on node2" in out.stderr and "rank 1/2 sum=3" in out.stdout
    assert scontrol_fields(job_id)["ExcNodeList"] == "node1"


def test_a_job_that_needs_a_drained_node_is_held_in_the_queue_not_refused(tmp_path: Path, slurm_env: dict):
    """`sbatch --test-only` places a job on the nodes in service only, and refuses one that needs a drained node;
    sbatch takes it and holds it until the node returns. The launcher submits it and says for which node it will
    wait; a job not even every node of the partition could hold stays refused, nothing written. (Slurm's pending
    reason is its own: ReqNodeNotAvail as a rule, but one 26.05 run showed no ReqNodeNotAvail for two minutes; what is
    held to account is the job waiting, then starting once the node returns.)"""
    resume = ["scontrol", "update", "nodename=node2", "state=resume"]
    subprocess.run(["scontrol", "update", "nodename=node2", "state=drain", "reason=held by a test"], check=True)
    job_id, drained = None, True
    try:
        test_only = subprocess.run(["sbatch", "--test-only", "--nodes", "2", "--wrap", "true"], capture_output=True,
                                   text=True)  # fmt: skip
        assert test_only.returncode != 0 and "node configuration is not available" in test_only.stderr  # why
        out = launch(tmp_path, slurm_env, "held", script(tmp_path, "ok.py", "print(1)\n"))
        assert out.returncode == 0, out.stdout + out.stderr
        assert "slurm        holds it in the queue until nodes return: no set of the nodes in service now fits it " \
               "(sbatch --test-only), 1 out of service would: node2 drained (held by a test)" in out.stdout  # fmt: skip
        job_id = job_id_of(tmp_path, "held")
        refused = launch(tmp_path, slurm_env, "three", script(tmp_path, "ok.py", "print(1)\n"), "--nodes", "3")
        assert refused.returncode == 2 and "Slurm would reject the job" in refused.stderr, refused.stderr
        assert "node configuration is not available" in refused.stderr and "Nothing was written" in refused.stderr
        assert not (tmp_path / "logs/configs/three").exists()
        held = scontrol_fields(job_id)  # seconds after submission: several scheduling passes (sched_interval=2)
        assert held["JobState"] == "PENDING", held
        subprocess.run(resume, check=True)
        drained = False
        ran = wait_for(lambda: (f := scontrol_fields(job_id))["JobState"] != "PENDING" and f, timeout=120)
        assert ran["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED"), (held, ran)
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], check=True)  # (a finished job: nothing to do, exit 0)
        if drained:
            subprocess.run(resume, check=True)
        # a resumed node is "not responding" (idle*) until Slurm's next ping: in service again before the next test
        wait_for(lambda: all(n.in_service for n in slurm.node_states(None)), timeout=60)


def test_missing_slurm_conf_is_named(tmp_path: Path, slurm_env: dict):
    env = {**slurm_env, "SLURM_CONF": str(tmp_path / "missing.conf")}
    out = launch(tmp_path, env, "noconf", script(tmp_path, "ok.py", "print(1)\n"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "missing.conf does not exist" in out.stderr and "localcluster up" in out.stderr


def test_no_slurm_configuration_at_all_is_named(tmp_path: Path, slurm_env: dict):
    # sbatch installed, but no SLURM_CONF, no /etc/slurm/slurm.conf, no DNS SRV record: not a rejected job. A system
    # configuration, where the machine has one, is hidden by an empty filesystem over /etc/slurm in a private mount
    # namespace of the launcher's (root's unshare), so the test runs on every machine.
    env = {k: v for k, v in slurm_env.items() if k != "SLURM_CONF"}
    hide = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs none /etc/slurm && exec "$@"',
        "-",
    ]
    probe = subprocess.run([*hide, "true"], capture_output=True, text=True)
    assert probe.returncode == 0, f"cannot hide /etc/slurm (unshare as root): {probe.stderr}"
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "noconf", "--nodes", "2",
            "--gpus_per_node", "2", "--run_train_script", script(tmp_path, "ok.py", "print(1)\n"), "--dataset", "none",
            "--time_limit", "5:00"]  # fmt: skip
    out = subprocess.run([*hide, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "cannot reach the Slurm controller" in out.stderr and "SLURM_CONF (not set)" in out.stderr
    assert "rejected" not in out.stderr and "localcluster up" in out.stderr


def test_dead_controller_names_dry_run(tmp_path: Path, slurm_env: dict):
    conf = Path(slurm_env["SLURM_CONF"]).read_text()
    dead = tmp_path / "dead.conf"  # the same cluster, but a port no controller listens on
    dead.write_text(
        "\n".join("SlurmctldPort=6999" if line.startswith("SlurmctldPort=") else line for line in conf.splitlines())
    )
    out = launch(tmp_path, {**slurm_env, "SLURM_CONF": str(dead)}, "nowhere", script(tmp_path, "ok.py", "1\n"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "cannot reach the Slurm controller" in out.stderr and "--dry_run" in out.stderr
    assert not (tmp_path / "logs/configs/nowhere").exists()  # asked before writing: nothing stays behind


def wait_for(predicate, timeout: float = 60.0, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


def jobs(*argv: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.jobs", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_status_attach_and_cancel(tmp_path: Path, slurm_env: dict):
    out = launch(
        tmp_path, slurm_env, "sleeper", script(tmp_path, "sleep.py", SLEEP), "--nodes", "1", "--gpus_per_node", "1"
    )
    assert out.returncode == 0 and "Submitted job" in out.stdout
    bundle_dir = only_bundle(tmp_path, "sleeper")
    job_id = json.loads((bundle_dir / "manifest.json").read_text())["slurm"]["job_id"]
    log = Path(json.loads((bundle_dir / "manifest.json").read_text())["outputs"]["log"])
    wait_for(lambda: log.exists() and "sleeping" in log.read_text())
    status = jobs("status", str(bundle_dir), env=slurm_env)
    assert status.returncode == 0 and f"job {job_id} RUNNING" in status.stdout

    follower = subprocess.Popen(
        [sys.executable, "-m", "launcher.jobs", "attach", job_id],
        cwd=ROOT,
        env=slurm_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)
    assert jobs("cancel", str(bundle_dir), env=slurm_env).returncode == 0
    stdout, _ = follower.communicate(timeout=60)
    assert follower.returncode == 1
    assert "sleeping" in stdout and f"Job {job_id} ended CANCELLED" in stdout
    # nothing of the job survives on the nodes
    wait_for(
        lambda: "sleep.py" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout,
        timeout=30,
    )


def test_ctrl_c_stops_following_not_the_job(tmp_path: Path, slurm_env: dict):
    out = launch(
        tmp_path, slurm_env, "ctrlc", script(tmp_path, "sleep.py", SLEEP), "--nodes", "1", "--gpus_per_node", "1"
    )
    bundle_dir = only_bundle(tmp_path, "ctrlc")
    job_id = json.loads((bundle_dir / "manifest.json").read_text())["slurm"]["job_id"]
    said = tmp_path / "follower.err"
    with said.open("w") as err:
        # SIGINT as a terminal leaves it (a shell's background job, `make test &`, passes it on ignored, and Python
        # then never raises KeyboardInterrupt)
        follower = subprocess.Popen([sys.executable, "-m", "launcher.jobs", "attach", str(bundle_dir)], cwd=ROOT,
                                    env=slurm_env, stdout=subprocess.PIPE, stderr=err, text=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:  # (the job sleeps 5 minutes: cancelled whatever happens, or it holds node1 from the tests after this one)
        wait_for(lambda: (slurm.job_state(job_id) or slurm.job_state(job_id)).state == "RUNNING")
        wait_for(lambda: f"job {job_id} RUNNING" in said.read_text())  # following (not still starting up)
        follower.send_signal(2)  # SIGINT, as Ctrl-C
        follower.communicate(timeout=120)
        stderr = said.read_text()
        assert out.returncode == 0 and follower.returncode == 130, stderr
        assert "keeps running" in stderr and "launcher.jobs attach" in stderr and "launcher.jobs cancel" in stderr
        assert slurm.job_state(job_id).state == "RUNNING"
    finally:
        follower.kill()
        slurm.cancel(job_id)


@pytest.mark.parametrize("bad", ["a'; touch pwned #", "sp ace $(touch pwned)"])
def test_hostile_paths_run_for_real(tmp_path: Path, slurm_env: dict, bad: str):
    root = tmp_path / bad
    root.mkdir()
    out = launch(root, slurm_env, "hostile", script(root, "allreduce.py", ALLREDUCE), "--nodes", "1", "--show_logs")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 1/2 sum=3 expected=3" in out.stdout
    assert not list(tmp_path.rglob("pwned")) and not (ROOT / "pwned").exists()


NAP_THEN = 'import time\nprint("napping", flush=True)\ntime.sleep(6)\nraise SystemExit({code})\n'


def job_id_of(tmp_path: Path, run_name: str) -> str:
    return json.loads((only_bundle(tmp_path, run_name) / "manifest.json").read_text())["slurm"]["job_id"]


def scontrol_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    return parse.parse_scontrol(out.stdout)


def test_dependency_holds_the_run_until_its_job_completes(tmp_path: Path, slurm_env: dict):
    # one node each: without the dependency the second would start at once beside the first
    first = launch(tmp_path, slurm_env, "first", script(tmp_path, "nap.py", NAP_THEN.format(code=0)), "--nodes", "1")
    assert first.returncode == 0, first.stderr
    first_id = job_id_of(tmp_path, "first")
    after = f"afterok:{first_id}"
    second = launch(tmp_path, slurm_env, "second", script(tmp_path, "allreduce.py", ALLREDUCE), "--nodes", "1",
                    "--dependency", after, "--show_logs")  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    second_id = job_id_of(tmp_path, "second")
    assert f"job {second_id} PENDING (reason: Dependency, waiting for {after}(unfulfilled))" in second.stderr
    assert "rank 1/2 sum=3" in second.stdout
    ended, started = scontrol_fields(first_id), scontrol_fields(second_id)
    assert ended["JobState"] == "COMPLETED" and ended["EndTime"] <= started["StartTime"]  # ISO times sort as text
    (script_file,) = (tmp_path / "logs/slurm_scripts/second").glob("*.sbatch")
    assert f"#SBATCH --dependency={after}" in script_file.read_text()


def test_dependency_that_can_never_be_met(tmp_path: Path, slurm_env: dict):
    first = launch(tmp_path, slurm_env, "doomed", script(tmp_path, "nap.py", NAP_THEN.format(code=7)), "--nodes", "1")
    assert first.returncode == 0, first.stderr
    first_id = job_id_of(tmp_path, "doomed")
    # submitted while the first still runs: Slurm accepts it, then cancels it when the first fails
    ran = script(tmp_path, "ran.py", "print('RAN-ANYWAY')\n")
    quick = {**slurm_env, "LAUNCHER_POLL_SECONDS": "2"}  # its cancel, while pending, is seen at a look 2-8 s apart
    waiting = launch(tmp_path, quick, "waiting", ran, "--nodes", "1", "--dependency", f"afterok:{first_id}",
                     "--show_logs")  # fmt: skip
    assert waiting.returncode == 1, waiting.stdout + waiting.stderr
    assert "ended CANCELLED" in waiting.stdout and "RAN-ANYWAY" not in waiting.stdout
    assert f"it never started: its dependency can no longer be met (afterok:{first_id}(failed))" in waiting.stdout
    assert scontrol_fields(first_id)["JobState"] == "FAILED"

    # launched now, the same dependency is refused before anything is written; so is an unknown job id
    late = launch(tmp_path, slurm_env, "late", script(tmp_path, "ok.py", "print(1)\n"), "--dependency",
                  f"afterok:{first_id},afterany:999999")  # fmt: skip
    assert late.returncode == 2 and "Traceback" not in late.stderr
    assert f"job {first_id} ended FAILED, so afterok can never be met" in late.stderr
    assert "Slurm does not know job 999999" in late.stderr
    assert not (tmp_path / "logs/configs/late").exists()


@pytest.mark.slurm_versions
def test_dependency_syntax_agrees_with_slurm(slurm_env: dict):
    """What the launcher takes as --dependency, Slurm takes; what it refuses, Slurm refuses too, but for the few
    forms it is deliberately stricter about."""
    from test_dependency import ACCEPTED, REFUSED, STRICTER

    # Slurm 23.02 and later refuse afterok/afternotok on a job they do not know: the job ids the lists name are
    # made real, each a held array of tasks 0-3 (a delay after '+' and a task id after '_' are left alone)
    held = ["sbatch", "--parsable", "--hold", "--array=0-3", "--nodes", "1", "--output", "/dev/null", "--wrap", "true"]
    ids = {n: subprocess.run(held, env=slurm_env, capture_output=True, text=True, check=True).stdout.strip()
           for n in ("1", "2", "7", "12", "13")}  # fmt: skip

    def real(text: str) -> str:
        # (not a task id: after `_`, or in a task range `_[1-2]`)
        return re.sub(r"(?<![_+0-9[-])(0*)([1-9][0-9]*)", lambda m: m.group(1) + ids.get(m.group(2), m.group(2)), text)

    def slurm_takes(text: str) -> bool:
        argv = ["sbatch", "--test-only", f"--dependency={real(text)}", "--nodes", "1", "--wrap", "true"]
        out = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 or "dependency" in out.stderr.lower(), (text, out.stderr)
        return out.returncode == 0

    try:
        assert real("afterok:01,after:1_*+5?12_3") == f"afterok:0{ids['1']},after:{ids['1']}_*+5?{ids['12']}_3"
        assert real("afterok:1_[1-2]") == f"afterok:{ids['1']}_[1-2]"
        assert [text for text in ACCEPTED if not slurm_takes(text)] == []
        assert [text for text in REFUSED if slurm_takes(text)] == []
        # 24.11 and later refuse afterok on a job they do not know, 26.05 a list that mixes `,` and `?` and a task id
        # left empty (a task range of a real array, `_[1-2]`, every release takes)
        release = slurm_release(slurm_env)
        also_refused = [
            text
            for text in STRICTER
            if (text == "afterok:+9999999" and release >= (24, 11))
            or (text in ("afterok:1,afterany:2?after:3", "afterok:1_") and release >= (26, 5))
        ]
        assert [text for text in STRICTER if not slurm_takes(text)] == also_refused
    finally:
        subprocess.run(["scancel", *ids.values()], env=slurm_env, check=True)


@pytest.mark.slurm_versions
def test_dependency_on_an_array_is_judged_on_every_task(tmp_path: Path, slurm_env: dict, monkeypatch):
    """The launcher's verdict on each dependency is the one Slurm reaches when a job waits on it for real."""
    from launcher.runs import launch

    def sbatch(*flags: str) -> str:
        argv = ["sbatch", "--parsable", "--nodes", "1", "--output", str(tmp_path / "%j.out"), *flags]
        return subprocess.run(argv, env=slurm_env, capture_output=True, text=True, check=True).stdout.strip()

    never_met = awaited_jobs.NEVER_SATISFIED
    array = sbatch("--array=0-2", "--wrap", "exit $((SLURM_ARRAY_TASK_ID == 1))")  # task 1 fails
    wait_for(lambda: len(states := slurm.job_states(array)) == 3 and all(s.terminal for s in states))
    monkeypatch.chdir(tmp_path)

    def launcher_problems(text: str) -> list[str]:
        _, found = launch.check(["--run_name", "t", "--dataset", "none", "--dependency", text])
        return [p.message for p in found]

    def slurm_meets(text: str) -> bool:
        job = sbatch("--dependency", text, "--wrap", "true")

        def verdict() -> str | None:  # met: it leaves PENDING; never: it stays, with DependencyNeverSatisfied
            state = slurm.job_state(job)
            assert state is not None
            return "met" if state.state != "PENDING" else "never" if state.reason == never_met else None

        met = wait_for(verdict) == "met"
        subprocess.run(["scancel", job], env=slurm_env, check=True)
        return met

    never = {
        f"afterok:{array}_*": f"job {array}_* (an array) ended FAILED in 1 of its 3 tasks, so afterok can never be met",
        f"AFTEROK:{array}_1": f"job {array}_1 ended FAILED, so afterok can never be met",
        f"aftercorr:{array}": f"job {array} (an array) ended FAILED in 1 of its 3 tasks, so aftercorr can never be met",
    }
    for text, message in never.items():
        assert launcher_problems(text) == [message] and not slurm_meets(text), text
    for text in (f"afternotok:{array}", f"afterok:{array}_2", array, f"afterok:{array}_1?afterok:{array}_2"):
        assert launcher_problems(text) == [] and slurm_meets(text), text
    # a task the array does not have: Slurm 22.05 counts it as done (and starts the run at once), 24.11 refuses the
    # run at submission; the launcher refuses it before the queue on both
    (problem,) = launcher_problems(f"afterok:{array}_7")
    assert problem.startswith(f"Slurm does not know job {array}_7; Slurm 23.02 and later refuse afterok on it")
    if slurm_release(slurm_env) < (23, 2):
        assert slurm_meets(f"afterok:{array}_7")
    else:
        with pytest.raises(subprocess.CalledProcessError) as refused:
            sbatch("--dependency", f"afterok:{array}_7", "--wrap", "true")
        assert "dependency" in refused.value.stderr.lower()


def test_mem_units_agree_with_slurm(slurm_env: dict):
    """What the launcher takes as --mem, sbatch takes (a size this cluster lacks is a different refusal); what it
    refuses, sbatch refuses, but for the few forms it is deliberately stricter about."""
    from test_validate import MEM_ACCEPTED, MEM_REFUSED, MEM_STRICTER

    def sbatch_takes(value: str) -> bool:
        argv = ["sbatch", "--test-only", f"--mem={value}", "--nodes", "1", "--wrap", "true"]
        out = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=60)
        invalid = "Invalid --mem specification" in out.stderr
        assert out.returncode == 0 or invalid or "node configuration is not available" in out.stderr, out.stderr
        return not invalid

    assert [value for value in MEM_ACCEPTED if not sbatch_takes(value)] == []
    assert [value for value in MEM_REFUSED if sbatch_takes(value)] == []
    assert [value for value in MEM_STRICTER if not sbatch_takes(value)] == []
