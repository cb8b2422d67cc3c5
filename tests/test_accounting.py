"""Accounting for real, on the local cluster with slurmdbd on its own MariaDB (the `slurm_accounting` fixture): the
launcher reads sacct (attempts of a requeue chain, their times, AllocTRES's GPUs), checks --account against the
associations, and keeps a GPU-hour ledger that agrees with the job's own records. The ledger without accounting
is tested in tests/test_e2e_training.py (the demo flow) and tests/test_ledger.py."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_runs import bundles, finish, launch, manifest, steps_of_attempts, submitted_job_id, wait_for
from launcher_helpers import ROOT
from slurm_cluster import every_node_in_service, no_job_left, require_slurm, slurm_release
from test_preemption import last_logged_step

from launcher import localcluster
from launcher.bundle import sweep_record
from launcher.bundle.manifest import load as manifest_of
from launcher.ledger import usage
from launcher.localcluster.slurm_conf import DBD_OFFSET, PORT_STEP
from launcher.runs import submission, sweep
from launcher.slurm import client

pytestmark = [pytest.mark.slurm, pytest.mark.accounting]

# run_train.py itself, except that in the first attempt the checkpoint that a preemption's notice asks for never
# finishes (as one that outlasts the grace time): Slurm kills the run at the end of the grace time and requeues it,
# and the next attempt resumes from the last periodic checkpoint before the notice; the steps after it are thrown
# away (at least one: the notice's step, whose save hung). Steps are paced to 0.25 s. Each training process dies
# with its torchrun (PR_SET_PDEATHSIG), as a cgroup would end them all: proctrack/linuxproc, the local cluster's,
# loses track of processes whose parent it killed first.
DEAF_TO_NOTICES = """
import ctypes, os, runpy, signal, sys, time
sys.path.insert(0, {root!r})
from launcher.train import stop
from launcher.train.torch_engine import engine as torch_engine

ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
first = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
agreed, save, stopping = stop.StopRequest.agreed, torch_engine.checkpoint.save, []
step = torch_engine.TorchTrainer.train_step

def noted(self):
    said = agreed(self)
    stopping.append(said)
    return said

def slow_save(*args, **kwargs):
    if first and stopping and stopping[-1]:
        time.sleep(3600)
    return save(*args, **kwargs)

def paced(self, ddp):
    started = time.perf_counter()
    done = step(self, ddp)
    time.sleep(max(0.0, 0.25 - (time.perf_counter() - started)))
    return done

