"""The flags: one dataclass per group, a comment under every field (the --help text, `launcher.config.cli`).

Flag names and defaults follow the nanotron Slurm launcher. Fields that are derived (model shape from
--model_size, dp from the job size) default to None, meaning "derive it"; `explicit_flags` tells which flags the
user typed, so that flags override --config, which overrides the preset.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field


@dataclass
class SlurmArgs:
    """Slurm resources and job options."""

    nodes: int = 2  # Number of nodes.
    gpus_per_node: int = 8  # GPUs per node; torchrun starts one process per GPU.
    cpus_per_node: int | None = None  # CPUs per node (default: the nodes' CPUs, in proportion to the GPUs asked).
    partition: str | None = None  # Slurm partition (default: the cluster's default partition).
    qos: str | None = None  # Slurm QOS (default: the cluster's default QOS).
    account: str | None = None  # Slurm account to charge (default: your default account).
    constraint: str | None = None  # Node features the job needs, e.g. h100 or "h100&ib" (Slurm's --constraint).
    reservation: str | None = None  # Run inside this reservation.
    nodelist: str | None = None  # Run on these nodes (a Slurm hostlist, e.g. gpu[01-04]).
    exclude: str | None = None  # Never run on these nodes (a hostlist), e.g. one that misbehaves.
    exclusive: bool = False  # Whole nodes, shared with no other job.
    mem: str | None = None  # Memory per node, e.g. 500G, or 0 for all of it (default: the cluster's default).
    time_limit: str = "1:00:00"  # Time limit: [D-]HH:MM:SS, MM:SS or minutes.
    dependency: str | None = None  # Start after other jobs, e.g. afterok:123 (Slurm's --dependency; ids checked).
    export_partition: str | None = None  # Partition of the --export_hf job (default: the run's --partition).
    email: str | None = None  # E-mail for job notifications (END, FAIL).
    tmp_dir: str = "/tmp"  # Temporary directory on compute nodes (exported as TMPDIR).
    pre_launch_commands: str | None = None  # Shell commands run on the batch node before launch.
    extra_env: str | None = None  # Extra environment: KEY=VALUE pairs, separated by spaces or newlines.
    python: str | None = None  # Python that runs torchrun on the nodes (default: the launcher's own).
    nanotron_dialect: str = "auto"  # Config dialect: auto (the --python's nanotron, by its schema), 0.4 or main.
    max_requeues: int = 3  # Times a preempted or timed-out job is requeued to resume; 0 disables.
    spare_nodes: int = 0  # Nodes beyond the layout's, idle until one fails: training goes on there, in the same job.
    max_restarts: int = 10
    """Times training starts again in the allocation (or the job requeues) after a hang, a failed process or node;
    0: none (such a failure ends the job)."""
    signal_grace: int = 120  # Seconds before the time limit at which the job checkpoints and requeues.
    gpu_type: str | None = None  # GPU to plan for, e.g. h100, a100_80gb (default: the cluster's GRES type or h100).
    gpu_memory_gb: float | None = None  # GPU memory in GB (2^30 bytes) to plan for, e.g. 40 (default: the GPU type's).


@dataclass
class ModelArgs:
    """Model shape: a preset, with any field overridden."""

    model_size: str = "tiny"  # Preset under configs/presets: tiny, small, base, large, 1b, 3b, 7b, 8b, 13b, 70b.
    hidden_size: int | None = None  # Hidden size (default: from the preset).
    intermediate_size: int | None = None  # MLP intermediate size (default: from the preset).
    num_layers: int | None = None  # Number of transformer layers (default: from the preset).
    num_heads: int | None = None  # Attention heads (default: from the preset).
    num_kv_heads: int | None = None  # Key/value heads, GQA when < num_heads (default: from the preset).
    vocab_size: int | None = None  # Vocabulary size (default: the local tokenizer's, else the preset's).
    max_seq_len: int | None = None  # Sequence length and max positions (default: from the preset).
    rope_theta: float | None = None  # RoPE base (default: the preset's; nanotron 0.4 has only 10000).


@dataclass
class TrainingArgs:
    """Optimisation."""

    seed: int = 42  # Random seed.
    train_steps: int = 10000  # Number of optimizer steps.
    micro_batch_size: int = 2  # Sequences per GPU per forward pass.
    grad_accum_steps: int = 8  # Micro-batches accumulated per optimizer step.
    learning_rate: float = 3e-4  # Peak learning rate.
    min_lr: float = 3e-5  # Learning rate at the end of the decay.
    weight_decay: float = 0.01  # AdamW weight decay.
    grad_clip: float = 1.0  # Gradient clipping norm; 0 disables.
    warmup_steps: int = 1000  # Linear warmup steps.
    lr_decay_style: str = "cosine"  # Decay after warmup: cosine or linear.


@dataclass
class ParallelismArgs:
    """Parallelism: dp x tp x pp x cp must equal nodes x gpus_per_node."""

    dp: int | None = None  # Data parallel degree (default: fills the job: nodes*gpus/(tp*pp)).
    tp: int | None = None  # Tensor parallel degree (default: from the preset).
    pp: int | None = None  # Pipeline parallel degree (default: from the preset).
    cp: int = 1  # Context parallel degree: each sequence split over cp GPUs (nanotron main only).
    zero_stage: int = 0  # ZeRO stage: 1 shards the fp32 weights and Adam's states over dp (nanotron 0.4 has 0 and 1).
    pp_engine: str = "1f1b"  # Pipeline schedule: 1f1b (a stage holds at most pp micro-batches) or afab (all of them).
    tp_mode: str = "REDUCE_SCATTER"  # Tensor parallel mode: REDUCE_SCATTER (sequence parallel) or ALL_REDUCE.
    layout: str = "manual"  # manual: --tp, --pp, batch as given; auto: the planner's best that fits (--plan).


@dataclass
class DataArgs:
    """Training data."""

    dataset: str | None = "stas/openwebtext-10k"  # Hub dataset name or a local path; "none" for random tokens.
    text_column: str = "text"  # Column holding the text.
    data_stages: str | None = None  # Later data stages (nanotron main), NAME@STEP=DATASET;...: anneal@900=/data/hq.
    tokenizer: str = "robot-test/dummy-tokenizer-wordlevel"  # Hub tokenizer name or local directory.


@dataclass
class PathArgs:
    """Where things go."""

    project: str = "nanotron"  # Project name (wandb project, nanotron general.project).
    configs_path: str = "logs/configs"  # Bundles: config YAML and manifest, one directory per launch.
    slurm_logs_path: str = "logs/slurm_logs"  # Slurm output logs.
    checkpoints_path: str = "checkpoints"  # Checkpoints, under <checkpoints_path>/<run_name>.
    slurm_scripts_dir: str = "logs/slurm_scripts"  # Generated sbatch scripts.
    run_train_script: str = "run_train.py"  # Training script started by torchrun on every node.
    save_interval: int = 1000  # Checkpoint every N steps.
    save_initial_state: bool = False  # Save a checkpoint before the first step.
    keep_last: int | None = None
    """Keep only the N newest complete checkpoints (and --keep_every's); the job removes older ones as it saves
    (default: every checkpoint is kept)."""
    keep_every: int | None = None  # Keep for good every checkpoint whose step is a multiple of K (of --save_interval).
    checkpoints_remote: str | None = None
    """Copy every complete checkpoint to S3-compatible object storage, s3://BUCKET/PREFIX (the run's under
    PREFIX/<its checkpoints folder's name>), and resume from there where the checkpoints folder has none as new
    (credentials: AWS's variables or profiles in your environment, never a flag)."""
    s3_endpoint: str | None = None
    """The S3 endpoint, e.g. https://storage.googleapis.com or your site's Ceph (default: S3_ENDPOINT_URL or
    AWS_ENDPOINT_URL in your environment, else AWS's)."""
    keep_last_remote: int | None = None  # Keep only the N newest complete checkpoints in the bucket (default: all).
    resume: bool = True  # Resume from this run's latest checkpoint if there is one; false starts afresh.


@dataclass
class LoggingArgs:
    """Logging."""

    wandb_disabled: bool = False  # Disable Weights & Biases (WANDB_MODE=disabled in the job).
    log_interval: int = 1  # Log every N steps.
    profiler_export_path: str | None = None  # Export torch profiler traces there (needs train_steps < 10).


@dataclass
class ExecutionArgs:
    """What to do with the bundle."""

    dry_run: bool = False  # Write the bundle, do not submit.
    show_logs: bool = False  # Follow the job's log and state until it ends.
    export_hf: bool = False
    """After training, a CPU job (chained: afterok) exports the last checkpoint as a Hugging Face model and prints
    its held-out perplexity (docs/export.md)."""
    config: str | None = None  # Start from this nanotron YAML; flags override it.
    sweep: str | None = None  # One run per grid point, e.g. "learning_rate=1e-4,3e-4 seed=1,2" (runs RUN-1..4).
    plan: bool = False  # Print the layouts that fit this model, job and batch, best first; write and submit nothing.
    skip_memory_check: bool = False  # Go ahead where the memory estimate says the layout does not fit the GPU.
    interactive: bool = False  # Allocate the run's nodes (salloc) and open a shell on the first, with its environment.


@dataclass
class JobArgs:
    """How the job guards itself on the nodes."""

    preflight: bool = True  # Check every node before training (GPUs, paths, Python, the rendezvous); false skips it.
    hang_timeout: int = 1800
    """Seconds in a checkpoint save (and, unless --startup_timeout, to an attempt's first step) that make a hang;
    0: no watchdog."""
    startup_timeout: int | None = None
    """Seconds an attempt may take to its first step (start-up, data loading, compilation, a resume) before it counts
    as hung (default: --hang_timeout)."""
    hang_factor: float = 10.0  # Between steps, a hang is this many median step times with no step (at least 60 s).
    debug: bool = False  # Trace the node side; NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, CUDA_LAUNCH_BLOCKING=1.
    engine: str = "auto"  # Training engine: auto (nanotron where CUDA and nanotron are, else torch), nanotron, torch.
    compile_layers: bool = False
    """The nanotron engine compiles each of its decoder layers with torch.compile at the first step (the torch engine
    compiles its own on GPUs whatever this says)."""
    rdzv_backend: str = "auto"  # torchrun's rendezvous: auto (c10d up to 256 nodes, static beyond), c10d or static.


@dataclass
class ContainerArgs:
    """The node step in a container (pyxis + enroot: srun --container-image); the batch script stays on the host."""

    container_image: str | None = None  # A squashfs image (a path starting with / or .) or a registry reference.
    container_mounts: str | None = None  # More mounts, SRC[:DST[:ro]] comma-separated (the run's paths are added).
    container_workdir: str | None = None  # Working directory inside the container (default: the image's $HOME).
    container_env: str | None = None  # Variables whose host values replace the image's, e.g. PATH,LD_LIBRARY_PATH.
    container_writable: bool = False  # Make the container's root filesystem writable (default: read-only).


@dataclass
class EvalArgs:
    """Downstream scores of the checkpoints: an lm-eval job per evaluated step, beside training (docs/evals.md)."""

    eval_tasks: str | None = None
    """lm-eval task names, comma-separated (e.g. hellaswag,arc_easy); a preset of configs/evals among them
    (early-signal) stands for its tasks."""
    eval_include: str | None = None  # A folder of your own lm-eval task YAMLs (e.g. over local JSONL files).
    eval_every: int | None = None  # Evaluate every N steps, a multiple of --save_interval (default: the last step).
    eval_limit: int | None = None  # Samples per task (default: every sample).
    eval_partition: str | None = None  # Partition of the eval jobs (default: the run's --partition).
    eval_gpus: int = 0  # GPUs of each eval job (0: its node's CPUs).
    eval_time_limit: str | None = None
    """Time limit of each eval job: [D-]HH:MM:SS, MM:SS or minutes (default: the run's --time_limit, at most 4
    hours)."""
    eval_heldout: str | None = None
    """Held-out data for the loss and bits per byte at each evaluated step: split:NAME of the run's local dataset,
    tail:N (the last N tokens of the tokenized folder it trains on, kept out of training; N may end in k, M or G), or
    another local dataset the run does not train on (a save_to_disk folder, a .jsonl/.json/.parquet/.csv file, a .txt
    file of one document a line, a tokenized folder); or domains, a loss each: NAME=SOURCE,NAME=SOURCE."""
    rank_by: str | None = None  # --sweep: rank the points by this task's score (TASK or TASK:METRIC), best first.


@dataclass
class LaunchArgs:
    """All flags, by group."""

    run_name: str  # Name of the run: job name, bundle and checkpoint directories.
    slurm: SlurmArgs = field(default_factory=SlurmArgs)
    model: ModelArgs = field(default_factory=ModelArgs)
    training: TrainingArgs = field(default_factory=TrainingArgs)
    parallelism: ParallelismArgs = field(default_factory=ParallelismArgs)
    data: DataArgs = field(default_factory=DataArgs)
    paths: PathArgs = field(default_factory=PathArgs)
    logging: LoggingArgs = field(default_factory=LoggingArgs)
    execution: ExecutionArgs = field(default_factory=ExecutionArgs)
    job: JobArgs = field(default_factory=JobArgs)
    container: ContainerArgs = field(default_factory=ContainerArgs)
    evals: EvalArgs = field(default_factory=EvalArgs)


GROUPS = {
    "slurm": SlurmArgs,
    "model": ModelArgs,
    "training": TrainingArgs,
    "parallelism": ParallelismArgs,
    "data": DataArgs,
    "paths": PathArgs,
    "logging": LoggingArgs,
    "execution": ExecutionArgs,
    "job": JobArgs,
    "container": ContainerArgs,
    "evals": EvalArgs,
}


def flag_names() -> list[str]:
    """Every flag the launcher accepts, without dashes (the interface snapshot)."""
    names = ["run_name"]
    for group in GROUPS.values():
        names += [f.name for f in dataclasses.fields(group)]
    return names


def flag_types() -> dict[str, type]:
    """Each flag's value type (int, float, bool or str; None allowed aside)."""
    kinds: dict[str, type] = {}
    for group in GROUPS.values():  # evaluated hints: the annotations are text here (postponed)
        for name, hint in typing.get_type_hints(group).items():
            kinds[name] = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    return kinds


def explicit_flags(argv: list[str]) -> set[str]:
    """Names of the flags typed on the command line (`--x v`, `--x=v`, and `--nox` for a boolean x)."""
    known = set(flag_names())
    typed = {tok[2:].split("=", 1)[0] for tok in argv if tok.startswith("--")}
    negated = {name[2:] for name in typed if name.startswith("no")}
    return (typed | negated) & known
