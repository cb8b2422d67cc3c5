"""The follower's rate of controller queries: how often it asks, what the job's log tells it instead, one query
for many jobs; measured on the real local cluster with sdiag's RPC counts."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from launcher_helpers import ROOT

from launcher import protocol as P
from launcher.errors import LauncherError
from launcher.localcluster.sdiag import parse_rpc_counts, rpc_counts, served
from launcher.slurm import client
from launcher.slurm.follow import Cadence, LogTail, Watched, describe, poll_problem
from launcher.slurm.parse import JobState, parse_squeue_states

pytestmark = pytest.mark.slurm

SQUEUE = (  # `squeue -h -t all -j ... -O SQUEUE_STATES` on Slurm 22.05; the last line as a version may pad it
    "2|FAILED|NonZeroExitCode|512|0|node1|(null)|\n"
    "3|PENDING|JobHeldUser|0|0||afterany:1(unfulfilled),afterok:1(unfulfilled)|\n"
    "5|CANCELLED|None|15|1|node[1-2]|(null)|\n"
    "6|FAILED|NonZeroExitCode|7:0|0|node2|(null)|\n"
    "  8 |RUNNING   |None        |0   |2 |node1   |(null)   |\n"
    "9|PENDING|Resources|0|0||(null)|2026-11-26T05:20:46|\n"  # with StartTime: the scheduler's estimate
    "10|PENDING|Priority|0|0||(null)|N/A|\n"  # none yet
)


def test_squeue_states_read_as_scontrol_says_them() -> None:
    states = parse_squeue_states(SQUEUE)
    assert states["2"] == JobState("2", "FAILED", "NonZeroExitCode", 2, 0, 0, "node1", "")
    assert states["3"].dependency == "afterany:1(unfulfilled),afterok:1(unfulfilled)" and states["3"].nodes == ""
    assert (states["5"].exit_code, states["5"].signal, states["5"].restarts) == (0, 15, 1)  # killed by SIGTERM
    assert (states["6"].exit_code, states["6"].signal) == (7, 0)
    assert states["8"] == JobState("8", "RUNNING", "None", 0, 0, 2, "node1", "")
    assert (states["9"].start, states["10"].start) == ("2026-11-26T05:20:46", "")
    expected = "job 9 PENDING (reason: Resources, Slurm expects it to start at 2026-11-26 05:20:46)"
    assert describe(states["9"]) == expected


def test_attempt_lines_are_found_across_reads(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    tail = LogTail(log, None)
    assert tail.pump() == (0, [])  # no log yet
    started = P.line("attempt_started", job=7, attempt=1, when="2026-11-24T10:00:00+00:00", nodes="node1")
    ended = P.line("attempt_ended", job=7, attempt=1, when="2026-11-24T10:00:02+00:00", code=0).encode() + b"\n"
    log.write_bytes(started.encode() + b"\nstep 1\n")
    assert tail.pump()[1] == [(1, "started")]
    with open(log, "ab") as f:  # a line that only quotes the words, then the end line written in two pieces
        f.write(b"echo " + ended + ended[:30])
    assert tail.pump()[1] == []
    with open(log, "ab") as f:
        f.write(ended[30:])
    count, marks = tail.pump()
    assert marks == [(1, "ended")] and count > 0 and tail.offset == log.stat().st_size


def test_the_cadence_backs_off_and_comes_back_for_an_end() -> None:
    cadence = Cadence()
    watched = Watched("7", LogTail(Path("/nonexistent"), None))

    def waits(state: JobState, changes: list[bool]) -> list[float]:
        out = []
        for changed in changes:
            watched.wait = cadence.next_wait(watched, state, changed)
            out.append(round(watched.wait, 1))
        return out

    pending = JobState("7", "PENDING", "None", 0, 0, 0, "")
    assert waits(pending, [True, False]) == [5.0, 30.0]  # a first look, then the quiet interval
    resources = JobState("7", "PENDING", "Resources", 0, 0, 0, "")
    assert waits(resources, [True] + [False] * 5) == [30.0, 45.0, 67.5, 101.2, 120.0, 120.0]
    running = JobState("7", "RUNNING", "None", 0, 0, 0, "node1")
    assert waits(running, [True, False, False]) == [30.0, 30.0, 30.0]
    watched.mark, watched.wait = (1, "ended"), cadence.soon  # the log said attempt 1 ended; Slurm says RUNNING
    assert waits(running, [False] * 7) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    requeued = JobState("7", "PENDING", "BeginTime", 0, 0, 1, "")  # attempt 1 ended with a requeue
    assert waits(requeued, [True, False]) == [30.0, 45.0]


def test_the_poll_interval_is_a_setting_checked_before_use(monkeypatch: pytest.MonkeyPatch) -> None:
    assert poll_problem("120") is None and poll_problem("1.5") is None
    for bad in ("0", "-3", "abc", "1e9"):
        problem = poll_problem(bad)
        assert problem is not None and "LAUNCHER_POLL_SECONDS" in problem.message, bad
    monkeypatch.setenv("LAUNCHER_POLL_SECONDS", "120")
    assert Cadence.from_env() == Cadence(quiet=120.0) and Cadence.from_env().pending_max == 480.0
    monkeypatch.setenv("LAUNCHER_POLL_SECONDS", "often")
    with pytest.raises(LauncherError, match="unset it"):
        Cadence.from_env()


def sbatch(env: dict, *argv: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", *argv], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def test_many_jobs_in_one_query_as_scontrol_sees_each(slurm_env: dict) -> None:
    done, failed = sbatch(slurm_env, "--wrap", "true"), sbatch(slurm_env, "--wrap", "exit 3")
    held = sbatch(slurm_env, "--hold", f"--dependency=afterany:{done}", "--wrap", "true")
    running = sbatch(slurm_env, "--wrap", "sleep 60")
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and not (
            client.job_state(done).terminal and client.job_state(failed).terminal  # type: ignore[union-attr]
            and client.job_state(running).state == "RUNNING"  # type: ignore[union-attr]
        ):  # fmt: skip
            time.sleep(0.2)
        before = rpc_counts(slurm_env)
        many = client.job_states_many([done, failed, held, running])
        cost = served(before, rpc_counts(slurm_env))
        assert cost == {"REQUEST_JOB_INFO": 1, "REQUEST_PARTITION_INFO": 1}  # one squeue for the four
        assert set(many) == {done, failed, held, running}
        assert set(client.job_states_many([done, "999999"])) == {done}  # a job Slurm does not know is left out
        for job_id, state in many.items():
            assert state == client.job_state(job_id), job_id
        assert many[failed].exit_code == 3 and many[held].reason == "JobHeldUser" and many[running].nodes
    finally:
        subprocess.run(["scancel", held, running], env=slurm_env, check=False)


NAP = 'import time\nprint("napping", flush=True)\ntime.sleep({seconds})\n'
QUIET_WINDOW = 20.0


def wait_until(predicate, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.1)


def test_following_a_quiet_job_costs_no_query_until_its_log_says_it_ended(tmp_path: Path, slurm_env: dict) -> None:
    """A running job followed with LAUNCHER_POLL_SECONDS=60 for a 20 s quiet window: no controller query in it
    (the follower of before asked twice a second: ~80 RPCs in 20 s); then the job's own end line brings the end
    within seconds, though the next scheduled query is a minute away."""
    nap = tmp_path / "nap.py"
    nap.write_text(NAP.format(seconds=QUIET_WINDOW + 6))
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "quiet", "--nodes", "1",
            "--gpus_per_node", "1", "--run_train_script", str(nap), "--dataset", "none", "--time_limit", "5:00",
            "--show_logs"]  # fmt: skip
    err = tmp_path / "follower.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(argv, cwd=tmp_path, env={**slurm_env, "LAUNCHER_POLL_SECONDS": "60"},
                                stdout=subprocess.PIPE, stderr=stderr, text=True)  # fmt: skip
    logs = tmp_path / "logs/slurm_logs"
    try:
        wait_until(lambda: any("napping" in p.read_text() for p in logs.glob("*/*.out")), timeout=90)
        (log,) = logs.glob("*/*.out")
        wait_until(lambda: " RUNNING on " in err.read_text(), timeout=10)
        quiet_start = rpc_counts(slurm_env)
        time.sleep(QUIET_WINDOW)
        in_quiet = served(quiet_start, rpc_counts(slurm_env))
        wait_until(lambda: " attempt 1 ended " in log.read_text(), timeout=60)
        ended = time.monotonic()
        wait_until(lambda: " COMPLETED" in err.read_text(), timeout=30)
        noticed = time.monotonic() - ended
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert " ended COMPLETED" in stdout, stdout + err.read_text()  # (a nap is no training: its verdict says so)
    assert sum(in_quiet.values()) == 0, in_quiet  # not one query from anyone in the quiet window
    assert noticed < 5, f"the end was noticed {noticed:.1f} s after the job's log said it"
    after = served(quiet_start, rpc_counts(slurm_env))
    assert after["REQUEST_JOB_INFO_SINGLE"] >= 1  # the query that confirmed the end: the counts do see the follower


PENDING_WINDOW, PENDING_POLL = 30.0, 10


def test_a_pending_job_says_why_it_waits_and_when_it_may_start_and_is_asked_politely(
    tmp_path: Path, slurm_env: dict
) -> None:
    """A job that waits for GPUs another job holds: --show_logs and `jobs status` say Slurm's reason and its
    estimate of the start (the one `squeue --start` prints), and the follower asks the controller at most once a
    poll interval while it waits (backing off), counted with sdiag; the job then runs once the GPUs are free."""
    blocker = sbatch(slurm_env, "--nodes", "2", "--gpus-per-node", "2", "--time", "10", "--wrap", "sleep 600")
    # running before the run is submitted: a job submitted while the blocker still pends waits for "Priority" (a
    # job ahead of it) until Slurm's next pass, not for "Resources"
    wait_until(lambda: getattr(client.job_state(blocker), "state", "") == "RUNNING", timeout=60)
    nap = tmp_path / "nap.py"
    nap.write_text(NAP.format(seconds=1))
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "waits", "--nodes", "1",
            "--gpus_per_node", "1", "--run_train_script", str(nap), "--dataset", "none", "--time_limit", "5:00",
            "--show_logs"]  # fmt: skip
    err = tmp_path / "follower.err"
    try:
        with open(err, "w") as stderr:
            proc = subprocess.Popen(argv, cwd=tmp_path, env={**slurm_env, "LAUNCHER_POLL_SECONDS": str(PENDING_POLL)},
                                    stdout=subprocess.PIPE, stderr=stderr, text=True)  # fmt: skip
        wait_until(lambda: "Slurm expects it to start at" in err.read_text(), timeout=120)
        before = rpc_counts(slurm_env)
        time.sleep(PENDING_WINDOW)
        asked = served(before, rpc_counts(slurm_env))
        said = next(line for line in err.read_text().splitlines() if "Slurm expects it to start at" in line)
        job_id = said.split()[2]
        (bundle,) = (tmp_path / "logs/configs/waits").iterdir()
        status = subprocess.run([sys.executable, "-m", "launcher.jobs", "status", str(bundle)], cwd=ROOT,
                                env=slurm_env, capture_output=True, text=True, timeout=60)  # fmt: skip
        start = subprocess.run(["squeue", "--start", "-h", "-j", job_id, "-o", "%S"], env=slurm_env,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        client.cancel(blocker)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        subprocess.run(["scancel", blocker], env=slurm_env, check=False)
        proc.kill()
    assert f"job {job_id} PENDING (reason: Resources, Slurm expects it to start at " in said, said
    assert start[:1].isdigit() and start.replace("T", " ")[:16] in status.stdout, (start, status.stdout)
    assert f"job {job_id} PENDING (reason: Resources, Slurm expects it to start at" in status.stdout
    # while it waited: one controller query (scontrol show job) per poll interval at most, none from anyone else
    queries = asked["REQUEST_JOB_INFO_SINGLE"] + asked["REQUEST_JOB_INFO"]
    assert 1 <= queries <= PENDING_WINDOW / PENDING_POLL + 1, asked
    assert " ended COMPLETED" in stdout, stdout + err.read_text()  # it started once the GPUs were free


def test_a_bad_poll_setting_is_refused_before_submission(tmp_path: Path, slurm_env: dict) -> None:
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "bad", "--nodes", "1",
            "--run_train_script", str(tmp_path / "x.py"), "--dataset", "none", "--show_logs"]  # fmt: skip
    out = subprocess.run(argv, cwd=tmp_path, env={**slurm_env, "LAUNCHER_POLL_SECONDS": "soon"}, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "LAUNCHER_POLL_SECONDS='soon' is not a number of seconds" in out.stderr
    assert not (tmp_path / "logs").exists()


def test_sdiag_counts_are_read_from_their_section() -> None:
    text = (
        "Remote Procedure Call statistics by message type\n"
        "\tREQUEST_FED_INFO                        ( 2049) count:59     ave_time:463    total_time:27343\n"
        "\tREQUEST_JOB_INFO_SINGLE                 ( 2021) count:59     ave_time:471    total_time:27812\n"
        "\nRemote Procedure Call statistics by user\n"
        "\troot            (       0) count:120    ave_time:466    total_time:55555\n"
    )
    before = parse_rpc_counts(text)
    assert before == {"REQUEST_FED_INFO": 59, "REQUEST_JOB_INFO_SINGLE": 59}
    after = Counter({**before, "REQUEST_JOB_INFO_SINGLE": 61, "MESSAGE_NODE_REGISTRATION_STATUS": 1})
    assert served(before, after) == {"REQUEST_JOB_INFO_SINGLE": 2}  # a node's own report is no one's query
    assert served(before, after, nodes=True)["MESSAGE_NODE_REGISTRATION_STATUS"] == 1
