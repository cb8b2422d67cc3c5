"""The contract between the launcher and the job, in one place: what the launcher writes and the job reads, and what
the job (its supervisor, its node step, training) writes and the launcher reads.

Standard library only: the launcher imports it, and so does the job. The job's lines are written by one function
(`line`), and triage builds its patterns from the same formats (`pattern`), so a line's words cannot drift between
the code that prints it and the code that reads it.
"""

from __future__ import annotations

import re
import string
import time

# The bundle's files (in the bundle directory), and where the batch script and the job's log go.
CONFIG = "config.yaml"
MANIFEST = "manifest.json"
JOB_FILE = "job.json"  # the job's settings (launcher/node/job.py), written once with the bundle
METRICS = "metrics.jsonl"  # one JSON object per logged step (the job appends; the launcher plots)
RUNTIME_RECORD = "runtime.jsonl"  # one JSON object per attempt: what the job really ran (rank 0 appends at start)
STOP_FILE = "stop-requested"  # the supervisor's word to training: checkpoint at the next step and exit
OUTCOME_FILE = "outcome"  # training's word to the supervisor: OUTCOME_FORMAT
REQUEUES_FILE = "requeues"  # one REQUEUE_FORMAT line per requeue the job asked for
RESTARTS_FILE = "restarts"  # one RESTART_FORMAT line per failure the job went on from (a restart, or a requeue)
RANKS_FILE = "ranks"  # training's rank 0, as each node step starts: RANKS_FORMAT, a line a node
STRAGGLERS_FILE = "stragglers.jsonl"  # training's rank 0: one JSON object per rank it names as slower than the others
PROGRESS_FILE = "progress"  # PROGRESS_FORMAT, written by training's rank 0, read by the hang watchdog
HUNG_FILE = "hung"  # the watchdog's finding: HUNG_FILE_FORMAT
NODE_CHECK_REPORT = "node-check"  # the node checks' problems, one "NODE: WHAT" a line
PORT_TAKEN_FILE = "port-taken"  # left by the first node when its rendezvous port was taken
INTERACTIVE_RC = "interactive.rc"  # --interactive: the shell's start-up file (the run's environment)
SWEEP_RECORD = "sweep.json"  # a sweep's record, in its own directory beside the points' bundles
SCRIPT_SUFFIX, LOG_SUFFIX = ".sbatch", ".out"  # <scripts>/<run>/<stamp>.sbatch, <logs>/<run>/<stamp>.out
EXPORT_SCRIPT = "export.sbatch"  # --export_hf: the export job's batch script, in the bundle
EXPORT_RESULT = "export.json"  # the export job's word: the HF folder, its step, its held-out loss (JSON)
EXPORT_LOG_SUFFIX = ".export.out"  # <logs>/<run>/<stamp>.export.out: the export job's log
CHECKPOINTS_RECORD = "checkpoints.jsonl"  # the job's supervisor: a line per checkpoint seen, a line per purge
EVAL_SCRIPT = "eval.sbatch"  # --eval_tasks: the eval job's batch script, in the bundle (its argument: the step)
EVALS_DIR = "evals"  # in the bundle: each eval's result, step-<N>-<key>.json (launcher/evals/record.py)
EVAL_LOG_SUFFIX = ".eval-{step}.out"  # <logs>/<run>/<stamp>.eval-<step>.out: an eval job's log

# Under the run's checkpoints path.
LOCK = ".launcher-lock"  # a directory (mkdir is atomic): one writer per run
LOCK_HOLDER = "job"  # the file in it that names the job holding the lock
TORCH_POINTER = "latest"  # the torch engine's pointer to its newest checkpoint (a step number)
NANOTRON_POINTER = "latest.txt"  # nanotron's
POINTERS = {TORCH_POINTER: "torch", NANOTRON_POINTER: "nanotron"}  # pointer -> the engine that writes it
DATA_CACHE = ".data-cache"  # the torch engine's packed windows
DIALECT_RECORD = "nanotron-dialect"  # the config dialect ("0.4" | "main") the run's checkpoints were written from
WANDB_RUN_ID_FILE = "wandb-run-id"  # the run's one experiment-tracker run: every attempt and restart appends to it
WANDB_LOGGED_FILE = "wandb-logged-to"  # the last step that wandb run holds for certain (written as a run finishes)
NANOTRON_METADATA = "checkpoint_metadata.json"  # in a nanotron checkpoint step: its format "version" (1.2 | 1.5)
SAVES_RECORD = "saves"  # a line per save the launcher's engines began (its step): retention removes only these
LEASES = ".leases"  # a reader's lease on a step (an export, an eval): a file each, named <step>-<holder>.json
PURGING = ".purging-"  # .purging-<step>-<random>: a step renamed out of the steps' names, being deleted
EVALS_SUBMITTED = ".evals"  # each eval job's submission, once across jobs and launches: <step>-<key>.json

