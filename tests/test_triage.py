"""Triage: the verdict on a job that ended badly, from Slurm's state and the job's log (launcher/slurm/triage.py).

The torchrun logs are real, recorded by tests/fixtures/triage/make.sh (see its README); the Slurm side of a job's
log (srun, slurmstepd, the batch script's `[launcher ...]` lines) is written here and in launcher_helpers, in the
formats they use.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher_helpers import END, SRUN_KILL, START, TRIAGE_FIXTURES, job_log

from launcher import protocol as P
from launcher.node import failures
from launcher.runs.submission import read_log
from launcher.slurm import fixes, triage
from launcher.slurm.awaited_jobs import NEVER_SATISFIED
from launcher.slurm.parse import JobState


def judge(text: str, state: str = "FAILED", **slurm: object) -> triage.Verdict:
    found = triage.verdict(state, text, **slurm)  # type: ignore[arg-type]
    assert found is not None
    assert found.cause in fixes.CAUSES
    assert 2 <= len(found.lines()) <= 3 and found.fix  # one or two lines of why, one of what to do
    return found


def test_completed_has_no_verdict():
    assert triage.verdict("COMPLETED", job_log("exception-1node.log")) is None


@pytest.mark.parametrize("fixture", ["exception-1node.log", "exception-record.log"])
def test_an_exception_names_the_rank_that_raised_it_not_the_ones_stopped_after(fixture: str):
    v = judge(job_log(fixture), exit_code=143)
    assert (v.cause, v.rank, v.node) == ("exception", 1, "node1")
    assert "ValueError: shard 7 of /data/tokenized has 0 samples, expected 4096 (rank 1)" in v.message
    assert "at fail.py:72 in main" in v.message  # where in the code
    assert "exit code 143 is srun stopping the other ranks after it" in v.message
    assert "RuntimeError" not in v.message and "[rank1]" in v.fix


def test_two_nodes_the_first_to_raise_wins_over_each_nodes_own_root_cause():
    # node1's torchrun calls its rank 1 the root cause; that rank only lost its peer on node2
    text = job_log("exception-2nodes.log")
    roots = [f for f in failures.child_failures(text.splitlines()) if f.root]
    assert {(f.rank, f.host) for f in roots} == {(1, "node1"), (3, "node2")}
    v = judge(text, exit_code=143)
    assert (v.cause, v.rank, v.node, v.where) == ("exception", 3, "node2", "rank 3 on node2")
    assert "raised ValueError" in v.message and "(rank 3)" in v.message


def test_two_nodes_with_srun_stopping_the_healthy_node():
    # the ranks on node1 are stuck (as in an NCCL collective) when rank 3 raises: node2's torchrun exits 1, and
    # srun (--kill-on-bad-exit) sends node1's torchrun SIGTERM: a SignalException, no summary from node1
    text = job_log("exception-2nodes-srun.log")
    assert "SignalException: Process" in text and len([f for f in failures.child_failures(text.splitlines())]) == 2
    v = judge(text, exit_code=143)
    assert (v.cause, v.rank, v.node) == ("exception", 3, "node2") and "raised ValueError" in v.message
    assert "SignalException" not in v.message and "exit code 143 is srun stopping" in v.message


def test_two_nodes_without_tracebacks_torchruns_summaries_decide():
    # only torchrun's summaries and srun's lines left (the tracebacks fell outside the excerpt): the root cause
    # that did not just lose a peer has no traceback here either, so the earliest non-stopped entry is named
    text = "\n".join(line for line in job_log("exception-2nodes.log").splitlines() if not line.startswith("[rank"))
    v = judge(text)
    assert v.rank in (1, 3) and v.node in ("node1", "node2") and "exited with code 1" in v.message


def test_cuda_out_of_memory_names_the_flags_to_change():
    flags = {"micro_batch_size": 4, "grad_accum_steps": 8, "tp": 2, "pp": 1}
    v = judge(job_log("cuda-oom.log"), exit_code=143, flags=flags)
    assert (v.cause, v.rank, v.node) == ("cuda_oom", 1, "node1")
    assert "ran out of GPU memory on GPU 0: tried to allocate 2.00 GiB with 1.19 GiB of 79.11 GiB free" in v.message
    assert "--micro_batch_size 2 --grad_accum_steps 16 (the same batch)" in v.fix
    assert "--tp 4 or --pp 2" in v.fix


def test_an_out_of_memory_that_stopped_the_restarts_keeps_the_flags_to_change():
    stop = P.line(
        "no_restart",
        reason="the same out-of-memory as the failure before, at the same point of the run "
        "(before its first step): torch.OutOfMemoryError",
        fix="fit the step in memory",
        why="a failure",
    )
    flags = {"micro_batch_size": 4, "grad_accum_steps": 8, "tp": 2, "pp": 1}
    v = judge(job_log("cuda-oom.log") + stop + "\n", exit_code=1, flags=flags)
    assert v.cause == "cuda_oom" and "not restarted: the same out-of-memory" in v.message
    assert "--micro_batch_size 2 --grad_accum_steps 16 (the same batch)" in v.fix


def test_oom_fix_without_flags_at_micro_batch_1_and_with_the_memory_models_note():
    assert "halve --micro_batch_size and double --grad_accum_steps" in triage.oom_fix()
    assert "a larger --tp or a larger --pp" in triage.oom_fix()
    at_one = triage.oom_fix({"micro_batch_size": 1, "grad_accum_steps": 8, "tp": 1, "pp": 1})
    assert "--micro_batch_size is 1 already" in at_one and "--tp 2 or --pp 2" in at_one
    noted = triage.oom_fix(None, "the memory model puts this run at 86 GiB per GPU of 80")
    assert noted.startswith("the memory model puts this run at 86 GiB per GPU of 80; halve --micro_batch_size")
    v = judge(job_log("cuda-oom.log"), memory_note="the memory model puts this run at 86 GiB per GPU of 80")
    assert v.fix.startswith("the memory model")


def test_an_nccl_error_says_what_nccl_said():
    v = judge(job_log("nccl-error.log"))
    assert (v.cause, v.rank, v.node) == ("nccl", 1, "node1")
    assert "NCCL error: unhandled system error (NCCL 2.27.3)" in v.message
    assert "socketStartConnect: Connect to 10.10.0.12<47311> failed" in v.message
    assert "--exclude" in v.fix and "NCCL_DEBUG=INFO" in v.fix


def test_an_nccl_timeout_names_the_collective_and_the_rank():
    v = judge(job_log("nccl-timeout.log"))
    assert (v.cause, v.rank, v.node) == ("nccl", 1, "node1")
    assert "collective ALLREDUCE (SeqNum 1207) timed out after 600 s" in v.message
    assert "never reached that collective" in v.fix


def test_the_jobs_own_error_line_is_bad_input():
    text = job_log("user-error.log")
    (root,) = [f for f in failures.child_failures(text.splitlines()) if f.root]  # each rank printed it, exit 2
    v = judge(text, exit_code=2)
    assert (v.cause, v.rank, v.node) == ("bad_input", root.rank, "node1")
    assert "dataset /scratch/run/dataset has no column 'content' (columns: text)" in v.message
    assert "--text_column" in v.fix


def test_the_jobs_error_line_keeps_a_config_errors_problems():
    text = START + "error: config /c.yaml cannot train with 4 process(es):\n  - tp 3 does not divide 4 heads\n"
    v = judge(text)
    assert v.cause == "bad_input" and "cannot train with 4 process(es): - tp 3 does not divide 4 heads" in v.message


def test_a_hang_points_at_the_stacks():
    hang = P.line("hung", stamp="15:02:10.004", step=812, idle=615, limit=600, stacks="/l/stacks")
    v = judge(START + "step 812/1000 | loss 2.1\n" + hang + "\n" + SRUN_KILL, exit_code=143)
    assert v.cause == "hung" and "training hung at step 812: no progress for 615 s (limit 600 s)" in v.message
    assert "/l/stacks" in v.fix


def test_a_failed_node_check_names_the_node_to_exclude():
    line = P.line("node_check_failed", node="node2", what="0 of 2 GPUs visible")
    v = judge(START + line + "\n", exit_code=1)
    assert (v.cause, v.node) == ("preflight", "node2") and "0 of 2 GPUs visible" in v.message
    assert "--exclude node2" in v.fix


def test_preemption_by_state_and_by_the_jobs_notice():
    v = judge(START + "step 30/100 | loss 3.0\n", "PREEMPTED")
    assert v.cause == "preempted" and "at step 30 of 100" in v.message and "--max_requeues" in v.fix
    notice = P.line("preemption", what="SIGTERM from Slurm, grace 60 s")
    v = judge(START + notice + "\n" + job_log("exception-1node.log"), "FAILED", exit_code=143)
    assert v.cause == "preempted" and "SIGTERM from Slurm, grace 60 s" in v.message  # not the exception after it


def test_time_limit_with_no_requeue_left_and_without_the_warning_handled():
    spent = P.line("warned") + "\n" + P.line("no_requeue_left", step=520, most=3) + "\n"
    v = judge(START + spent, "FAILED", exit_code=3)  # the script exits 3 before Slurm's limit
    assert v.cause == "time_limit" and "no requeue left" in v.message and "step 520" in v.message
    assert "resume from step 520" in v.fix and "--max_requeues" in v.fix
    timeout = "slurmstepd: error: *** JOB 48 ON node1 CANCELLED AT 2026-11-23T15:41:47 DUE TO TIME LIMIT ***\n"
    v = judge(START + "step 77/500 | loss 2.0\n" + timeout, "TIMEOUT")
    assert v.cause == "time_limit" and "at step 77 of 500" in v.message and "--max_requeues" in v.fix
    v = judge(START + spent.splitlines()[0] + "\n" + timeout, "TIMEOUT")
    assert "--signal_grace" in v.fix  # warned, but the checkpoint did not finish in time


def test_the_node_of_the_batch_script_failing_is_a_node_failure():
    """Slurm ends a --no-kill job FAILED when the node its batch script runs on fails (recorded on Slurm 24.11: the
    log's last line is srun's); where the script spoke after srun, it lived on, and the failure was not that."""
    v = judge(START + "step 276/700 | loss 0.46\nsrun: error: Node failure on node1\n", "FAILED", nodes="node[1-3]")
    assert (v.cause, v.node) == ("node_fail", "node1") and "the job's batch script, which runs there" in v.message
    assert "--exclude node1" in v.fix
    lived_on = judge(START + "srun: error: Node failure on node2\nTraceback (most recent call last):\n", "FAILED")
    assert lived_on.cause != "node_fail"


def test_node_failure_names_the_node():
    v = judge(START + "step 5/9 | loss 3\nsrun: error: Node failure on node2\n", "NODE_FAIL", nodes="node[1-2]")
    assert (v.cause, v.node) == ("node_fail", "node2") and "node node2 failed (NODE_FAIL)" in v.message
    assert "--exclude node2" in v.fix and "resume" in v.fix
    v = judge(START, "NODE_FAIL", nodes="node[1-2]")  # Slurm's node list when the log does not say which
    assert "one of the job's nodes (node[1-2])" in v.message
    v = judge(START, "NODE_FAIL", nodes="gpu-a07")
    assert "node gpu-a07 failed" in v.message and "--exclude gpu-a07" in v.fix


def test_cancelled_by_a_user_and_for_a_dependency():
    v = judge(START + "step 3/9 | loss 3\n", "CANCELLED")
    assert v.cause == "cancelled" and "at step 3 of 9" in v.message and "nothing failed" in v.fix
    assert "before it started" in judge("", "CANCELLED").message
    v = judge("", "CANCELLED", reason=NEVER_SATISFIED, dependency="afterok:15(failed)")
    assert v.cause == "dependency"
    assert "it never started: its dependency can no longer be met (afterok:15(failed))" in v.message
    assert "afterany" in v.fix


def test_host_out_of_memory():
    oom = (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=48.0. Some of the step tasks have been OOM Killed.\n"
        "srun: error: node2: task 1: Out Of Memory\n"
    )
    v = judge(START + oom, "OUT_OF_MEMORY", exit_code=0)
    assert (v.cause, v.node) == ("host_oom", "node2") and "--mem" in v.fix
    assert judge(START + oom, "FAILED").cause == "host_oom"  # the step's OOM kill in a job that ended FAILED


def test_a_signal_without_traceback_is_a_crash():
    summary = (TRIAGE_FIXTURES / "nccl-timeout.log").read_text().split("Root Cause", 1)[1].replace("-6", "-11")
    v = judge(START + "Root Cause" + summary.replace("SIGABRT", "SIGSEGV"))
    assert (v.cause, v.rank) == ("crash", 1) and "SIGSEGV" in v.message


def test_a_stop_on_request_and_a_log_that_says_nothing():
    stop = P.line("stop_file", step=40) + "\n"
    assert judge(START + stop, exit_code=3).cause == "stopped"
    v = judge(START + "something odd\n", exit_code=1)
    assert v.cause == "unknown" and "its last line: something odd" in v.message


def test_only_the_last_attempt_is_judged():
    first = job_log("exception-1node.log")
    second = START.replace("attempt 1", "attempt 2") + "step 9/9 | loss 1\n" + END
    text = triage.excerpt((first + second).splitlines(keepends=True))
    assert "ValueError" not in text
    assert judge(text, "CANCELLED").cause == "cancelled"


def test_the_excerpt_is_bounded_and_keeps_the_first_failure_and_the_tail(tmp_path: Path):
    log = tmp_path / "big.out"
    with open(log, "w") as f:
        f.write(START + "x" * 5_000_000 + "\n")  # a line of 5 MB (a progress bar without newlines)
        f.write(job_log("exception-2nodes.log"))
        for n in range(200_000):
            f.write(f"[rank0]: noise line {n} after the failure, from a rank that kept logging\n")
        f.write(P.line("attempt_ended", job=48, attempt=1, when="2026-11-23T15:00:00+00:00", code=143) + "\n")
    text = read_log(log)
    assert len(text) < 4_000_000 and log.stat().st_size > 15_000_000
    assert "[rank3]: ValueError" in text and "noise line 199999" in text and "attempt 1 ended" in text
    v = judge(text, exit_code=143)
    assert (v.rank, v.node) == (3, "node2")
    assert read_log(tmp_path / "missing.out") == ""


def test_for_job_reads_slurms_record():
    job = JobState("48", "FAILED", "NonZeroExitCode", 143, None, 0, "node[1-2]")
    v = triage.for_job(job, job_log("exception-2nodes.log"))
    assert v is not None and v.record() == {
        "cause": "exception",
        "where": {"rank": 3, "node": "node2"},
        "message": v.message,
        "fix": v.fix,
    }
    assert json.loads(json.dumps(v.record())) == v.record()


def test_a_harmless_traceback_early_on_does_not_hide_the_failure_in_the_middle():
    warning = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nImportError: no apex\n'
    middle = job_log("exception-2nodes.log").replace(START, "")
    noise = "".join(f"step {n}/9999 | loss 2.0\n" for n in range(5000))
    text = triage.excerpt((START + warning + noise + middle + noise).splitlines(keepends=True))
    assert "ImportError: no apex" in text and "[rank3]: ValueError" in text and "step 4999/9999" in text
    assert judge(text).rank == 3  # torchrun's summaries say which ranks failed: they outrank a stray traceback


def test_a_chained_exception_is_named_by_its_last_link():
    chain = (
        '[rank2]: Traceback (most recent call last):\n[rank2]:   File "/x/data.py", line 9, in load\n'
        "[rank2]: KeyError: 'input_ids'\n\n"  # torch's excepthook leaves blank lines unprefixed
        "[rank2]: The above exception was the direct cause of the following exception:\n\n"
        '[rank2]: Traceback (most recent call last):\n[rank2]:   File "/x/train.py", line 40, in step\n'
        "[rank2]: RuntimeError: batch 17 has no input_ids\n"
    )
    (raised,) = failures.tracebacks(chain.splitlines())
    assert (raised.rank, raised.type, raised.message, raised.frame) == (
        2, "RuntimeError", "batch 17 has no input_ids", "train.py:40 in step"
    )  # fmt: skip
    assert raised.line == 0  # where the chain starts


def test_a_big_log_is_read_from_its_end_only(tmp_path: Path):
    from launcher.runs.submission import read_log
    from launcher.slurm import logread

    log = tmp_path / "big.out"
    with open(log, "w") as f:
        f.write("[launcher 10:00:00.000] job 5 attempt 1 started 2026-11-24T10:00:00+00:00 on node1\n")
        f.write("x" * 3000 + "\n")  # a long line across the cut
        f.writelines(f"step {i}/100000 | loss 2.0\n" for i in range(200_000))
        f.write("Traceback (most recent call last):\nRuntimeError: CUDA error: an illegal memory access\n")
    lines = list(logread.tail_lines(log, max_bytes=10_000))
    assert lines[0].startswith("step ") and lines[-1].startswith("RuntimeError") and sum(map(len, lines)) <= 10_000
    assert lines == log.read_text().splitlines(keepends=True)[-len(lines) :]  # whole lines, the file's last ones
    assert "RuntimeError: CUDA error: an illegal memory access" in read_log(log)


NANOTRON_RAISES = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/u/run_train.py", line 40, in <module>
[rank1]:     code = main()
[rank1]:   File "/home/u/venv/lib/python3.11/site-packages/nanotron/trainer.py", line 559, in train
[rank1]:     outputs, loss_avg = self.training_step(dataloader=self.current_dataloader)
[rank1]:   File "/v/site-packages/nanotron/parallel/pipeline_parallel/engine.py", line 292, in train_batch_iter
[rank1]:     output = self.forward(context=context, state=state, micro_batch=micro_batch, model=model)
[rank1]:   File "/home/u/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _call_impl
[rank1]:     return forward_call(*args, **kwargs)
[rank1]: RuntimeError: shape '[2, 64, 4, 16]' is invalid for input of size 4096
"""


