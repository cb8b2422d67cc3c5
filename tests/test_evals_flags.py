"""--eval_tasks and its flags, checked purely (launcher/config/eval_checks.py): the preset read as data, every flag's
rule named with its fix, the held-out data really out of training, nanotron main's `lighteval:` section refused with
the flags that do it here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from launcher_helpers import fixed_paths, spec_for

from launcher.config import validate
from launcher.config.flags import EvalArgs
from launcher.errors import ConfigError
from launcher.evals import checks as eval_checks
from launcher.runs import launch


def problems_of(*flags: str, demo=None) -> dict[str, str]:
    data = ("--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer)) if demo else ("--dataset", "none")
    spec, problems = spec_for("--nodes", "1", "--gpus_per_node", "2", "--save_interval", "10", *data, *flags)
    return {p.flag: f"{p.message} | {p.fix}" for p in problems + validate.validate(spec)}


def test_a_preset_is_data_its_tasks_and_its_own_task_yamls():
    assert "early-signal" in eval_checks.preset_names() and "lighteval" not in eval_checks.preset_names()
    found, problems = eval_checks.tasks_of(EvalArgs(eval_tasks="early-signal", eval_include="/data/mine"))
    assert not problems and found is not None and found.preset == "early-signal"
    assert found.tasks[:2] == ("hellaswag", "arc_easy") and "commonsense_qa_cloze" in found.tasks
    assert found.include == (str(eval_checks.PRESETS / "tasks"), "/data/mine")
    named = yaml.safe_load((eval_checks.PRESETS / "tasks" / "commonsense_qa_cloze.yaml").read_text())
    assert named["task"] == "commonsense_qa_cloze" and named["output_type"] == "multiple_choice"
    plain, _ = eval_checks.tasks_of(EvalArgs(eval_tasks=" hellaswag, arc_easy ,"))
    assert plain is not None and plain.tasks == ("hellaswag", "arc_easy") and plain.preset is None
    assert eval_checks.tasks_of(EvalArgs())[0] is None


def test_every_eval_flag_names_its_fix():
    assert problems_of("--eval_tasks", "hellaswag", "--eval_every", "20") == {}
    found = problems_of("--eval_tasks", "hellaswag", "--eval_every", "15", "--eval_limit", "0", "--eval_gpus", "-1",
                        "--eval_include", "/no/such/folder", "--eval_partition", "a b")  # fmt: skip
    assert "not a multiple of --save_interval 10" in found["eval_every"] and "--eval_every 20" in found["eval_every"]
    assert "must be positive" in found["eval_limit"] and "must be 0 (CPU) or more" in found["eval_gpus"]
    assert "is not a folder" in found["eval_include"]
    assert "'a b' is not a Slurm partition name" in found["eval_partition"]
    alone = problems_of("--eval_every", "20", "--eval_gpus", "1")
    assert "add --eval_tasks" in alone["eval_every"] and "add --eval_tasks" in alone["eval_gpus"]
    assert "names no task" in problems_of("--eval_tasks", ",")["eval_tasks"]
    assert "not an lm-eval task name" in problems_of("--eval_tasks", "hella swag;rm")["eval_tasks"]
    assert "--interactive runs no batch job" in problems_of("--eval_tasks", "piqa", "--interactive")["eval_tasks"]


def test_rank_by_names_a_task_of_a_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert "add --sweep" in problems_of("--eval_tasks", "piqa", "--rank_by", "piqa")["rank_by"]
    rules = eval_checks.rank_by_problems
    assert "add --eval_tasks" in rules(EvalArgs(rank_by="piqa"), swept=True)[0].message + rules(
        EvalArgs(rank_by="piqa"), swept=True)[0].fix  # fmt: skip
    assert "not one of --eval_tasks' tasks" in rules(EvalArgs(eval_tasks="piqa", rank_by="arc"), swept=True)[0].message
    assert rules(EvalArgs(eval_tasks="piqa,arc_easy", rank_by="arc_easy:acc_norm"), swept=True) == []
    monkeypatch.chdir(tmp_path)  # a sweep's --rank_by is checked before anything is written
    with pytest.raises(ConfigError, match="--rank_by: 'arc' is not one of --eval_tasks' tasks"):
        launch.main(["--run_name", "sw", "--dataset", "none", "--sweep", "seed=1,2", "--eval_tasks", "piqa",
                     "--rank_by", "arc", "--dry_run"])  # fmt: skip
    assert not (tmp_path / "logs").exists()


def test_the_heldout_data_is_out_of_training(tmp_path: Path, demo_data):
    import datasets

    train = datasets.load_from_disk(str(demo_data.dataset))
    both = tmp_path / "both"
    datasets.DatasetDict({"train": train, "validation": train.select(range(4))}).save_to_disk(str(both))
    with_eval = ("--eval_tasks", "piqa", "--eval_heldout")
    assert "eval_heldout" not in problems_of(*with_eval, "split:validation", "--dataset", str(both))
    trained = problems_of(*with_eval, "split:train", "--dataset", str(both))
    assert "trains on the split 'train'" in trained["eval_heldout"]
    missing = problems_of(*with_eval, "split:test", "--dataset", str(both))["eval_heldout"]
    assert f"{both} has no split 'test' (splits: train, validation) | name a split it has that the run does not " \
           "train on: split:validation" in missing and "save the training split" not in missing  # fmt: skip
    found = problems_of(*with_eval, str(demo_data.dataset), demo=demo_data)
    assert "the run trains on" in found["eval_heldout"] and "not held out" in found["eval_heldout"]
    assert "eval_heldout" not in problems_of(*with_eval, str(both / "validation"), demo=demo_data)
    assert "several splits" in problems_of(*with_eval, str(both), demo=demo_data)["eval_heldout"]
    lines = tmp_path / "held.jsonl"
    lines.write_text('{"body": "x"}\n')
    assert "text" in problems_of(*with_eval, str(lines), demo=demo_data)["eval_heldout"]  # no --text_column there
    assert "not a local path" in problems_of(*with_eval, "someone/dataset", demo=demo_data)["eval_heldout"]


LIGHTEVAL = {
    "checkpoints_path": "/scratch/ckpt",
    "tasks": {
        "tasks": "lighteval|hellaswag|0|1,lighteval|arc:easy|0|1,custom|mathqa|0|0,custom|nosuchtask|0|0",
        "max_samples": 1000,
    },
    "eval_interval": 20,
    "slurm": {"partition": "hopper-prod", "gpus_per_node": 8},
}


def test_nanotron_mains_lighteval_section_is_refused_with_the_flags_that_do_it_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data
):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "main.yaml"
    config.write_text(yaml.safe_dump({"lighteval": LIGHTEVAL}))
    argv = ["--run_name", "le", "--nodes", "1", "--gpus_per_node", "2", "--dataset", str(demo_data.dataset),
            "--tokenizer", str(demo_data.tokenizer), "--config", str(config), "--dry_run"]  # fmt: skip
    with pytest.raises(ConfigError) as e:
        launch.prepare(argv)
    said = str(e.value)
    assert "lighteval: section" in said and "rank 0" in said
    assert "hellaswag is lm-eval's hellaswag; arc:easy is lm-eval's arc_easy; mathqa is lm-eval's mathqa; " \
           "nosuchtask has no lm-eval task of that name" in said  # lm-eval asked (0.4.13 ships mathqa)  # fmt: skip
    assert "--eval_tasks hellaswag,arc_easy,mathqa --eval_every 20" in said
    assert not list(tmp_path.rglob("config.yaml"))  # nothing written for nanotron's rank 0 to read
    config.write_text(yaml.safe_dump({"lighteval": None}))  # main's examples' own `lighteval: null`: no section
    prepared = launch.prepare(argv)
    written = yaml.safe_load(prepared.paths.config.read_text())
    assert written.get("lighteval") is None


def test_a_name_longer_than_a_filesystem_allows_is_a_named_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    long = "x" * 300
    for flag, value in (("eval_include", f"/tmp/{long}"), ("eval_include", long), ("eval_heldout", f"/tmp/{long}"),
                        ("eval_heldout", f"{tmp_path}/{long}/held.jsonl")):  # fmt: skip
        found = problems_of("--eval_tasks", "hellaswag", f"--{flag}", value)
        assert "a name in it is 300 bytes long" in found[flag] and f"give --{flag} a path of shorter names" in found[
            flag]  # fmt: skip


def test_heldout_data_is_never_the_training_data_however_it_is_named(tmp_path: Path, demo_data):
    """The split folder the run trains on, by its path, a path with `..` in it, a symlink, a hard link, a file in the
    folder it trains on, a folder holding it, or the dataset of a --config's later stage: none is held out."""
    import datasets

    train = datasets.load_from_disk(str(demo_data.dataset))
    both = tmp_path / "both"
    datasets.DatasetDict({"train": train, "validation": train.select(range(4))}).save_to_disk(str(both))
    (tmp_path / "link").symlink_to(both / "train")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a"}\n{"text": "b"}\n')
    (tmp_path / "hard.jsonl").hardlink_to(rows)
    (tmp_path / "soft.jsonl").symlink_to(rows)
    with_eval = ("--eval_tasks", "piqa", "--eval_heldout")
    tok = ("--tokenizer", str(demo_data.tokenizer))
    for named in (both / "train", f"{both}/validation/../train", tmp_path / "link", both / "train" / "state.json"):
        said = problems_of(*with_eval, str(named), "--dataset", str(both), *tok).get("eval_heldout", "")
        assert "not held out" in said and str(both / "train") in said, named
    assert "eval_heldout" not in problems_of(*with_eval, str(both / "validation"), "--dataset", str(both), *tok)
    for named in (tmp_path / "hard.jsonl", tmp_path / "soft.jsonl"):
        said = problems_of(*with_eval, str(named), "--dataset", str(rows), *tok).get("eval_heldout", "")
        assert "not held out" in said and str(rows) in said, named
    holder = problems_of(*with_eval, str(tmp_path), "--dataset", str(rows), *tok).get("eval_heldout", "")
    assert "not held out" in holder and f"{tmp_path} holds {rows}" in holder
    config = tmp_path / "stages.yaml"
    stage = [{"name": name, "start_training_step": at, "data": {"dataset": {"hf_dataset_or_datasets": str(data)}}}
             for name, at, data in (("first", 1, demo_data.dataset), ("later", 5, rows))]  # fmt: skip
    config.write_text(yaml.safe_dump({"data_stages": stage}))
    spec, problems = spec_for("--nodes", "1", "--gpus_per_node", "2", "--save_interval", "10", "--config", str(config),
                              *tok, *with_eval, str(tmp_path / "soft.jsonl"))  # fmt: skip
    said = [p.message for p in problems + validate.validate(spec) if p.flag == "eval_heldout"]
    assert any("not held out" in m and str(rows) in m for m in said), said


