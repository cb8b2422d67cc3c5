"""--eval_heldout, checked before the queue (docs/evals.md): `split:NAME` of the run's local saved dataset, `tail:N` of
the one tokenized folder it trains on, or another local dataset, readable as the eval job reads it and never the
training data, however it is named."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from launcher.config import datacheck, ranges
from launcher.config.spec import RunSpec
from launcher.nanotron_config import mixture, nanoset, nanoset_yaml, stages
from launcher.nanotron_config.datasource import is_local_path
from launcher.nanotron_config.schema import get_path, train_split
from launcher.problems import Problem

HELDOUT_FILES = (".jsonl", ".json", ".txt", ".parquet", ".csv")
# A held-out JSON-lines file is read before the queue up to this many bytes or lines, whichever comes first (~2 s at
# most on a busy 2-core machine: 64 MiB of documents, or a million short lines): every line a JSON object with the
# text column; the rest of a bigger file is left to the eval job's loader.
JSONL_BOUND = 64 << 20
JSONL_LINES = 1_000_000
JSONL_BATCH = 4 << 20


def problems(spec: RunSpec) -> list[Problem]:
    """--eval_heldout: one source, or domains NAME=SOURCE,... (names of their own, one tail at most), each source
    checked (`source_problems`, its problems naming its domain)."""
    text = spec.args.evals.eval_heldout
    if text is None or ranges.unusable_path("eval_heldout", text):  # (that is said by ranges)
        return []
    domains = nanoset.heldout_domains(text)
    names = [name for name, _ in domains]
    fix = "give NAME=SOURCE,NAME=SOURCE (names: letters, digits, _ . -), or one SOURCE"
    out = [Problem("eval_heldout", f"the domain name {n!r} appears twice", fix) for n in dict.fromkeys(names)
           if names.count(n) > 1]  # fmt: skip
    if len(domains) > 1 and nanoset.HELDOUT in names:
        out.append(Problem("eval_heldout", "a source without NAME= beside others", fix))
    if sum(source.startswith(nanoset.TAIL) for _, source in domains) > 1:
        out.append(Problem("eval_heldout", "two tails of the training folder", "hold out one tail:N"))
    for name, source in domains:
        out += [Problem(p.flag, f"{name}: {p.message}" if len(domains) > 1 else p.message, p.fix, p.key)
                for p in source_problems(spec, source)]  # fmt: skip
    return out


def source_problems(spec: RunSpec, text: str) -> list[Problem]:
    """One held-out source: a split of the run's local dataset other than the one it trains on, the tail of the
    tokenized folder it trains on (`tail_problems`), or a local dataset the run does not train on, readable with
    --text_column (a tokenized folder: made with the run's tokenizer)."""
    if text.startswith(nanoset.TAIL):
        return tail_problems(spec, text)
    column = spec.args.data.text_column
    if text.startswith("split:"):
        split, dataset = text.removeprefix("split:"), spec.args.data.dataset
        training = train_split(spec.base_config)
        if not dataset or mixture.is_mixture(dataset) or not is_local_path(dataset) or spec.stages:
            return [
                Problem(
                    "eval_heldout",
                    f"{text} names a split of the run's dataset, which is not one local saved dataset",
                    "give a local dataset the run does not train on: --eval_heldout PATH",
                )
            ]
        if dataset in spec.nanosets or nanoset.is_tokenized(dataset):
            return [Problem("eval_heldout", f"{text} names a split of a saved DatasetDict; the run trains on the "
                            f"tokenized folder {dataset}, which has none", "hold out its last tokens: --eval_heldout "
                            "tail:N (e.g. tail:100k), or give held-out data: --eval_heldout PATH")]  # fmt: skip
        splits = datacheck.saved_splits(dataset)
        if splits is not None and split not in splits:
            others = ", ".join(f"split:{s}" for s in splits if s != training)
            fix = f"name a split it has that the run does not train on: {others}" if others else (
                "give held-out data the run does not train on: --eval_heldout PATH")  # fmt: skip
            return [Problem("eval_heldout", f"{dataset} has no split {split!r} (splits: {', '.join(splits)})", fix)]
        if split == training:
            return [
                Problem(
                    "eval_heldout",
                    f"the run trains on the split {split!r}: it is not held out",
                    "name another split (e.g. split:validation), or another dataset",
                )
            ]
        return [_heldout(p) for p in datacheck.dataset_problems(dataset, column, split)]
    path = Path(os.path.expanduser(text)).resolve()
    if not is_local_path(text):
        return [Problem("eval_heldout", f"{text} is not a local path (the eval job reads offline)",
                        "give split:NAME of the run's dataset, or a local dataset folder or file")]  # fmt: skip
    overlap = _not_held_out(path, trained_paths(spec), train_split(spec.base_config))
    if overlap is not None:
        return [overlap]
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return [Problem("eval_heldout", f"{path} is a dataset of several splits",
                        f"name one: {path}/validation (a split's folder)")]  # fmt: skip
    if path.is_file() and path.suffix not in HELDOUT_FILES:
        return [Problem("eval_heldout", f"{path} is not one of {', '.join(HELDOUT_FILES)}",
                        "give a save_to_disk folder or a .jsonl file")]  # fmt: skip
    if path.is_file() and path.suffix == ".txt":
        return []  # a line a document
    if nanoset.is_tokenized(str(path)):
        folder, problems = nanoset.inspect(path, "eval_heldout")
        if folder is not None and not nanoset.same_tokenizer(folder.tokenizer, spec.args.data.tokenizer or ""):
            return [Problem("eval_heldout", f"{path} was tokenized by {folder.tokenizer}, the run's tokenizer is "
                            f"{spec.args.data.tokenizer}", "give held-out data tokenized as the run's")]  # fmt: skip
        return problems
    found = [_heldout(p) for p in datacheck.dataset_problems(str(path), column, "train")]
    if not found and path.is_file() and path.suffix in (".jsonl", ".json"):
        found += [p for p in [_jsonl_problem(path, column)] if p is not None]
    return found


def _jsonl_problem(path: Path, column: str) -> Problem | None:
    """The first line of a held-out JSON-lines file that is not a JSON object with `column` as text (its number
    named), read up to JSONL_BOUND bytes or JSONL_LINES lines: the rest of a bigger file is left to the job's loader.
    The lines are parsed a batch at a time as one JSON array (a line at a time in a batch that does not parse so,
    or whose lines are not each braced). A file whose first line is no whole object (one JSON array, a
    pretty-printed object) is left to the job."""
    read, number = 0, 0
    with open(path, "rb") as f:
        while read < JSONL_BOUND and number < JSONL_LINES:
            lines = f.readlines(min(JSONL_BATCH, JSONL_BOUND - read))
            if not lines:
                return None
            read += sum(len(line) for line in lines)
            if read >= JSONL_BOUND and not lines[-1].endswith(b"\n"):
                lines.pop()  # a line the bound cuts: the job's to read
            if not lines:
                return None
            if number == 0:
                lines[0] = lines[0].removeprefix(codecs.BOM_UTF8)
                head = next((line for line in lines if line.strip()), b"")
                if head and not isinstance(_record(head), dict):
                    return None  # (an array, or an object over several lines: the job's loader reads it whole)
            kept = [line for line in lines if not line.isspace()]
            try:
                records = json.loads(b"[" + b",".join(kept) + b"]")
            except (ValueError, RecursionError):
                records = None
            whole = all(line.strip().startswith(b"{") and line.strip().endswith(b"}") for line in kept)
            if not whole or not isinstance(records, list) or len(records) != len(kept):
                records = [_record(line) for line in kept]
            bad = next(
                (k for k, r in enumerate(records) if type(r) is not dict or type(r.get(column)) is not str), None
            )
            if bad is not None:
                at = number + [k for k, line in enumerate(lines, start=1) if not line.isspace()][bad]
                what = f"has no {column!r} (--text_column) as text" if isinstance(records[bad], dict) else (
                    "is not a JSON object")  # fmt: skip
                return Problem("eval_heldout", f"line {at} of {path} {what}", 'give JSON lines, each an object with '
                               f'the text column, e.g. {{"{column}": "..."}} (--text_column)')  # fmt: skip
            number += len(lines)
    return None


def _record(line: bytes) -> object:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def trained_paths(spec: RunSpec) -> list[Path]:
    """Every local dataset the run trains on, symlinks resolved: its --dataset's (each of a mixture's), its data
    stages' (--data_stages', else a --config's), its tokenized folders."""
    names = [*mixture.names(spec.datasets), *(n for s in spec.stages for n in mixture.names(s.dataset))]
    names += [] if spec.stages else stages.config_dataset_names(spec.base_config)
    return [Path(os.path.expanduser(n)).resolve() for n in [*names, *spec.nanosets] if is_local_path(n)]


def _not_held_out(held: Path, trained: list[Path], split: str) -> Problem | None:
    """Why `held` (resolved) is data the run trains on, however it is named: one of `trained` (or the same file by
    another link), in one of them (a file of it, the split folder of a DatasetDict the run trains on; another split's
    folder is held out), or holding one of them; None where it is held out."""
    for t in trained:
        if held == t or _same_file(held, t):
            what = f"the run trains on {t}"
        elif held.is_relative_to(t):
            first = held.relative_to(t).parts[0]
            if first != split and datacheck.saved_splits(str(t)) is not None:
                continue  # another split of the DatasetDict whose `split` the run trains on
            what = f"{held} is in {t / first}, which the run trains on"
        elif t.is_relative_to(held):
            what = f"{held} holds {t}, which the run trains on"
        else:
            continue
        return Problem("eval_heldout", f"{what}: it is not held out", "give data the run does not train on")
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # (one of them is not there: not the same)
        return False


def tail_problems(spec: RunSpec, text: str) -> list[Problem]:
    """--eval_heldout tail:N: N tokens, at least one window of the run's sequence length + 1, at the end of the one
    tokenized folder the run trains on from its first step; what training keeps of it (the config's
    dataset_max_tokens, which keeps it off the tail: nanotron_config.nanoset_yaml.section) a window for each
    data-parallel rank at least."""
    fix = "give tail:N, the last N tokens of the run's tokenized folder (e.g. tail:100k), or held-out data: PATH"
    try:
        count = nanoset.heldout_tail(text) or 0
    except ValueError as e:
        return [Problem("eval_heldout", str(e), fix)]
    first = [str(Path(n).resolve()) for n in mixture.names(spec.datasets)]
    if len(spec.nanosets) != 1 or first != [str(Path(n).resolve()) for n in spec.nanosets]:
        what = f"{len(spec.nanosets)} tokenized folders" if len(spec.nanosets) > 1 else "no tokenized folder"
        what = "a tokenized folder in a later stage only" if len(spec.nanosets) == 1 else what
        return [Problem("eval_heldout", f"{text} holds out the end of the one tokenized folder the run trains on "
                        f"from its first step; it trains on {what}", "train on one folder, or give held-out data: "
                        "--eval_heldout PATH (or split:NAME of a local dataset)")]  # fmt: skip
    (name, folder), seq = next(iter(spec.nanosets.items())), spec.shape.max_seq_len
    if folder is None:
        return []  # (what is wrong with the folder is said by the dataset's checks)
    if count >= folder.tokens:
        most, dp = folder.tokens - max(spec.dims.dp, 1) * seq - 1, max(spec.dims.dp, 1)
        fix = f"hold out fewer: at most tail:{most}" if most >= seq + 1 else "tokenize more data, or give held-out " \
            "data: --eval_heldout PATH"  # fmt: skip
        how = "all" if count == folder.tokens else "more than"
        return [Problem("eval_heldout", f"{text} holds out {count:,} tokens, {how} the {folder.tokens:,} {name} holds",
                        fix)]  # fmt: skip
    if count < seq + 1:
        return [Problem("eval_heldout", f"{text}: {count} tokens are less than one window of the sequence length + 1 "
                        f"({seq + 1})", f"hold out at least {seq + 1} tokens")]  # fmt: skip
    cap = nanoset_yaml.caps_of(get_path(spec.config, ("data", "dataset"))).get(name, folder.tokens - count)
    windows, dp = max((cap - 1) // seq, 0), max(spec.dims.dp, 1)
    if windows < dp:  # each data-parallel rank reads a window an epoch at least
        return [Problem("eval_heldout", f"{text}: training keeps {cap:,} tokens of {name} ({folder.tokens:,} in all), "
                        f"{windows} windows of {seq + 1} tokens, fewer than the {dp} data-parallel ranks",
                        "hold out fewer tokens, or tokenize more data")]  # fmt: skip
    return []


def _heldout(p: Problem) -> Problem:
    return Problem("eval_heldout", p.message, p.fix)
