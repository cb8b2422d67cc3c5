"""A clean command line is parsed by plain argparse (launcher.config.flags._quick_parser), not simple-parsing, whose
import and parse cost the dry run ~60 ms; --help and anything the quick parser is unsure of go to simple-parsing.
So the quick parser must never accept a line simple-parsing refuses, nor read one differently."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from launcher_helpers import run_launcher

from launcher.config import flags

CLEAN = [
    ["--run_name", "x"],
    ["--run_name=x", "--nodes=4", "--dry_run"],
    ["--run_name", "x", "--nodes", "4", "--gpus_per_node", "2", "--dry_run", "true", "--show_logs", "no"],
    ["--run_name", "x", "--noresume", "--nosave_initial_state", "--exclusive", "--debug", "Y"],
    ["--run_name", "x", "--dataset", "--partition", "--cpus_per_node", "16", "--gpu_memory_gb", "40.5"],
    ["--run_name", "x", "--dataset", "none", "--learning_rate", "1e-3", "--min_lr=0", "--hang_factor", "2"],
    ["--run_name", "x", "--tp", "2", "--tp", "4", "--extra_env", "A=1 B=2", "--sweep", "seed=1,2"],
    ["--run_name", "x", "--zero_stage", "-1", "--time_limit", "", "--python", "/usr/bin/python3"],
    ["--nodes", "1", "--run_name", "a b", "--config", "c.yaml", "--preflight", "FALSE", "--plan"],
]
REFUSED = [  # each an error of simple-parsing's: the quick parser must leave it to it
    [],
    ["--run_name"],
    ["--run_name", "x", "--nodes", "many"],
    ["--run_name", "x", "--hidden", "128"],
    ["--run_name", "x", "--dry_run", "maybe"],
    ["--run_name", "x", "--nodes", "1.5"],
    ["--run_name", "x", "extra"],
    ["--run_name", "x", "--gpu_memory_gb", "lots"],
]


def simple_parsing(argv: list[str]) -> flags.LaunchArgs | int:
    """simple-parsing's reading of argv: LaunchArgs, or the exit code it ends with."""
    try:
        with flags._without_help_text():
            return flags.build_parser().parse_args(argv).args
    except SystemExit as e:
        return int(e.code or 0)


def quick(argv: list[str]) -> flags.LaunchArgs | None:
    try:
        return flags._parse_quickly(argv)
    except flags._Unsure:
        return None


@pytest.mark.parametrize("argv", CLEAN)
def test_a_clean_command_line_is_read_quickly_and_as_simple_parsing_reads_it(argv):
    args = quick(argv)
    assert args is not None, "left to simple-parsing"
    assert args == simple_parsing(argv)
    assert flags.parse(argv) == (args, flags.explicit_flags(argv))


@pytest.mark.parametrize("argv", REFUSED)
def test_what_simple_parsing_refuses_it_still_refuses_with_its_own_message(argv, capsys):
    assert quick(argv) is None
    code = simple_parsing(argv)
    expected = capsys.readouterr().err
    assert code == 2 and expected
    with pytest.raises(SystemExit) as e:
        flags.parse(argv)
    assert e.value.code == code and capsys.readouterr().err == expected


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


@settings(max_examples=120, deadline=None)
@given(command_lines())
def test_the_quick_parser_never_reads_a_line_otherwise_than_simple_parsing(argv):
    args = quick(argv)
    if args is not None:
        assert repr(simple_parsing(argv)) == repr(args)  # repr: nan == nan


def test_a_dry_run_never_imports_simple_parsing(tmp_path: Path):
    out = run_launcher("--run_name", "x", "--dry_run", cwd=tmp_path, block=("simple_parsing",))
    assert out.returncode == 0, out.stderr
    out = run_launcher("--run_name", "x", "--nodes", "many", cwd=tmp_path, block=("simple_parsing",))
    assert out.returncode != 0 and "simple_parsing" in out.stderr  # an error's message is simple-parsing's


def test_a_launch_parses_each_command_line_once(tmp_path: Path, monkeypatch):
    from launcher import launch

    monkeypatch.chdir(tmp_path)
    seen: list[list[str]] = []
    parse = flags.parse
    monkeypatch.setattr(flags, "parse", lambda argv: seen.append(argv) or parse(argv))
    argv = ["--run_name", "x", "--nodes", "1", "--gpus_per_node", "2", "--dataset", "none", "--dry_run"]
    assert launch.main(argv) == 0
    assert seen == [argv]
    seen.clear()
    assert launch.main([*argv, "--sweep", "seed=1,2"]) == 0
    assert len(seen) == 3 and len({tuple(a) for a in seen}) == 3  # the sweep's line, then each point's own