def test_every_line_of_a_heldout_jsonl_is_read_up_to_a_bound(tmp_path: Path, demo_data, monkeypatch):
    from launcher.evals import heldout

    with_eval = ("--eval_tasks", "piqa", "--eval_heldout")
    held = tmp_path / "held.jsonl"
    held.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "c"\n{"text": "d"}\n')
    said = problems_of(*with_eval, str(held), demo=demo_data)["eval_heldout"]
    assert f"line 4 of {held} is not a JSON object" in said
    held.write_text('{"text": "a"}\n{"body": "b"}\n')
    said = problems_of(*with_eval, str(held), demo=demo_data)["eval_heldout"]
    assert f"line 2 of {held} has no 'text' (--text_column) as text" in said
    held.write_text('{"text": "a"}\n{"text": 3}\n')
    assert "line 2 of" in problems_of(*with_eval, str(held), demo=demo_data)["eval_heldout"]
    held.write_text('{"text": "a"}\n' * 100 + "not json\n")
    monkeypatch.setattr(heldout, "JSONL_BOUND", 1000)  # the rest of a bigger file is left to the job
    assert "eval_heldout" not in problems_of(*with_eval, str(held), demo=demo_data)


def test_eval_time_limit_is_checked_like_time_limit_and_said_in_the_summary():
    assert "eval_time_limit" not in problems_of("--eval_tasks", "hellaswag", "--eval_time_limit", "30:00")
    found = problems_of("--eval_tasks", "hellaswag", "--eval_time_limit", "soon")
    assert "'soon' is not a Slurm time | use HH:MM:SS" in found["eval_time_limit"]
    assert "add --eval_tasks" in problems_of("--eval_time_limit", "1:00:00")["eval_time_limit"]
    from launcher.perf import sizes
    from launcher.report import summary

    flags = ("--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--time_limit", "2-00:00:00", "--eval_tasks",
             "hellaswag")  # fmt: skip
    from launcher.evals import script

    for more, time, why in ((("--eval_time_limit", "30:00"), "0:30:00", "--eval_time_limit"),
                            ((), "4:00:00", "the run's --time_limit, at most 4 h")):  # fmt: skip
        spec, _ = spec_for(*flags, *more)
        assert f"(CPUs, up to {time}: {why})" in summary.render(spec, fixed_paths("t"), sizes.derived(spec))
        assert f"#SBATCH --time={time}\n" in script.text(spec, fixed_paths("t"))  # as the eval job's script has it


