"""Run by tests/nanotron_main.py: `python nanotron_main_judge.py SRC CONFIG...` parses each CONFIG with the nanotron
under SRC (main's), flash_attn and triton stood in, and prints one JSON line per file: what nanotron read."""

from __future__ import annotations

import json
import sys

sys.path.insert(0, sys.argv[1])

from launcher.train.nanotron_engine import flash_attn_compat, triton_compat  # noqa: E402

flash_attn_compat.install(is_main=False)
triton_compat.install()
import nanotron.config as nc  # noqa: E402

assert nc.__file__.startswith(sys.argv[1]), nc.__file__  # main's, not the installed 0.4

for path in sys.argv[2:]:
    try:
        c = nc.get_config_from_file(path)
    except Exception as e:  # noqa: BLE001 - what nanotron says is the verdict
        print(json.dumps({"path": path, "error": f"{type(e).__name__}: {e}"}))
        continue
    m = c.model.model_config
    stages = [
        {
            "name": s.name,
            "start": s.start_training_step,
            "dataset": getattr(s.data.dataset, "hf_dataset_or_datasets", None),
            # a Nanoset's fields as main read them (NanosetDatasetsArgs); absent for a hub dataset
            **{
                key: getattr(s.data.dataset, key)
                for key in (
                    "dataset_folder",
                    "dataset_weights",
                    "tokenizer_name",
                    "vocab_size",
                    "token_size_in_bytes",
                    "dataset_max_tokens",
                )
                if type(s.data.dataset).__name__ == "NanosetDatasetsArgs"
            },
        }
        for s in c.data_stages or []
    ]
    print(json.dumps({
        "path": path,
        "model": type(m).__name__,
        "hidden_size": m.hidden_size,
        "num_key_value_heads": m.num_key_value_heads,
        "vocab_size": m.vocab_size,
        "rope_theta": m.rope_theta,
        "rope_interleaved": m.rope_interleaved,
        "dp": c.parallelism.dp, "tp": c.parallelism.tp, "pp": c.parallelism.pp,
        "cp": c.parallelism.context_parallel_size,
        "sequence_length": c.tokens.sequence_length,
        "optimizer": type(c.optimizer.optimizer_factory).__name__,
        "adam": [c.optimizer.optimizer_factory.adam_eps, c.optimizer.optimizer_factory.adam_beta1,
                 c.optimizer.optimizer_factory.adam_beta2],
        "stages": stages,
        "checkpoints_path": str(c.checkpoints.checkpoints_path),
    }))  # fmt: skip
