"""What a run read and ran with (launcher.nanotron_config.provenance) and the job's record of it at each attempt's
start (launcher.train.record): fingerprints of data and tokenizers, nanotron's version and source commit, the
packages' versions each record holds."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import tiny_config

from launcher.nanotron_config import provenance as pv
from launcher.train import record
from launcher.train.environment import JobEnvironment
from launcher.train.settings import to_train_config

MIB = 1 << 20


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / "data-00000-of-00001.arrow").write_bytes(bytes(range(256)) * (3 * MIB // 256))  # 3 MiB
    (root / "state.json").write_text('{"a": 1}')
    (root / ".lock").write_text("ignored")
    return root


def test_a_local_dataset_is_its_files_sizes_and_first_and_last_mib(tmp_path: Path):
    root = _tree(tmp_path / "ds")
    first = pv.local_fingerprint(root)
    assert (first["files"], first["bytes"], first["hashed"]) == (2, 3 * MIB + 8, 2)
    (root / ".lock").write_text("another process's lock")  # hidden files are not the data
    assert pv.local_fingerprint(root) == first
    big = root / "data-00000-of-00001.arrow"
    data = bytearray(big.read_bytes())
    data[MIB + 5] ^= 1  # the middle MiB is not read: by design, a change there goes unseen
    big.write_bytes(bytes(data))
    assert pv.local_fingerprint(root)["sha256"] == first["sha256"]
    for where in (5, len(data) - 5):  # the first and the last MiB are
        changed = bytearray(data)
        changed[where] ^= 1
        big.write_bytes(bytes(changed))
        assert pv.local_fingerprint(root)["sha256"] != first["sha256"], where
    big.write_bytes(bytes(data) + b"x")  # and so is the size
    assert pv.local_fingerprint(root)["bytes"] == first["bytes"] + 1
    (root / "state.json").write_text('{"a": 2}')  # a small file whole
    assert pv.same_data(pv.local_fingerprint(root), first) is False


def test_a_tokenized_folder_is_its_sizes_and_its_indexes(nanoset_folders: list[Path], tmp_path: Path):
    """A Nanoset by its data files' names and sizes and its indexes' and metadata's hashes: a token file's content
    is never read (a change inside it, its size kept, goes unseen), an index's is, and tokenize/'s record and logs
    (which change as attempts run) are no part of it."""
    root = tmp_path / "tok"
    shutil.copytree(nanoset_folders[0], root)
    first = pv.local_fingerprint(root)
    (token_file,) = root.glob("*.ds")
    index, metadata = Path(f"{token_file}.index"), Path(f"{token_file}.metadata")
    sizes = sum(p.stat().st_size for p in (token_file, index, metadata))
    assert first["tokenized"] is True and (first["files"], first["bytes"], first["hashed"]) == (3, sizes, 2)
    assert pv.local_fingerprint(root) == first
    (root / "tokenize" / "logs" / "another-attempt.log").write_text("a later attempt's log")
    (root / "tokenize" / "record.json").write_text("{}")
    assert pv.local_fingerprint(root) == first
    tokens = bytearray(token_file.read_bytes())
    tokens[2] ^= 1  # inside the first MiB: a token file is not read at all
    token_file.write_bytes(bytes(tokens))
    assert pv.same_data(pv.local_fingerprint(root), first) is True
    token_file.write_bytes(bytes(tokens[:-2]))  # a token less: its size
    assert pv.same_data(pv.local_fingerprint(root), first) is False
    token_file.write_bytes(bytes(tokens))
    offsets = bytearray(index.read_bytes())
    offsets[8] ^= 1  # a document's end moved, the sizes kept: the index's hash
    index.write_bytes(bytes(offsets))
    assert pv.same_data(pv.local_fingerprint(root), first) is False


def test_a_single_file_a_missing_path_and_no_dataset(tmp_path: Path):
    one = tmp_path / "train.jsonl"
    one.write_text('{"text": "a b"}\n')
    fp = pv.fingerprint(str(one), "datasets", tmp_path)
    assert (fp["files"], fp["bytes"]) == (1, one.stat().st_size)
    gone = pv.fingerprint(str(tmp_path / "gone"), "datasets", tmp_path)
    assert "error" in gone and pv.same_data(gone, gone) is None and "gone" in pv.short(gone)
    assert pv.fingerprint(None, "datasets", tmp_path) == {"random": True}
    assert pv.short({"random": True}) == "random tokens"


def test_a_hub_name_is_its_cached_revision(tmp_path: Path):
    cache = pv.hub_cache({"HF_HOME": str(tmp_path / "hf")})
    assert cache == tmp_path / "hf" / "hub"
    assert pv.hub_fingerprint("org/data", "datasets", cache) == {"hub": "org/data", "revision": None}
    refs = cache / "datasets--org--data" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("0123456789abcdef\n")
    fp = pv.fingerprint("org/data", "datasets", cache)
    assert fp == {"hub": "org/data", "revision": "0123456789abcdef"}
    assert pv.same_data(fp, {"hub": "org/data", "revision": "fedcba"}) is False
    assert pv.same_data(fp, {"hub": "org/data", "revision": None}) is None  # cannot say
    assert pv.same_data(fp, {"hub": "org/other", "revision": None}) is False
    assert pv.short(fp) == "org/data @ 0123456789ab"


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _clone(root: Path) -> Path:
    """A nanotron source tree in a git repository (as `git clone` leaves it): src/nanotron/__init__.py."""
    package = root / "src" / "nanotron"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.4"\n')
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "x")
    return package


def test_nanotron_from_a_clone_on_the_path_is_its_commit_and_state(tmp_path: Path):
    package = _clone(tmp_path / "nanotron")
    head = _git(tmp_path / "nanotron", "rev-parse", "HEAD")
    found = pv.nanotron_install([str(package.parent)])
    assert (found["found"], found["version"], found["commit"], found["dirty"]) == (True, "0.4", head, False)
    (package / "__init__.py").write_text('__version__ = "0.4"\nchanged = 1\n')
    assert pv.nanotron_install([str(package.parent)])["dirty"] is True


def test_nanotron_installed_editable_from_a_clone_is_the_clones_commit(tmp_path: Path):
    package = _clone(tmp_path / "nanotron")
    site = tmp_path / "site"
    (site / "nanotron-0.4.dist-info").mkdir(parents=True)
    url = {"url": (tmp_path / "nanotron").as_uri(), "dir_info": {"editable": True}}
    (site / "nanotron-0.4.dist-info" / "direct_url.json").write_text(json.dumps(url))
    found = pv.nanotron_install([str(site), str(package.parent)])
    assert found["commit"] == _git(tmp_path / "nanotron", "rev-parse", "HEAD") and found["version"] == "0.4"


def test_nanotron_installed_from_a_git_url_or_a_wheel(tmp_path: Path):
    site = tmp_path / "site"
    (site / "nanotron").mkdir(parents=True)
    (site / "nanotron" / "__init__.py").write_text("")
    dist = site / "nanotron-0.4.dist-info"
    dist.mkdir()
    wheel = pv.nanotron_install([str(site)])
    assert (wheel["version"], wheel["commit"], wheel["dirty"]) == ("0.4", None, None)  # PyPI's: no commit to say
    vcs = {"url": "https://github.com/huggingface/nanotron", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}
    (dist / "direct_url.json").write_text(json.dumps(vcs))
    assert pv.nanotron_install([str(site)])["commit"] == "abc123"
    assert pv.nanotron_install([str(tmp_path / "empty")]) == {"found": False}


def test_a_clone_on_the_path_is_not_taken_for_the_installed_wheel(tmp_path: Path):
    # nanotron main on PYTHONPATH in front of PyPI's 0.4 (the tests' python-main): the metadata is the wheel's,
    # not the clone's, and the clone's commit is what runs
    site = tmp_path / "site"
    (site / "nanotron").mkdir(parents=True)
    (site / "nanotron-0.4.dist-info").mkdir()
    package = _clone(tmp_path / "nanotron")
    (package / "__init__.py").write_text('__version__ = "0.4.1"\n')
    found = pv.nanotron_install([str(package.parent), str(site)])
    assert found["path"] == str(package) and found["version"] == "0.4.1" and found["dirty"] is True


def test_versions_are_read_from_the_installed_names_without_importing_a_package(tmp_path: Path):
    site = tmp_path / "site"
    (site / "Simple_Parsing-0.1.9.dist-info").mkdir(parents=True)  # pip's spelling: the name normalised to compare
    (site / "torch-2.13.0+cpu.dist-info").mkdir()
    (site / "jinja2-3.1.6.egg-info").mkdir()  # another layout: importlib.metadata reads it
    (site / "jinja2-3.1.6.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: jinja2\nVersion: 3.1.6\n")
    found = pv.versions(("simple-parsing", "torch", "jinja2", "wandb"), [str(site), str(tmp_path / "not-there")])
    assert found == {"python": platform.python_version(), "simple-parsing": "0.1.9", "torch": "2.13.0+cpu",
                     "jinja2": "3.1.6", "wandb": None}  # fmt: skip
    # the manifest's and a tokenized folder's record read theirs so, on a login node without importing torch
    code = ("import sys; from launcher.bundle import manifest; from launcher.nanotron_config import provenance as pv; "
            "v = manifest.versions(); t = pv.versions(pv.TOKENIZE_PACKAGES); "
            "assert 'torch' not in sys.modules and v['torch'] and t['datatrove'], (v, t)")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr


def _job_config(demo_data, tmp_path: Path):
    return to_train_config(tiny_config(demo_data, tmp_path / "ckpt"))


def test_rank_0_appends_one_record_per_attempt_and_others_write_nothing(tmp_path: Path, demo_data):
    cfg = _job_config(demo_data, tmp_path)
    runtime = tmp_path / "runtime.jsonl"
    env = {"RANK": "0", "WORLD_SIZE": "2", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]",
           "HF_HOME": str(tmp_path / "hf"), "LAUNCHER_BUNDLE": str(tmp_path)}  # fmt: skip
    record.append(cfg, JobEnvironment.read({**env, "RANK": "1"}), "torch")
    assert not runtime.exists()
    record.append(cfg, JobEnvironment.read(env), "torch")
    record.append(cfg, JobEnvironment.read({**env, "SLURM_RESTART_COUNT": "1"}), "torch")
    first, second = (json.loads(line) for line in runtime.read_text().splitlines())
    assert (first["job_id"], first["attempt"], second["attempt"], first["nodes"]) == ("7", 1, 2, "node[1-2]")
    assert first["data"] == {str(demo_data.dataset): pv.local_fingerprint(demo_data.dataset)}
    assert first["tokenizer"] == pv.local_fingerprint(demo_data.tokenizer)
    import torch

    assert first["torch"] == {"version": torch.__version__, "cuda": torch.version.cuda, "nccl": None, "gpu": None}
    assert first["nanotron"] == pv.nanotron_install(sys.path) and first["engine"] == "torch"
    assert first["python"]["executable"] == sys.executable
    assert first["versions"] == pv.versions(pv.RUN_PACKAGES) and first["versions"]["torch"] == torch.__version__
    assert first["took_s"] < 5.0  # well under 1 s: this catches a blow-up, at any load


def test_every_dataset_of_a_mixture_and_of_later_stages_is_fingerprinted(tmp_path: Path, demo_data):
    config = tiny_config(demo_data, tmp_path / "ckpt")
    config["data"]["dataset"]["hf_dataset_or_datasets"] = {str(demo_data.dataset): 0.7, "org/hub-data": 0.3}
    cfg = to_train_config(yaml.safe_load(yaml.safe_dump(config)))
    assert record.datasets_of(cfg) == [str(demo_data.dataset), "org/hub-data"]
    out = record.record(cfg, JobEnvironment.read({"HF_HUB_CACHE": str(tmp_path)}), "torch")
    assert out["data"]["org/hub-data"] == {"hub": "org/hub-data", "revision": None}
    none = to_train_config({**tiny_config(demo_data, tmp_path), "data": {"dataset": None, "seed": 1}})
    assert list(record.record(none, JobEnvironment.read({}), "torch")["data"]) == [pv.RANDOM]


def test_an_unwritable_record_is_a_warning_not_a_failed_job(tmp_path: Path, demo_data, capsys):
    cfg = _job_config(demo_data, tmp_path)
    record.append(cfg, JobEnvironment.read({"LAUNCHER_BUNDLE": str(tmp_path / "no" / "such" / "dir")}), "torch")
    assert "runtime record was not written" in capsys.readouterr().out


def test_a_dataset_of_many_files_hashes_a_few_spread_over_them(tmp_path: Path):
    root = tmp_path / "shards"
    root.mkdir()
    for n in range(pv.MAX_FILES_HASHED * 3):
        (root / f"shard-{n:05d}.bin").write_bytes(n.to_bytes(4, "big") * 8)
    fp = pv.local_fingerprint(root)
    assert (fp["files"], fp["hashed"]) == (pv.MAX_FILES_HASHED * 3, pv.MAX_FILES_HASHED)
    last = root / f"shard-{pv.MAX_FILES_HASHED * 3 - 1:05d}.bin"
    last.write_bytes(b"\xff" * 32)  # the same size, other bytes: the last file is among those hashed
    assert pv.local_fingerprint(root)["sha256"] != fp["sha256"]