def test_an_exception_inside_nanotron_is_named_so():
    """A traceback whose frames run through nanotron's own package: the verdict names nanotron's frame (not only
    torch's innermost one) and says what to do about a failure in nanotron itself."""
    v = judge(START + NANOTRON_RAISES + END, exit_code=1)
    assert (v.cause, v.rank) == ("nanotron", 1)
    assert "raised RuntimeError: shape '[2, 64, 4, 16]' is invalid" in v.message
    assert "inside nanotron's own code, at nanotron/parallel/pipeline_parallel/engine.py:292 in train_batch_iter" in (
        v.message
    )
    assert "(innermost: module.py:1751 in _call_impl)" in v.message
    assert "report it to nanotron" in v.fix and "--engine torch" in v.fix
    launcher_only = NANOTRON_RAISES.replace("site-packages/nanotron/", "site-packages/launcher/train/nanotron_engine/")
    assert judge(START + launcher_only + END, exit_code=1).cause == "exception"  # the launcher's own engine: not it


def test_a_failure_inside_nanotron_that_stopped_the_restarts_keeps_its_own_fix():
    """The batch script stopped restarting after the same failure came again: the verdict says so, and its fix is
    still what to do about a failure in nanotron itself, not only to correct what the traceback points at."""
    stop = P.line(
        "no_restart",
        reason="the same exception as the failure before, at the same point of the run (after "
        "step 2): RuntimeError: shape",
        fix="correct what its traceback points at",
        why="a failure (rank 1)",
    )
    v = judge(START + NANOTRON_RAISES + stop + "\n" + END, exit_code=1)
    assert v.cause == "nanotron" and "in train_batch_iter" in v.message
    assert "; not restarted: the same exception as the failure before" in v.lines()[1]
    assert "report it to nanotron" in v.fix and "--engine torch" in v.fix
