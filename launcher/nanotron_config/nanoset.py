"""A folder of tokenized data as datatrove's DocumentTokenizer writes it and nanotron main's Nanoset reads it, read
from its own small files (standard library; no numpy, no datatrove): what it holds and every way it is incomplete.

Per token file (datatrove 0.10's DocumentTokenizer, src/datatrove/pipeline/tokens/tokenizer.py in its repository):
  X.ds           raw little-endian tokens, no header: uint16 (token size 2) or uint32 (4)
  X.ds.index     every document's end offset in tokens, uint64 little-endian: the last one is the file's length
  X.ds.metadata  "tokenizer_name_or_path|token_size", the token count, a readable count
One rule for the launcher (checks before the queue) and the tokenize command (its record), so they cannot disagree.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from launcher.problems import Problem

TOKEN_SUFFIX = ".ds"
INDEX_SUFFIX = ".ds.index"
METADATA_SUFFIX = ".ds.metadata"
TOKEN_SIZES = (2, 4)  # datatrove: 4 where the vocabulary has more than 65,536 entries, else 2
OFFSET_BYTES = 8  # an index entry: uint64
MOST_LISTED = 3  # names quoted in a message before "..."


@dataclass(frozen=True)
class TokenFile:
    path: Path  # the .ds file
    tokens: int  # its size in tokens (its index's last offset, its metadata's count)
    documents: int  # entries in its index


@dataclass(frozen=True)
class TokenizedFolder:
    path: Path
    files: tuple[TokenFile, ...]
    tokenizer: str  # the tokenizer's name or path as the metadata records it
    token_size: int  # bytes per token

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.files)

    @property
    def documents(self) -> int:
        return sum(f.documents for f in self.files)


def is_tokenized(value: str) -> bool:
    """Whether a dataset value names a tokenized folder: a directory holding datatrove's token files (or their
    index or metadata) or `launcher.data tokenize`'s record, at any depth. Stops at the first such file."""
    path = os.path.expanduser(value)
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, "tokenize", "record.json")):
        return True
    for _, _, names in os.walk(path):
        if any(n.endswith((TOKEN_SUFFIX, INDEX_SUFFIX, METADATA_SUFFIX)) for n in names):
            return True
    return False


def max_vocab(token_size: int) -> int:
    """The largest vocabulary a token size holds (ids 0..2**(8*size)-1)."""
    return 1 << (8 * token_size)


def token_size_for(vocab_size: int) -> int:
    """The token size datatrove writes for a vocabulary (utils/tokenization.py)."""
    return 4 if vocab_size > max_vocab(2) else 2


def _listed(names: list[str]) -> str:
    return ", ".join(names[:MOST_LISTED]) + (", ..." if len(names) > MOST_LISTED else "")


