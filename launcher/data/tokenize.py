"""`python -m launcher.data tokenize`: a dataset tokenized once, ahead of training, into the files nanotron main's
Nanoset reads, through datatrove's own pipeline (a reader, then its DocumentTokenizer) and executor.

Checked before anything runs (every problem at once, nothing written on refusal); the output folder holds the token
files and `tokenize/` (this command's record and datatrove's logs, its completion records among them): the same
command again continues an interrupted tokenization where it stopped (datatrove's skip_completed).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher import atomic
from launcher.config import datacheck
from launcher.errors import LauncherError
from launcher.nanotron_config import nanoset, provenance
from launcher.nanotron_config.datasource import is_local_path
from launcher.problems import Problem

RECORD_DIR = "tokenize"  # in the output folder: record.json and datatrove's logging_dir
RECORD = "record.json"
FILE_READERS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}  # a folder of files: datatrove's readers


@dataclass(frozen=True)
class TokenizeArgs:
    dataset: str  # a save_to_disk directory, a data file, a folder of .jsonl/.parquet files, or a cached hub name
    tokenizer: str  # a local tokenizer directory (with tokenizer.json) or a hub name
    output: str  # the folder the token files go to
    text_column: str = "text"
    split: str = "train"  # the split of a saved DatasetDict
    eos_token: str = "auto"  # appended to every document: "auto" (the tokenizer's own), "none", or a token
    tasks: int = 1  # datatrove tasks (one token file each)
    workers: int | None = None  # tasks run at once (None: 1 on this machine, all of them on Slurm)
    shuffle: bool = True  # datatrove shuffles each file's documents
    seed: int = 0


@dataclass(frozen=True)
class Plan:
    """What the checks resolved: the reader, the tokenizer as datatrove loads it, the token size."""

    args: TokenizeArgs
    reader: str  # "disk" (save_to_disk), "file" (a data file through datasets), "jsonl" or "parquet" (a folder),
    # "hub" (a hub name from the datasets cache)
    source: str  # the path the reader reads
    tokenizer_path: str  # a local tokenizer's tokenizer.json (what datatrove loads) or the hub name
    vocab_size: int
    eos_token: str | None
    resume: bool  # the output holds this same tokenization, unfinished or finished

    @property
    def output(self) -> Path:
        return Path(os.path.expanduser(self.args.output))

    @property
    def token_size(self) -> int:
        return nanoset.token_size_for(self.vocab_size)


def offline() -> None:
    """Hub names are read from this machine's datasets cache, never downloaded: the hub client offline here (and in
    the processes this one starts: datatrove's workers, the Slurm tasks through the environment sbatch passes)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    for module in ("huggingface_hub.constants", "datasets.config"):  # read at their import: already imported
        if module in sys.modules:
            sys.modules[module].HF_HUB_OFFLINE = True  # type: ignore[attr-defined]


def _hub(args: TokenizeArgs) -> tuple[tuple[str, str] | None, list[Problem]]:
    """A hub name, read from the datasets cache (as the job's `load_dataset` reads it offline): its split loaded
    (memory-mapped arrow files) and its text column checked."""
    offline()
    import datasets

    try:
        loaded = datasets.load_dataset(args.dataset, split=args.split)
    except Exception as e:  # datasets raises many types for a name it cannot resolve offline
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, [
            Problem(
                "dataset",
                f"{args.dataset!r} (split {args.split!r}) is not in this machine's datasets cache "
                f"({datasets.config.HF_DATASETS_CACHE}): {first}; tokenize reads hub datasets from the cache only",
                f"load it once where the hub is reachable (datasets.load_dataset({args.dataset!r})) with this "
                "HF_DATASETS_CACHE, or save it to a local folder and give that",
            )
        ]
    if args.text_column not in loaded.column_names:
        return None, [
            Problem(
                "text_column",
                f"{args.dataset} has no column {args.text_column!r} (columns: {', '.join(loaded.column_names)})",
                f"use --text_column {loaded.column_names[0]}" if loaded.column_names else "give another dataset",
            )
        ]
    return ("hub", args.dataset), []


def _dataset(args: TokenizeArgs) -> tuple[tuple[str, str] | None, list[Problem]]:
    """(reader, source) for --dataset, or its problems."""
    if not is_local_path(args.dataset):
        return _hub(args)
    path = Path(os.path.expanduser(args.dataset))
    if not path.exists():
        return None, [Problem("dataset", f"{path} does not exist", "give a save_to_disk directory or a data file")]
    if path.is_dir() and not (path / "dataset_info.json").is_file() and not (path / "dataset_dict.json").is_file():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in FILE_READERS)
        kinds = {FILE_READERS[p.suffix] for p in files}
        if len(kinds) == 1:
            return (kinds.pop(), str(path)), datacheck.dataset_problems(str(files[0]), args.text_column, args.split)
        if len(kinds) > 1:
            return None, [Problem("dataset", f"{path} mixes .jsonl and .parquet files", "give a folder of one kind")]
    problems = datacheck.dataset_problems(str(path), args.text_column, args.split)
    if path.is_dir() and (path / "dataset_dict.json").is_file() and not (path / "dataset_info.json").is_file():
        path = path / args.split  # a saved DatasetDict: its split, a saved Dataset
    return ("disk" if path.is_dir() else "file", str(path)), problems


