"""The Slurm client: submit a script, read a job's state, cancel it. Argument lists only, never a shell.

State comes from `scontrol show job` (works without accounting, for MinJobAge seconds after the end), then from
`sacct` where accounting exists; a job's attempts, their times and GPUs from `sacct --duplicates`
(`accounting_records`), the user's accounts from `sacctmgr` (`user_accounts`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import QueueFull, SlurmUnavailable, SubmissionError
from launcher.slurm.parse import (
    NODE_STATES,
    SACCT_FIELDS,
    SQUEUE_JOBS,
    SQUEUE_STATES,
    JobState,
    NodeState,
    SacctRecord,
    parse_config,
    parse_gres_types,
    parse_job_records,
    parse_node_shapes,
    parse_node_states,
    parse_sacct_records,
    parse_scontrol,
    parse_squeue_jobs,
    parse_squeue_states,
    state_from_sacct,
)

JOB_ID = re.compile(r"^\d+(_\d+)?$", re.ASCII)
WHAT_NOW = (  # (each command adds what it has besides: the launcher's and `jobs rerun`'s --dry_run)
    "Start the project's local cluster to try it there: python -m launcher.localcluster up (then export SLURM_CONF "
    "as it prints)."
)
NO_SLURM = "Slurm's commands ({}) are not installed or not on PATH here. " + WHAT_NOW
HINTS = (  # sbatch's words -> the flag to change
    ("invalid partition", "--partition: pick one listed by `sinfo -s`, or leave it out for the default"),
    ("invalid qos", "--qos: pick one you may use (`sacctmgr show assoc user=$USER format=qos`)"),
    ("invalid account", "--account: pick one of yours (`sacctmgr show assoc user=$USER format=account`)"),
    ("time limit", "--time_limit: stay under the partition's limit (`sinfo -o '%P %l'`)"),
    (
        "node configuration is not available",
        "--nodes, --gpus_per_node (and --nodelist, --exclude, --constraint, --mem, if given): no set of the "
        "partition's nodes matches them all (`sinfo -N -o '%N %P %G %f %m'`)",
    ),
    ("mutually exclusive", "--gpus_per_node asks for the GPUs: unset SBATCH_GRES (or leave its gpu item out)"),
    ("(gres) specification", "--gpus_per_node: the nodes have fewer GPUs (`sinfo -o '%P %G'`)"),
    ("invalid feature", "--constraint: use features the nodes have (`sinfo -o '%P %f'`)"),
    ("reservation", "--reservation: use one that exists and admits you (`scontrol show reservation`)"),
    ("invalid node name", "--nodelist / --exclude: use node names Slurm knows (`sinfo -N`)"),
    ("invalid number of nodes", "--nodelist: it names more nodes than --nodes"),
    ("dependency", "--dependency: name jobs that exist (`squeue --me`)"),
)
# A full queue (MaxJobCount jobs held, finished ones for MinJobAge included), as each release says it: 26.05 by
# name; before, EAGAIN. sbatch itself then retries 15 times, sleeping 1, 2, ... 15 s (`sbatch --test-only` does not).
QUEUE_FULL = ("maxjobcount limit reached", "queue full", "resource temporarily unavailable",
              "temporarily unable to accept job")  # fmt: skip
SBATCH_RETRIES_S = sum(range(1, 16))
FULL_QUEUE_FIX = (
    "nothing in the flags: Slurm's queue holds as many jobs as it may (MaxJobCount in `scontrol show config`, "
    "finished jobs counted for MinJobAge); submit the kept script once jobs have left the queue"
)


def _command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmUnavailable(NO_SLURM.format(name))
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # Slurm would spend a minute looking elsewhere before failing
        raise SlurmUnavailable(
            f"SLURM_CONF={conf} does not exist. Unset it to use the system's configuration, "
            "or start the local cluster: python -m launcher.localcluster up"
        )
    return path


# Inside `fail_fast()`: the controller found unreachable there (empty: not yet), which every later command raises
_UNREACHABLE: list[SlurmUnavailable] | None = None


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """A launch's checks: once one command finds the controller unreachable (each waits out Slurm's own retries,
    ~9 s with MessageTimeout=10), every later one raises the same at once: a dead controller kept a launch's five
    questions waiting 54 s. Never around following a job, whose queries outlive a controller's restart."""
    global _UNREACHABLE
    _UNREACHABLE = []
    try:
        yield
    finally:
        _UNREACHABLE = None


