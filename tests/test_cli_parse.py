"""The command line is parsed by plain argparse over the flag dataclasses (launcher.config.cli): simple-parsing's
forms (a switch alone, with a true/false word, or --noSWITCH; an optional flag alone meaning None), argparse's
own messages for what it refuses (secrets redacted; the words it cannot place said all at once, an unknown flag with
the nearest names), exit 2, and no simple-parsing import outside --help."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from launcher_helpers import run_launcher, spec_for

from launcher.config import cli, flags

CLEAN = [  # (argv, what some of it parses to)
    (["--run_name", "x"], {"run_name": "x"}),
    (["--run_name=x", "--nodes=4", "--dry_run"], {"nodes": 4, "dry_run": True}),
    (["--run_name", "x", "--nodes", "4", "--dry_run", "true", "--show_logs", "no"], {"dry_run": True,
                                                                                    "show_logs": False}),
    (["--run_name", "x", "--noresume", "--nosave_initial_state", "--exclusive", "--debug", "Y"],
     {"resume": False, "save_initial_state": False, "exclusive": True, "debug": True}),
    (["--run_name", "x", "--dataset", "--partition", "--cpus_per_node", "16", "--gpu_memory_gb", "40.5"],
     {"dataset": None, "partition": None, "cpus_per_node": 16, "gpu_memory_gb": 40.5}),
    (["--run_name", "x", "--tp", "2", "--tp", "4", "--extra_env", "A=1 B=2"], {"tp": 4, "extra_env": "A=1 B=2"}),
    (["--run_name", "x", "--zero_stage", "-1", "--time_limit", ""], {"zero_stage": -1, "time_limit": ""}),
    (["--nodes", "1", "--run_name", "a b", "--preflight", "FALSE", "--plan"], {"run_name": "a b", "preflight": False,
                                                                              "plan": True}),
]  # fmt: skip
REFUSED = [  # (argv, argparse's words for it)
    ([], "the following arguments are required: --run_name"),
    (["--run_name"], "argument --run_name: expected one argument"),
    (["--run_name", "x", "--nodes", "many"], "argument --nodes: invalid int value: 'many'"),
    (["--run_name", "x", "--hidden", "128"], "--hidden: not a flag the launcher knows; the nearest: --hidden_size"),
    (["--run_name", "x", "--dry_run", "maybe"], "argument --dry_run: 'maybe' is not true or false"),
    (["--run_name", "x", "--nodes", "1.5"], "argument --nodes: invalid int value: '1.5'"),
    (["--run_name", "x", "extra"], "'extra' follows --run_name's value 'x': a flag takes one value; quote one that "
                                    "has spaces (--run_name 'x extra')"),
    (["extra", "--run_name", "x"], "'extra' is no flag's value; every value follows its flag"),
    (["--run_name", "x", "--nodes", "1", "2"], "'2' follows --nodes's value '1': a flag takes one value\n"),
    (["--run_name", "x", "--noresume", "yes"], "argument --noresume: takes no value"),
    (["--run_name", "x", "--nodes", "hf_" + "a" * 30], "argument --nodes: invalid int value: '<redacted>'"),
    (["--run_name=--"], "argument --run_name: expected one argument"),  # argparse read it as [] (hypothesis found)
    (
        ["--run_name", "x", "--partition", "-x"],
        "--partition: its value '-x' starts with a dash; give it as --partition=-x",
    ),  # an optional value read as --partition alone, then a stray -x
    (
        ["--run_name", "x", "--tp", "-help"],
        "--tp: its value '-help' starts with a dash; give it as --tp=-help",
    ),  # not argparse's -h given 'elp' (hypothesis found)
    # an unknown flag is one, whatever comes before it: a switch's value is never a flag
    (["--run_name", "x", "--wandb_disabled", "--bogus_flag"], "--bogus_flag: not a flag the launcher knows; every "
                                                               "flag: --help, and docs/flags.md\n"),
    (["--run_name", "x", "--dry_run", "-x"], "--dry_run: '-x' is neither a flag nor a value it takes"),
    (["--run_name", "x", "-x", "--dry_run"], "-x: not a flag the launcher knows"),
    (
        ["--run_name", "x", "--partition", "--gpus", "4"],
        "--gpus: not a flag the launcher knows; the nearest: --eval_gpus, --gpus_per_node (every flag: --help); as "
        "--partition's value, give it as --partition=--gpus\n",
    ),  # its value '4' is not said again
]  # fmt: skip


DEFAULTS = {f.name: f.default for group in flags.GROUPS.values() for f in dataclasses.fields(group)}


def values(args: flags.LaunchArgs) -> dict:
    out = {"run_name": args.run_name}
    for name in flags.GROUPS:
        out.update(vars(getattr(args, name)))
    return out


@pytest.mark.parametrize("argv,expected", CLEAN)
def test_a_clean_command_line_reads_as_typed(argv, expected):
    args, explicit = cli.parse(argv)
    got = values(args)
    assert {k: got[k] for k in expected} == expected
    alone = {k for k, v in expected.items() if v is None and DEFAULTS[k] is None}  # "derive it": not a choice
    assert explicit == flags.explicit_flags(argv) - alone and set(expected) - alone <= explicit


@pytest.mark.parametrize("argv,words", REFUSED)
def test_what_it_refuses_ends_with_argparses_words_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"slurm_launcher.py: error: {words}" in err, err
    assert err.startswith(f"usage: {cli.USAGE}") and "hf_" not in err


def test_every_unknown_flag_and_stray_word_is_said_at_once_with_the_nearest_names(capsys):
    argv = ["--run_name", "x", "--wandb_disabled", "--bogus_flag", "--nodse", "2", "--wandb_disabled", "--tp", "2",
            "4", "--mirco_batch_size=3", "--lr", "1e-3", "--hf_token", "hf_" + "a" * 30]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        cli.parse(argv)
    err = capsys.readouterr().err
    said = err.split("error: ", 1)[1].splitlines()
    assert e.value.code == 2 and said == [
        "6 problems on the command line, nothing was written or submitted:",
        "  - --bogus_flag: not a flag the launcher knows; every flag: --help, and docs/flags.md",
        "  - --nodse: not a flag the launcher knows; the nearest: --nodes, --nodelist (every flag: --help)",
        "  - '4' follows --tp's value '2': a flag takes one value",
        "  - --mirco_batch_size: not a flag the launcher knows; the nearest: --micro_batch_size (every flag: --help)",
        "  - --lr: not a flag the launcher knows; every flag: --help, and docs/flags.md",
        "  - --hf_token: not a flag the launcher knows; every flag: --help, and docs/flags.md",
    ], err
    assert "hf_a" not in err and "Traceback" not in err


NAMES = [*flags.flag_names(), "nodry_run", "noresume", "hidden", "no"]
TOKENS = ["", "x", "none", "None", "0", "-1", "3", "1e3", "2.5", "nan", "true", "No", "maybe", "=", "--", "-x"]
TYPED = {int: ["0", "3", "-1", "007"], float: ["2.5", "1e-3", "-0.5", "3"], str: ["x", "a b", "none"]}
TYPED[bool] = ["true", "No", "1", "f"]
KINDS = flags.flag_types()


@st.composite
def command_lines(draw) -> list[str]:
    argv = []
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=5)):
        typed = TYPED[KINDS[name]] if name in KINDS and draw(st.booleans()) else []
        value = draw(st.sampled_from([None, *typed, *typed, *TOKENS]))
        if value is None:
            argv.append(f"--{name}")
        elif draw(st.booleans()):
            argv.append(f"--{name}={value}")
        else:
            argv += [f"--{name}", value]
    if draw(st.integers(0, 9)):
        argv += ["--run_name", draw(st.sampled_from(["x", "-x", "", "a=b"]))]
    return argv


@settings(max_examples=150, deadline=None)
@given(command_lines())
def test_whatever_is_accepted_has_each_flags_type_and_whatever_is_refused_exits_2(argv):
    try:
        args, _ = cli.parse(argv)
    except SystemExit as e:
        assert e.code == 2
        return
    for name, value in values(args).items():
        assert value is None or type(value) is KINDS.get(name, str), (name, value)


@pytest.mark.parametrize("flag", ["hidden_size", "num_layers", "vocab_size", "tp"])
def test_a_derived_flag_typed_alone_is_derived_as_if_not_typed(flag):
    spec, problems = spec_for("--model_size", "small", f"--{flag}")
    assert getattr(spec.args.model if flag != "tp" else spec.args.parallelism, flag) is not None, problems
    assert spec.shape.resolved and values(spec.args) == values(spec_for("--model_size", "small")[0].args)


def test_a_dry_run_never_imports_simple_parsing_nor_does_a_mistake(tmp_path: Path):
    out = run_launcher("--run_name", "x", "--dry_run", cwd=tmp_path, block=("simple_parsing",))
    assert out.returncode == 0, out.stderr
    out = run_launcher("--run_name", "x", "--nodes", "many", cwd=tmp_path, block=("simple_parsing",))
    assert out.returncode == 2 and "invalid int value: 'many'" in out.stderr and "Traceback" not in out.stderr


def test_a_launch_parses_each_command_line_once(tmp_path: Path, monkeypatch):
    from launcher.runs import launch

    monkeypatch.chdir(tmp_path)
    seen: list[list[str]] = []
    parse = cli.parse
    monkeypatch.setattr(cli, "parse", lambda argv: seen.append(argv) or parse(argv))
    argv = ["--run_name", "x", "--nodes", "1", "--gpus_per_node", "2", "--dataset", "none", "--dry_run"]
    assert launch.main(argv) == 0
    assert seen == [argv]
    seen.clear()
    assert launch.main([*argv, "--sweep", "seed=1,2"]) == 0
    assert len(seen) == 3 and len({tuple(a) for a in seen}) == 3  # the sweep's line, then each point's own
