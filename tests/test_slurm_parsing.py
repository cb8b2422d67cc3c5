"""Parsing what Slurm's commands print (pure): scontrol's one-line records and sacct's parsable lines.

scontrol is also exercised for real by the end-to-end tests, and sacct by those on the local cluster with
accounting (tests/test_accounting.py); the sacct lines here were recorded there (Slurm 22.05).
"""

from __future__ import annotations

import pytest

from launcher.slurm import parse as slurm

SCONTROL = (
    "JobId=42 JobName=demo UserId=root(0) GroupId=root(0) JobState=PENDING Reason=Resources Dependency=(null) "
    "Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:0 NodeList=(null) Command=/a b/job.sbatch "
    "StdOut=/logs/run dir/20260101.out"
)


def test_scontrol_record():
    fields = slurm.parse_scontrol(SCONTROL)
    assert fields["JobState"] == "PENDING" and fields["Reason"] == "Resources" and fields["Restarts"] == "2"
    assert fields["StdOut"] == "/logs/run dir/20260101.out"  # a value with a space stays whole
    assert fields["Command"] == "/a b/job.sbatch"


# `scontrol show job -o 108` for an array of 4 tasks, task 1 failed (Slurm 22.05, shortened): one line a task
ARRAY = """\
JobId=108 ArrayJobId=108 ArrayTaskId=3 JobName=wrap JobState=COMPLETED Reason=None Dependency=(null) Restarts=0 ExitCode=0:0 NodeList=node1
JobId=111 ArrayJobId=108 ArrayTaskId=2 JobName=wrap JobState=COMPLETED Reason=None Dependency=(null) Restarts=0 ExitCode=0:0 NodeList=node1
JobId=110 ArrayJobId=108 ArrayTaskId=1 JobName=wrap JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Restarts=0 ExitCode=1:0 NodeList=node2
JobId=109 ArrayJobId=108 ArrayTaskId=0 JobName=wrap JobState=COMPLETED Reason=None Dependency=(null) Restarts=0 ExitCode=0:0 NodeList=node1
"""  # noqa: E501


def test_scontrol_records_one_per_line():
    (job,) = slurm.parse_job_records("42", SCONTROL)
    assert (job.job_id, job.state, job.reason, job.restarts) == ("42", "PENDING", "Resources", 2)
    tasks = slurm.parse_job_records("108", ARRAY)
    assert [t.state for t in tasks] == ["COMPLETED", "COMPLETED", "FAILED", "COMPLETED"]
    assert (tasks[2].exit_code, tasks[2].reason, tasks[2].nodes) == (1, "NonZeroExitCode", "node2")
    assert slurm.parse_job_records("7", "") == []


# `sacct -j 9001 --duplicates -X -n -P -o JobID,State,ExitCode,Reason,NodeList,Submit,Start,End,ElapsedRaw,AllocTRES`
# on the local cluster with accounting: a job that requeued itself once, then completed
SACCT = """\
9001|REQUEUED|0:0|None|node[1-2]|2026-11-24T07:10:16|2026-11-24T07:10:16|2026-11-24T07:10:19|3|billing=2,cpu=2,gres/gpu=4,node=2
9001|COMPLETED|0:0|BeginTime|node[1-2]|2026-11-24T07:10:19|2026-11-24T07:10:31|2026-11-24T07:10:35|4|billing=2,cpu=2,gres/gpu=4,node=2
"""


def test_sacct_attempts_of_a_requeue_chain():
    first, last = slurm.parse_sacct_records(SACCT)
    assert (first.state, first.gpus, first.elapsed_s, last.state, last.exit_code) == ("REQUEUED", 4, 3, "COMPLETED", 0)
    assert first.start is not None and first.end is not None and (first.end - first.start).total_seconds() == 3
    state = slurm.state_from_sacct("9001", [first, last])
    assert state is not None and (state.state, state.restarts, state.exit_code) == ("COMPLETED", 1, 0)


@pytest.mark.parametrize(
    "line,state,code,signal",
    [
        ("7|CANCELLED by 0|0:15|None|node1||||0|", "CANCELLED", 0, 15),
        ("7|FAILED|7:0|NonZeroExitCode|node1|||Unknown|0|", "FAILED", 7, 0),
        ("7|PREEMPTED|0:15|None|node[1-2]|||||cpu=2,gres/gpu:h100=8,gres/gpu=8", "PREEMPTED", 0, 15),
    ],
)
def test_sacct_line(line: str, state: str, code: int, signal: int):
    (job,) = slurm.parse_sacct_records(line)
    assert (job.state, job.exit_code, job.signal, job.end) == (state, code, signal, None)
    assert job.gpus == (8 if "gpu=8" in line else 0)