# Slurm's job states in which a job may still run (pending, running, requeued or held, ...): one set for the whole house
# (a lock's holder alive, a reader's lease holding, an eval job still to end). SPECIAL_EXIT is a job requeued and held
# (`scontrol release` lets it run again): live, as Slurm counts it pending still. Every other state is the end.
LIVE_STATES = frozenset(
    "PENDING RUNNING SUSPENDED REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING SIGNALING CONFIGURING COMPLETING STAGE_OUT "
    "SPECIAL_EXIT".split()
)

# What training reads from its environment (set by the node step): the bundle, whose files (STOP_FILE, OUTCOME_FILE,
# METRICS, PROGRESS_FILE, RUNTIME_RECORD, RANKS_FILE, STRAGGLERS_FILE) it reads and writes by the names above.
ENV_BUNDLE = "LAUNCHER_BUNDLE"  # (unset: training runs alone, outside a job, and writes none of them)
ENV_SIGNAL_GRACE = "LAUNCHER_SIGNAL_GRACE"  # seconds the time-limit warning comes early (where the job requeues)
ENV_STOP_FILE_EVERY = "LAUNCHER_STOP_FILE_EVERY_S"  # seconds between rank 0's looks for the stop file (default 5)
ENV_NODE_TAG = "LAUNCHER_NODE_TAG"  # "JOB:NODE": the job and the node a training process runs on
ENV_STRAGGLER_EVERY = "LAUNCHER_STRAGGLER_EVERY"  # steps between rank 0's looks at every rank's step time (100)

# The rendezvous port on the first node (torchrun's store, and the node check before it): RDZV_PORT_LOW + job id %
# RDZV_PORT_SPAN, or where that is taken the next free one, wrapping inside the window (RDZV_PORT_TRIES at most):
# 20000-31999, below Linux's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default), where the
# kernel picks the local port of every outgoing connection on the node, so that any of them (srun's, torch's
# store clients', pip's) may hold a port there at the moment the job wants it.
RDZV_PORT_LOW, RDZV_PORT_SPAN, RDZV_PORT_TRIES = 20000, 12000, 500
RDZV_PORT_WINDOW = f"{RDZV_PORT_LOW}-{RDZV_PORT_LOW + RDZV_PORT_SPAN - 1}"

# Training's words as it ends (OUTCOME_FILE), read by the supervisor's end-of-attempt table.
FINISHED, STOPPED = "finished", "stopped"
OUTCOME_FORMAT = "{word} {step}\n"
PROGRESS_FORMAT = "{step} {time:.3f} {phase}\n"
HUNG_FILE_FORMAT = "{step} {idle} {limit}\n"
REQUEUE_FORMAT = "{why} attempt {attempt} step {step} nodes {nodes}"  # why: one of REQUEUE_WHY
REQUEUE_WHY = ("preemption", "time-limit", "hang", "node-check", "node-failure", "failure")
RANKS_FORMAT = "{node} {first} {last}\n"  # the global ranks first..last run on node (torchrun gives a node's in a row)
# why: hang | node-check | node-failure | failure; action: restart (in the allocation) | requeue; job: the Slurm job
# whose step failed (a script submitted again appends to the same file: each job counts only its own); checkpoint
# steps at the step's start and end; step: the last step training logged (- for none); failure: "KIND: SUMMARY" or -
RESTART_FORMAT = (
    "{why} {action} job {job} attempt {attempt} checkpoint {start} {end} step {at} nodes {nodes} failure {failure}"
)
RESTART_FORMAT_NO_JOB = RESTART_FORMAT.replace(" job {job}", "")  # the records written before they named their job