def _cannot_reach(name: str, said: str) -> SlurmUnavailable:
    """The controller unreachable, as `name` said it (`said`), with what to do; remembered inside `fail_fast()`."""
    error = SlurmUnavailable(
        f"{name} cannot reach the Slurm controller:\n  {said}\n"
        f"Is slurmctld up, and SLURM_CONF ({os.environ.get('SLURM_CONF', 'not set')}) the right file? " + WHAT_NOW
    )
    if _UNREACHABLE is not None:
        _UNREACHABLE.append(error)
    return error


def _run(argv: list[str], timeout: float = 30, input: str | None = None) -> subprocess.CompletedProcess[str]:
    if _UNREACHABLE:
        raise _UNREACHABLE[0]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise _cannot_reach(Path(argv[0]).name, f"no answer within {timeout:.0f} s") from e


def _unreachable(stderr: str) -> bool:
    return any(
        w in stderr.lower()
        for w in (
            "unable to contact slurm controller",
            "connection refused",
            "zero bytes were transmitted",
            "could not open configuration",
            "cannot stat file",
            "could not establish a configuration source",  # no slurm.conf, no SLURM_CONF, no DNS SRV record
        )
    )


def _query(name: str, *args: str) -> str | None:
    """A Slurm command's answer (stdout), or None when it refused (an unknown job, a bad option). Raises
    SlurmUnavailable when the controller does not answer."""
    out = _run([_command(name), *args])
    if out.returncode == 0:
        return out.stdout
    if _unreachable(out.stderr):
        raise _cannot_reach(name, out.stderr.strip())
    return None


def rejection(stderr: str) -> str:
    """sbatch's refusal, indented, with the flags to change; raises SlurmUnavailable if Slurm did not answer."""
    stderr = stderr.strip()
    if _unreachable(stderr):
        raise _cannot_reach("sbatch", stderr)
    hints = [h for words, h in HINTS if words in stderr.lower()] + ([FULL_QUEUE_FIX] if queue_full(stderr) else [])
    return (
        "  "
        + stderr.replace("\n", "\n  ")
        + "\n"
        + "\n".join(f"  fix {h}" for h in hints or ["check the #SBATCH options in the script against `sinfo`"])
    )


def queue_full(stderr: str) -> bool:
    """Whether sbatch's words say that Slurm's queue is full (QUEUE_FULL)."""
    return any(words in stderr.lower() for words in QUEUE_FULL)


def check_submission(script_text: str) -> str:
    """Ask Slurm whether it would accept this batch script, submitting nothing (`sbatch --test-only`, the script
    on stdin); return its forecast ("to start at 2026-11-22T15:06:18 ... on nodes node[1-2] in partition debug").
    Raises SubmissionError with sbatch's own words and the flags to change; QueueFull where Slurm's queue is full
    (it judged nothing)."""
    out = _run([_command("sbatch"), "--test-only"], timeout=60, input=script_text)
    if out.returncode != 0 and queue_full(out.stderr):
        raise QueueFull(out.stderr.strip())
    if out.returncode != 0:
        raise SubmissionError("Slurm would reject the job:\n" + rejection(out.stderr))
    forecast = re.search(r"Job \d+ (to start at .*)", out.stderr)
    return forecast.group(1).strip() if forecast else "accepted"


