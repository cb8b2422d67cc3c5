"""What to do about a run that ended badly, in the launcher's own words (its flags): the fix for each cause that
triage names (`launcher.slurm.triage`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESUME = "launch the same command again: it resumes from the last checkpoint"
FIXES = {  # what to do, by cause, in the launcher's own words (its flags)
    "exception": "correct what its traceback ({trace}) points at, then " + RESUME,
    "nanotron": "read its traceback ({trace}): where it names your config or data, correct that (--config, the "
    "flags) and " + RESUME + "; otherwise it is nanotron's own failure, which the launcher does not mend "
    "(docs/engines.md lists those it does): report it to nanotron with that traceback, and --engine torch trains a "
    "data-parallel layout (--tp 1 --pp 1) meanwhile",
    "nccl": "most often a network or node fault, not the run: " + RESUME + "; if it fails again on that node, "
    "--exclude it; --extra_env NCCL_DEBUG=INFO logs NCCL's details",
    "nccl_timeout": "one rank never reached that collective: look for a rank that failed, hung or lagged first (data "
    "loading, I/O, another code path); if none did, suspect the network (--extra_env NCCL_DEBUG=INFO); " + RESUME,
    "bad_input": "correct the data or config it names (--dataset, --text_column, --tokenizer, --config), then launch "
    "again",
    "host_oom": "ask for more host memory per node: --mem 0 takes all of it (or a larger --mem); a smaller "
    "--micro_batch_size needs less",
    "crash": "a crash in native code (CUDA, NCCL, an extension): the log shows its Python stack (faulthandler) "
    "above torchrun's summary; " + RESUME,
    "killed": "SIGKILL with no traceback is most often the host's out-of-memory killer: try a larger --mem",
    "exited": "read the log's lines before torchrun's summary; " + RESUME,
    "node_fail": "not the run's fault: " + RESUME + "; --exclude {node} keeps it off that node",
    "preflight": "keep the run off that node with --exclude {node} (and tell the cluster's admins), then launch again",
    "container": "give --container_image an image that holds it, or a --python on a host path the nodes see (the "
    "launcher mounts its installation); docs/containers.md says what an image must hold",
    "hung": "read the stacks in {stacks}: the rank not waiting where the others wait is the culprit (a collective it "
    "never reached, data loading, I/O); " + RESUME,
    "preempted": RESUME + "; --max_requeues N requeues it by itself; a --partition or --qos that is not "
    "preemptible avoids it",
    "time_limit_spent": "launch the same command again to resume from step {step}; a larger --max_requeues or "
    "--time_limit goes further per launch",
    "time_limit": RESUME + " (saved every --save_interval steps); with --max_requeues N it checkpoints and requeues "
    "itself at the limit",
    "time_limit_late": "; the warning came but the checkpoint did not finish in time: raise --signal_grace",
    "cancelled": "nothing failed: " + RESUME,
    "dependency": "launch it again once the job it waits for has succeeded, or with --dependency afterany:ID",
    "stopped": RESUME,
    "unknown": "read the end of the job's log",
    "pre_launch": "correct --pre_launch_commands (they run in the batch script before training, under `set -e`: a "
    "failing command or an `exit` ends the job there), then launch again",
    "not_trained": "nothing failed that Slurm saw: read the job's log above its last lines; " + RESUME,
    "not_restarted": "read the log of the last node steps; " + RESUME,
}
CAUSES = (
    "exception", "nanotron", "cuda_oom", "nccl", "node_fail", "time_limit", "preempted", "bad_input", "dependency",
    "hung", "preflight", "container", "cancelled", "host_oom", "crash", "stopped", "pre_launch", "not_trained",
    "not_restarted", "unknown",
)  # fmt: skip


def oom_fix(flags: Mapping[str, Any] | None = None, memory_note: str | None = None) -> str:
    """The fix for CUDA out of memory, from the run's flags where known (micro_batch_size, grad_accum_steps, tp, pp).

    `memory_note`: the memory model's estimate for these flags (launcher/perf/memory.py, once it exists), e.g.
    "the memory model puts this run at 86 GiB per GPU of 80": it goes first."""
    flags = flags or {}
    mbs, accum, tp, pp = (flags.get(k) for k in ("micro_batch_size", "grad_accum_steps", "tp", "pp"))
    if isinstance(mbs, int) and isinstance(accum, int) and mbs > 1:
        batch = f"use --micro_batch_size {mbs // 2} --grad_accum_steps {accum * 2} (the same batch)"
    elif mbs == 1:
        batch = "--micro_batch_size is 1 already"
    else:
        batch = "halve --micro_batch_size and double --grad_accum_steps (the same batch)"
    tp_text = f"--tp {tp * 2}" if isinstance(tp, int) else "a larger --tp"
    split = f"{tp_text} or {f'--pp {pp * 2}' if isinstance(pp, int) else 'a larger --pp'}"
    fix = f"{batch}, or shard the model over more GPUs: {split}"
    return f"{memory_note}; {fix}" if memory_note else fix
