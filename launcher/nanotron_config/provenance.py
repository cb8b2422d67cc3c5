"""What a run really read and ran with, one rule for the job (which records it at each attempt's start) and the
launcher (which compares it with what a rerun would get): a dataset's or tokenizer's fingerprint, which nanotron
is installed (its version and, for a source install, its git commit and whether it was changed), and the versions
of the packages each record holds (`versions`: the launch's manifest, the job's runtime record, a tokenized
folder's record).

Standard library only, and cheap: the job's rank 0 runs it before training. A local dataset is fingerprinted by its
files' sizes and the sha256 of their first and last MiB (a file of up to 2 MiB whole), not by reading it all (a
tokenized folder by its sizes and its indexes' and metadata's hashes, never its token files' content); a hub
name by the revision this machine's hub cache holds for it. nanotron is found without importing it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launcher.nanotron_config.datasource import is_local_path

EDGE_BYTES = 1 << 20  # the first and the last MiB of each file
MAX_FILES_HASHED = 64  # files hashed per dataset, spread evenly over them in name order; the others by size only
RANDOM = "(random tokens)"  # the name a run without a dataset records its data under
MAX_FILES_LISTED = 100_000  # a directory with more is fingerprinted by its first this many files, and says so
# The packages whose versions each record holds (`versions`, beside Python's). A launch's manifest and the job's
# runtime record hold the same ones, so that the launcher's Python and the job's compare name by name.
RUN_PACKAGES = ("nanotron", "torch", "transformers", "datasets", "tokenizers", "wandb", "simple-parsing", "pyyaml",
                "jinja2")  # fmt: skip
TOKENIZE_PACKAGES = ("datatrove", "tokenizers", "datasets", "nanotron-slurm-launcher")  # a tokenized folder's record


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def versions(packages: tuple[str, ...], search: list[str] | None = None) -> dict[str, str | None]:
    """Python's version and each package's (None where it is not installed), as `search` (default: sys.path)
    finds them, without importing any: one pass over the `name-version.dist-info` directory names there
    (importlib.metadata's per-package lookups cost a tenth of a dry run), importlib.metadata only for a package
    installed another way (an egg-info)."""
    search = sys.path if search is None else search
    found: dict[str, str] = {}
    for entry in search:
        try:
            children = os.listdir(entry or ".")
        except OSError:
            continue
        for child in children:
            if child.endswith(".dist-info"):
                dist, _, dist_version = child[: -len(".dist-info")].rpartition("-")
                found.setdefault(_normalized(dist), dist_version)
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        version = found.get(_normalized(name))
        if version is None:
            from importlib import metadata  # slow to import: only where the names did not say

            installed = next(iter(metadata.distributions(name=name, path=search)), None)
            version = installed.version if installed is not None else None
        out[name] = version
    return out


def _file_digest(path: Path, size: int) -> str:
    """sha256 of the first and last MiB of a file (of the whole file where it is no longer than both)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= 2 * EDGE_BYTES:
            h.update(f.read())
        else:
            h.update(f.read(EDGE_BYTES))
            f.seek(size - EDGE_BYTES)
            h.update(f.read(EDGE_BYTES))
    return h.hexdigest()


def _files(root: Path) -> tuple[list[Path], bool]:
    """The files under `root` (itself, where it is a file), in name order, without hidden ones (a cache's lock or
    temporary file); and whether the listing was cut at MAX_FILES_LISTED."""
    if root.is_file():
        return [root], False
    if not root.is_dir():
        raise FileNotFoundError(2, "no such file or directory", str(root))
    found: list[Path] = []
    for parent, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(parent) / n for n in sorted(names) if not n.startswith(".")]
        if len(found) >= MAX_FILES_LISTED:
            return sorted(found)[:MAX_FILES_LISTED], True
    return sorted(found), False


def _spread(n: int, most: int) -> set[int]:
    """At most `most` of the indices 0..n-1, spread evenly (the first and the last among them)."""
    if n <= most:
        return set(range(n))
    return {round(i * (n - 1) / (most - 1)) for i in range(most)}


TOKENIZED = (".ds", ".ds.index", ".ds.metadata", ".ds.loss")  # datatrove's token files and the files beside them
NOT_HASHED = (".ds",)  # a tokenized folder's token files: by name and size (their index pins what they hold)


def local_fingerprint(path: Path) -> dict[str, Any]:
    """A local file or directory: its files, their total size and one sha256 over each file's name, size and
    first/last MiB (`hashed` of them; the rest by name and size).

    A tokenized folder (datatrove's token files, a Nanoset) by its data files only (not `tokenize/`'s record and
    logs, which change as attempts run): every file's name and size, and the sha256 of its indexes and metadata
    (every document's end offset, the tokenizer, the count; an index's first and last MiB), never of the token
    files themselves (`tokenized`: True)."""
    out: dict[str, Any] = {"path": str(path)}
    try:
        files, cut = _files(path)
        tokenized = path.is_dir() and any(f.name.endswith(".ds") for f in files)
        if tokenized:
            files = [f for f in files if f.name.endswith(TOKENIZED)]
        h = hashlib.sha256()
        total = 0
        readable = [n for n, f in enumerate(files) if not (tokenized and f.name.endswith(NOT_HASHED))]
        hashed = {readable[i] for i in _spread(len(readable), MAX_FILES_HASHED * (2 if tokenized else 1))}
        for n, f in enumerate(files):
            size = f.stat().st_size
            total += size
            digest = _file_digest(f, size) if n in hashed else "-"
            h.update(f"{f.relative_to(path) if f != path else f.name}\t{size}\t{digest}\n".encode(errors="replace"))
    except OSError as e:
        return {**out, "error": e.strerror or str(e)}
    out.update(files=len(files), bytes=total, sha256=h.hexdigest(), hashed=len(hashed))
    if tokenized:
        out["tokenized"] = True
    if cut:
        out["listed_up_to"] = MAX_FILES_LISTED
    return out


