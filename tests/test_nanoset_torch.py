"""The torch engine on tokenized folders (nanotron main's Nanosets, made by the real tokenizer, datatrove): the
windows are the token files' own tokens, cut as the engine's packing cuts text; a mixture weighs as main does
(normalised); run_train.py trains on a folder with the loss falling, the nanotron engine left aside by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import DemoData, tiny_config, write_config
from test_train_engine import door, metrics

from launcher.nanotron_config import dialect, nanoset, nanoset_yaml
from launcher.train.data import PackedWindows, build_micro_batches
from launcher.train.main import NANOSET_NANOTRON
from launcher.train.settings import to_train_config
from launcher.train.tokenized import FolderWindows


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for name in ("LAUNCHER_BUNDLE", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _config(demo: DemoData, folders: dict[str, float], checkpoints: Path, **overrides) -> dict:
    config = tiny_config(demo, checkpoints, **overrides)
    read = {name: nanoset.inspect(name)[0] for name in folders}
    datasets = folders if len(folders) > 1 else next(iter(folders))
    vocab = config["model"]["model_config"]["vocab_size"]
    config["data"]["dataset"] = nanoset_yaml.section(datasets, None, read, vocab, str(demo.tokenizer), None)
    return dialect.to_main(config)


def test_the_windows_are_the_files_tokens(nanoset_folders: list[Path]):
    folder, _ = nanoset.inspect(nanoset_folders[0])
    assert folder is not None
    (token_file,) = folder.files
    tokens = np.fromfile(token_file.path, dtype="<u2").astype(np.int64)
    windows = FolderWindows([(str(folder.path), 1.0)], 64)
    assert len(windows) == (len(tokens) - 1) // 64 and windows.shape == (len(windows), 65)
    got = windows[[0, 3, len(windows) - 1]]
    for row, n in zip(got, (0, 3, len(windows) - 1), strict=True):
        assert np.array_equal(row, tokens[n * 64 : n * 64 + 65])


def test_datatroves_folder_reader_cuts_other_windows(nanoset_folders: list[Path]):
    """Why the engines keep their own reader (launcher/train/tokenized.py's docstring, docs/data.md): datatrove's
    DatatroveFolderDataset, which nanotron main's Nanoset reads folders with, cuts windows that do not overlap.
    Should a datatrove cut them as the engines do, this fails, and its reader can take FolderWindows' place."""
    from datatrove.utils.dataset import DatatroveFolderDataset

    folder = nanoset_folders[0]
    tokens = np.fromfile(next(folder.glob("*.ds")), dtype="<u2").astype(np.int64)
    theirs = DatatroveFolderDataset(str(folder), seq_len=64, filename_pattern="*.ds", recursive=False, token_size=2)
    ours = FolderWindows([(str(folder), 1.0)], 64)
    assert len(theirs) == len(tokens) // 65 < len(ours) == (len(tokens) - 1) // 64
    assert np.array_equal(theirs[0]["input_ids"].numpy(), ours[[0]][0])  # the first window alike
    assert np.array_equal(theirs[1]["input_ids"].numpy(), tokens[65:130])  # then one token further each window
    assert not np.array_equal(theirs[1]["input_ids"].numpy(), ours[[1]][0])


def test_a_mixture_weighs_as_main_does(nanoset_folders: list[Path]):
    a, b = (str(p) for p in nanoset_folders)
    one, two = (len(FolderWindows([(p, 1.0)], 64)) for p in (a, b))
    mixed = FolderWindows([(a, 1.0), (b, 3.0)], 64)  # normalised: a quarter, three quarters
    assert len(mixed) in range(one + two - 1, one + two + 2)
    from_b = int(np.sum(mixed.index >= one))
    assert abs(from_b / len(mixed) - 0.75) < 0.01
    first = np.fromfile(next(Path(b).glob("*.ds")), dtype="<u2").astype(np.int64)
    last_of_b = mixed[[len(mixed) - 1]][0]  # b drawn past its end starts again from its first window
    k = (len(mixed) - (int(np.sum(mixed.index < one)))) - 1
    assert np.array_equal(last_of_b, first[(k % two) * 64 : (k % two) * 64 + 65])


def test_run_train_trains_on_a_folder(nanoset_folders, demo_data: DemoData, tmp_path: Path, monkeypatch, capsys):
    folder = str(nanoset_folders[0])
    config = _config(demo_data, {folder: 1.0}, tmp_path / "ckpt")
    cfg = to_train_config(config)
    assert cfg.nanoset == ((folder, 1.0),) and cfg.mixture == ()
    batches = build_micro_batches(cfg, 0, 1)
    assert isinstance(batches, PackedWindows) and isinstance(batches.windows, FolderWindows)
    monkeypatch.setenv("LAUNCHER_BUNDLE", str(tmp_path))  # its metrics.jsonl
    code, out, err = door(write_config(tmp_path / "c.yaml", config), capsys, "--engine", "torch")
    assert code == 0, err
    m = metrics(tmp_path / "metrics.jsonl")
    losses = [m[s]["loss"] for s in range(1, 31)]
    assert np.mean(losses[:5]) - np.mean(losses[-5:]) > 1.0, losses
    code, out, err = door(write_config(tmp_path / "n.yaml", config), capsys, "--engine", "nanotron")
    assert NANOSET_NANOTRON not in out + err  # main's dialect: the nanotron engine feeds its trainer from the folder
    config_04 = tiny_config(demo_data, tmp_path / "ckpt")  # 0.4's dialect: nanotron 0.4 (PyPI) has no Nanoset
    config_04["data"]["dataset"] = config["data_stages"][0]["data"]["dataset"]
    code, out, err = door(write_config(tmp_path / "n04.yaml", config_04), capsys, "--engine", "nanotron")
    assert code != 0 and NANOSET_NANOTRON in out + err


@pytest.mark.parametrize("mixed", [False, True], ids=["one-folder", "mixture"])
def test_a_stopped_run_resumes_at_the_next_sample(nanoset_folders, demo_data: DemoData, mixed: bool, tmp_path: Path,
                                                  monkeypatch, capsys):  # fmt: skip
    """Stopped at step 12 and resumed (from its checkpoint, a new run_train.py) to 36, across an epoch's end: every
    micro-batch's token ids are the uninterrupted run's, in order (each drawn one logged by a look at the stream)."""
    a, b = (str(p) for p in nanoset_folders)
    drawn: list[tuple[int, list]] = []
    real = PackedWindows.micro_batch

    def logged(self: PackedWindows, index: int):  # type: ignore[no-untyped-def]
        batch = real(self, index)
        drawn.append((index, batch.tolist()))
        return batch

    monkeypatch.setattr(PackedWindows, "micro_batch", logged)

    def leg(name: str, ckpt: str, steps: int) -> tuple[str, list]:
        config = _config(demo_data, {a: 1.0, b: 3.0} if mixed else {a: 1.0}, tmp_path / ckpt,
                         **{"tokens.train_steps": steps})  # fmt: skip
        drawn.clear()
        code, out, err = door(write_config(tmp_path / f"{name}.yaml", config), capsys, "--engine", "torch")
        assert code == 0, err
        return out, list(drawn)

    out, straight = leg("straight", "a", 36)
    assert "epoch 2 begins at step" in out  # the comparison crosses an epoch's end
    _, first = leg("first", "b", 12)
    out, rest = leg("rest", "b", 36)
    assert "resumed from checkpoint step 12" in out
    assert [i for i, _ in straight] == list(range(36 * 2))  # micro-batches 0, 1, ... (2 a step), each drawn once
    assert first + rest == straight  # the same micro-batches, in the same order, token id by token id
