"""Every launch checks the memory fit (launcher.perf.fit): a layout estimated not to fit is refused with fixes
that each fit, --skip_memory_check goes ahead, --layout auto takes the planner's best; the GPU comes from the
flags, the cluster's GRES type or the default; a default warmup adapts to a short run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from launcher_helpers import all_problems, spec_for

from launcher.config.cli import parse
from launcher.config.facts import ClusterFacts
from launcher.config.resolve import resolve
from launcher.config.validate import validate
from launcher.errors import ConfigError
from launcher.nanotron_config import gpus
from launcher.perf import fit
from launcher.perf.memory import GIB, estimate
from launcher.runs import launch

EIGHT_B_ON_ONE_NODE = ("--model_size", "8b", "--nodes", "1", "--gpus_per_node", "8", "--tp", "1", "--dataset", "none")
ONE_B_LONG = ("--model_size", "1b", "--micro_batch_size", "64", "--max_seq_len", "4096", "--dataset", "none")


def memory_problem(*flags: str):
    spec, problems = spec_for(*flags)
    found = [p for p in all_problems(spec, problems) if "needs an estimated" in p.message]
    return spec, found


@pytest.mark.parametrize("flags,flag", [(EIGHT_B_ON_ONE_NODE, "tp"), (ONE_B_LONG, "micro_batch_size")])
def test_what_cannot_fit_is_refused_naming_the_estimate(flags: tuple, flag: str):
    spec, (problem,) = memory_problem(*flags)
    assert problem.flag == flag
    total = estimate(spec.shape, fit.layout_of(spec)).total
    assert f"needs an estimated {total / GIB:.1f} GiB" in problem.message
    assert "79.6 GiB of the H100 80GB SXM" in problem.message
    for part in ("weights", "gradients", "optimizer", "activations", "logits", "headroom"):
        assert part in problem.message
    assert "--skip_memory_check" in problem.fix


@pytest.mark.parametrize("flags", [EIGHT_B_ON_ONE_NODE, ONE_B_LONG])
def test_every_fix_named_fits(flags: tuple):
    _, (problem,) = memory_problem(*flags)
    fixes = [f.split(" (")[0] for f in re.split(r"; or |fits with ", problem.fix) if f.startswith("--")]
    assert fixes
    for fix in fixes:
        words = fix.replace("--layout auto, the planner's best", "--layout auto").split()
        if words[:2] == ["--layout", "auto"]:
            continue  # checked below: the planner's choice
        spec, problems = spec_for(*flags, *words)
        assert [p for p in all_problems(spec, problems) if "needs an estimated" in p.message] == [], fix
    assert "--tp 4" in problem.fix or "--micro_batch_size" in problem.fix


def test_auto_layout_takes_the_planners_best_that_fits(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine.yaml"  # a micro batch that cannot fit, from a YAML: auto may change it, a flag not
    mine.write_text("tokens:\n  micro_batch_size: 64\n")
    flags = ["--model_size", "1b", "--max_seq_len", "4096", "--config", str(mine), "--dataset", "none", "--dry_run"]
    with pytest.raises(ConfigError, match="needs an estimated"):
        launch.main(["--run_name", "a", *flags])
    assert launch.main(["--run_name", "a", *flags, "--layout", "auto"]) == 0
    assert "chosen by --layout auto" in capsys.readouterr().out
    config = yaml.safe_load(next((tmp_path / "logs/configs/a").glob("*/config.yaml")).read_text())
    tokens, par = config["tokens"], config["parallelism"]
    assert tokens["micro_batch_size"] < 64
    assert tokens["micro_batch_size"] * tokens["batch_accumulation_per_replica"] * par["dp"] == 64 * 8 * 16


def test_auto_layout_keeps_what_you_typed():
    spec, _ = spec_for("--model_size", "8b", "--nodes", "2", "--tp", "2", "--layout", "auto")
    chosen, problems = fit.auto_layout(spec, {"tp", "layout", "model_size", "nodes"})
    assert problems == [] and chosen.args.parallelism.tp == 2
    assert fit.problems(chosen, validate(chosen)) == [] and validate(chosen) == []
    t = chosen.args.training
    assert t.micro_batch_size * t.grad_accum_steps * chosen.args.parallelism.dp == fit.global_batch(spec)


def test_skip_memory_check_goes_ahead_and_the_summary_says_so(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _, found = memory_problem(*ONE_B_LONG, "--skip_memory_check")
    assert found == []
    assert launch.main(["--run_name", "s", *ONE_B_LONG, "--skip_memory_check", "--dry_run"]) == 0
    assert "estimated NOT to fit: going ahead as --skip_memory_check says" in capsys.readouterr().out


def test_the_summary_has_the_memory_line(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launch.main(["--run_name", "m", "--model_size", "1b", "--nodes", "1", "--dataset", "none", "--dry_run"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("memory"))
    assert "of 79.6 GiB per GPU (weights" in line and "H100 80GB SXM (the default" in line


def test_gpu_flags():
    spec, problems = spec_for("--gpu_type", "A100-SXM4-40GB")
    assert problems == [] and spec.gpu.gpu.key == "a100" and spec.gpu.origin == "--gpu_type A100-SXM4-40GB"
    spec, _ = spec_for("--gpu_memory_gb", "24")
    assert spec.gpu.gpu.memory_gib == 24 and spec.gpu.origin == "--gpu_memory_gb 24"
    _, problems = spec_for("--gpu_type", "abacus")
    assert [p.flag for p in problems] == ["gpu_type"] and "h100" in problems[0].fix
    _, problems = spec_for("--gpu_memory_gb", "-1")
    assert [p.flag for p in problems] == ["gpu_memory_gb"]
    # a smaller GPU refuses what an H100 takes
    assert memory_problem("--model_size", "8b", "--nodes", "1", "--gpu_type", "a100")[1]
    assert not memory_problem("--model_size", "8b", "--nodes", "1")[1]


def test_the_clusters_gpu_type_is_used_where_no_flag_says():
    def with_types(*types: str | None, flags: tuple[str, ...] = ("--model_size", "8b")) -> gpus.GpuChoice:
        args, explicit = parse(["--run_name", "t", *flags])
        return resolve(args, explicit, ClusterFacts(asked=True, gpu_types=types))[0].gpu

    found = with_types("a100_80gb", "l40s")
    assert found.gpu.key == "l40s" and "sinfo says gpu:l40s" in found.origin  # the smallest of the two
    assert with_types("a100_80gb", flags=("--gpu_type", "h200")).gpu.key == "h200"  # a flag wins
    assert "not in configs/gpus.yaml" in with_types("mystery").origin
    assert with_types(None) == gpus.default_choice()  # gpu:8: no type
    assert with_types() == gpus.default_choice()  # Slurm said nothing of the partition's GPUs


def test_gres_spellings_sites_use():
    for name, key in [("h100", "h100"), ("nvidia_h100_80gb_hbm3", "h100"), ("H100-80GB", "h100"),
                      ("a100", "a100"), ("a100_80gb", "a100_80gb"), ("a100-sxm4-40gb", "a100"), ("h200", "h200"),
                      ("l40s", "l40s"), ("tesla_v100", "v100"), ("v100", "v100")]:  # fmt: skip
        gpu = gpus.lookup(name)
        assert gpu is not None and gpu.key == key, name
    assert gpus.lookup("tpu") is None
    assert "40 or the 80 GB" in gpus.table()["a100"].note


def test_a_default_warmup_longer_than_the_run_adapts():
    spec, problems = spec_for("--train_steps", "100")
    assert problems + validate(spec) == []
    assert spec.args.training.warmup_steps == 10 and "default 1000" in spec.adapted["warmup_steps"]
    spec, _ = spec_for("--train_steps", "100", "--warmup_steps", "500")  # typed: still an error
    assert [p.flag for p in validate(spec)] == ["warmup_steps"] and spec.adapted == {}


def test_a_config_warmup_is_a_choice(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text("optimizer:\n  learning_rate_scheduler:\n    lr_warmup_steps: 500\ntokens:\n  train_steps: 100\n")
    spec, problems = spec_for("--config", str(config))
    assert "warmup_steps" in [p.flag for p in problems + validate(spec)]


def test_planner_choices_reach_the_config_and_nanotrons_parser(tmp_path: Path):
    from launcher_helpers import config_of

    from launcher.nanotron_config import schema
    from launcher.train.nanotron_engine.compat import import_nanotron_config

    spec, problems = spec_for("--nodes", "1", "--tp", "2", "--pp", "2", "--zero_stage", "1", "--pp_engine", "AFAB",
                              "--tp_mode", "all_reduce", "--dataset", "none")  # fmt: skip
    assert problems + validate(spec) == []
    config = config_of(spec, str(tmp_path / "ckpt"))
    assert config["optimizer"]["zero_stage"] == 1
    assert config["parallelism"]["pp_engine"] == "afab" and config["parallelism"]["tp_mode"] == "ALL_REDUCE"
    assert config["parallelism"]["tp_linear_async_communication"] is False  # nanotron's o_proj asserts it
    path = tmp_path / "config.yaml"
    path.write_text(schema.dump(config))
    parsed = import_nanotron_config().get_config_from_file(str(path))
    assert parsed.optimizer.zero_stage == 1 and parsed.parallelism.tp_mode.name == "ALL_REDUCE"


def test_unknown_modes_are_problems():
    spec, _ = spec_for("--zero_stage", "3", "--pp_engine", "zb", "--tp_mode", "x", "--layout", "magic")
    assert {p.flag for p in validate(spec)} >= {"zero_stage", "pp_engine", "tp_mode", "layout"}
