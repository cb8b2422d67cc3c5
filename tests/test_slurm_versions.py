"""What Slurm 25.05-26.05 changed that a launcher reads or asks (docs/slurm-versions.md), each reproduced with
Slurm's own commands on the real local cluster of the release the suite runs on (22.05 from Debian 12; 24.11 and
26.05 through scripts/slurm_root.sh), asserting that release's behaviour, then met through the launcher: the same
reading and the same verdict on every release. Marked `slurm_versions` (CI runs these on every release)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from launcher_helpers import ROOT
from slurm_cluster import slurm_release
from test_slurm_e2e import launch, script, wait_for

from launcher import protocol as P
from launcher.localcluster import ClusterSpec, down, up
from launcher.runs import submission
from launcher.slurm import client, follow, parse, releases, triage

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_versions]

# a batch script that says the launcher's last line for its attempt, as the launcher's does, then ends with `code`
ENDS_WITH = 'echo "{line}"; exit {code}'


def ended_line(code: int) -> str:
    return P.line("attempt_ended", stamp="00:00:00.000", job="$SLURM_JOB_ID", attempt=1, when="now", code=code)


def sbatch(env: dict, tmp_path: Path, *args: str) -> str:
    argv = ["sbatch", "--parsable", "--nodes", "1", "--output", str(tmp_path / "%j.out"), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()


def ended(job: str) -> parse.JobState:
    return wait_for(lambda: (s := client.job_state(job)) is not None and s.terminal and s, timeout=60)


def test_an_exit_code_above_128_reads_the_same_on_every_release(tmp_path: Path, slurm_env: dict, capsys):
    """scontrol and squeue say a batch script's `exit 137` as 137:0 on every release, and a death by SIGKILL as
    0:9 (sacct before 25.11 says 9:0 for the first: tests/test_accounting.py). The launcher's end of a run says
    the code the job logged, whichever command it read."""
    exited = sbatch(slurm_env, tmp_path, "--wrap", ENDS_WITH.format(line=ended_line(137), code=137))
    killed = sbatch(slurm_env, tmp_path, "--wrap", "kill -9 $$")
    assert (ended(exited).exit_code, ended(exited).signal) == (137, 0)
    assert (ended(killed).exit_code, ended(killed).signal) == (0, 9)
    many = client.job_states_many([exited, killed])  # squeue's raw wait status
    assert [(many[j].exit_code, many[j].signal) for j in (exited, killed)] == [(137, 0), (0, 9)]
    log = tmp_path / f"{exited}.out"
    assert releases.logged_exit_code(exited, log.read_text()) == 137
    submission.report_end(ended(exited), log)
    assert f"Job {exited} ended FAILED, exit code 137" in capsys.readouterr().out
    # what sacct before 25.11 says of it (9:0) is read as the job logged it: the same verdict
    as_old_sacct = parse.JobState(exited, "FAILED", "None", 9, 0, 0, ended(exited).nodes)
    assert releases.as_logged(as_old_sacct, log.read_text()).exit_code == 137
    text = submission.read_log(log)
    assert triage.for_job(releases.as_logged(as_old_sacct, text), text) == triage.for_job(ended(exited), text)


def test_scontrol_show_job_is_read_the_same_on_every_release(tmp_path: Path, slurm_env: dict):
    """Slurm 25.11 adds SubmitLine (the command line as typed: spaces and `=` included) before WorkDir, 26.05 also
    Exclusive and LicensesAlloc, and leaves StdErr empty where --error was not given: the launcher's reader takes
    the fields it needs, never a word of the submit line for a key."""
    wrap = "true JobState=RUNNING StdOut=/nowhere"
    job = sbatch(slurm_env, tmp_path, "--wrap", wrap)
    state = ended(job)
    assert (state.state, state.exit_code) == ("COMPLETED", 0)
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=slurm_env, capture_output=True, text=True)
    fields = parse.parse_scontrol(shown.stdout)
    assert (fields["JobState"], fields["StdOut"], fields["WorkDir"]) == ("COMPLETED", str(tmp_path / f"{job}.out"),
                                                                          str(Path.cwd()))  # fmt: skip
    if slurm_release(slurm_env) >= (25, 11):
        assert f" SubmitLine=sbatch --parsable --nodes 1 --output {tmp_path}/%j.out --wrap {wrap} " in shown.stdout
        assert fields["SubmitLine"].endswith(f"--wrap {wrap}")
    else:
        assert "SubmitLine" not in fields
    assert client.job_log_path(job) == tmp_path / f"{job}.out"


def test_gres_beside_gpus_per_node(tmp_path: Path, slurm_env: dict):
    """Slurm 26.05 refuses `--gres=gpu:N` beside `--gpus-per-node` (sbatch, and srun in a job); older releases
    take both. The launcher asks with --gpus-per-node alone, and refuses a gpu GRES in sbatch's environment
    (SBATCH_GRES) on every release, before anything is written."""
    argv = ["sbatch", "--test-only", "--nodes", "1", "--gres=gpu:1", "--gpus-per-node=1", "--wrap", "true"]
    both = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=60)
    refused = slurm_release(slurm_env) >= (26, 5)
    assert (both.returncode != 0) == refused, both
    assert ("mutually exclusive" in both.stderr) == refused, both.stderr
    out = launch(tmp_path, {**slurm_env, "SBATCH_GRES": "gpu:2"}, "gres", script(tmp_path, "ok.py", "print(1)\n"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--gpus_per_node: SBATCH_GRES=gpu:2 in the environment asks sbatch for GPUs" in out.stderr
    assert "unset SBATCH_GRES" in out.stderr and not (tmp_path / "logs").exists()
    if refused:  # and Slurm's own refusal, were it to come (a site's default GRES), names the fix
        assert "unset SBATCH_GRES" in client.rejection(both.stderr)


def test_a_step_that_fails_before_its_task_starts_fails_srun(tmp_path: Path, slurm_env: dict):
    """Slurm 26.05's srun no longer reports 0:0 for a step that aborted before a task started (its accounting
    record). The launcher reads srun's own exit status (its supervisor is srun's parent), which is
    non-zero for such a step on every release: stdin that cannot be opened, a task prolog that cannot run, a step
    the allocation cannot hold."""
    steps = "; ".join(
        f"timeout 30 srun {flags} true; echo {name}=$?"
        for name, flags in (
            ("stdin", "--input=/nonexistent/in"),
            ("prolog", "--task-prolog=/nonexistent/tp"),
            ("nodes", "--nodes=2"),
        )  # fmt: skip
    )
    job = sbatch(slurm_env, tmp_path, "--wrap", steps)
    assert ended(job).state == "COMPLETED"
    said = (tmp_path / f"{job}.out").read_text()
    assert all(f"{name}=1" in said for name in ("stdin", "prolog", "nodes")), said


def test_a_requeued_job_waits_cred_expire_and_a_second(tmp_path: Path, slurm_env: dict):
    """A requeued job is not eligible before cred_expire + 1 s (the local cluster's 10 s; Slurm's default 120 s)
    on every release; 25.11 names the wait requeue_delay (SchedulerParameters), cred_expire by default. The wait
    counts from the end of the job's last step (slurmctld's batch_requeue_fini), seconds after the requeue at load:
    at least 11 s after the requeue (less a second of rounding and one of scontrol), at most 11 s (and the rounding)
    after the job was first seen pending."""
    job = sbatch(slurm_env, tmp_path, "--wrap", "sleep 60")
    wait_for(lambda: client.job_state(job).state == "RUNNING")  # type: ignore[union-attr]
    subprocess.run(["scontrol", "requeue", job], env=slurm_env, check=True)
    requeued = time.time()

    def pending() -> dict[str, str] | None:  # (COMPLETING first, on 22.05)
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=slurm_env, capture_output=True, text=True)
        fields = parse.parse_scontrol(shown.stdout)
        return fields if fields.get("JobState") == "PENDING" else None

    try:
        fields = wait_for(pending, timeout=60)
        seen = time.time()
        eligible = datetime.fromisoformat(fields["EligibleTime"]).timestamp()  # (whole seconds)
        waits = (eligible - requeued, eligible - seen)
        assert fields["Reason"] == "BeginTime" and waits[0] >= 9 and waits[1] <= 12, (waits, fields)
    finally:
        subprocess.run(["scancel", job], env=slurm_env, check=True)


def test_restart_count_in_an_output_name(tmp_path: Path, slurm_env: dict):
    """`%r` in --output: Slurm 25.11 on writes one file per attempt (x-0, x-1), older releases one file named as
    typed. The launcher never writes `%` into a log path (a % in --slurm_logs_path is refused): every attempt
    appends to the one log its follower, triage and ledger read."""
    attempt = "${SLURM_RESTART_COUNT:-0}"
    wrap = f'echo "attempt {attempt}"; [ "{attempt}" -ge 1 ] || scontrol requeue $SLURM_JOB_ID'
    job = sbatch(slurm_env, tmp_path, "--output", str(tmp_path / "x-%r.log"), "--open-mode=append", "--wrap", wrap)
    wait_for(lambda: (s := client.job_state(job)) is not None and s.terminal and s.restarts == 1, timeout=90)
    logs = sorted(p.name for p in tmp_path.glob("x-*.log"))
    assert logs == (["x-0.log", "x-1.log"] if slurm_release(slurm_env) >= (25, 11) else ["x-%r.log"]), logs
    out = launch(tmp_path, slurm_env, "pct", script(tmp_path, "ok.py", "print(1)\n"), "--slurm_logs_path", "logs/%r")
    assert out.returncode == 2 and "--slurm_logs_path" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.fixture(scope="module")
def expedite_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A second local cluster with SlurmctldParameters=enable_expedited_requeue."""
    spec = ClusterSpec(tmp_path_factory.mktemp("expedite"), nodes=2, gpus_per_node=2, expedited_requeue=True)
    yield up(spec)
    down(spec)


