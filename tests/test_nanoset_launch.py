"""--dataset naming tokenized folders (nanotron main's Nanosets; made by the real tokenizer, datatrove): the config
the launcher writes, judged by nanotron main's own parser (vendored); the summary's exact token count; every
refusal before the queue at once, each naming its flag, nothing written, no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import DemoData
from launcher_helpers import all_problems, config_of, run_launcher, spec_for
from nanotron_main import judge, source

from launcher.nanotron_config import nanoset, schema
from launcher.perf.sizes import data_volume

MAIN = ("--nanotron_dialect", "main")


def _judged(spec, tmp_path: Path) -> dict:
    config = config_of(spec, str(tmp_path / "ckpt"))
    path = tmp_path / "config.yaml"
    path.write_text(schema.dump(config))
    (seen,) = judge(path)
    assert "error" not in seen, seen
    return seen


def test_a_folder_is_written_as_main_reads_it(nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path):
    a = nanoset_folders[0]
    spec, problems = spec_for("--dataset", str(a), "--tokenizer", str(demo_data.tokenizer), *MAIN)
    assert all_problems(spec, problems) == []
    dataset = config_of(spec, str(tmp_path / "ckpt"))["data_stages"][0]["data"]["dataset"]
    assert "hf_dataset_or_datasets" not in dataset and "text_column_name" not in dataset  # never merged
    seen = _judged(spec, tmp_path)
    (stage,) = seen["stages"]
    assert stage["dataset_folder"] == [str(a)] and stage["tokenizer_name"] == str(demo_data.tokenizer)
    assert stage["vocab_size"] == seen["vocab_size"] and stage["token_size_in_bytes"] == 2
    folder, _ = nanoset.inspect(a)
    assert folder is not None
    run = 8 * 256 * spec.args.training.train_steps  # an exact count in the summary: the files', not an estimate
    volume = data_volume(spec, run)
    assert volume["dataset_tokens"] == folder.tokens and volume["dataset_tokens_exact"]
    assert volume["epochs"] == run / folder.tokens


def test_a_mixture_and_stages_weigh_as_main_does(nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path):
    a, b = nanoset_folders
    mix = f"{a}:0.5,{b}:2.5"  # main normalises: above 1 is a weight (a hub mixture's fraction of rows is not)
    spec, problems = spec_for("--dataset", mix, "--tokenizer", str(demo_data.tokenizer), "--data_stages",
                              f"anneal@5={b}", *MAIN)  # fmt: skip
    assert all_problems(spec, problems) == []
    first, anneal = _judged(spec, tmp_path)["stages"]
    assert first["dataset_folder"] == [str(a), str(b)] and first["dataset_weights"] == [0.5, 2.5]
    assert anneal["start"] == 5 and anneal["dataset_folder"] == [str(b)] and anneal["dataset"] is None


def test_every_refusal_at_once_nothing_written(nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path):
    a, b = (Path(shutil.copytree(f, tmp_path / f"copy{n}")) for n, f in enumerate(nanoset_folders))
    ds = sorted(a.glob("*.ds"))[0]
    Path(f"{ds}.index").unlink()  # a token file without its index
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hello")
    stages = f"s2@5={tmp_path / 'nowhere'};s3@9={tmp_path / 'empty'};s4@12={tmp_path / 'other'}"
    out = run_launcher(
        "--run_name", "n", "--dataset", f"{a}:1,{b}:x", "--tokenizer", str(demo_data.tokenizer), *MAIN,
        "--data_stages", stages, "--dry_run", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "5 problems found, nothing was written" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "logs").exists()
    assert f"--dataset: {ds} has no {ds.name}.index beside it" in out.stderr
    assert f"--dataset: {b}:x has no weight" in out.stderr
    assert f"local path {tmp_path / 'nowhere'} does not exist" in out.stderr
    assert f"--data_stages: {tmp_path / 'empty'} is a directory but not a dataset" in out.stderr
    assert f"{tmp_path / 'other'} is a directory but not a dataset" in out.stderr
    assert out.stderr.count("nor a tokenized folder (no *.ds token files)") == 2


def test_damaged_folders_tokenizers_and_weights(nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path):
    a, b = (Path(shutil.copytree(f, tmp_path / f"copy{n}")) for n, f in enumerate(nanoset_folders))
    Path(f"{sorted(a.glob('*.ds'))[0]}.index").unlink()
    for metadata in b.glob("*.ds.metadata"):  # made with another tokenizer, as its metadata says
        lines = metadata.read_text().splitlines()
        metadata.write_text("\n".join(["gpt2|2", *lines[1:]]) + "\n")
    spec, problems = spec_for("--dataset", f"{a}:0,{b}:0", "--tokenizer", str(demo_data.tokenizer), *MAIN)
    said = all_problems(spec, problems)
    assert all(p.flag == "dataset" for p in said), said
    text = "\n".join(p.message for p in said)
    assert "sum to 0" in text and ".ds.index beside it" in text
    assert f"{b} was tokenized with gpt2, not the run's --tokenizer" in text
    spec, problems = spec_for("--dataset", str(b), "--tokenizer", str(demo_data.tokenizer), "--vocab_size", "70000",
                              "--nanotron_dialect", "0.4")  # fmt: skip
    said = all_problems(spec, problems)
    text = "\n".join(f"--{p.flag}: {p.message} ({p.fix})" for p in said)
    assert "nanotron 0.4 (the PyPI release) has no Nanoset" in text and "--nanotron_dialect main" in text
    assert "too small for a vocabulary of" not in text  # the tokenizer's vocabulary decides, not the padded model's
    spec, problems = spec_for("--dataset", str(a), "--tokenizer", str(demo_data.tokenizer), "--engine", "nanotron",
                              *MAIN)  # fmt: skip
    assert [p for p in all_problems(spec, problems) if p.flag == "engine"] == []  # main's nanotron engine reads them


def test_a_hub_mixture_keeps_its_rule(demo_data: DemoData, second_dataset: Path):
    _, problems = spec_for("--dataset", f"{demo_data.dataset}:0.5,{second_dataset}:2", *MAIN)
    assert any("a weight lies in (0, 1]" in p.message for p in problems)


def test_a_folder_mixed_with_a_hub_dataset(nanoset_folders: list[Path], demo_data: DemoData):
    _, problems = spec_for("--dataset", f"{nanoset_folders[0]}:0.5,{demo_data.dataset}:0.5", *MAIN)
    assert any("is a tokenized folder (a Nanoset)" in p.message for p in problems)


def test_token_size_too_small(nanoset_folders: list[Path]):
    folder, problems = nanoset.inspect(nanoset_folders[0], "dataset", vocab_size=70_000)
    assert folder is None and "too small for a vocabulary of 70000" in problems[0].message


def test_nanotron_main_s_own_example_config(nanoset_folders: list[Path], demo_data: DemoData, tmp_path: Path):
    """examples/config_nanoset.yaml (three stages over tokenized folders, the last in the dict form main no longer
    parses): refused for its missing folders with the reason; with them there, written as main reads it."""
    example = source() / "examples" / "config_nanoset.yaml"
    spec, problems = spec_for("--config", str(example), *MAIN, cwd=tmp_path)
    said = all_problems(spec, problems)
    assert [p.flag for p in said] == ["config", "config"], said
    assert all("does not exist" in p.message for p in said)
    assert f"tokenized folder {tmp_path / 'datasets/c4-es/tokenized'} does not exist" in said[0].message
    for name, made in (("c4-es", nanoset_folders[0]), ("SlimPajama-6B", nanoset_folders[1])):
        (tmp_path / "datasets" / name).mkdir(parents=True)
        (tmp_path / "datasets" / name / "tokenized").symlink_to(made)
    flags = ("--config", str(example), "--tokenizer", str(demo_data.tokenizer), *MAIN)
    spec, problems = spec_for(*flags, cwd=tmp_path)
    assert all_problems(spec, problems) == []
    assert "dataset_folder {path: weight}" in spec.adapted["config"]
    written = config_of(spec, str(tmp_path / "ckpt"))
    assert all("hf_dataset_or_datasets" not in s["data"]["dataset"] for s in written["data_stages"])
    one, two, blend = _judged(spec, tmp_path)["stages"]
    c4, slim = (str(made.resolve()) for made in nanoset_folders)  # the links followed, as every local path is
    assert one["dataset_folder"] == [c4] and two["dataset_folder"] == [slim, c4]
    assert blend["dataset_folder"] == [slim, c4] and blend["dataset_weights"] == [0.8, 0.2]
    assert {s["vocab_size"] for s in (one, two, blend)} == {50257}  # the example's model's
    assert [s["start"] for s in (one, two, blend)] == [1, 15, 25]
