"""The flag set and its --help are an interface: changing them must be deliberate (update tests/golden/flags.txt and
tests/golden/help.txt with the change: UPDATE_GOLDEN=1)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from launcher.config import cli
from launcher.config.cli import build_parser
from launcher.config.flags import GROUPS, flag_names

SNAPSHOT = Path(__file__).parent / "golden" / "flags.txt"
HELP = Path(__file__).parent / "golden" / "help.txt"
DOCS = Path(__file__).parent.parent / "docs" / "flags.md"
NANOTRON_LAUNCHER_FLAGS = (  # the documented interface we follow (shared/reference/004)
    "run_name nodes gpus_per_node partition qos time_limit email tmp_dir pre_launch_commands extra_env model_size "
    "hidden_size intermediate_size num_layers num_heads num_kv_heads vocab_size max_seq_len seed train_steps "
    "micro_batch_size grad_accum_steps learning_rate min_lr weight_decay grad_clip warmup_steps dp pp tp dataset "
    "text_column tokenizer project configs_path slurm_logs_path checkpoints_path slurm_scripts_dir "
    "run_train_script save_interval save_initial_state wandb_disabled profiler_export_path dry_run show_logs"
).split()


def matches_snapshot(text: str, snapshot: Path) -> bool:
    """Whether `text` is the snapshot's (written first, where UPDATE_GOLDEN=1)."""
    if os.environ.get("UPDATE_GOLDEN") == "1":
        snapshot.write_text(text)
    return text == snapshot.read_text()


def test_flag_set_matches_snapshot():
    assert matches_snapshot("\n".join(flag_names()) + "\n", SNAPSHOT)


def test_every_documented_nanotron_flag_exists():
    assert set(NANOTRON_LAUNCHER_FLAGS) <= set(flag_names())


def test_every_flag_has_help_text():
    parser = build_parser(with_help=True)
    helps = {a.dest.split(".")[-1]: a.help for a in parser._actions}
    missing = [name for name in flag_names() if not (helps.get(name) or "").strip()]
    assert missing == []


def test_help_matches_its_snapshot():
    assert matches_snapshot(cli.help_text(width=100), HELP)


def test_help_reads_as_users_know_it():
    """No simple-parsing headers (`LaunchArgs ['args']:`), no doubled default, no type placeholder on a switch;
    the groups docs/flags.md's table names, in its order."""
    text = cli.help_text(width=100)
    assert "['args" not in text and "(default: None)" not in text and not re.search(r"\bbool\b", text)
    entries = re.split(r"\n  (?=--)", text)  # one flag's invocation and help each
    for entry in entries:
        assert entry.count("(default") + entry.count("; default") <= 1, entry
    for switch in ("--dry_run, --nodry_run", "--resume, --noresume", "--exclusive, --noexclusive"):
        assert re.search(rf"\n  {switch}\s", text), switch
    assert "(default: on)" in next(e for e in entries if e.startswith("--resume,"))
    documented = re.findall(r"^\| (\w[\w ]*?) \| `--", DOCS.read_text(), re.M)
    assert documented == ["required", *(cli.TITLES[g] for g in GROUPS)]
    assert [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")] == [
        "options",
        *documented,
    ]


def test_abbreviated_flags_are_refused_not_guessed(capsys):
    # argparse would take --hidden for --hidden_size, but then the preset would quietly win over it
    with pytest.raises(SystemExit) as e:
        cli.parse(["--run_name", "x", "--hidden", "128"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--hidden: not a flag the launcher knows; the nearest: --hidden_size " in err


def test_negated_boolean_flags_count_as_typed():
    from launcher.config.cli import parse
    from launcher.config.flags import explicit_flags

    args, explicit = parse(["--run_name", "x", "--nosave_initial_state", "--noresume"])
    assert args.paths.save_initial_state is False and args.paths.resume is False
    assert {"save_initial_state", "resume"} <= explicit
    assert explicit_flags(["--run_name", "x", "--nodes=4", "--notes", "1"]) == {"run_name", "nodes"}


def test_help_shows_the_field_comments():
    # a parse reads no help text (launcher.config.cli builds it for --help only); --help must still have it all
    import subprocess
    import sys

    from launcher_helpers import LAUNCHER

    out = subprocess.run([sys.executable, str(LAUNCHER), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for phrase in ("Number of nodes.", "Hub dataset name or a local path", "Write the bundle, do not submit."):
        assert phrase in text, phrase