def submit(script: Path, *options: str) -> str:
    """sbatch the script file itself (with sbatch `options`, e.g. a dependency); return the job id. Raises
    SubmissionError with sbatch's own words. At a full queue sbatch retries for SBATCH_RETRIES_S: waited for."""
    out = _run([_command("sbatch"), "--parsable", *options, str(script)], timeout=SBATCH_RETRIES_S + 60)
    if out.returncode != 0:
        raise SubmissionError("sbatch rejected the job:\n" + rejection(out.stderr))
    job_id = out.stdout.strip().split(";")[0]
    if not JOB_ID.match(job_id):
        raise SubmissionError(f"sbatch answered {out.stdout.strip()!r}, not a job id")
    return job_id


def accounting_records(job_id: str) -> list[SacctRecord] | None:
    """Every attempt of a job as slurmdbd keeps it (`sacct --duplicates`: a requeue keeps the id, each attempt
    its record), oldest first; [] when sacct does not know the job (not yet, or no longer); None where the cluster
    keeps no accounting (or sacct is missing, or slurmdbd does not answer)."""
    sacct = shutil.which("sacct")
    if sacct is None:
        return None
    try:
        out = _run([sacct, "-j", job_id, "--duplicates", "-X", "-n", "-P", "-o", SACCT_FIELDS])
    except SlurmUnavailable:  # slurmdbd not answering: as without accounting
        return None
    if out.returncode != 0:
        return None  # accounting disabled ("Slurm accounting storage is disabled"), or slurmdbd down
    return [r for r in parse_sacct_records(out.stdout) if r.job_id == job_id]


def _from_sacct(job_id: str) -> list[JobState]:
    state = state_from_sacct(job_id, accounting_records(job_id) or [])
    return [state] if state else []


def job_states(job_id: str) -> list[JobState]:
    """Every record Slurm has under a job id (see parse_job_records; sacct's where scontrol no longer knows it, a
    terminal one only: see parse.state_from_sacct), or [] when Slurm does not know it."""
    out = _query("scontrol", "show", "job", "-o", job_id)
    if out is not None and "JobState=" in out:
        return parse_job_records(job_id, out)
    return _from_sacct(job_id)


def job_state(job_id: str) -> JobState | None:
    """The job's current state (for an array, its first record), or None when Slurm no longer knows it."""
    states = job_states(job_id)
    return states[0] if states else None


def job_states_many(job_ids: list[str]) -> dict[str, JobState]:
    """The states of many jobs in one controller query (`squeue -j ID,ID,... -t all`: two RPCs, however many
    jobs, where `scontrol show job` takes two each); a job squeue does not list (the controller has forgotten it,
    an array) is asked about alone (`job_state`: scontrol, then sacct). A job Slurm does not know is left out."""
    ids = list(dict.fromkeys(job_ids))
    if len(ids) == 1:  # squeue asks for one job as scontrol does, plus the partitions: scontrol is cheaper
        state = job_state(ids[0])
        return {ids[0]: state} if state else {}
    found: dict[str, JobState] = {}
    if ids:
        out = _run([_command("squeue"), "-h", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_STATES])
        if out.returncode != 0 and _unreachable(out.stderr):
            raise _cannot_reach("squeue", out.stderr.strip())
        found = {k: v for k, v in parse_squeue_states(out.stdout).items() if k in ids}
    for job_id in ids:
        if job_id not in found and (state := job_state(job_id)) is not None:
            found[job_id] = state
    return {job_id: found[job_id] for job_id in ids if job_id in found}


def job_log_path(job_id: str) -> Path | None:
    """The file Slurm writes the job's output to (StdOut), while the controller knows the job."""
    out = _query("scontrol", "show", "job", "-o", job_id)
    path = parse_scontrol(out).get("StdOut") if out is not None else None
    return Path(path) if path else None


def job_script(job_id: str) -> Path | None:
    """The batch script Slurm runs for the job (Command), while the controller knows the job."""
    out = _query("scontrol", "show", "job", "-o", job_id)
    path = parse_scontrol(out).get("Command") if out is not None else None
    return Path(path) if path else None