# The job's own lines in its log, behind LINE_PREFIX (`line` writes them); each names its fields in braces.
LINE_PREFIX = "[launcher {stamp}] "
LINE_START = LINE_PREFIX[: LINE_PREFIX.index("{")]
LINES = {
    "attempt_started": "job {job} attempt {attempt} started {when} on {nodes}",
    "attempt_ended": "job {job} attempt {attempt} ended {when}, exit code {code}",
    "debug": "--debug: the node step prints each command it runs; NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, "
    "CUDA_LAUNCH_BLOCKING=1",
    "warned": "time-limit or preemption notice (USR1): the run checkpoints at its next step and is requeued",
    "terminated": "termination signal (a cancel, the time limit, or the end of a preemption's grace time): this "
    "attempt ends",
    "hung": "hung at step {step}: no progress for {idle} s (limit {limit} s); stacks in {stacks}",
    "suspected": "suspected: {nodes} (its training processes' stacks differ from the others')",
    "two_writers": "two jobs of one run: job {holder} ({state}) holds {lock} and trains into {checkpoints}; this job "
    "does not train beside it. Cancel one of them, or chain them: --dependency afterany:{holder}",
    "heartbeat": "heartbeat",
    "no_rank": "node {node} is not in the job's node list ({nodes}): no rank",
    "no_free_port": "no free port for the rendezvous on {node} (tried {ports})",
    "rendezvous": "rendezvous {endpoint} ({backend}), {nodes} x {gpus}, python {python}",  # (`counted`: "1 node")
    "port_taken": "rendezvous port {port} was taken on {node} before torchrun could listen on it: trying another",
    "preemption": "preemption notice: {what}",
    "node_check_failed": "node check failed on {node}: {what}",
    "node_warning": "warning on {node}: {what}",
    "exclude_failed": "could not exclude {nodes} from the requeued job",
    "requeue_preemption": "checkpoint saved at step {step}; requeueing after the preemption; the next attempt resumes",
    # Slurm 24.05+ requeues a preempted job itself (PreemptMode=REQUEUE): the job leaves it to Slurm
    "requeue_by_slurm": "checkpoint saved at step {step}; requeueing after the preemption (by Slurm {version} "
    "itself, PreemptMode=REQUEUE); the next attempt resumes",
    "slurm_requeues_finished": "Slurm {version} requeues a preempted job however it ends: the next attempt finds the "
    "run finished",
    "requeue_time_limit": "checkpoint saved at step {step}; requeueing after the time-limit notice ({count} of "
    "{most}); the next attempt resumes",
    "no_requeue_left": "stopped at the checkpoint of step {step} with no requeue left (--max_requeues {most}): launch "
    "the same command again to resume",
    # (the free-text `why` of a failure comes last: its words may hold anything but a line break)
    "requeue_without": "no healthy nodes left for the layout: requeueing{without}; the next attempt resumes from the "
    "latest checkpoint; after {why}",
    "restart": "restart {count} of {most} in the allocation, leaving out {left}: training again on {nodes} from the "
    "checkpoint of step {step}, after {why}",
    "no_restart": "not restarting or requeueing: {reason}; fix: {fix}; after {why}",
    "no_decision": "no restart decision could be had (its answer: {answer}; what it printed, if anything, is above): "
    "this attempt ends as it would without restarts",
    "notice_over_restart": "the {notice} notice came as the restart was decided: it stands, training is not restarted",
    "stop_file": "stopped at the checkpoint of step {step} on request (the stop file): launch the same command again "
    "to resume",
    "late_notice": "the {notice} notice came as training ended: nothing to resume",
    "pre_launch_ended": "the pre-launch commands ended this attempt at: {command} (exit code {code})",
    "outcome": "training's last word: {word}",
    "purged": "retention removed step(s) {steps} ({freed} freed in {seconds} s); kept {kept}: {rules}",
    "retention_refused": "retention removes nothing: {why}",
    "retention_failed": "retention failed: {error} (a launcher bug: its traceback, if any, is above; please report "
    "it); nothing is removed this time",
    "eval_submitted": "step {step} is evaluated by job {eval_job} ({tasks}; log {log})",
    "eval_not_submitted": "step {step} is not evaluated: {why} (training goes on; jobs evals shows it)",
    "eval_lost": "eval job {eval_job} of step {step} ended without a result: {why} (`jobs evaluate --steps {step} "
    "--again` scores it again)",
    "supervisor_failed": "the job's supervisor failed: {error} (a launcher bug: its traceback is above, please report "
    "it); this attempt ends",
}
# Words a line had before, still read in older logs (same fields, in the same order).
FORMER_LINES = {"node_check_failed": ("preflight failed on {node}: {what}",)}
# What the node checks say of a container (the `what` of node_check_failed); triage knows the cause by its start.
CONTAINER_START = "the container "
CONTAINER_NO_PYTHON = CONTAINER_START + "{image} has no Python at {python}"
CONTAINER_LACKS = CONTAINER_START + "{image}: {python} lacks {modules}"
# What a field matches where a pattern needs more than "anything" (the default).
FIELD_PATTERNS = {
    "step": r"\S+", "steps": r"\d+", "attempt": r"\d+", "job": r"\S+", "node": r"[^:\s]+", "idle": r"[\d.?]+",
    "limit": r"[\d.?]+", "count": r"\d+", "most": r"\d+",
}  # fmt: skip
STAMP_PATTERN = r"\d\d:\d\d:\d\d(?:\.\d+)?"
# training's line for each logged step, and its last words
STEP_LINE = "step {step}/{steps} | "
STOP_MESSAGE = "stop requested: checkpoint saved at step {step}; exiting"
RESUMED_LINE = "resumed from checkpoint step {step} ({path}); rng digest {digest}"  # the torch engine's; the ledger's