def hub_cache(environ: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps its downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(environ["HF_HUB_CACHE"]))
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expanduser(home)) / "hub"


def hub_fingerprint(name: str, kind: str, cache: Path) -> dict[str, Any]:
    """A hub name (`kind`: "datasets" or "models") and the revision the hub cache holds for it (its main
    branch's commit), or None where this machine has not downloaded it."""
    folder = cache / f"{kind}--{name.replace('/', '--')}" / "refs" / "main"
    try:
        revision: str | None = folder.read_text(encoding="utf-8").strip() or None
    except (OSError, ValueError):
        revision = None
    return {"hub": name, "revision": revision}


def fingerprint(value: str | None, kind: str, cache: Path) -> dict[str, Any]:
    """A --dataset (`kind` "datasets") or --tokenizer ("models") value's fingerprint: a local path's files, or a
    hub name's cached revision; {"random": True} for no dataset."""
    if not value:
        return {"random": True}
    if is_local_path(value):
        return local_fingerprint(Path(os.path.expanduser(value)))
    return hub_fingerprint(value, kind, cache)


def same_data(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """Whether two fingerprints say the same data: None where either cannot say (missing, unreadable, a hub name
    without a cached revision)."""
    if not a or not b or "error" in a or "error" in b:
        return None
    if "hub" in a or "hub" in b:
        if a.get("hub") != b.get("hub"):
            return False
        return None if not a.get("revision") or not b.get("revision") else a["revision"] == b["revision"]
    if a.get("random") or b.get("random"):
        return bool(a.get("random")) == bool(b.get("random"))
    return (a.get("sha256"), a.get("bytes")) == (b.get("sha256"), b.get("bytes"))


def short(fp: Mapping[str, Any] | None) -> str:
    """A fingerprint in a few words, for a terminal."""
    if not fp:
        return "not recorded"
    if "error" in fp:
        return f"{fp.get('path')}: {fp['error']}"
    if fp.get("random"):
        return "random tokens"
    if "hub" in fp:
        return f"{fp['hub']} @ {fp['revision'][:12] if fp.get('revision') else 'revision not cached'}"
    return f"{fp['files']} file(s), {fp['bytes']} bytes, sha256 {str(fp['sha256'])[:12]}"


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _dist_of(where: Path, search: list[str]) -> tuple[Path | None, dict[str, Any]]:
    """The installed metadata (`nanotron-VERSION.dist-info`) of the nanotron found at `where`, and pip's record of
    where it came from (direct_url.json; {} where none): the one beside it (an installed copy), or an editable
    install's whose source holds it; (None, {}) for a tree on PYTHONPATH that pip did not install."""
    for entry in search:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not (name.lower().startswith("nanotron-") and name.endswith(".dist-info")):
                continue
            dist = Path(entry or ".") / name
            try:
                direct = json.loads((dist / "direct_url.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                direct = {}
            direct = direct if isinstance(direct, dict) else {}
            url = str(direct.get("url") or "")
            source = Path(url[len("file://") :]) if url.startswith("file://") else None
            if dist.parent.resolve() == where.parent.resolve() or (source and where.is_relative_to(source)):
                return dist, direct
    return None, {}


def _init_version(package_dir: Path) -> str | None:
    try:
        text = (package_dir / "__init__.py").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
    return found.group(1) if found else None


def nanotron_install(search: list[str]) -> dict[str, Any]:
    """Which nanotron `search` (a sys.path) finds, without importing it: where, its version (its installed
    metadata's, else its `__version__`), and for a source install its git commit and whether the tree differs
    from it (`dirty`, tracked files only): from pip's record of a git URL (direct_url.json), or from the git
    checkout the package lives in (an editable install, or a clone on PYTHONPATH)."""
    spec = importlib.machinery.PathFinder.find_spec("nanotron", search)
    if spec is None or not spec.submodule_search_locations:
        return {"found": False}
    where = Path(list(spec.submodule_search_locations)[0])
    dist, direct = _dist_of(where, search)
    version = dist.name[len("nanotron-") : -len(".dist-info")] if dist is not None else None
    out: dict[str, Any] = {"found": True, "path": str(where), "version": version or _init_version(where),
                           "commit": None, "dirty": None}  # fmt: skip
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("commit_id"):  # pip install git+URL@REV: the commit pip checked out
        out.update(commit=vcs["commit_id"], dirty=False, source=direct.get("url"))
        return out
    if dist is not None and dist.parent.resolve() == where.parent.resolve():
        return out  # an installed copy (a wheel, or a directory copied at install): no source tree to ask
    tracked = _git(where, "ls-files", "--error-unmatch", "__init__.py")  # the package is the checkout's own
    described = _git(where, "describe", "--always", "--dirty", "--abbrev=40") if tracked is not None else None
    if described:
        out.update(commit=described.removesuffix("-dirty"), dirty=described.endswith("-dirty"), source=str(where))
    return out