stop.StopRequest.agreed, torch_engine.checkpoint.save, torch_engine.TorchTrainer.train_step = noted, slow_save, paced
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.fixture
def acct_env(
    slurm_accounting_spec: localcluster.ClusterSpec, slurm_env: dict, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """This process and the launcher's pointed at the cluster with accounting; after the test, no job of it left
    there and every node in service (as `slurm_env` leaves the session's cluster)."""
    slurm_accounting = slurm_accounting_spec.env()
    for key, value in slurm_accounting.items():
        monkeypatch.setenv(key, value)
    yield {**slurm_env, **slurm_accounting}
    no_job_left(slurm_accounting_spec)
    every_node_in_service(slurm_accounting_spec)


def test_a_preempted_runs_ledger_from_sacct_and_from_its_records(tmp_path: Path, acct_env: dict, demo_data):
    script = tmp_path / "deaf.py"
    script.write_text(DEAF_TO_NOTICES.format(root=str(ROOT), script=str(ROOT / "run_train.py")))
    proc = launch(tmp_path, acct_env, demo_data, "preempted", "--train_steps", "40", "--save_interval", "7",
                  "--account", "research", "--run_train_script", str(script))  # fmt: skip
    (bundle_dir,) = wait_for(lambda: list((tmp_path / "logs/configs/preempted").glob("*")), timeout=30)
    job_id = wait_for(lambda: submitted_job_id(bundle_dir), timeout=60)
    wait_for(lambda: last_logged_step(bundle_dir) >= 9, timeout=180)
    urgent = ["sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--gpus-per-node", "2",
              "--output", str(tmp_path / "urgent-%j.out"), "--wrap", "sleep 2"]  # fmt: skip
    subprocess.run(urgent, env=acct_env, capture_output=True, text=True, check=True)
    code, out = finish(proc, timeout=400)
    log = Path(manifest(bundle_dir)["outputs"]["log"]).read_text()
    assert code == 0, out + log[-3000:]
    if slurm_release(acct_env) == (24, 11) and "attempt 3 started" in log:
        # Slurm 24.11.5 requeues the job once more when its second attempt ends (`requeue ... per user/system
        # request`), exit 0 or not (docs/slurm-versions.md): the launcher says so, the third attempt finds the run
        # finished. The ledger's figures below hold for the two attempts a release without it makes.
        assert submission.UNASKED_REQUEUE.format(attempt=2, next=3) in out and "requeued 2x" in out, out
        pytest.xfail("Slurm 24.11.5 requeued the job a second time, after its second attempt ended well")
    assert "ended COMPLETED" in out and "requeued 1x" in out

    # sacct: both attempts of the requeue chain, the first ended by the preemption, each with the job's 4 GPUs
    records = client.accounting_records(job_id)
    assert records is not None and [r.state for r in records] == ["PREEMPTED", "COMPLETED"], records
    assert [r.gpus for r in records] == [4, 4] and all(r.elapsed_s > 0 for r in records)

    # the ledger: the steps thrown away are those after the checkpoint the second attempt resumed from
    last_first, resumed = steps_of_attempts(bundle_dir, log, job_id)
    from_sacct, from_records = usage.ledgers(manifest_of(bundle_dir))
    assert from_sacct is not None and from_records is not None
    for found in (from_sacct, from_records):
        assert [a.ended for a in found.attempts] == ["preemption", "completed"]
        assert found.steps_thrown_away == last_first - resumed > 0 and resumed % 7 == 0
        assert found.attempts[1].resumed_from == resumed and found.attempts[0].last_step == last_first
        assert abs(found.allocated - (found.useful + found.lost)) < 1e-6
        assert found.causes == {"preemption": 1} and found.lost_to["preemption"] > 0
    assert usage.agree(from_sacct, from_records) == []  # within usage.TOLERANCE_S per GPU and attempt
    elapsed = sum(r.elapsed_s * r.gpus for r in records)
    assert abs(from_sacct.allocated - elapsed) <= 2 * 4  # sacct's Start/End and Elapsed, to the second
    recorded = manifest(bundle_dir)["ledger"]
    assert recorded["source"] == "sacct" and recorded["causes"] == {"preemption": 1}
    assert recorded["steps_thrown_away"] == last_first - resumed
    assert "lost" in out and "to 1 preemption" in out.split("gpu-hours")[-1]  # the end summary's line

    shown = subprocess.run(["python3", "-m", "launcher.jobs", "ledger", str(bundle_dir)], env=acct_env,
                           capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert shown.returncode == 0 and "from sacct:" in shown.stdout and "from job records:" in shown.stdout, shown
    assert "disagree" not in shown.stdout
    status = subprocess.run(["python3", "-m", "launcher.jobs", "status", str(bundle_dir)], env=acct_env,
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert status.returncode == 0 and "gpu-hours " in status.stdout and "to 1 preemption" in status.stdout, status


def test_account_is_checked_against_the_associations(tmp_path: Path, acct_env: dict, demo_data):
    assert client.user_accounts() == ["research", "root"]
    proc = launch(tmp_path, acct_env, demo_data, "noaccount", "--train_steps", "5", "--account", "nosuch")
    code, out = finish(proc, timeout=120)
    assert code == 2, out
    assert "--account" in out and "'nosuch' is not an account you may submit to here" in out
    assert "research, root" in out and "Traceback" not in out


def test_a_sweeps_ledger_with_accounting(tmp_path: Path, acct_env: dict, demo_data):
    proc = launch(tmp_path, acct_env, demo_data, "sw", "--train_steps", "6", "--sweep", "learning_rate=1e-3,3e-3",
                  nodes="1")  # fmt: skip
    code, out = finish(proc, timeout=400)
    assert code == 0, out
    (record_dir,) = [d for d in bundles(tmp_path, "sw") if (d / sweep.RECORD).exists()]
    points = sweep_record.load(record_dir).points
    assert "GPU-hours" in out and (record_dir / "gpu-hours.png").stat().st_size > 10_000
    total = 0.0
    for point in points:
        from_sacct, from_records = usage.ledgers(manifest_of(point.bundle))
        assert from_sacct is not None and from_records is not None
        assert usage.agree(from_sacct, from_records) == []
        assert [a.gpus for a in from_sacct.attempts] == [2]  # 1 node x 2 GPUs, from AllocTRES
        total += from_sacct.allocated
        assert manifest(point.bundle)["ledger"]["source"] == "sacct"
    shown = subprocess.run(["python3", "-m", "launcher.jobs", "ledger", str(record_dir)], env=acct_env,
                           capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert shown.returncode == 0, shown
    said = shown.stdout.split("total: ")[1].split()[0]
    assert abs(float(said) - total / 3600) <= 0.01 * total / 3600 + 1e-4, shown.stdout

    # the user's runs over a period: both points (the sweep's own record is no run), drawn in the configs path
    argv = ["--since", "2000-01-01", "--configs_path", str(tmp_path / "logs/configs")]
    period = subprocess.run(["python3", "-m", "launcher.jobs", "ledger", *argv], env=acct_env, capture_output=True,
                            text=True, cwd=ROOT)  # fmt: skip
    assert period.returncode == 0 and "GPU-hours of 2 run(s)" in period.stdout, period
    assert period.stdout.split("total: ")[1].split()[0] == said
    assert (tmp_path / "logs/configs/gpu-hours.png").stat().st_size > 10_000


def listening_tcp_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes, looked up in /proc/net/tcp and tcp6)."""
    inodes = {os.readlink(fd).removeprefix("socket:[").removesuffix("]") for fd in Path(f"/proc/{pid}/fd").iterdir()
              if os.readlink(fd).startswith("socket:")}  # fmt: skip
    rows = [line.split() for name in ("tcp", "tcp6") for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]]
    return [int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[3] == "0A" and row[9] in inodes]  # 0A: LISTEN


def test_accounting_comes_up_where_its_ports_are_held(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
):
    """As CI met it (`mariadbd not ready after 60 s`, its port held): other processes hold the ports slurmctld and
    slurmdbd would take. The cluster comes up on the next free ones, MariaDB serves slurmdbd over its Unix socket
    alone (no TCP port of its own that could be taken), and sacct reads a job back."""
    require_slurm(accounting=True)
    tmp_path = tmp_path_factory.mktemp("held")  # a short path: slurmstepd's Unix sockets lie below it (108 bytes)
    spec = localcluster.ClusterSpec(tmp_path / "c", nodes=1, gpus_per_node=1, accounting=True)
    held = [socket.create_server(("127.0.0.1", port)) for port in (spec.ctld_port, spec.dbd_port)]
    try:
        env = {**os.environ, **localcluster.up(spec)}
        assert f"port {spec.ctld_port} is taken" in capsys.readouterr().out
        # the next free slot (where no running cluster's job ids are): slurmdbd's port is its slurmctld's + 20
        dbd_port = int(re.search(r"^DbdPort=(\d+)$", spec.conf.with_name("slurmdbd.conf").read_text(), re.M)[1])
        ctld_port = int(re.search(r"^SlurmctldPort=(\d+)$", spec.conf.read_text(), re.M)[1])
        assert dbd_port != spec.dbd_port and dbd_port == ctld_port + DBD_OFFSET and ctld_port % PORT_STEP == 0
        mariadbd = localcluster.daemon_pids(spec)["mariadbd"]
        assert mariadbd and listening_tcp_ports(mariadbd) == []
        sbatch = ["sbatch", "--parsable", "-A", "research", "--output", str(tmp_path / "%j.out"), "--wrap", "true"]
        job = subprocess.run(sbatch, env=env, capture_output=True, text=True, check=True).stdout.strip()
        sacct = ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"]
        wait_for(lambda: subprocess.run(sacct, env=env, capture_output=True, text=True).stdout.strip() == "COMPLETED",
                 timeout=60)  # fmt: skip
    finally:
        localcluster.down(spec)
        for sock in held:
            sock.close()


@pytest.mark.slurm_versions
def test_sacct_before_25_11_takes_128_from_an_exit_code(tmp_path: Path, acct_env: dict, capsys):
    """sacct before 25.11 says a batch script's `exit 137` as `9:0`, as it says an `exit 9`; 25.11 on, and scontrol
    on every release, `137:0` (tests/test_slurm_versions.py). The end of a run read from sacct says the code the
    job logged, as one read from scontrol does: the same line and verdict."""
    from test_slurm_versions import ENDS_WITH, ended_line

    from launcher.slurm import parse, releases, triage

    def sbatch(code: int) -> str:
        argv = ["sbatch", "--parsable", "--output", str(tmp_path / "%j.out"), "--wrap",
                ENDS_WITH.format(line=ended_line(code), code=code)]  # fmt: skip
        return subprocess.run(argv, env=acct_env, capture_output=True, text=True, check=True).stdout.strip()

    jobs = {code: sbatch(code) for code in (137, 9)}
    recorded = {
        code: wait_for(lambda j=job: (r := client.accounting_records(j)) and r[-1].state in parse.TERMINAL and r, 60)
        for code, job in jobs.items()
    }
    before = slurm_release(acct_env) < (25, 11)
    assert [(r[-1].exit_code, r[-1].signal) for r in recorded.values()] == [(9 if before else 137, 0), (9, 0)]
    for code, job in jobs.items():
        log = tmp_path / f"{job}.out"
        from_sacct, from_scontrol = parse.state_from_sacct(job, recorded[code]), client.job_state(job)
        assert from_sacct is not None and from_scontrol is not None and from_scontrol.exit_code == code
        assert releases.as_logged(from_sacct, log.read_text()).exit_code == code
        text = submission.read_log(log)
        assert triage.for_job(releases.as_logged(from_sacct, text), text) == triage.for_job(from_scontrol, text)
        submission.report_end(from_sacct, log)
        assert f"Job {job} ended FAILED, exit code {code}" in capsys.readouterr().out
