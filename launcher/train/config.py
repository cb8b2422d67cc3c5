"""What the training job needs to know about a run, independent of any config schema.

`launcher.nanotron_schema.load_train_config(path)` reads a nanotron YAML into a `TrainConfig`; the engines
(`launcher.train.torch_engine`, `launcher.train.nanotron_engine`) consume only this. A second schema (newer
nanotron) adds a second reader, not a second engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """A Llama model's shape, as nanotron's LlamaConfig states it."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    hidden_act: str
    rope_theta: float  # nanotron 0.4's LlamaConfig has no field for it: its models use 10000
    bos_token_id: int
    eos_token_id: int


@dataclass(frozen=True)
class LRSchedule:
    """nanotron's LRSchedulerArgs, resolved (no None left but the optional phases)."""

    learning_rate: float
    min_decay_lr: float
    warmup_steps: int
    warmup_style: str  # "linear" | "constant"
    decay_style: str  # "linear" | "cosine"
    decay_steps: int
    decay_starting_step: int


@dataclass(frozen=True)
class TrainConfig:
    """Everything an engine reads from a run's config file."""

    project: str
    run_name: str
    seed: int
    model: ModelShape
    init_std: float
    dtype: str  # "bfloat16" | "float32" | "float16"
    dp: int
    tp: int
    pp: int
    sequence_length: int
    micro_batch_size: int
    grad_accum_steps: int  # nanotron: batch_accumulation_per_replica
    train_steps: int
    lr: LRSchedule
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float | None
    dataset: str | None  # a save_to_disk directory, a data file, or a hub name; None -> random tokens
    dataset_split: str
    dataset_config_name: str | None
    text_column: str
    tokenizer: str | None
    data_seed: int
    num_loading_workers: int
    checkpoints_path: str
    checkpoint_interval: int
    save_initial_state: bool
    resume_checkpoint_path: str | None
    log_interval: int  # nanotron: logging.iteration_step_info_interval
    init_path: str | None = None  # nanotron: model.init_method.path, weights of a nanotron checkpoint

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step across all data-parallel replicas."""
        return self.micro_batch_size * self.grad_accum_steps * self.dp
