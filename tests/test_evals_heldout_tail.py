"""--eval_heldout tail:N on a tokenized folder (made by the real tokenizer, datatrove): the folder's last N tokens kept
out of training by the config's dataset_max_tokens (as nanotron main's own parser reads it), never in a window either
engine's reader cuts, and evaluated on by the eval job; every misuse named before the queue."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from conftest import DemoData
from launcher_helpers import all_problems, config_of, spec_for
from nanotron_main import judge
from test_evals_job import STEP, TASKS, eval_job, result, trained_run, write_tasks

from launcher.nanotron_config import nanoset, schema
from launcher.perf.sizes import data_volume
from launcher.train.data import build_micro_batches
from launcher.train.settings import load_train_config
from launcher.train.tokenized import FolderWindows

HELD = 700  # tokens held out: several windows of 64 + 1


def test_tail_is_a_count_of_tokens():
    assert nanoset.heldout_tail("tail:100k") == 100_000 and nanoset.heldout_tail("tail:1_000") == 1000
    assert nanoset.heldout_tail("tail:2M") == 2_000_000 and nanoset.heldout_tail("tail:1.5k") == 1500
    assert nanoset.heldout_tail("split:validation") is None and nanoset.heldout_tail(None) is None
    for bad in ("tail:", "tail:x", "tail:0", "tail:-5", "tail:1.5", "tail:nan", "tail:1e3", "tail:1.0001k"):
        with pytest.raises(ValueError):
            nanoset.heldout_tail(bad)


def test_a_cap_keeps_every_window_before_it(nanoset_folders: list[Path]):
    folder, _ = nanoset.inspect(nanoset_folders[0])
    assert folder is not None
    tokens = np.fromfile(folder.files[0].path, dtype="<u2").astype(np.int64)
    cap = folder.tokens - HELD
    whole, capped = FolderWindows([(str(folder.path), 1.0)], 64), FolderWindows([(str(folder.path), 1.0)], 64, [cap])
    assert len(capped) == (cap - 1) // 64 < len(whole)
    last = len(capped) - 1
    assert last * 64 + 64 < cap  # the last window's last token comes before the cap
    assert np.array_equal(capped[[last]][0], tokens[last * 64 : last * 64 + 65])
    assert np.array_equal(capped[[0, last]], whole[[0, last]])  # the same windows, fewer of them


def offsets_folder(where: Path, sizes: list[int]) -> Path:
    """A folder of 4-byte token files (datatrove's layout) whose every token is its own offset in the folder: a
    window says where it was read."""
    where.mkdir(parents=True)
    start = 0
    for n, size in enumerate(sizes):
        ds = where / f"{n:03d}_part.ds"
        np.arange(start, start + size, dtype="<u4").tofile(ds)
        np.array([size // 2, size], dtype="<u8").tofile(f"{ds}.index")
        Path(f"{ds}.metadata").write_text(f"tok|4\n{size}\n{size / 1000:.1f}K\n")
        start += size
    return where


@pytest.mark.parametrize("cap", [300, 301, 320, 321, 600, 641, 0])  # file ends at 300 and 600; s = 64: 320 = 5 s
def test_no_window_reads_at_or_past_the_cap_across_files(tmp_path: Path, cap: int):
    folder = str(offsets_folder(tmp_path / "f", [300, 300, 400]))
    windows = FolderWindows([(folder, 1.0)], 64, [cap])
    read = windows[list(range(len(windows)))]
    assert np.array_equal(read[:, 1:-1] - read[:, :-2], np.ones((len(read), 63)))  # within one file each
    limit = cap or 1000  # 0: no cap, as nanotron main reads it
    assert read.max() < limit
    per_file = [max((min(size, limit - start) - 1) // 64, 0) for start, size in ((0, 300), (300, 300), (600, 400))]
    assert len(windows) == sum(per_file)  # every window that fits before the cap is there
    last = per_file[-1] and 600 + per_file[-1] * 64  # the last file's last window ends there
    assert not last or read.max() == last


def test_the_heldout_windows_start_where_the_tail_starts_across_files(tmp_path: Path):
    from launcher.train.evaluate import token_windows

    folder = str(offsets_folder(tmp_path / "f", [300, 300, 400]))
    cfg = SimpleNamespace(sequence_length=64, nanoset=((folder, 1.0),), nanoset_caps=(1000 - 450,))
    windows, where = token_windows(cfg, "tail:450")  # type: ignore[arg-type,misc]
    assert windows[0][0] == 550 and windows.max() < 1000 and where.startswith("the last 450 tokens of")
    assert np.array_equal(windows[0], np.arange(550, 615))  # from file 1 into file 2
    shrunk = SimpleNamespace(sequence_length=64, nanoset=((folder, 1.0),), nanoset_caps=(700,))
    assert token_windows(shrunk, "tail:450")[0][0][0] == 700  # type: ignore[arg-type,index]  # never before the cap


def flags(folder: Path, demo: DemoData, *more: str) -> tuple[str, ...]:
    return ("--nodes", "1", "--gpus_per_node", "1", "--save_interval", str(STEP), "--train_steps", str(STEP),
            "--dataset", str(folder), "--tokenizer", str(demo.tokenizer), "--nanotron_dialect", "main",
            "--eval_tasks", "piqa", *more)  # fmt: skip


def test_the_config_caps_training_as_main_reads_it_and_the_engines_read_it(
    nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path
):
    folder = nanoset_folders[0]
    read, _ = nanoset.inspect(folder)
    assert read is not None
    spec, problems = spec_for(*flags(folder, demo_data, "--eval_heldout", f"tail:{HELD}"))
    assert [p for p in all_problems(spec, problems) if p.flag == "eval_heldout"] == []
    volume = data_volume(spec, 1000)  # the launch summary's count: what training reads
    assert volume["dataset_tokens"] == read.tokens - HELD
    assert "(the last tokens held out: --eval_heldout tail:700)" in volume["dataset_tokens_how"]
    path = tmp_path / "config.yaml"
    path.write_text(schema.dump(config_of(spec, str(tmp_path / "ckpt"))))
    (seen,) = judge(path)  # nanotron main's own parser
    assert "error" not in seen, seen
    (stage,) = seen["stages"]
    assert stage["dataset_folder"] == [str(folder)] and stage["dataset_max_tokens"] == [read.tokens - HELD]
    cfg = load_train_config(str(path))  # what the job reads: the engines' windows stop before the tail
    assert cfg.nanoset_caps == (read.tokens - HELD,)
    batches = build_micro_batches(cfg, 0, 1)
    length = cfg.sequence_length
    assert len(batches.windows) == (read.tokens - HELD - 1) // length  # type: ignore[attr-defined]


def test_every_misuse_is_named_before_the_queue(nanoset_folders: list[Path], demo_data: DemoData):
    a, b = nanoset_folders
    read, _ = nanoset.inspect(a)
    assert read is not None

    def said(*more: str, folder: str | Path = a) -> str:
        spec, problems = spec_for(*flags(Path(folder), demo_data, *more))
        return " / ".join(f"{p.message} | {p.fix}" for p in all_problems(spec, problems) if p.flag == "eval_heldout")

    assert "not a count of tokens" in said("--eval_heldout", "tail:lots")
    assert "less than one window" in said("--eval_heldout", "tail:10")
    assert "training keeps 5 tokens of" in said("--eval_heldout", f"tail:{read.tokens - 5}")
    assert "it trains on 2 tokenized folders" in said("--eval_heldout", "tail:1k", folder=f"{a}:1,{b}:1")
    assert "it trains on no tokenized folder" in said("--eval_heldout", "tail:1k", folder=demo_data.dataset)
    later = said("--eval_heldout", "tail:1k", "--data_stages", f"later@3={a}", folder=demo_data.dataset)
    assert "a tokenized folder in a later stage only" in later  # the eval job reads the first stage's folder
    assert said("--eval_heldout", str(b)) == ""  # another folder, made with the run's tokenizer, is held-out data
    assert "not held out" in said("--eval_heldout", str(a))
    past = said("--eval_heldout", "tail:1G")  # more than the folder holds: no negative count
    assert f"tail:1G holds out 1,000,000,000 tokens, more than the {read.tokens:,} {a} holds" in past
    assert "-" not in past.split("|")[0].replace(str(a), "").replace("tail:1G", "")
    split = said("--eval_heldout", "split:validation")  # a tokenized folder has no splits: its tail
    assert f"split:validation names a split of a saved DatasetDict; the run trains on the tokenized folder {a}" in split
    assert "tail:N" in split and "not a tokenized folder" not in split


def test_the_eval_job_scores_the_tail(nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path):
    """A run trained on the folder by the torch engine, then its eval job: the held-out figures are the tail's."""
    folder = nanoset_folders[0]
    tasks = write_tasks(tmp_path)
    run = trained_run(tmp_path, demo_data, "--eval_tasks", ",".join(TASKS), "--eval_include", str(tasks),
                      "--eval_heldout", f"tail:{HELD}", "--nanotron_dialect", "main", dataset=folder)  # fmt: skip
    job = eval_job(run, STEP)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    held = result(run)["heldout"]["heldout"]  # (one source: the domain named "heldout")
    assert held["held_out"] == f"the last {HELD:,} tokens of {folder} (kept out of training)"
    assert held["tokens"] > 0 and np.isfinite(held["loss"]) and held["bits_per_byte"] > 0


def own_cap(tmp_path: Path, folder: Path, cap: object) -> Path:
    """A --config (main's dialect) whose one stage reads `folder` with its own dataset_max_tokens."""
    path = tmp_path / "mine.yaml"
    dataset = {"dataset_folder": [str(folder)], "dataset_max_tokens": cap}
    path.write_text(yaml.safe_dump({"data_stages": [{"name": "stable", "start_training_step": 1,
                                                     "data": {"dataset": dataset, "seed": 42}}]}))  # fmt: skip
    return path


def test_a_configs_own_cap_is_checked_kept_for_its_folder_and_the_lower_one_wins(
    nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path
):
    a, b = nanoset_folders
    base = ("--tokenizer", str(demo_data.tokenizer), "--nanotron_dialect", "main", "--nodes", "1", "--gpus_per_node",
            "1")  # fmt: skip
    spec, problems = spec_for("--config", str(own_cap(tmp_path, a, 5000)), *base)
    said = [p for p in all_problems(spec, problems) if "dataset_max_tokens" in p.message]
    assert said and said[0].flag == "config" and "not one whole number of tokens >= 0 per folder" in said[0].message
    mine = own_cap(tmp_path, a, [5000])
    spec, problems = spec_for("--config", str(mine), *base, "--eval_tasks", "piqa", "--eval_heldout", "tail:700")
    assert all_problems(spec, problems) == []
    (stage,) = config_of(spec, str(tmp_path / "ckpt"))["data_stages"]
    assert stage["data"]["dataset"]["dataset_max_tokens"] == [5000]  # below T - 700: the config's own stands
    assert data_volume(spec, 1000)["dataset_tokens"] == 5000
    spec, problems = spec_for("--config", str(mine), *base, "--dataset", str(b))
    assert all_problems(spec, problems) == []
    (stage,) = config_of(spec, str(tmp_path / "ckpt"))["data_stages"]
    other = stage["data"]["dataset"]
    assert other["dataset_folder"] == [str(b)] and "dataset_max_tokens" not in other  # a's cap is not b's
