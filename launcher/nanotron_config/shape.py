"""A Llama model's shape: the one type the launcher's checks, memory model and planner and the training job share.

The launcher builds it from the resolved flags (`launcher.config.spec.RunSpec.shape`), the job from the run's
nanotron YAML (`launcher.train.settings`); `launcher.nanotron_config.parallel.check_layout`, `launcher.perf.memory`,
`launcher.perf.planner`, `launcher.perf.fit`, `launcher.perf.sizes` and the job's model take it whole.
Field names are the launcher's flags (`--hidden_size`, `--num_layers`, ...). Standard library only: the job
imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROPE_THETA = 10000.0  # nanotron 0.4's Llama has no rope_theta field and uses this value


@dataclass(frozen=True)
class ModelShape:
    """A Llama model as nanotron 0.4's LlamaConfig states it."""

    hidden_size: int
    intermediate_size: int
    num_layers: int  # nanotron: num_hidden_layers
    num_heads: int  # nanotron: num_attention_heads
    num_kv_heads: int  # nanotron: num_key_value_heads
    vocab_size: int
    max_seq_len: int  # nanotron: max_position_embeddings; the launcher also trains at it (tokens.sequence_length)
    tie_word_embeddings: bool = False
    # What only the job's model reads (nanotron's defaults; neither the layout nor the memory depends on them):
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    rope_theta: float = ROPE_THETA  # nanotron 0.4's LlamaConfig has no field for it: its models use 10000
    bos_token_id: int = 1
    eos_token_id: int = 2
    rope_interleaved: bool = False  # main's field; the torch engine rotates halves for a 0.4 config (docs)

    def sizes(self) -> dict[str, int]:
        """The integer sizes by flag name (each must be positive)."""
        return {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "vocab_size": self.vocab_size,
            "max_seq_len": self.max_seq_len,
        }

    @property
    def resolved(self) -> bool:
        """Whether every size is positive (the checks and estimates that divide by them can run)."""
        return all(v > 0 for v in self.sizes().values())

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def llama_config_kwargs(self) -> dict[str, Any]:
        """This shape as transformers' `LlamaConfig` takes it (its keyword arguments; RoPE in transformers' layout)."""
        return dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            hidden_act=self.hidden_act,
            max_position_embeddings=self.max_seq_len,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
        )


# field -> nanotron's LlamaConfig key, for the sizes a config must state (a missing one raises KeyError naming it)
REQUIRED = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "vocab_size": "vocab_size",
}


def from_model_config(mc: dict[str, Any], **given: Any) -> ModelShape:
    """A nanotron 0.4 `model.model_config` mapping as a ModelShape (nanotron's defaults where an optional value is
    missing); `given` fields replace the mapping's values (the launcher's resolved flags)."""
    values = {field: given[field] if field in given else mc[key] for field, key in REQUIRED.items()}
    optional = {
        "num_kv_heads": mc.get("num_key_value_heads") or values["num_heads"],
        "max_seq_len": mc.get("max_position_embeddings", 2048),
        "tie_word_embeddings": mc.get("tie_word_embeddings", False),
        "rms_norm_eps": mc.get("rms_norm_eps", 1e-6),
        "hidden_act": mc.get("hidden_act", "silu"),
        "bos_token_id": mc.get("bos_token_id", 1),
        "eos_token_id": mc.get("eos_token_id", 2),
        "rope_theta": mc.get("rope_theta", ROPE_THETA),
        "rope_interleaved": bool(mc.get("rope_interleaved", False)),
    }
    return ModelShape(**{**optional, **values, **given})
