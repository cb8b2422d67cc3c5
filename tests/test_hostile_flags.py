"""No flag value ends in a traceback (issue 30): every flag `--help` lists, given a hostile value (empty, huge,
not finite, shell metacharacters, control characters, a name or a path longer than a filesystem allows, bytes that
are not UTF-8), either makes a dry run whose scripts parse, or is a user error: exit 2, a line naming the flag,
and nothing written.

In-process, as slurm_launcher.py runs it (`launch.main` through `errors.as_command`): an exception that escapes
is the traceback a user would see, and fails the test. Each launch is a dry run from an empty directory of its
own, HOME an empty one too (a `~` in a value lands there); no Slurm is asked.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher import jobs
from launcher import protocol as P
from launcher.config import cli, ranges
from launcher.errors import as_command
from launcher.node.job import load as load_job
from launcher.runs import launch
from launcher.slurm import client

FLAGS = sorted(set(re.findall(r"(?<![\w-])--([a-z][a-z_]*)", cli.help_text(width=200))) - {"help"})
# What a command line can hold: any text but NUL and the surrogates that no bytes decode to (os.fsdecode gives
# \udc80-\udcff for bytes that are not UTF-8: those come from the binary strategy below)
ANY = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
CONTROL = [chr(c) for c in [*range(1, 32), *range(127, 160)]]
HOSTILE = st.one_of(
    st.sampled_from(["", " ", "\t", "-", "--", "-x", "=", ",", ":", "none", "0", "-1", "..", "~", "~x/y"]),
    st.integers(10**15, 10**80).flatmap(lambda n: st.sampled_from([str(n), f"-{n}", f"{n}.5"])),  # huge
    st.sampled_from(["nan", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e-999"]),  # not finite
    st.text(alphabet="$`'\";&|<>(){}[]*?!#\\ \n%^=,:@", min_size=1, max_size=12),  # shell metacharacters
    st.lists(st.sampled_from(CONTROL), min_size=1, max_size=3).map(lambda c: f"a{''.join(c)}b"),  # control chars
    st.integers(ranges.NAME_MAX + 1, 1000).map(lambda n: "d/" + "x" * n),  # a name longer than NAME_MAX
    st.integers(ranges.NAME_MAX + 1, 1000).map(lambda n: "/" + "x" * n),  # (first: no ENOENT before it)
    st.integers(ranges.PATH_MAX // 200 + 1, 40).map(lambda n: "/".join(["y" * 200] * n)),  # a path beyond PATH_MAX
    st.binary(min_size=1, max_size=3).filter(lambda b: b"\0" not in b).map(lambda b: os.fsdecode(b"a\xff" + b)),
    st.text(ANY, max_size=20),  # anything at all
)
OUTPUTS = ("configs_path", "slurm_scripts_dir", "slurm_logs_path", "checkpoints_path")


def dry_run(typed: list[tuple[str, str, bool]]) -> tuple[int, str, str, Path]:
    """A dry run with `typed` ((flag, value, as --flag=value)) after the output flags and before --dry_run (the
    one that wins): its exit code, stdout, stderr, and its directory (HOME in it) to look into, then remove."""
    where = Path(tempfile.mkdtemp(prefix="hostile-"))
    (where / "run").mkdir()
    (where / "home").mkdir()
    argv = ["--run_name", "r", *(f"--{flag}={where / 'run' / flag}" for flag in OUTPUTS)]
    for flag, value, joined in typed:
        argv += [f"--{flag}={value}"] if joined else [f"--{flag}", value]
    argv.append("--dry_run")
    out, err, home, cwd = io.StringIO(), io.StringIO(), os.environ.get("HOME"), os.getcwd()
    os.environ["HOME"] = str(where / "home")
    os.chdir(where / "run")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = as_command(lambda: launch.main(argv))
    except SystemExit as e:  # argparse's refusal
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # the traceback a user would see: the test fails with it, leaving nothing in /tmp
        shutil.rmtree(where, ignore_errors=True)
        raise
    finally:
        os.chdir(cwd)
        os.environ.update({"HOME": home} if home is not None else {})
    return code, out.getvalue(), err.getvalue(), where


def written(where: Path) -> list[str]:
    return sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.name not in ("run", "home"))


def holds(code: int, out: str, err: str, where: Path, flags: list[str]) -> None:
    """The rule: a dry run whose scripts parse (or the help, where a value is `--help`, or the layouts, where
    `--plan` is on: nothing written), or exit 2, each problem a line, a line naming one of `flags`, and nothing
    written."""
    try:
        assert "Traceback" not in err, err
        if code == 0 and (out.startswith(f"usage: {cli.USAGE}") or out.endswith("Nothing was written or submitted.\n")):
            assert written(where) == [], out
            return
        if code == 0:
            scripts, settings = list(where.rglob("*.sbatch")), list(where.rglob(P.JOB_FILE))
            assert scripts or settings, out  # (a sweep's points, or one run's; a script may lie outside `where`)
            for script in scripts:
                assert subprocess.run(["bash", "-n", script], capture_output=True).returncode == 0, script.read_text()
            for one in settings:
                load_job(one)  # the job reads its settings back
            return
        assert code == 2, err
        lines = err.splitlines()
        counted = re.match(r"error: (\d+) problems? found", lines[0]) if lines else None
        if counted:  # the launcher's own: one line per problem, each naming its flag
            assert sum(line.startswith("  - --") for line in lines) == int(counted.group(1)) == len(lines) - 1, err
        assert any(f"--{flag}" in line for flag in flags for line in lines), err
        assert written(where) == [], err
    finally:
        shutil.rmtree(where, ignore_errors=True)


def named(flag: str, value: str, joined: bool) -> list[str]:
    """The flags a line may name for `--flag value`: the flag, or the value where it has a flag's shape and is
    typed apart (`--dry_run --A`: a switch's value is never a flag, so --A is an unknown flag of its own)."""
    return [flag, *([value[2:].split("=", 1)[0]] if not joined and re.match(r"--[A-Za-z]", value) else [])]


@pytest.mark.parametrize("flag", FLAGS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=HOSTILE, joined=st.booleans())
def test_a_hostile_value_of_any_flag_is_a_line_naming_it_and_nothing_written(flag, value, joined):
    code, out, err, where = dry_run([(flag, value, joined)])
    holds(code, out, err, where, named(flag, value, joined))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(FLAGS), HOSTILE, st.booleans()), min_size=2, max_size=4))