@pytest.mark.parametrize("state", ["RUNNING", "PENDING", "REQUEUED"])
def test_a_record_sacct_has_not_ended_is_never_read_as_running(state: str):
    """slurmdbd lags behind the controller (or missed an end): a record that is not terminal is no state at all."""
    (record,) = slurm.parse_sacct_records(f"7|{state}|0:0|None|node1|||Unknown|0|")
    assert slurm.state_from_sacct("7", [record]) is None
    assert slurm.state_from_sacct("7", []) is None


# `sinfo -h -o "%P %G"` as sites print it (Slurm 22.05-23.11): the default partition is marked *, a node's GPUs
# name a type or not, other GRES (shards, MPS) sit beside them, socket affinity in parentheses
SINFO = """\
gpu* gpu:h100:8(S:0-1)
gpu* gpu:h100:4(S:0),shard:16
a100 gpu:a100:4(S:0-1),gpu:a100_80gb:4(S:0-1)
mixed gpu:nvidia_h100_80gb_hbm3:8(S:0,2-3),mps:400
plain gpu:8
cpu (null)
"""


@pytest.mark.parametrize(
    "partition,types",
    [
        (None, ["h100", "h100"]),  # the default partition's
        ("a100", ["a100", "a100_80gb"]),
        ("mixed", ["nvidia_h100_80gb_hbm3"]),
        ("plain", [None]),  # GPUs without a type
        ("cpu", []),
        ("missing", []),
    ],
)
def test_sinfo_gres_types(partition, types):
    assert slurm.parse_gres_types(SINFO, partition) == types


# `sinfo -h -N -o NODE_STATES` (the states as sinfo's man page lists them; node3 is in two partitions)
NODE_STATES = """node1|gpu*|idle|gpu:h100:8(S:0-1)|none
node2|gpu*|drained|gpu:h100:8(S:0-1)|bad DIMM | replaced Monday
node3|gpu*|down*|gpu:h100:8|Not responding
node3|long|down*|gpu:h100:8|Not responding
node4|gpu*|mixed|gpu:h100:8|none
node5|gpu*|draining|gpu:h100:8|Kill task failed
node6|gpu*|allocated|gpu:h100:8|none
node7|gpu*|idle*|gpu:h100:8|none
node8|gpu*|maint|gpu:h100:8|none
node9|gpu*|idle~|gpu:h100:8|none
node10|gpu*|completing|gpu:h100:4|none
node11|gpu*|reserved|gpu:h100:8|none
node12|gpu*|planned|gpu:h100:8|none
node13|long|unknown|gpu:h100:8|none
"""


def test_node_states_say_which_nodes_slurm_places_nothing_on_now():
    nodes = slurm.parse_node_states(NODE_STATES)
    assert [n.name for n in nodes] == [f"node{k}" for k in range(1, 13)]  # the default partition's, each once
    away = {n.name for n in nodes if not n.in_service}
    # drained, down, draining, not responding (*), in maintenance, reserved: out; busy, powered down (~: Slurm
    # powers it up for a job), completing, planned for a job: in service
    assert away == {"node2", "node3", "node5", "node7", "node8", "node11"}
    assert nodes[1].reason == "bad DIMM | replaced Monday" and nodes[1].gpus == 8 and nodes[9].gpus == 4
    assert [(n.name, n.in_service) for n in slurm.parse_node_states(NODE_STATES, "long")] == [
        ("node3", False),
        ("node13", False),
    ]
    assert slurm.parse_node_states(NODE_STATES, "missing") == [] == slurm.parse_node_states("garbage\n")


# `scontrol show job -o 6002` on Slurm 26.05.5 (the local cluster, shortened): SubmitLine, as typed, before WorkDir
SCONTROL_26 = (
    "JobId=6002 JobName=wrap UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=137:0 NodeList=node1 OverSubscribe=YES Exclusive=NO Contiguous=0 "
    "Licenses=(null) LicensesAlloc=(null) Network=(null) Command=(null) SubmitLine=sbatch --parsable -o "
    "/tmp/out-%j.log --wrap true StdOut=/elsewhere JobState=RUNNING WorkDir=/tmp StdErr= StdIn=/dev/null "
    "StdOut=/tmp/out-6002.log"
)


def test_scontrol_record_with_a_submit_line():
    fields = slurm.parse_scontrol(SCONTROL_26)
    assert (fields["JobState"], fields["ExitCode"], fields["WorkDir"]) == ("FAILED", "137:0", "/tmp")
    assert fields["StdOut"] == "/tmp/out-6002.log" and fields["StdErr"] == ""  # not the submit line's words
    assert fields["SubmitLine"] == "sbatch --parsable -o /tmp/out-%j.log --wrap true StdOut=/elsewhere JobState=RUNNING"
    (job,) = slurm.parse_job_records("6002", SCONTROL_26)
    assert (job.state, job.exit_code, job.signal, job.nodes) == ("FAILED", 137, 0, "node1")


