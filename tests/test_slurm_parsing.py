"""Parsing what Slurm's commands print (pure): scontrol's one-line records and sacct's parsable lines.

scontrol is also exercised for real by the end-to-end tests; sacct needs an accounting database, which the local
cluster does not run, so its format is pinned here from sacct's documented -P output.
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


@pytest.mark.parametrize(
    "line,state,code,signal,restarts,reason",
    [
        ("COMPLETED|0:0|None|node[1-2]|0", "COMPLETED", 0, 0, 0, "None"),
        ("FAILED|7:0|NonZeroExitCode|node1|1", "FAILED", 7, 0, 1, "NonZeroExitCode"),
        ("CANCELLED by 0|0:15|None|node1|0", "CANCELLED", 0, 15, 0, "None"),
        ("TIMEOUT|0:0||node1|3", "TIMEOUT", 0, 0, 3, "None"),
        ("PENDING|0:0|Priority|None assigned|0", "PENDING", 0, 0, 0, "Priority"),
    ],
)
def test_sacct_line(line: str, state: str, code: int, signal: int, restarts: int, reason: str):
    job = slurm.parse_sacct("7", line)
    assert (job.state, job.exit_code, job.signal, job.restarts, job.reason) == (state, code, signal, restarts, reason)
    assert job.terminal == (state != "PENDING")


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
