"""nanotron's own forward on a checkpoint, for the export's logits tests: `torchrun --nproc_per_node 1
nanotron_forward.py CONFIG TOKENS VOCAB OUT` with the test-side CPU patches (tests/cpu_nanotron.py's environment; main's
source first where the config is main's).

CONFIG is a nanotron config whose `model.init_method.path` is the checkpoint (any tp x pp: nanotron's own
`load_weights` merges it into this one process). The nanotron engine runs as the job runs it
(`launcher.train.nanotron_engine.engine.train`: nanotron imported with its stand-ins and mends, the launcher's trainer
subclass built from the config, the weights loaded by nanotron), and where it would train, this asks nanotron's
model (`LlamaForTraining.model`) instead for the logits of TOKENS (a JSON list of token lists) and for its greedy
continuation of them, one forward per new token (the argmax over the VOCAB tokens of the tokenizer, not the
vocabulary's padding). OUT gets {"logits": [...], "greedy": [...]} (logits as
(batch, length, vocabulary) nested lists, the vocabulary's padding included).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from launcher.train.nanotron_engine import engine
from launcher.train.settings import load_train_config

NEW_TOKENS = 5


def logits_of(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """nanotron's Llama on (batch, length) tokens: its (length, batch, vocab) logits, as (batch, length, vocab)."""
    mask = torch.ones_like(ids, dtype=torch.bool)
    return model.model(input_ids=ids, input_mask=mask).transpose(0, 1).float()


def forward_only(trainer_class: Any, tokens: list[list[int]], vocab: int, out: str) -> Any:
    def made(*args: Any) -> Any:
        class Forward(trainer_class(*args)):  # type: ignore[misc]
            def train(self, *ignored: Any, **also_ignored: Any) -> None:
                model = self.unwrapped_model
                model.eval()
                ids = torch.tensor(tokens, device=next(model.parameters()).device)  # a GPU's, on one
                with torch.no_grad():
                    logits = logits_of(model, ids)
                    greedy = ids
                    for _ in range(NEW_TOKENS):
                        step = logits_of(model, greedy)[:, -1, :vocab]
                        greedy = torch.cat([greedy, step.argmax(-1, keepdim=True)], dim=1)
                with open(out, "w") as f:
                    json.dump({"logits": logits.tolist(), "greedy": greedy.tolist()}, f)

        return Forward

    return made


if __name__ == "__main__":
    config, tokens_file, vocab, out = sys.argv[1:5]
    with open(tokens_file) as f:
        tokens = json.load(f)
    engine.trainer_class = forward_only(engine.trainer_class, tokens, int(vocab), out)
    engine.train(config, load_train_config(config))
