"""A small local dataset and tokenizer for demos and tests: nothing is downloaded.

The text is English-like and learnable: templated sentences over a small vocabulary where each subject has its
own verbs and each verb its own objects, so a tiny model's loss falls clearly within a few dozen steps.

    python -m launcher.localcluster.demo_data OUTDIR   # writes OUTDIR/dataset and OUTDIR/tokenizer (reused if present)
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

SUBJECTS = {
    "cat": ["chases", "watches", "ignores"],
    "dog": ["fetches", "chases", "guards"],
    "child": ["reads", "draws", "builds"],
    "farmer": ["plants", "waters", "sells"],
    "baker": ["bakes", "sells", "slices"],
    "sailor": ["ties", "mends", "sails"],
}
OBJECTS = {
    "chases": ["mouse", "ball", "bird"],
    "watches": ["bird", "window", "fire"],
    "ignores": ["dog", "rain", "noise"],
    "fetches": ["stick", "ball", "paper"],
    "guards": ["house", "gate", "sheep"],
    "reads": ["book", "letter", "map"],
    "draws": ["house", "tree", "boat"],
    "builds": ["tower", "boat", "fort"],
    "plants": ["seeds", "trees", "corn"],
    "waters": ["garden", "corn", "trees"],
    "sells": ["bread", "corn", "eggs"],
    "bakes": ["bread", "cake", "pie"],
    "slices": ["bread", "cake", "cheese"],
    "ties": ["rope", "knot", "sail"],
    "mends": ["net", "sail", "rope"],
    "sails": ["boat", "ship", "sea"],
}
ADJECTIVES = ["old", "young", "happy", "quiet", "small", "brave"]
PLACES = ["in the morning", "at night", "near the river", "in the garden", "after the rain", "every day"]
SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def sentence(rng: random.Random) -> str:
    """One templated sentence: 'the <adj> <subject> <verb> the <object> <place> .'"""
    subject = rng.choice(sorted(SUBJECTS))
    verb = rng.choice(SUBJECTS[subject])
    return f"the {rng.choice(ADJECTIVES)} {subject} {verb} the {rng.choice(OBJECTS[verb])} {rng.choice(PLACES)} ."


def make_texts(num_docs: int, seed: int) -> list[str]:
    """`num_docs` documents of 3 to 8 sentences each, deterministic in `seed`."""
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(rng.randint(3, 8))) for _ in range(num_docs)]


def make_dataset(directory: str | Path, num_docs: int = 2000, seed: int = 0) -> Path:
    """Write a `datasets.Dataset` with a `text` column to `directory` (save_to_disk); reuse one already there."""
    from datasets import Dataset

    directory = Path(directory)
    if not (directory / "dataset_info.json").exists():
        Dataset.from_dict({"text": make_texts(num_docs, seed)}).save_to_disk(str(directory))
    return directory


def make_tokenizer(directory: str | Path, texts: list[str], vocab_size: int = 256) -> Path:
    """Train a word-level tokenizer on `texts` and save it loadable by `AutoTokenizer.from_pretrained(directory)`.

    Ids 0-3 are <unk>, <s> (bos), </s> (eos), <pad>, matching nanotron's default bos/eos ids 1 and 2.
    Reuses a tokenizer already in `directory`.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    if (directory / "tokenizer.json").exists():
        return directory
    tokenizer = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()))
    tokenizer.train_from_iterator(texts, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS).save_pretrained(str(directory))
    return directory


def make_demo(outdir: str | Path, num_docs: int = 2000, seed: int = 0, vocab_size: int = 256) -> tuple[Path, Path]:
    """OUTDIR/dataset and OUTDIR/tokenizer, made if missing."""
    from datasets import load_from_disk

    outdir = Path(outdir)
    dataset = make_dataset(outdir / "dataset", num_docs=num_docs, seed=seed)
    tokenizer = make_tokenizer(outdir / "tokenizer", load_from_disk(str(dataset))["text"], vocab_size=vocab_size)
    return dataset, tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.demo_data", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", help="where to write dataset/ and tokenizer/")
    parser.add_argument("--num-docs", type=int, default=2000, help="documents in the dataset")
    parser.add_argument("--seed", type=int, default=0, help="seed of the text generator")
    parser.add_argument("--vocab-size", type=int, default=256, help="upper bound on the tokenizer's vocabulary")
    args = parser.parse_args(argv)
    dataset, tokenizer_dir = make_demo(args.outdir, args.num_docs, args.seed, args.vocab_size)

    from transformers import AutoTokenizer

    print(f"dataset: {dataset.resolve()}")
    print(f"tokenizer: {tokenizer_dir.resolve()}")
    print(f"vocab size: {len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))}")


if __name__ == "__main__":
    main()