def test_presets_combine_with_tasks_and_a_task_named_twice_is_evaluated_once():
    found, problems = eval_checks.tasks_of(EvalArgs(eval_tasks="early-signal,lambada_openai", eval_include="/d/mine"))
    preset, _ = eval_checks.tasks_of(EvalArgs(eval_tasks="early-signal"))
    assert not problems and found is not None and preset is not None
    assert found.tasks == (*preset.tasks, "lambada_openai") and found.include == (*preset.include, "/d/mine")
    assert found.preset == "early-signal" and "early-signal and lambada_openai (" in found.said
    twice, _ = eval_checks.tasks_of(EvalArgs(eval_tasks="early-signal,hellaswag,piqa,piqa"))
    assert twice is not None and twice.tasks == preset.tasks and twice.repeated == ("hellaswag", "piqa")
    assert "hellaswag, piqa named twice: evaluated once" in twice.said


def test_rank_by_is_checked_against_what_the_task_computes_and_the_points_evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The metric asked of lm-eval in the job's Python (sys.executable here); a sweep of --eval_tasks ranked by a task
    every point evaluates."""
    monkeypatch.chdir(tmp_path)
    base = ["--run_name", "sw", "--nodes", "1", "--gpus_per_node", "1", "--dataset", "none", "--extra_env",
            f"HF_HOME={tmp_path / 'hf'}", "--dry_run"]  # fmt: skip

    def refused(*flags: str) -> str:
        with pytest.raises(ConfigError) as e:
            launch.main([*base, *flags])
        return str(e.value)

    said = refused("--sweep", "seed=1,2", "--eval_tasks", "piqa", "--rank_by", "piqa:bogus")
    assert "--rank_by: piqa does not compute 'bogus' (it computes acc, acc_norm); e.g. --rank_by piqa:acc_norm" in said
    assert "piqa: its Hub dataset baber/piqa is not in the job's datasets cache" in said  # (said at once)
    assert "'piqa:' names no metric after the colon" in refused("--sweep", "seed=1,2", "--eval_tasks", "piqa",
                                                                 "--rank_by", "piqa:")  # fmt: skip
    assert "'acc' is not one of --eval_tasks' tasks" in refused("--sweep", "seed=1,2", "--eval_tasks", "piqa",
                                                                 "--rank_by", "acc:extra")  # fmt: skip
    swept = refused("--sweep", "eval_tasks=piqa,arc_easy", "--rank_by", "piqa")
    assert "--rank_by: 'piqa' is not one of the tasks every point evaluates" in swept
    every = refused("--sweep", "eval_tasks=piqa seed=1,2", "--rank_by", "piqa:acc")
    assert "--rank_by" not in every and "no task is evaluated" not in every and "baber/piqa" in every
    assert not (tmp_path / "logs").exists()


def test_help_and_the_flag_table_name_every_form_of_heldout_data():
    from launcher_helpers import ROOT

    from launcher.config import cli

    helped = " ".join(cli.help_text(width=1000).split())
    entry = helped[helped.index("--eval_heldout") : helped.index("--rank_by")]
    table = next(line for line in (ROOT / "docs" / "flags.md").read_text().splitlines() if "--eval_heldout" in line)
    for said in (entry, table):
        assert all(form in said for form in ("split:NAME", "tail:N", ".jsonl", ".parquet", ".csv", ".txt")), said
