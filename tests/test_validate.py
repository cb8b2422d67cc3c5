"""Validation: every problem at once, each naming its flag and a fix; anything accepted satisfies nanotron."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launcher_helpers import spec_for

from launcher.config.flags import flag_names
from launcher.config.slurm_values import time_limit_seconds
from launcher.config.validate import validate
from launcher.nanotron_config.parallel import ParallelDims, check_layout
from launcher.nanotron_config.shape import ModelShape
from launcher.problems import report


def problems_for(*flags: str) -> list:
    """The pure phase's problems (resolution and validation): flags, not this machine's disk."""
    spec, problems = spec_for(*flags)
    return problems + validate(spec)


def flags_of(problems: list) -> list[str]:
    return [p.flag for p in problems]


def test_defaults_are_valid():
    assert problems_for("--nodes", "4") == []


def test_world_size_mismatch_names_dp_and_fix():
    (problem,) = problems_for("--nodes", "2", "--gpus_per_node", "8", "--dp", "4", "--tp", "2")
    assert problem.flag == "dp" and "--dp 8" in problem.fix


def test_replica_larger_than_job_suggests_nodes():
    problems = problems_for("--model_size", "70b", "--nodes", "2", "--gpus_per_node", "8")
    assert flags_of(problems) == ["tp"]
    assert "--nodes 4" in problems[0].fix


def test_heads_not_divisible_by_tp_lists_choices_that_work():
    shape = ("--num_heads", "12", "--num_kv_heads", "12", "--hidden_size", "768", "--nodes", "1")
    (problem,) = problems_for(*shape, "--tp", "8")
    assert problem.flag == "tp" and "--num_heads 12 nor --num_kv_heads 12" in problem.message
    assert problem.fix == "use --tp 1, 2 or 4"  # 3, 6 and 12 divide the heads but not the job's 8 GPUs
    for tp in ("1", "2", "4"):
        assert problems_for(*shape, "--tp", tp) == []


def test_every_mistake_is_reported_at_once(tmp_path: Path):
    problems = problems_for(
        "--run_name",
        "bad name",
        "--time_limit",
        "1h",
        "--email",
        "nope",
        "--extra_env",
        "A=1 B",
        "--warmup_steps",
        "20000",
        "--min_lr",
        "1",
        "--dataset",
        str(tmp_path / "missing"),
        "--pp",
        "3",
        "--num_layers",
        "2",
        "--grad_accum_steps",
        "1",
    )
    assert set(flags_of(problems)) >= {
        "run_name",
        "time_limit",
        "email",
        "extra_env",
        "warmup_steps",
        "min_lr",
        "dataset",
        "pp",
        "grad_accum_steps",
    }
    text = report(problems)
    assert text.count("\n  - --") == len(problems)


def test_tokenizer_larger_than_vocab(tmp_path: Path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 1, "c": 299}}, "added_tokens": []}')
    assert "vocab_size" in flags_of(problems_for("--tokenizer", str(tok), "--vocab_size", "256"))
    spec, _ = spec_for("--tokenizer", str(tok))  # not given: derived from the tokenizer, rounded up
    assert spec.args.model.vocab_size == 320


@pytest.mark.parametrize(
    "text,seconds", [("30", 1800), ("1:00:00", 3600), ("2-00", 172800), ("10:30", 630), ("1-02:03:04", 93784)]
)
def test_time_limit_seconds(text: str, seconds: int):
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["\u0661:00:00", "1:\u0660\u0660", "2-00:00:\uff10"])  # Arabic-Indic, fullwidth
def test_time_limit_takes_ascii_digits_only(text: str):
    assert flags_of(problems_for("--time_limit", text)) == ["time_limit"]


@pytest.mark.parametrize("bad", ["1h", "", "1:2:3:4", "-1", "1-"])
def test_bad_time_limits(bad: str):
    assert "time_limit" in flags_of(problems_for("--time_limit", bad))


def test_profiler_needs_short_runs():
    assert "profiler_export_path" in flags_of(problems_for("--profiler_export_path", "/tmp/prof"))


layouts = st.fixed_dictionaries(
    {
        "nodes": st.integers(1, 4),
        "gpus": st.sampled_from([1, 2, 4, 8]),
        "tp": st.sampled_from([None, 1, 2, 4, 8]),
        "pp": st.sampled_from([None, 1, 2, 4]),
        "dp": st.sampled_from([None, 1, 2, 4, 8, 16]),
        "heads": st.sampled_from([4, 6, 8, 12, 16, 32]),
        "kv": st.sampled_from([1, 2, 4, 8, 16]),
        "head_dim": st.sampled_from([8, 16, 64, 7, 9]),  # odd head sizes too: nanotron's rotary needs even ones
        "hidden_extra": st.sampled_from([0, 0, 0, 1]),  # sometimes a hidden size that heads do not divide
        "layers": st.integers(1, 8),
        "accum": st.integers(1, 4),
        "inter": st.sampled_from([96, 256, 1000]),
        "vocab": st.sampled_from([1000, 32000, 50257]),
    }
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_accepted_layouts_satisfy_nanotron(x: dict):
    flags = [
        "--nodes",
        str(x["nodes"]),
        "--gpus_per_node",
        str(x["gpus"]),
        "--num_heads",
        str(x["heads"]),
        "--num_kv_heads",
        str(x["kv"]),
        "--hidden_size",
        str(x["heads"] * x["head_dim"] + x["hidden_extra"]),
        "--num_layers",
        str(x["layers"]),
        "--grad_accum_steps",
        str(x["accum"]),
        "--intermediate_size",
        str(x["inter"]),
        "--vocab_size",
        str(x["vocab"]),
    ]
    for name in ("tp", "pp", "dp"):
        if x[name] is not None:
            flags += [f"--{name}", str(x[name])]
    spec, problems = spec_for(*flags)
    problems += validate(spec)
    assert all(p.flag in flag_names() and p.fix for p in problems)
    # Both ways: accepted exactly when nanotron's constraints hold (computed here, independently; tiny: tp=pp=1).
    tp, pp, world = x["tp"] or 1, x["pp"] or 1, x["nodes"] * x["gpus"]
    dp = x["dp"] or world // (tp * pp)
    hidden = x["heads"] * x["head_dim"] + x["hidden_extra"]
    nanotron_ok = (
        dp >= 1
        and hidden % x["heads"] == 0
        and (hidden // x["heads"]) % 2 == 0
        and dp * tp * pp == world
        and x["heads"] % tp == 0
        and x["kv"] % tp == 0
        and x["heads"] % x["kv"] == 0
        and x["layers"] >= pp
        and x["inter"] % tp == 0
        and (pp == 1 or x["accum"] >= pp - 1)
    )
    assert (problems == []) == nanotron_ok, problems
    if problems:
        return
    p, m = spec.args.parallelism, spec.args.model
    assert p.dp * p.tp * p.pp == x["nodes"] * x["gpus"]
    assert m.num_heads % p.tp == 0 and m.num_kv_heads % p.tp == 0 and m.num_heads % m.num_kv_heads == 0
    assert m.num_layers >= p.pp and m.intermediate_size % p.tp == 0  # a vocabulary is padded to a multiple of tp
    assert spec.padded_vocab % p.tp == 0 and spec.padded_vocab - m.vocab_size < p.tp
    assert p.pp == 1 or spec.args.training.grad_accum_steps >= p.pp - 1


def test_check_layout_is_shared_with_the_trainer():
    shape = ModelShape(
        hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=256, max_seq_len=64
    )
    dims = ParallelDims(world=4, dp=1, tp=1, pp=1, grad_accum_steps=1, started=True)
    problems = check_layout(shape, dims)
    assert flags_of(problems) == ["dp"] and "torchrun" in problems[0].message
    assert dims.problems(shape) == problems and dims.replica == 1


@pytest.mark.parametrize(
    "flags,flag",
    [
        (("--run_name", "abc\n"), "run_name"),  # a trailing line break: `$` alone would let it through
        (("--email", "a@b.org\n"), "email"),
        (("--time_limit", "10\n"), "time_limit"),
        (("--seed", "-5"), "seed"),
        (("--seed", str(2**32)), "seed"),
        (("--learning_rate", "nan"), "learning_rate"),
        (("--min_lr", "inf"), "min_lr"),
        (("--cpus_per_node", "-1"), "cpus_per_node"),
        (("--extra_env", "é=1"), "extra_env"),
        (("--dataset", "data/missing.jsonl"), "dataset"),  # a data file by its suffix: local, and missing
        (("--tp", "0"), "tp"),
    ],
)
def test_values_the_job_would_choke_on(flags: tuple, flag: str):
    problems = problems_for(*flags)
    assert flags_of(problems) == [flag], problems


def test_no_time_limit_is_a_time_limit():
    for text in ("UNLIMITED", "infinite", "0"):
        assert problems_for("--time_limit", text) == []


def test_both_intervals_are_reported():
    assert flags_of(problems_for("--save_interval", "0", "--log_interval", "0")) == ["save_interval", "log_interval"]


def test_shell_syntax_is_checked_with_everything_else():
    problems = problems_for("--pre_launch_commands", "if then", "--time_limit", "3h")
    assert sorted(flags_of(problems)) == ["pre_launch_commands", "time_limit"]


@pytest.mark.parametrize(
    "commands",
    [
        "cat > /dev/null <<'EOF'",  # bash only warns, and the here-document swallows the rest of the script
        "cat > /dev/null <<EOF\nsome text",
    ],
)
def test_a_shell_warning_is_a_problem(commands: str):
    (problem,) = problems_for("--pre_launch_commands", commands)
    assert problem.flag == "pre_launch_commands" and "here-document" in problem.message


def test_well_formed_here_documents_pass():
    assert problems_for("--pre_launch_commands", "cat > /dev/null <<'EOF'\nsome text\nEOF\necho done") == []


def test_extra_env_values_are_literal_so_a_reference_is_a_problem():
    (problem,) = problems_for("--extra_env", "HF_HOME=/data/hf TOKEN_FILE=$HOME/.tok")
    assert problem.flag == "extra_env" and "TOKEN_FILE" in problem.message and "$HOME" in problem.message
    assert "pre_launch_commands" in problem.fix


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_the_stop_file_interval_is_seconds_above_zero(value: str, monkeypatch: pytest.MonkeyPatch):
    (problem,) = problems_for("--extra_env", f"LAUNCHER_STOP_FILE_EVERY_S={value}")
    assert problem.flag == "extra_env" and f"LAUNCHER_STOP_FILE_EVERY_S={value} is not a number" in problem.message
    assert problems_for("--extra_env", "LAUNCHER_STOP_FILE_EVERY_S=0.2") == []
    # the job, given it from elsewhere (an exported variable), keeps its default rather than failing at start-up
    from launcher.train.environment import JobEnvironment

    monkeypatch.setenv("LAUNCHER_STOP_FILE_EVERY_S", value)
    assert JobEnvironment.read().stop_file_every == 5.0
    monkeypatch.setenv("LAUNCHER_STOP_FILE_EVERY_S", "0.2")
    assert JobEnvironment.read().stop_file_every == 0.2


@pytest.mark.parametrize(
    "flag,value",
    [
        ("extra_env", "HF_TOKEN=hf_abc"),  # by name
        ("extra_env", "WANDB_API_KEY=xyz"),
        ("pre_launch_commands", "export WANDB_API_KEY=xyz"),
        ("pre_launch_commands", "huggingface-cli login --token hf_abcdefghijklmnopqrstuvwx"),  # by value
        ("pre_launch_commands", "wandb login 0123456789abcdef0123456789abcdef01234567"),
        ("extra_env", "SOME_VAR=ghp_abcdefghijklmnopqrstuvwxyz0123"),
        ("tokenizer", "hf_abcdefghijklmnopqrstuvwx"),
        ("extra_env", "WANDB_KEY=abc"),
    ],
)
def test_secret_values_are_refused_and_never_repeated(flag: str, value: str):
    problems = problems_for(f"--{flag}", value)
    assert flag in flags_of(problems)
    text = report(problems)
    secret = value.split()[-1].split("=")[-1]
    assert secret not in text, text


@pytest.mark.parametrize(
    "flags",
    [
        ("--checkpoints_path", "/x/disk-01_shared_checkpoints_x"),  # 'sk-' inside a word is no OpenAI key
        ("--dataset", "org/multitask-pretraining-mixture-v2"),
        ("--pre_launch_commands", 'huggingface-cli login --token "$HF_TOKEN"'),  # a reference, not the token
        ("--pre_launch_commands", "export HF_TOKEN=$(cat ~/.hf_token)"),
        ("--pre_launch_commands", "python prep.py --tokenizer=gpt2 --max_tokens=2048"),
        ("--pre_launch_commands", "git checkout 0123456789abcdef0123456789abcdef01234567 && source ~/.bashrc"),
        ("--extra_env", "TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_IMPLICIT_TOKEN=1 SSH_KEY_PATH=/k"),
    ],
)
def test_ordinary_runs_are_not_mistaken_for_secrets(flags: tuple):
    assert problems_for(*flags) == []


@pytest.mark.parametrize(
    "flag,value",
    [
        ("pre_launch_commands", 'curl -H "Authorization: Bearer abcdefghijklmnopqrstu" https://x'),
        ("pre_launch_commands", "git clone https://me:pw123secret@host/repo"),
        ("extra_env", "WANDB_API_KEY 0123456789abcdef0123456789abcdef01234567"),  # a stray value, not repeated
        ("extra_env", 'A="unclosed 0123456789abcdef0123456789abcdef01234567'),
    ],
)
def test_more_secrets_are_refused_and_never_repeated(flag: str, value: str):
    problems = problems_for(f"--{flag}", value)
    assert flag in flags_of(problems)
    text = report(problems)
    for secret in ("abcdefghijklmnopqrstu", "pw123secret", "0123456789abcdef0123456789abcdef01234567"):
        assert secret not in text, text


def test_argparse_errors_are_redacted_too(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        spec_for("--seed", "hf_abcdefghijklmnopqrstuvwx")
    err = capsys.readouterr().err
    assert "--seed" in err and "hf_abcdefghijklmnopqrstuvwx" not in err


# What Slurm 22.05's sbatch takes as --mem (str_to_mbytes), tried on the local cluster; tests/test_slurm_e2e.py puts
# both lists to the real sbatch again.
MEM_ACCEPTED = ["0", "4096", "500G", "500GB", "500gb", "500gB", "100M", "100MB", "100mb", "1K", "1KB", "1kb", "2T",
                "2TB", "2tb", "0G", "007"]  # fmt: skip
MEM_REFUSED = ["1B", "1GiB", "2048KiB", "1P", "1X", "1Gxyz", "1GBB", "1.5G", "-5", "1 G", "", "G",
               "\u0661\u0662", "1\u0663G"]  # fmt: skip
MEM_STRICTER = [" 100", "+100"]  # Slurm's strtoll skips a leading space or sign: not worth taking


@pytest.mark.parametrize("value", MEM_ACCEPTED)
def test_mem_takes_every_unit_slurm_takes(value: str):
    assert problems_for("--mem", value) == []


@pytest.mark.parametrize("value", MEM_REFUSED + MEM_STRICTER)
def test_mem_refuses_the_rest(value: str):
    (problem,) = problems_for("--mem", value)
    assert problem.flag == "mem" and "500GB" in problem.fix


def test_a_start_up_grace_needs_the_watchdog_and_time_to_start():
    assert problems_for("--startup_timeout", "600") == []  # a slow start (compiling, loading data) is no hang
    assert problems_for("--hang_timeout", "20", "--startup_timeout", "600") == []
    (short,) = problems_for("--startup_timeout", "5")
    assert short.flag == "startup_timeout" and "too short to start a run" in short.message
    (idle,) = problems_for("--hang_timeout", "0", "--startup_timeout", "600")
    assert idle.flag == "startup_timeout" and "no effect with --hang_timeout 0" in idle.message