def test_an_expedited_requeue_where_the_cluster_enables_it(tmp_path: Path, slurm_env: dict, expedite_cluster):
    """`sbatch --requeue=expedite` (25.11): refused where SlurmctldParameters lacks enable_expedited_requeue, and
    before 25.11 everywhere (`--requeue` takes no argument). The launcher asks for it where the cluster's config
    (read once at submission) enables it and its Slurm is 25.11 or newer, a plain --requeue elsewhere: every job
    it submits is accepted."""
    new = slurm_release(slurm_env) >= (25, 11)
    enabled = {**slurm_env, **expedite_cluster}
    argv = ["sbatch", "--parsable", "--requeue=expedite", "--output", "/dev/null", "--wrap", "true"]
    plain = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=60)
    # (26.05.5 says no more than that: SLURM26.md expected "Expedited requeue requested but not enabled")
    said = "Requested operation not supported on this system" if new else "'--requeue' doesn't allow an argument"
    assert plain.returncode != 0 and said in plain.stderr, plain.stderr
    expedited = subprocess.run(argv, env=enabled, capture_output=True, text=True, timeout=60)
    assert (expedited.returncode == 0) == new, expedited.stderr
    for name, env in (("plain", slurm_env), ("expedited", enabled)):
        out = launch(tmp_path, env, name, script(tmp_path, f"{name}.py", "print(1)\n"), "--show_logs")
        assert out.returncode == 0 and "ended COMPLETED" in out.stdout, out.stdout + out.stderr
        (bundle,) = (tmp_path / "logs/configs" / name).iterdir()
        run = json.loads((bundle / "manifest.json").read_text())
        text = Path(run["files"]["script"]["path"]).read_text()
        asked = name == "expedited" and new
        assert ("#SBATCH --requeue=expedite\n" in text, "#SBATCH --requeue\n" in text) == (asked, not asked)