def _eos(args: TokenizeArgs, tokenizer: Any, directory: Path | None) -> tuple[str | None, list[Problem]]:
    if args.eos_token == "none":
        return None, []
    token: str | None = args.eos_token
    if args.eos_token == "auto":
        token = None
        config = directory / "tokenizer_config.json" if directory else None
        if config is not None and config.is_file():
            eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
            token = eos.get("content") if isinstance(eos, dict) else eos
        if token is None:
            return None, []  # the tokenizer names none: documents are not separated (as datatrove's default)
    if tokenizer.token_to_id(token) is None:
        return None, [
            Problem("eos_token", f"{token!r} is not in the tokenizer's vocabulary", "give one of its tokens, or none")
        ]
    return token, []


def _tokenizer(args: TokenizeArgs) -> tuple[tuple[str, int, str | None] | None, list[Problem]]:
    """(what datatrove loads, vocabulary size, end-of-document token) for --tokenizer, or its problems."""
    from tokenizers import Tokenizer

    directory: Path | None = None
    if is_local_path(args.tokenizer):
        problems = datacheck.tokenizer_problems(args.tokenizer)
        if problems:
            return None, problems
        directory = Path(os.path.expanduser(args.tokenizer))
        if not (directory / "tokenizer.json").is_file():
            return None, [
                Problem(
                    "tokenizer",
                    f"{directory} has no tokenizer.json (datatrove's tokenizer reads a fast tokenizer's file)",
                    "save it with AutoTokenizer.from_pretrained(...).save_pretrained(DIR), which writes one",
                )
            ]
        loaded = str(directory / "tokenizer.json")
    else:
        loaded = args.tokenizer
    try:
        tokenizer = Tokenizer.from_file(loaded) if directory else Tokenizer.from_pretrained(loaded)
    except Exception as e:  # tokenizers raises plain Exceptions for a file or a name it cannot read
        return None, [Problem("tokenizer", f"cannot load {loaded} ({e})", "give a tokenizer directory or hub name")]
    eos, problems = _eos(args, tokenizer, directory)
    return (loaded, tokenizer.get_vocab_size(), eos), problems


def _inputs(args: TokenizeArgs) -> dict[str, Any]:
    """What makes two tokenizations the same (a record's, compared on a rerun)."""
    keep = ("dataset", "tokenizer", "text_column", "split", "eos_token", "tasks", "shuffle", "seed")
    inputs = {k: v for k, v in asdict(args).items() if k in keep}
    for key in ("dataset", "tokenizer"):  # a local path as the same path from any directory
        if is_local_path(inputs[key]):
            inputs[key] = os.path.abspath(os.path.expanduser(inputs[key]))
    return inputs


