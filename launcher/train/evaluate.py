"""`python -m launcher.train.evaluate --config CONFIG --result RESULT [--heldout HELDOUT]`: the smallest evaluation
that says an exported model works: its loss (mean cross-entropy of the next token), perplexity and bits per byte on
held-out text, in float32 on CPU. Run by the export job of `--export_hf` (templates/export.sh.j2) after
`launcher.export.chained`, whose RESULT (the bundle's export.json) names the folder, and by each eval job of
--eval_heldout (launcher/evals/evaljob.py); the figures are added to RESULT and to the folder's README (its model card).

Held-out text: HELDOUT where given (--eval_heldout: `split:NAME` of the run's dataset, `tail:N` of its tokenized
folder, or another local dataset, a tokenized folder too);
else the dataset's validation split where it has one (a `save_to_disk` DatasetDict with a split named validation,
valid or test, other than the one trained on); else the last DOCUMENTS documents of the training data, said so (held
out only where the run did not reach them). The text is tokenized and packed as the engines pack it
(`launcher.train.data`), into at most WINDOWS windows of the run's sequence length (at most LENGTH tokens). Bits per
byte: the windows' summed loss in bits over the UTF-8 bytes of the text their predicted tokens decode to.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from launcher import atomic
from launcher.errors import LauncherError
from launcher.nanotron_config import nanoset
from launcher.train.data import load_split, load_tokenizer, pack, tokenize
from launcher.train.settings import TrainConfig, load_train_config
from launcher.train.tokenized import DTYPES

HELD_OUT_SPLITS = ("validation", "valid", "test")
DOCUMENTS = 64
WINDOWS = 8
LENGTH = 512


def given(cfg: TrainConfig, heldout: str) -> tuple[list[str], str]:
    """--eval_heldout's text: `split:NAME` of the run's dataset, or a local dataset (its train split, its only one)."""
    if heldout.startswith("split:"):
        split = heldout.removeprefix("split:")
        part = dataclasses.replace(cfg, dataset_split=split, mixture=())
        where = f"the {split!r} split of {cfg.dataset}"
    else:
        column = "text" if heldout.endswith(".txt") else cfg.text_column
        part = dataclasses.replace(cfg, dataset=heldout, dataset_split="train", mixture=(), text_column=column)
        where = heldout
    data = load_split(part)
    return [t for t in data.select(range(min(len(data), DOCUMENTS * 4)))[part.text_column] if t], where


def held_out(cfg: TrainConfig, heldout: str | None = None) -> tuple[list[str], str]:
    """(texts, where they came from, in words)."""
    import datasets

    if heldout:
        return given(cfg, heldout)

    path = Path(os.path.expanduser(cfg.dataset)) if cfg.dataset and not cfg.mixture else None
    if path is not None and path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except FileNotFoundError:
            loaded = None
        if isinstance(loaded, datasets.DatasetDict):
            for split in HELD_OUT_SPLITS:
                if split in loaded and split != cfg.dataset_split:
                    texts = [t for t in loaded[split][cfg.text_column][: DOCUMENTS * 4] if t]
                    return texts, f"the {split!r} split of {cfg.dataset}"
    data = load_split(cfg)
    start = max(0, len(data) - DOCUMENTS)
    texts = [t for t in data.select(range(start, len(data)))[cfg.text_column] if t]
    return texts, (f"the last {len(data) - start} documents of the training data ({cfg.dataset or 'the mixture'}; "
                   "no validation split: held out only where the run did not reach them)")  # fmt: skip


def token_windows(cfg: TrainConfig, heldout: str | None) -> tuple[np.ndarray, str] | None:
    """Held-out windows that are tokens already: `tail:N` (the last N tokens of the run's tokenized folder, which
    training never reads: its config's dataset_max_tokens), or a tokenized folder (from its first token); None for
    held-out text. At most WINDOWS windows of min(sequence length, LENGTH) + 1 tokens, overlapping by one; the files'
    tokens read as one stream (a window may span two files)."""
    count = nanoset.heldout_tail(heldout)
    if count is not None:
        if len(cfg.nanoset) != 1:
            raise LauncherError(f"{heldout} needs a run on one tokenized folder ({len(cfg.nanoset)} in its config)")
        name = cfg.nanoset[0][0]
        where = f"the last {count:,} tokens of {name} (kept out of training)"
    elif heldout and nanoset.is_tokenized(heldout):
        name, where = heldout, heldout
    else:
        return None
    folder, problems = nanoset.inspect(name, "eval_heldout")
    if folder is None:
        raise LauncherError("; ".join(p.message for p in problems))
    if count is not None:  # from the cap on, never before it (files removed since the launch would move the tail)
        count = folder.tokens - max(folder.tokens - count, (cfg.nanoset_caps or (None,))[0] or 0)
    length = min(cfg.sequence_length, LENGTH)
    wanted, pieces = WINDOWS * length + 1, []
    for path, first, held in nanoset.tail_tokens(folder, folder.tokens if count is None else max(count, 0)):
        mapped = np.memmap(path, dtype=DTYPES[folder.token_size], mode="r")
        pieces.append(np.asarray(mapped[first : first + min(held, wanted)], dtype=np.int64))
        wanted -= len(pieces[-1])
        if wanted <= 0:
            break
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    rows = [tokens[k * length : k * length + length + 1] for k in range(max((len(tokens) - 1) // length, 0))]
    return (np.stack(rows) if rows else np.zeros((0, length + 1), dtype=np.int64)), where


def evaluate(cfg: TrainConfig, output: Path, heldout: str | None = None) -> dict:
    """The exported model's held-out loss, perplexity and bits per byte: {"loss", "perplexity", "bits_per_byte",
    "tokens", "held_out"}."""
    import torch
    from transformers import AutoModelForCausalLM

    tokened = token_windows(cfg, heldout)
    if tokened is not None:
        windows, where = tokened
        length, total = windows.shape[1] - 1, windows.size
    else:
        texts, where = held_out(cfg, heldout)
        token_lists, eos_id = tokenize(cfg, texts)
        total = sum(len(t) + 1 for t in token_lists)
        length = min(cfg.sequence_length, LENGTH, max(total - 1, 1))
        windows = pack(token_lists, eos_id, length)[:WINDOWS]
    if len(windows) == 0:
        raise LauncherError(f"{where} holds no text to evaluate on ({total} tokens)")
    model = AutoModelForCausalLM.from_pretrained(str(output), dtype=torch.float32).eval()
    ids = torch.as_tensor(windows)
    with torch.no_grad():  # one window at a time: memory of one sequence's activations
        losses = [float(model(input_ids=row[None], labels=row[None]).loss) for row in ids]
    loss = sum(losses) / len(losses)
    decode = load_tokenizer(cfg).decode
    text_bytes = sum(len(decode(row[1:].tolist()).encode("utf-8")) for row in ids)
    bits = sum(losses) * (ids.shape[1] - 1) / math.log(2)
    return {"loss": loss, "perplexity": math.exp(loss), "bits_per_byte": bits / max(text_bytes, 1),
            "tokens": int(len(ids) * length), "held_out": where}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run's nanotron config (the bundle's config.yaml)")
    parser.add_argument("--result", type=Path, required=True, help="export.json: names the folder; gets the figures")
    parser.add_argument("--heldout", help="split:NAME or tail:N of the run's dataset, or a dataset (--eval_heldout)")
    args = parser.parse_args(argv)
    try:
        result = json.loads(args.result.read_text(encoding="utf-8"))
        output = Path(result["output"])
        figures = evaluate(load_train_config(args.config), output, args.heldout)
    except (LauncherError, OSError, ValueError, KeyError) as e:
        print(f"error: the evaluation failed: {e}", file=sys.stderr)
        return 1
    said = (f"held-out loss {figures['loss']:.4f}, perplexity {figures['perplexity']:.4g}, bits per byte "
            f"{figures['bits_per_byte']:.4f} over {figures['tokens']} tokens of {figures['held_out']}")  # fmt: skip
    with open(output / "README.md", "a", encoding="utf-8") as card:
        card.write(f"- **evaluated**: {said} (`python -m launcher.train.evaluate`, float32 on CPU)\n")
    atomic.replace(args.result, json.dumps({**result, **figures}, indent=2) + "\n")
    print(f"export: {output}: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
