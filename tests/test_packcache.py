"""The torch engine's shared packed windows (`packcache`): named by the data's files, written whole, and read back
by every rank instead of tokenizing again; a data error on rank 0 still reaches every rank."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import tiny_config, write_config

from launcher.errors import TrainError
from launcher.train import packcache
from launcher.train.data import build_micro_batches, build_windows
from launcher.train.settings import TrainConfig, load_train_config
from launcher.train.torch_engine import shared_data


@pytest.fixture
def cfg(demo_data, tmp_path: Path) -> TrainConfig:
    return load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group, as torchrun gives a single rank."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_key_follows_the_data_the_tokenizer_and_the_packing(cfg: TrainConfig, tmp_path: Path) -> None:
    first = packcache.key(cfg)
    assert first is not None and first == packcache.key(dataclasses.replace(cfg))  # the same data, the same name
    assert packcache.key(dataclasses.replace(cfg, sequence_length=cfg.sequence_length * 2)) != first
    assert packcache.key(dataclasses.replace(cfg, text_column="body")) != first
    data_file = next(p for p in Path(cfg.dataset).rglob("*.arrow"))
    stat = data_file.stat()
    os.utime(data_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten in place
    assert packcache.key(cfg) not in (first, None)
    tokenizer_copy = tmp_path / "tokenizer-copy"
    tokenizer_copy.mkdir()
    for f in Path(cfg.tokenizer).iterdir():
        (tokenizer_copy / f.name).write_bytes(f.read_bytes())
    assert packcache.key(dataclasses.replace(cfg, tokenizer=str(tokenizer_copy))) != packcache.key(cfg)
    assert packcache.key(dataclasses.replace(cfg, dataset="someone/on-the-hub")) is None  # not local: not cached
    assert packcache.key(dataclasses.replace(cfg, dataset=None)) is None


def test_saved_whole_and_loaded_mapped(tmp_path: Path) -> None:
    path = tmp_path / ".data-cache" / "windows-abc.npy"
    windows = np.arange(30, dtype=np.int64).reshape(5, 6)
    (tmp_path / ".data-cache").mkdir()
    (tmp_path / ".data-cache" / ".tmp-dead-windows-old.npy").write_bytes(b"half")  # a killed save's leftover
    packcache.save(path, windows)
    loaded = packcache.load(path)
    assert isinstance(loaded, np.memmap) and np.array_equal(loaded, windows) and loaded.dtype == np.int32
    assert sorted(p.name for p in path.parent.iterdir()) == ["windows-abc.npy"]
    path.write_bytes(b"not an array")
    assert packcache.load(path) is None and packcache.load(tmp_path / "missing.npy") is None
    np.save(path, np.zeros(4, dtype=np.int64))  # not windows
    assert packcache.load(path) is None


def test_rank_0_packs_once_and_later_attempts_read_the_cache(
    cfg: TrainConfig, one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_windows(cfg)
    first = shared_data.shared_windows(cfg)
    cached = packcache.path_for(cfg)
    assert cached is not None and cached.parent == Path(cfg.checkpoints_path) / ".data-cache"
    assert first is not None and np.array_equal(first, built)

    def no_second_time(_cfg: TrainConfig) -> np.ndarray:
        raise AssertionError("tokenized again although the cache has the windows")

    monkeypatch.setattr(shared_data, "build_windows", no_second_time)
    again = shared_data.shared_windows(cfg)  # a requeued attempt
    assert again is not None and np.array_equal(again, built)
    from_cache = build_micro_batches(cfg, 0, 1, again)
    from_data = build_micro_batches(cfg, 0, 1, built)
    for k in range(6):
        batch = from_cache.micro_batch(k)
        assert batch.dtype == torch.int64 and torch.equal(batch, from_data.micro_batch(k))


def test_a_data_error_on_rank_0_is_raised_and_nothing_cached(cfg: TrainConfig, one_rank: None) -> None:
    small_vocab = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=16))
    with pytest.raises(TrainError, match="vocab_size is 16"):
        shared_data.shared_windows(small_vocab)
    assert not list((Path(cfg.checkpoints_path) / ".data-cache").glob("*"))


def test_the_waiting_ranks_hear_from_rank_0_while_it_packs(
    cfg: TrainConfig, one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corpus that takes longer to tokenize than a collective may wait: rank 0 broadcasts every HEARTBEAT_S."""
    slow_build = shared_data.build_windows

    def slow(c: TrainConfig) -> np.ndarray:
        time.sleep(0.5)
        return slow_build(c)

    said: list[object] = []
    broadcast = dist.broadcast_object_list

    def counted(objects: list, src: int = 0) -> None:
        broadcast(objects, src=src)
        said.append(objects[0])

    monkeypatch.setattr(shared_data, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(shared_data, "build_windows", slow)
    monkeypatch.setattr(shared_data.dist, "broadcast_object_list", counted)
    windows = shared_data.shared_windows(cfg)
    assert windows is not None and np.array_equal(windows, slow_build(cfg))
    heartbeats = [s for s in said if s is True]
    assert len(heartbeats) >= 5 and said[-2:] == [False, None], said  # working..., done, no error


def test_a_cache_that_cannot_be_written_is_a_warning_and_rank_0_builds_once(
    cfg: TrainConfig, one_rank: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[int] = []
    real_build = shared_data.build_windows

    def counted(c: TrainConfig) -> np.ndarray:
        calls.append(1)
        return real_build(c)

    def full_disk(path: Path, windows: np.ndarray) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_data, "build_windows", counted)
    monkeypatch.setattr(packcache, "save", full_disk)
    windows = shared_data.shared_windows(cfg)
    assert windows is not None and np.array_equal(windows, real_build(cfg)) and len(calls) == 1
    assert "warning: the packed data could not be cached" in capsys.readouterr().out