def test_an_exit_code_sacct_took_128_from_is_read_as_the_job_logged_it():
    from launcher import protocol as P
    from launcher.slurm import releases

    def log(code: int, job: str = "7") -> str:
        ended = P.line("attempt_ended", job=job, attempt=1, when="2026-11-27T09:00:00+00:00", code=code)
        return f"some output\n{ended}\n"

    def read(code: int, signal: int, logged: str) -> tuple[int | None, int | None]:
        state = releases.as_logged(slurm.JobState("7", "FAILED", "None", code, signal, 0, "node1"), logged)
        return state.exit_code, state.signal

    assert read(9, 0, log(137)) == (137, 0)  # sacct before 25.11
    assert read(137, 0, log(137)) == (137, 0)  # sacct from 25.11, scontrol, squeue
    assert read(0, 0, log(128)) == (128, 0)
    assert read(9, 0, log(9)) == (9, 0)  # a plain exit 9
    assert read(1, 0, log(137)) == (1, 0)  # not sacct's subtraction: Slurm's word stands
    assert read(0, 9, log(137)) == (0, 9)  # a signal
    assert read(9, 0, log(137, job="8")) == (9, 0)  # another job's line
    assert read(9, 0, "no line of the launcher\n") == (9, 0)


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("gpu:2", True),
        ("gpu:h100:8", True),
        ("gres/gpu:1", True),
        ("nvme:1,gpu", True),
        ("nvme:1", False),
        ("", False),
        ("gpumem:10G", False),
    ],  # fmt: skip
)
def test_a_gpu_gres_in_sbatchs_environment_is_a_problem(value: str, refused: bool):
    from launcher.slurm import client, releases

    found = releases.gres_problems({"SBATCH_GRES": value} if value else {})
    assert [p.flag for p in found] == (["gpus_per_node"] if refused else [])
    assert all("unset SBATCH_GRES" in p.fix for p in found)
    said = client.rejection("sbatch: fatal: --gpus-per-node and --gres=gpu are mutually exclusive.")
    assert "unset SBATCH_GRES" in said and "fewer GPUs" not in said
    assert "fewer GPUs" in client.rejection("sbatch: error: Invalid generic resource (gres) specification")


# `scontrol show config` (lines of it), Slurm 26.05.5 on the local cluster with the parameter on
CONFIG_26 = """Configuration data as of 2026-11-27T09:20:00
AccountingStorageType   = (null)
SchedulerParameters     = batch_sched_delay=0,sched_interval=2,bf_interval=1
SlurmctldParameters     = preempt_send_user_signal,enable_expedited_requeue
SLURM_VERSION           = 26.05.5
"""


@pytest.mark.parametrize(
    ("version", "parameters", "expedite"),
    [
        ("26.05.5", "preempt_send_user_signal,enable_expedited_requeue", True),
        ("25.11.0", "enable_expedited_requeue", True),
        ("25.05.3", "enable_expedited_requeue", False),
        ("26.05.5", "(null)", False),
        ("26.05.5", "enable_expedited", False),
        ("", "enable_expedited_requeue", False),
    ],  # fmt: skip
)
def test_expedited_requeue_needs_25_11_and_the_parameter(version: str, parameters: str, expedite: bool):
    from launcher.slurm import releases

    config = slurm.parse_config(CONFIG_26)
    assert config["SLURM_VERSION"] == "26.05.5" and releases.expedites_requeue(config)
    assert config["SchedulerParameters"] == "batch_sched_delay=0,sched_interval=2,bf_interval=1"
    assert releases.expedites_requeue({"SLURM_VERSION": version, "SlurmctldParameters": parameters}) == expedite


def test_one_set_of_live_states_and_the_terminal_ones_apart():
    """protocol.LIVE_STATES (the job side's: a lock's holder, a lease's reader, an eval job) and parse.TERMINAL (the
    launcher's: a job that ended) never both hold a state; SPECIAL_EXIT, a job requeued and held, is live."""
    from launcher import protocol as P
    from launcher.slurm.parse import TERMINAL

    assert P.LIVE_STATES.isdisjoint(TERMINAL)
    assert "SPECIAL_EXIT" in P.LIVE_STATES and "REQUEUE_HOLD" in P.LIVE_STATES and "PENDING" in P.LIVE_STATES
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"} <= TERMINAL