def _output(args: TokenizeArgs) -> tuple[bool, list[Problem]]:
    """Whether the output continues an earlier run of this same tokenization, or the problems with it."""
    out = Path(os.path.expanduser(args.output))
    fix = "give a new --output (or remove this one)"
    if out.exists() and not out.is_dir():
        return False, [Problem("output", f"{out} is a file", fix)]
    record = out / RECORD_DIR / RECORD
    if record.is_file():
        try:
            earlier = json.loads(record.read_text(encoding="utf-8"))["inputs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return False, [Problem("output", f"cannot read {record} ({e})", fix)]
        differ = sorted(k for k, v in _inputs(args).items() if earlier.get(k) != v)
        if differ:
            was = ", ".join(f"--{k} {earlier.get(k)}" for k in differ)
            return False, [Problem("output", f"{out} holds a tokenization made with {was}", f"{fix}, or use those")]
        return True, []
    if out.is_dir() and any(out.iterdir()):
        return False, [Problem("output", f"{out} is not empty and holds no tokenization of this command", fix)]
    parent = next(p for p in [out, *out.parents] if p.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        return False, [Problem("output", f"cannot write in {parent}", "give an --output you can write")]
    return False, []


def check(args: TokenizeArgs) -> tuple[Plan | None, list[Problem]]:
    """Every problem with the command at once; a Plan only where there is none."""
    problems = [
        Problem(flag, f"--{flag} {value} is below 1", f"use --{flag} 1 or more")
        for flag, value in (("tasks", args.tasks), ("workers", args.workers))
        if value is not None and value < 1
    ]
    reader, found = _dataset(args)
    problems += found
    tokenizer, found = _tokenizer(args)
    problems += found
    resume, found = _output(args)
    problems += found
    if problems or reader is None or tokenizer is None:
        return None, problems
    loaded, vocab, eos = tokenizer
    return Plan(args, reader[0], reader[1], loaded, vocab, eos, resume), []


def pipeline(plan: Plan) -> list[Any]:
    """The datatrove pipeline: the reader for the input's kind, then the tokenizer."""
    from datatrove.pipeline.readers import HuggingFaceDatasetReader, JsonlReader, ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    args = plan.args
    reader: Any
    if plan.reader == "disk":
        reader = HuggingFaceDatasetReader(plan.source, {}, load_from_disk=True, text_key=args.text_column)
    elif plan.reader == "hub":  # load_dataset(name, split=...) in each task, offline (`offline`)
        reader = HuggingFaceDatasetReader(plan.source, {"split": args.split}, text_key=args.text_column)
    elif plan.reader == "file":
        builder = datacheck.DATA_FILE_BUILDERS[Path(plan.source).suffix]
        options = {"data_files": plan.source, "split": "train"}
        reader = HuggingFaceDatasetReader(builder, options, text_key=args.text_column)
    else:
        kind = JsonlReader if plan.reader == "jsonl" else ParquetReader
        reader = kind(plan.source, text_key=args.text_column, glob_pattern=f"*.{plan.reader}")
    local = plan.tokenizer_path != args.tokenizer  # a local directory's tokenizer.json
    tokenizer = DocumentTokenizer(
        output_folder=str(plan.output),
        # what the metadata records and nanotron main compares, as a string, with the config's tokenizer (and loads
        # with AutoTokenizer where the config names none): the directory, not its tokenizer.json
        tokenizer_name_or_path=os.path.abspath(os.path.expanduser(args.tokenizer)) if local else args.tokenizer,
        eos_token=plan.eos_token,
        shuffle_documents=args.shuffle,
        seed=args.seed,
    )
    if local:  # datatrove's load_tokenizer would ask the hub for a directory: its cached tokenizer given instead
        tokenizer.tokenizer = _local_tokenizer(plan)
    return [reader, tokenizer]


def _local_tokenizer(plan: Plan) -> Any:
    """A local tokenizer.json loaded as datatrove's `tokenizer` property does (utils/tokenization.py): the file,
    with the end-of-document token appended by a post-processor."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer.from_file(plan.tokenizer_path)
    if plan.eos_token:
        eos = [("<EOS>", tokenizer.token_to_id(plan.eos_token))]
        tokenizer.post_processor = TemplateProcessing(single="$A <EOS>", special_tokens=eos, pair=None)
    return tokenizer


def write_record(plan: Plan, command: list[str], status: str, extra: dict[str, Any] | None = None) -> Path:
    """The output's record: the command, versions, input fingerprint, status (and at its end the token count)."""
    path = plan.output / RECORD_DIR / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # the Slurm jobs of earlier attempts stay listed
        jobs = list(json.loads(path.read_text(encoding="utf-8")).get("slurm_jobs", []))
    except (OSError, ValueError, AttributeError):
        jobs = []
    cache = provenance.hub_cache(os.environ)
    record = {
        "command": shlex.join([sys.executable, "-m", "launcher.data", *command]),
        "cwd": os.getcwd(),
        "inputs": _inputs(plan.args),
        "dataset": provenance.fingerprint(plan.args.dataset, "datasets", cache),
        "tokenizer": provenance.fingerprint(plan.args.tokenizer, "models", cache),
        "tokenizer_loaded": plan.tokenizer_path,
        "vocab_size": plan.vocab_size,
        "token_size": plan.token_size,
        "eos_token": plan.eos_token,
        "versions": provenance.versions(provenance.TOKENIZE_PACKAGES),
        "status": status,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "slurm_jobs": jobs,
        **(extra or {}),
    }
    atomic.replace(path, json.dumps(record, indent=2) + "\n")
    return path


def run_local(plan: Plan, command: list[str]) -> nanoset.TokenizedFolder:
    """Tokenize on this machine with datatrove's LocalPipelineExecutor; the finished folder, checked. `command`:
    the arguments as given (the record's)."""
    from datatrove.executor import LocalPipelineExecutor

    write_record(plan, command, "running")
    executor = LocalPipelineExecutor(
        pipeline=pipeline(plan),
        tasks=plan.args.tasks,
        workers=plan.args.workers or 1,
        logging_dir=str(plan.output / RECORD_DIR / "logs"),
        skip_completed=True,
    )
    executor.run()
    return finish(plan, command)


def finish(plan: Plan, command: list[str]) -> nanoset.TokenizedFolder:
    """The folder checked whole once every task ended, and the record completed with its counts."""
    folder, problems = nanoset.inspect(plan.output, "output", plan.vocab_size)
    if folder is None:
        write_record(plan, command, "incomplete", {"problems": [str(p) for p in problems]})
        listed = "\n".join(f"  - {p}" for p in problems)
        raise LauncherError(f"the tokenization did not finish whole; the same command continues it:\n{listed}")
    write_record(
        plan, command, "complete", {"tokens": folder.tokens, "documents": folder.documents, "files": len(folder.files)}
    )
    return folder
