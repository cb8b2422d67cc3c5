"""`python -m launcher.train.domains --config CONFIG --model DIR --result RESULT --domain NAME SOURCE [--domain ...]`:
an exported model's held-out loss and bits per byte on each domain of `--eval_heldout NAME=SOURCE,...` (each SOURCE
any form the flag takes: `split:NAME`, `tail:N`, a local dataset, a tokenized folder), with each document's totals
for `jobs verdict --task heldout:NAME` (its interval over documents). Run by each eval job (launcher/evals/evaljob.py),
in float32 on CPU.

Each document alone: the eos token training puts before a document, then its tokens (the run's tokenizer, no special
tokens); every one of its tokens is predicted, in windows of at most min(sequence length, 512) tokens (a window's
first prediction sees the window's first token only). A domain's loss is the mean next-token cross-entropy over
every predicted token, summed over its documents; its bits per byte the summed cross-entropy in bits over the
documents' UTF-8 bytes. Documents are taken in order until TOKENS tokens are predicted (at least two). Held-out
tokens (`tail:N`, a tokenized folder) have no documents: each of their windows (launcher/train/evaluate.py's) is one,
its bytes those its predicted tokens decode to.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

from launcher import atomic
from launcher.errors import LauncherError
from launcher.train.data import encoder, load_tokenizer
from launcher.train.evaluate import LENGTH, held_out, token_windows
from launcher.train.settings import TrainConfig, load_train_config

TOKENS = 16_384  # predicted tokens a domain is scored on, at most (whole documents; on CPU)


def _id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def documents(cfg: TrainConfig, source: str) -> tuple[list[tuple[str, list[int], int]], str]:
    """(each document's id, its token ids (eos first), its UTF-8 bytes), and where they came from."""
    tokened = token_windows(cfg, source)
    if tokened is not None:
        windows, where = tokened
        decode = load_tokenizer(cfg).decode
        rows = [row.tolist() for row in windows]
        return [(f"{_id(where)}-{k}", row, len(decode(row[1:]).encode("utf-8"))) for k, row in enumerate(rows)], where
    texts, where = held_out(cfg, source)
    encode, eos_id = encoder(cfg)
    found: list[tuple[str, list[int], int]] = []
    predicted = 0
    for text in texts:
        if predicted >= TOKENS and len(found) >= 2:
            break
        ids = [eos_id, *encode([text])[0]]
        found.append((_id(text), ids, len(text.encode("utf-8"))))
        predicted += len(ids) - 1
    return found, where


def score(model: object, ids: list[int], length: int) -> float:
    """The summed next-token cross-entropy (nats) of every token after the first, in windows of `length`."""
    import torch

    total = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, length):
            window = torch.as_tensor(ids[start : start + length + 1])[None]
            logits = model(input_ids=window[:, :-1]).logits.float()  # type: ignore[operator]
            total += float(torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum"))
    return total


def domain(cfg: TrainConfig, model: object, source: str) -> dict:
    """One domain's figures and its documents' totals."""
    docs, where = documents(cfg, source)
    docs = [d for d in docs if len(d[1]) > 1]
    if not docs:
        raise LauncherError(f"{where} holds no document to evaluate on")
    length = min(cfg.sequence_length, LENGTH)
    nll = [score(model, ids, length) for _, ids, _ in docs]
    tokens = [len(ids) - 1 for _, ids, _ in docs]
    size = [n for _, _, n in docs]
    loss = sum(nll) / sum(tokens)
    return {"loss": loss, "perplexity": math.exp(loss), "bits_per_byte": sum(nll) / math.log(2) / max(sum(size), 1),
            "tokens": sum(tokens), "bytes": sum(size), "documents": len(docs), "held_out": where,
            "per_document": {"id": [d[0] for d in docs], "nll": nll, "tokens": tokens, "bytes": size}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run's nanotron config (the bundle's config.yaml)")
    parser.add_argument("--model", type=Path, required=True, help="the exported model's folder")
    parser.add_argument("--result", type=Path, required=True, help="where the figures go (JSON)")
    parser.add_argument("--domain", nargs=2, action="append", required=True, metavar=("NAME", "SOURCE"))
    args = parser.parse_args(argv)
    try:
        import torch
        from transformers import AutoModelForCausalLM

        cfg = load_train_config(args.config)
        model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32).eval()
        found = {name: domain(cfg, model, source) for name, source in args.domain}
    except (LauncherError, OSError, ValueError, KeyError) as e:
        print(f"error: the held-out evaluation failed: {e}", file=sys.stderr)
        return 1
    atomic.replace(args.result, json.dumps({"domains": found}) + "\n")
    for name, figures in found.items():
        print(f"eval: held-out {name}: loss {figures['loss']:.4f}, bits per byte {figures['bits_per_byte']:.4f} over "
              f"{figures['documents']} documents ({figures['tokens']:,} tokens) of {figures['held_out']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