def test_several_hostile_values_at_once_are_said_together_and_nothing_written(typed):
    code, out, err, where = dry_run(typed)
    holds(code, out, err, where, [name for typed_flag in typed for name in named(*typed_flag)])


OVERLONG = "x" * (ranges.NAME_MAX + 1)


@pytest.mark.parametrize("flag", ranges.PATH_FLAGS)
@pytest.mark.parametrize("under", ["d/", "/"])  # (at the root: the kernel meets the long name first, not ENOENT)
def test_a_name_longer_than_the_filesystem_allows_is_said_for_every_path_flag(flag, under):
    code, out, err, where = dry_run([(flag, f"{under}{OVERLONG}", True)])
    holds(code, out, err, where, [flag])
    assert f"--{flag}: a name in it is {ranges.NAME_MAX + 1} bytes long" in err, err


SAID = [  # (what is typed, each problem's line, as said)
    ([("nodes", "9" * 30, True), ("tp", "4", True)],
     ["--nodes: a number of 30 digits is beyond any run (at most 100,000 here); give --nodes a realistic value"]),
    ([("learning_rate", "nan", False), ("rope_theta", "1e999", True)],
     ["--rope_theta: must be a finite number, got inf; give a number to --rope_theta",  # (the model's flags first)
      "--learning_rate: must be a finite number, got nan; give a number to --learning_rate"]),
    ([("tp", "-" + "9" * 13, True), ("plan", "true", True)],
     ["--tp: -9999999999999 is beyond any run; give --tp a realistic value"]),
    ([("pre_launch_commands", os.fsdecode(b"echo \xff"), True)],
     ["--pre_launch_commands: it holds bytes that are not UTF-8 (at character 6); give --pre_launch_commands as "
      "UTF-8 text"]),
    ([("run_name", "a\nb", True)],
     ["--run_name: 'a\\nb' is not safe as a file and job name; use letters, digits, '.', '_', '-' (at most 64, "
      "starting with a letter or digit)"]),
]  # fmt: skip


@pytest.mark.parametrize("typed,said", SAID)
def test_what_no_run_takes_is_said_once_each_on_a_line_of_its_own(typed, said):
    code, out, err, where = dry_run(typed)
    holds(code, out, err, where, [name for typed_flag in typed for name in named(*typed_flag)])
    assert err.splitlines()[1:] == [f"  - {line}" for line in said], err


def jobs_argv(action: str, where: str, value: str) -> list[str]:
    """`python -m launcher.jobs` with `value` as the run(s) it names, its --configs_path, diff's --tolerance, or
    export's --output or --step."""
    runs = {"diff": [value, value], "rerun": [value, "--dry_run"], "ledger": [value], "status": [value],
            "export": [value], "checkpoints": [value]}  # fmt: skip
    if where == "target":
        return [action, *runs[action]]
    if where == "tolerance":
        return ["diff", "a", "b", f"--tolerance={value}"]
    if where in ("output", "step"):
        return ["export", "a", f"--{where}={value}"]
    return [
        action,
        *(["a", "b"] if action == "diff" else ["a"] if action in ("rerun", "export", "checkpoints") else []),
        f"--configs_path={value}",
    ]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    action=st.sampled_from(["diff", "rerun", "ledger", "status", "export", "checkpoints"]),
    where=st.sampled_from(["target", "configs_path", "tolerance", "output", "step"]),
    value=HOSTILE.filter(lambda v: not client.JOB_ID.match(v.strip())),
)  # (a job id asks Slurm: tested there)
def test_the_jobs_commands_take_any_value_without_a_traceback(action, where, value):  # fmt: skip
    where_to = Path(tempfile.mkdtemp(prefix="hostile-jobs-"))
    out, err, cwd = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(where_to)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = as_command(lambda: jobs.main(jobs_argv(action, where, value)))
    except SystemExit as e:  # argparse's refusal: a usage line and one error line
        code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(cwd)
        left = sorted(p.name for p in where_to.rglob("*"))
        shutil.rmtree(where_to, ignore_errors=True)
    said = err.getvalue()
    assert code in (0, 1, 2) and "Traceback" not in said, said
    assert code == 0 or said.startswith(("error: ", "usage: ")), said
    assert left == [], left


def test_every_flag_of_help_is_tried():
    assert len(FLAGS) > 80 and {"run_name", "configs_path", "dry_run", "noresume", "sweep"} <= set(FLAGS)