@pytest.fixture(scope="module")
def small_queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local cluster whose controller holds 3 jobs at most (MaxJobCount=3), finished ones for 2 s (MinJobAge=2:
    purged within 10 s)."""
    spec = ClusterSpec(tmp_path_factory.mktemp("queue"), nodes=1, gpus_per_node=2, max_job_count=3, min_job_age_s=2)
    yield up(spec)
    down(spec)


def test_a_full_queue_is_waited_for_not_refused(tmp_path: Path, slurm_env: dict, small_queue: dict):
    """A queue that holds MaxJobCount jobs (26.05 fills at 3; before, at 2: `>=`): `sbatch --test-only` fails at once,
    26.05 saying "MaxJobCount limit reached", before it "Resource temporarily unavailable"; sbatch retries for 2
    minutes, 26.05 saying "queue full". The launcher does not call that a refusal of the job: it says that Slurm
    cannot judge it now and submits through sbatch's retries, which a job leaving the queue lets through."""
    env = {**slurm_env, **small_queue}
    new = slurm_release(slurm_env) >= (26, 5)
    held = [sbatch(env, tmp_path, "--hold", "--wrap", "true") for _ in range(3 if new else 2)]
    judged = subprocess.run(["sbatch", "--test-only", "--wrap", "true"], env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert judged.returncode != 0, judged.stderr
    assert ("MaxJobCount limit reached" if new else "Resource temporarily unavailable") in judged.stderr
    retries = subprocess.Popen(["sbatch", "--wrap", "true"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    assert retries.stderr is not None
    said = retries.stderr.readline()
    retries.kill()
    retries.wait()
    assert ("queue full" if new else "temporarily unable to accept job") in said and "retrying" in said, said
    argv = [sys.executable, str(ROOT / "slurm_launcher.py"), "--run_name", "full", "--nodes", "1", "--gpus_per_node",
            "2", "--run_train_script", script(tmp_path, "ok.py", "print(1)\n"), "--dataset", "none", "--time_limit",
            "5:00"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    while not any(line.lstrip().startswith("slurm ") for line in lines) and proc.poll() is None:
        lines.append(proc.stdout.readline())
    assert "slurm        cannot judge it now: its queue is full" in "".join(lines), "".join(lines)
    subprocess.run(["scancel", held[0]], env=env, check=True)  # purged within 10 s: sbatch's next try gets through
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Submitted job " in out and "Traceback" not in err, out + err
    run = json.loads(next((tmp_path / "logs/configs/full").glob("*/manifest.json")).read_text())
    assert run["slurm"]["job_id"] and run["slurm"]["submitted"], run["slurm"]
    subprocess.run(["scancel", *held[1:], run["slurm"]["job_id"]], env=env, check=True)


def test_a_queue_that_stays_full_is_said_with_its_fix():
    """What sbatch says when its retries end (26.05's words, and 22.05-24.11's), read as a full queue."""
    for stderr in ("sbatch: error: Slurm job queue full, sleeping and retrying\nsbatch: error: Batch job submission "
                   "failed: MaxJobCount limit reached", "sbatch: error: Slurm temporarily unable to accept job, "
                   "sleeping and retrying\nsbatch: error: Batch job submission failed: Resource temporarily "
                   "unavailable"):  # fmt: skip
        said = client.rejection(stderr)
        assert "fix nothing in the flags: Slurm's queue holds as many jobs as it may (MaxJobCount" in said, said
        assert "check the #SBATCH options" not in said


@pytest.fixture(scope="module")
def blocks(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: dict) -> Iterator[dict[str, str]]:
    """A local cluster of 4 nodes in 2 topology blocks (topology/block, BlockSizes=2)."""
    if slurm_release(slurm_cluster) < (23, 11):
        pytest.skip("topology/block arrived in Slurm 23.11: 22.05 has no such reason to give")
    spec = ClusterSpec(tmp_path_factory.mktemp("blocks"), nodes=4, gpus_per_node=2, block_nodes=2)
    yield up(spec)
    down(spec)


def test_a_job_no_topology_block_holds_now(tmp_path: Path, slurm_env: dict, blocks: dict, monkeypatch):
    """One node of each block busy: a 2-node job waits. 26.05 says why ("No_suitable_topology_unit_found" in
    scontrol, with spaces in squeue), 24.11 "Resources"; the follower's line says what the topology reason means."""
    env = {**slurm_env, **blocks}
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])  # the launcher's reading (client.job_state), of this cluster
    busy = [sbatch(env, tmp_path, "--exclusive", "-w", node, "--wrap", "sleep 300") for node in ("node1", "node3")]
    waiting = sbatch(env, tmp_path, "--nodes", "2", "--exclusive", "--wrap", "true")
    new = slurm_release(slurm_env) >= (26, 5)
    expected = "No_suitable_topology_unit_found" if new else "Resources"
    try:
        state = wait_for(lambda: (s := client.job_state(waiting)) is not None and s.reason == expected and s, 60)
        squeue = subprocess.run(["squeue", "-h", "-j", waiting, "-o", "%r"], env=env, capture_output=True, text=True)
        assert squeue.stdout.strip() == expected.replace("_", " "), squeue.stdout
        said = follow.describe(state)
        assert said.startswith(f"job {waiting} PENDING (reason: {expected}")
        assert (follow.TOPOLOGY_WAIT in said, follow.TOPOLOGY_WAIT in follow.reason_said(squeue.stdout.strip())) == (
            new,
            new,
        )
    finally:
        subprocess.run(["scancel", *busy, waiting], env=env, check=True)