def fields(name: str) -> list[str]:
    """The fields a line names, in order."""
    return [f for _, f, _, _ in string.Formatter().parse(LINES[name]) if f]


def now_stamp(now: float | None = None) -> str:
    """A line's time stamp: HH:MM:SS.mmm, local time."""
    now = time.time() if now is None else now
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def counted(n: int, one: str, many: str = "") -> str:
    """`n` and its word, in the plural but for one: "1 node", "2 nodes", "2 processes"."""
    return f"{n} {one if n == 1 else many or one + ('es' if one.endswith('s') else 's')}"


def line(name: str, stamp: str | None = None, **values: object) -> str:
    """A whole line as the job prints it: prefix, then the line (the one writer of the job's lines)."""
    return LINE_PREFIX.format(stamp=stamp or now_stamp()) + LINES[name].format(**values)


def _regex(fmt: str, *former: str) -> str:
    """A format's regular expression: its static text literally (or a former format's in its place), each field a
    named group."""
    out, seen = [], set()
    parts = [list(string.Formatter().parse(f)) for f in (fmt, *former)]
    assert all([p[1] for p in other] == [p[1] for p in parts[0]] for other in parts), f"fields differ: {fmt}"
    for chunks in zip(*parts, strict=True):
        field = chunks[0][1]
        texts = sorted({re.escape(c[0]) for c in chunks})
        out.append(texts[0] if len(texts) == 1 else "(?:" + "|".join(texts) + ")")
        if field:
            out.append(f"(?P={field})" if field in seen else f"(?P<{field}>{FIELD_PATTERNS.get(field, '.*?')})")
            seen.add(field)
    return "".join(out)


PREFIX_PATTERN = "^" + re.escape(LINE_START) + STAMP_PATTERN + re.escape("] ")


def pattern(name: str, whole: bool = True) -> re.Pattern[str]:
    """A line's regular expression: the prefix, then the line (`whole`: to its end, else only its start)."""
    return re.compile(PREFIX_PATTERN + _regex(LINES[name], *FORMER_LINES.get(name, ())) + (r"\s*$" if whole else ""))


def step_pattern() -> re.Pattern[str]:
    """Training's line for a logged step: `step 12/40 | loss ...`."""
    return re.compile("^" + _regex(STEP_LINE))