def release() -> str | None:
    """The Slurm release of this machine's commands (`sbatch --version`: "slurm 22.05.8" -> "22.05.8"); asks no
    controller."""
    out = _run([_command("sbatch"), "--version"])
    words = out.stdout.split()
    return words[-1] if out.returncode == 0 and words else None


def cancel(job_id: str) -> None:
    out = _run([_command("scancel"), job_id])
    if out.returncode != 0:
        raise SubmissionError(f"scancel {job_id} failed: {out.stderr.strip()}")


def cluster_config() -> dict[str, str]:
    """The controller's configuration (`scontrol show config`: "Key = Value" lines) as a dict; {} where it does
    not say. Raises SlurmUnavailable when Slurm does not answer."""
    out = _query("scontrol", "show", "config")
    return parse_config(out) if out is not None else {}


def partition_nodes(partition: str | None) -> tuple[list[str | None], list[tuple[int, int]]]:
    """The GRES types of a partition's GPUs (None for GPUs without a type) and the (CPUs, GPUs) of each kind of its
    nodes (the default partition's when None), from one sinfo query. Raises SlurmUnavailable when Slurm does not
    answer."""
    out = _query("sinfo", "-h", "-o", "%P|%c|%G")
    if out is None:
        return [], []
    fields = [(line.strip().split("|") + ["", ""])[:3] for line in out.splitlines()]
    gres = "\n".join(f"{name} {node_gres}" for name, _, node_gres in fields)
    return parse_gres_types(gres, partition), parse_node_shapes(out, partition)


def node_states(partition: str | None) -> list[NodeState]:
    """Every node of a partition (the default one when None) with its state, GPUs and why it is out of service,
    if it is (one sinfo query). SlurmUnavailable when Slurm does not answer."""
    out = _query("sinfo", "-h", "-N", "-o", NODE_STATES)
    return parse_node_states(out, partition) if out is not None else []


def live_jobs(name: str) -> list[tuple[str, str, str]]:
    """This user's jobs named `name` (or any of its comma-separated names) that Slurm still holds (pending,
    running, requeued, ...): (job id, state, batch script path)."""
    out = _query("squeue", "-h", "--me", "--name", name, "-o", SQUEUE_JOBS)
    return parse_squeue_jobs(out) if out is not None else []


def sbatch(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`sbatch ARGS...` as given (argv[0] is sbatch's place): its exit code and words, never raised (124 where it did
    not answer in time, 127 where there is no sbatch): the eval submitter records what it said."""
    try:
        return _run([_command("sbatch"), *argv[1:]], timeout=timeout)
    except SlurmUnavailable as e:
        return subprocess.CompletedProcess(argv, 127 if "not found" in str(e) else 124, "", str(e))


def jobs_named(name: str) -> list[str] | None:
    """The ids of this user's jobs named `name` in any state Slurm still holds; None where it does not answer."""
    try:
        out = _query("squeue", "-h", "--me", "--states=all", f"--name={name}", "-o", "%i")
    except SlurmUnavailable:
        return None
    return None if out is None else [w for w in out.split() if w.replace("_", "").isdigit()]


def srun_lists(option: str) -> bool:
    """Whether `srun --help` lists `option`: a SPANK plugin's options appear there where the plugin is loaded (pyxis's
    --container-image). Asks no controller."""
    proc = _run([_command("srun"), "--help"])
    return option in proc.stdout + proc.stderr


def user_accounts() -> list[str] | None:
    """The accounts the user may submit to (their associations on this cluster, `sacctmgr show assoc`); None where
    the cluster keeps no associations (no accounting) or sacctmgr does not answer."""
    sacctmgr = shutil.which("sacctmgr")
    if sacctmgr is None:
        return None
    user = pwd.getpwuid(os.getuid()).pw_name  # the user Slurm sees: the uid's, whatever $USER says
    out = _run([sacctmgr, "-n", "-P", "show", "assoc", f"user={user}", "format=account"], timeout=20)
    if out.returncode != 0:
        return None
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})
