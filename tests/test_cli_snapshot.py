"""The flag set is an interface: changing it must be deliberate (update tests/golden/flags.txt with the change)."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.config.flags import build_parser, flag_names

SNAPSHOT = Path(__file__).parent / "golden" / "flags.txt"
NANOTRON_LAUNCHER_FLAGS = (  # the documented interface we follow (shared/reference/004)
    "run_name nodes gpus_per_node partition qos time_limit email tmp_dir pre_launch_commands extra_env model_size "
    "hidden_size intermediate_size num_layers num_heads num_kv_heads vocab_size max_seq_len seed train_steps "
    "micro_batch_size grad_accum_steps learning_rate min_lr weight_decay grad_clip warmup_steps dp pp tp dataset "
    "text_column tokenizer project configs_path slurm_logs_path checkpoints_path slurm_scripts_dir "
    "run_train_script save_interval save_initial_state wandb_disabled profiler_export_path dry_run show_logs"
).split()


def test_flag_set_matches_snapshot():
    names = "\n".join(flag_names()) + "\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        SNAPSHOT.write_text(names)
    assert names == SNAPSHOT.read_text()


def test_every_documented_nanotron_flag_exists():
    assert set(NANOTRON_LAUNCHER_FLAGS) <= set(flag_names())


def test_every_flag_has_help_text():
    parser = build_parser()
    parser.parse_known_args(["--run_name", "x"])  # simple-parsing adds its actions when it first parses
    helps = {a.dest.split(".")[-1]: a.help for a in parser._actions if a.dest.startswith("args")}
    missing = [name for name in flag_names() if not (helps.get(name) or "").strip()]
    assert missing == []


def test_abbreviated_flags_are_refused_not_guessed():
    # argparse would take --hidden for --hidden_size, but then the preset would quietly win over it
    parser = build_parser()
    try:
        parser.parse_args(["--run_name", "x", "--hidden", "128"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--hidden was accepted")


def test_negated_boolean_flags_count_as_typed():
    from launcher.config.flags import explicit_flags, parse

    args, explicit = parse(["--run_name", "x", "--nosave_initial_state", "--noresume"])
    assert args.paths.save_initial_state is False and args.paths.resume is False
    assert {"save_initial_state", "resume"} <= explicit
    assert explicit_flags(["--run_name", "x", "--nodes=4", "--notes", "1"]) == {"run_name", "nodes"}


def test_help_shows_the_field_comments():
    # the dry run skips reading help text (launcher.config.flags._without_help_text); --help must still have it all
    import subprocess
    import sys

    from launcher_helpers import LAUNCHER

    out = subprocess.run([sys.executable, str(LAUNCHER), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for phrase in ("Number of nodes.", "Hub dataset name or a local path", "Write the bundle, do not submit."):
        assert phrase in text, phrase