def read_metadata(path: Path) -> tuple[str, int, int]:
    """A .ds.metadata file's tokenizer, token size and token count; ValueError where it is not one."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2 or "|" not in lines[0]:
        raise ValueError("not 'tokenizer|token_size' then a token count")
    tokenizer, _, size = lines[0].rpartition("|")
    if not size.isdigit() or int(size) not in TOKEN_SIZES or not lines[1].strip().isdigit():
        raise ValueError(f"token size {size!r} or token count {lines[1].strip()!r} is not a number datatrove writes")
    return tokenizer, int(size), int(lines[1])


def _last_offset(index: Path) -> tuple[int, int]:
    """The number of documents an index lists and its last end offset (in tokens); ValueError where its size is
    not a whole number of entries."""
    size = index.stat().st_size
    if size == 0 or size % OFFSET_BYTES:
        raise ValueError(f"{index.name} is {size} bytes, not a whole number of {OFFSET_BYTES}-byte offsets")
    with index.open("rb") as f:
        f.seek(size - OFFSET_BYTES)
        (last,) = struct.unpack("<Q", f.read(OFFSET_BYTES))
    return size // OFFSET_BYTES, last


def _token_file(ds: Path, flag: str) -> tuple[TokenFile | None, tuple[str, int] | None, list[Problem]]:
    """One token file checked against its index and metadata: the file, (tokenizer, token size), problems."""
    redo = "tokenize again into a new --output (python -m launcher.data tokenize), or restore the file"
    index, metadata = Path(f"{ds}.index"), Path(f"{ds}.metadata")
    missing = [p.name for p in (index, metadata) if not p.is_file()]
    if missing:
        what = " and ".join(missing)
        return (
            None,
            None,
            [Problem(flag, f"{ds} has no {what} beside it (an unfinished or damaged tokenization)", redo)],
        )
    try:
        tokenizer, token_size, count = read_metadata(metadata)
        documents, last = _last_offset(index)
        size = ds.stat().st_size
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, None, [Problem(flag, f"cannot read {ds}'s files ({e})", redo)]
    problems = []
    if size % token_size:
        problems.append(Problem(flag, f"{ds} is {size} bytes, not a whole number of {token_size}-byte tokens", redo))
    elif last * token_size != size:
        problems.append(
            Problem(
                flag,
                f"{ds} holds {size // token_size} tokens but its index ends at {last} (truncated or overwritten)",
                redo,
            )
        )
    elif count != last:
        problems.append(Problem(flag, f"{metadata} counts {count} tokens, the file holds {last}", redo))
    if problems:
        return None, (tokenizer, token_size), problems
    return TokenFile(ds, last, documents), (tokenizer, token_size), []


def inspect(
    folder: str | Path, flag: str = "dataset", vocab_size: int | None = None
) -> tuple[TokenizedFolder | None, list[Problem]]:
    """A tokenized folder and every problem with it at once (`flag` names the flag that gave the folder; with
    `vocab_size`, the token size must hold that vocabulary). The folder is None where any problem was found."""
    path = Path(os.path.expanduser(str(folder)))
    how = "give a folder written by `python -m launcher.data tokenize` (docs/data.md)"
    if not path.is_dir():
        return None, [
            Problem(flag, f"tokenized folder {path} {'is not a directory' if path.exists() else 'does not exist'}", how)
        ]
    try:
        every = sorted(p for p in path.rglob("*") if p.is_file())
    except OSError as e:
        return None, [Problem(flag, f"cannot read {path} ({e.strerror or e})", "give a folder you can read")]
    token_files = [p for p in every if p.name.endswith(TOKEN_SUFFIX)]
    if not token_files:
        held = _listed([str(p.relative_to(path)) for p in every])
        what = f"holds no token files (*{TOKEN_SUFFIX}; it holds {held})" if every else "is empty"
        return None, [Problem(flag, f"{path} {what}", f"tokenize a dataset into it first: {how}")]
    problems: list[Problem] = []
    files: list[TokenFile] = []
    kinds: dict[tuple[str, int], list[str]] = {}
    for ds in token_files:
        token_file, kind, found = _token_file(ds, flag)
        problems += found
        if kind is not None:
            kinds.setdefault(kind, []).append(ds.name)
        if token_file is not None:
            files.append(token_file)
    if len(kinds) > 1:
        made = "; ".join(f"{_listed(names)} by {name} ({size}-byte tokens)" for (name, size), names in kinds.items())
        problems.append(
            Problem(flag, f"{path} mixes files of different tokenizations: {made}", "give each tokenization a folder")
        )
    if len(kinds) == 1:
        ((tokenizer, token_size),) = kinds
        if vocab_size is not None and vocab_size > max_vocab(token_size):
            problems.append(
                Problem(
                    flag,
                    f"{path} holds {token_size}-byte tokens (ids below {max_vocab(token_size)}), too small for a "
                    f"vocabulary of {vocab_size}",
                    "tokenize again with this tokenizer (datatrove then writes 4-byte tokens)",
                )
            )
        if not problems:
            return TokenizedFolder(path, tuple(files), tokenizer, token_size), []
    return None, problems


def same_tokenizer(recorded: str, tokenizer: str) -> bool:
    """Whether a metadata's tokenizer is the run's --tokenizer: the same hub name, or the same local tokenizer (a
    directory, or its tokenizer.json as datatrove's tokenizer loads a local one)."""
    if recorded == tokenizer:
        return True

    def local(value: str) -> str | None:
        path = Path(os.path.expanduser(value))
        if path.name == "tokenizer.json":
            path = path.parent
        return os.path.realpath(path) if path.exists() else None

    a, b = local(recorded), local(tokenizer)
    return a is not None and a == b


def datasets_args(
    parts: list[tuple[TokenizedFolder, float]], vocab_size: int, flag: str = "dataset"
) -> tuple[dict | None, list[Problem]]:
    """nanotron main's `NanosetDatasetsArgs` (config.py) for folders checked by `inspect` (their token size against
    the tokenizer's vocabulary) and their weights, every field that must agree with the files from the files. main
    asserts at parse time: one tokenizer and token size for all folders, `tokenizer_name` equal (as a string) to each
    folder's metadata and to the config's tokenizer (given the name, it loads no tokenizer there), `vocab_size`
    equal to the model's (`vocab_size`: the model's, padded as the config writes it). Weights: `weight_problems`."""
    problems = []
    kinds = {(f.tokenizer, f.token_size) for f, _ in parts}
    if len(kinds) > 1:
        made = "; ".join(f"{f.path} by {f.tokenizer} ({f.token_size}-byte tokens)" for f, _ in parts)
        problems.append(Problem(flag, f"the folders were tokenized differently: {made}", "tokenize them alike"))
    problems += weight_problems([(str(f.path), w) for f, w in parts], flag)
    if problems or not parts:
        return None, problems
    first = parts[0][0]
    return {
        "dataset_folder": [str(f.path) for f, _ in parts],
        "dataset_weights": [float(w) for _, w in parts],
        "tokenizer_name": first.tokenizer,
        "vocab_size": vocab_size,
        "token_size_in_bytes": first.token_size,
    }, []


def weight_problems(parts: list[tuple[str, float]], flag: str = "dataset") -> list[Problem]:
    """A Nanoset mixture's weights as nanotron main reads them: it normalises them by their sum (asserting it is
    positive), so any weight >= 0 is one (above 1 too: not the fraction of rows a hub mixture keeps); a negative one
    would ask for a negative number of samples, and a sum of 0 (or nothing finite) for none at all."""
    bad = [f"{name}:{w}" for name, w in parts if not (math.isfinite(w) and w >= 0)]
    if bad:
        fix = "give each folder a weight >= 0 (nanotron main normalises them by their sum)"
        return [Problem(flag, f"Nanoset weights must be numbers >= 0: {', '.join(bad)}", fix)]
    if parts and sum(w for _, w in parts) <= 0:
        listed = ", ".join(f"{name}:{w:g}" for name, w in parts)
        return [Problem(flag, f"the weights of {listed} sum to 0: nothing would be read", "give one a weight > 0")]
    return []


TAIL = "tail:"  # --eval_heldout tail:N
SCALES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
COUNT = re.compile(r"(\d{1,15}(?:\.\d{1,9})?)([kKmMgGbB]?)")  # 100k, 1.5M, 2_000_000


HELDOUT = "heldout"  # the name of a held-out domain given without one (--eval_heldout SOURCE)
DOMAIN = re.compile(r"([A-Za-z][\w.-]{0,63})=(.*)", re.S)  # NAME=SOURCE


def heldout_domains(value: str | None) -> list[tuple[str, str]]:
    """`--eval_heldout NAME=SOURCE[,NAME=SOURCE...]` as (name, source) pairs, in order; a bare SOURCE is named
    "heldout". Not checked here (names twice, a bare source beside others: launcher/evals/checks.py)."""
    if not value:
        return []
    found = []
    for part in value.split(","):
        named = DOMAIN.fullmatch(part.strip())
        found.append((named.group(1), named.group(2).strip()) if named else (HELDOUT, part.strip()))
    return found


def heldout_tail(value: str | None) -> int | None:
    """`--eval_heldout tail:N`'s N (of its domain NAME=tail:N, where it names several): the tokens at the end of the
    run's tokenized folder (its files in sorted order) kept out of training and evaluated on; N in digits, or with
    k, M or G (B) for thousands, millions, billions. None where no domain is a tail; ValueError where N is not a
    positive count."""
    tails = [source for _, source in heldout_domains(value) if source.startswith(TAIL)]
    if not tails:
        return None
    value = tails[0]
    found = COUNT.fullmatch(value.removeprefix(TAIL).strip().replace("_", ""))
    if found is None:
        raise ValueError(f"{value!r}: N is not a count of tokens (digits, or with k, M, G)")
    number, scale = found.group(1), SCALES.get(found.group(2).lower(), 1)
    count = Fraction(number) * scale
    if count < 1 or count.denominator != 1:
        raise ValueError(f"{value!r}: N is not a whole number of tokens >= 1")
    return int(count)


def tail_tokens(folder: TokenizedFolder, count: int) -> list[tuple[Path, int, int]]:
    """Where the last `count` tokens of a folder lie: (token file, first token, tokens) per file, in order."""
    out, start = [], folder.tokens - count
    offset = 0
    for token_file in folder.files:
        end = offset + token_file.tokens
        if end > start:
            first = max(start - offset, 0)
            out.append((token_file.path, first, token_file.tokens - first))
        offset = end
    return out
