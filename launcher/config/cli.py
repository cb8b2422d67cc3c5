"""The command line: plain argparse over the flag dataclasses (`launcher.config.flags`), and `--help` as users know
it: the groups docs/flags.md names, each flag's comment with its default said once, switches shown as switches.

The help text is the fields' comments, read by simple-parsing's docstring reader only when --help is asked: a
command line that parses needs neither it nor the ~75 ms of reading source it costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
import sys
import typing
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

from launcher.config.flags import GROUPS, LaunchArgs, explicit_flags
from launcher.secrets_guard import redact

PROG = "slurm_launcher.py"
USAGE = f"{PROG} --run_name NAME [flags]"
DESCRIPTION = (
    "Turn a few flags into a validated nanotron training run on Slurm: config, sbatch script, manifest; submit it "
    "and follow it to its end."
)
EPILOG = (
    "A switch takes true or false too (--dry_run false), and --noSWITCH turns it off. The flags by group, with "
    "what each does: docs/flags.md."
)
TITLES = {  # group -> its title, as docs/flags.md's table names it
    "slurm": "Slurm",
    "model": "model",
    "training": "training",
    "parallelism": "parallelism",
    "data": "data",
    "paths": "paths",
    "logging": "logging",
    "execution": "execution",
    "job": "job",
    "container": "container",
    "evals": "evals",
}
METAVARS = {int: "INT", float: "FLOAT", str: "TEXT"}
TRUE_WORDS = ("yes", "true", "t", "y", "1")
FALSE_WORDS = ("no", "false", "f", "n", "0")
HELP_WIDTH = 120


class _Boolean(argparse.Action):
    """A switch: `--x`, `--x VALUE` (true/false, yes/no, 1/0, ...) and `--nox`."""

    def __call__(self, parser: Any, namespace: object, values: object, option_string: str | None = None) -> None:
        negated = option_string == "--no" + self.dest.rsplit(".", 1)[-1]
        word = values.strip().lower() if isinstance(values, str) else None
        if values is None:
            setattr(namespace, self.dest, not negated)
        elif negated:
            parser.error(f"argument {option_string}: takes no value (got {values!r})")
        elif word in TRUE_WORDS + FALSE_WORDS:
            setattr(namespace, self.dest, word in TRUE_WORDS)
        else:
            parser.error(f"argument {option_string}: {values!r} is not true or false")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's own errors (`invalid int value: '...'`) repeat what was typed: a secret is redacted there too."""
        super().error(redact(message))


class _Formatter(argparse.HelpFormatter):
    """A flag that may be given without a value shows its value plainly (`--partition TEXT`, not `[TEXT]`); a switch
    shows both its forms and no value (`--exclusive, --noexclusive`)."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == "?" and not isinstance(action, _Boolean):
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _Boolean):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def _kind(hint: Any) -> tuple[type, bool]:
    """A field's value type and whether it may be None."""
    kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    return kind, kind is not hint


def _help(group: type, name: str, default: Any) -> str:
    """A field's comment, with its default where the comment does not say it (a switch's only when it is on)."""
    from simple_parsing.docstring import get_attribute_docstring  # only for --help: it reads the source

    doc = get_attribute_docstring(group, name)
    text = (doc.comment_inline or doc.comment_above or doc.docstring_below).strip()
    if "default" in text.lower() or default is None or default is False:
        return text
    return f"{text} (default: {'on' if default is True else default})"


def build_parser(with_help: bool = False, width: int | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every flag with simple-parsing's forms (a field that may be None takes an
    optional value, and alone means None; a switch takes a true/false word or none). `with_help`: with the
    fields' comments as help (what --help prints); without, it parses only (every default is SUPPRESS, so that
    the namespace holds what was typed). `width`: of the help (default: the terminal's, at most HELP_WIDTH)."""
    width = width or min(shutil.get_terminal_size().columns - 2, HELP_WIDTH)
    parser = _Parser(
        prog=PROG, usage=USAGE, description=DESCRIPTION, epilog=EPILOG, add_help=False, allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        formatter_class=lambda prog: _Formatter(prog, max_help_position=30, width=width),
    )  # fmt: skip
    if with_help:  # (parsing, `parse` answers -h and --help itself: argparse would read `--tp -help` as -h's)
        parser.add_argument("-h", "--help", action="help", help="show this help and exit")
    required = parser.add_argument_group("required")
    what = _help(LaunchArgs, "run_name", None) if with_help else None
    required.add_argument("--run_name", dest="run_name", type=str, required=True, metavar="NAME", help=what)
    for group_name, group in GROUPS.items():
        doc = (group.__doc__ or "").strip() if with_help else None
        section = parser.add_argument_group(TITLES[group_name], doc)
        hints = typing.get_type_hints(group)
        for f in dataclasses.fields(group):
            kind, optional = _kind(hints[f.name])
            default = f.default if f.default is not dataclasses.MISSING else None
            shown = _help(group, f.name, default) if with_help else None
            dest, flag = f"{group_name}.{f.name}", f"--{f.name}"
            if kind is bool:
                section.add_argument(flag, f"--no{f.name}", dest=dest, nargs="?", action=_Boolean, help=shown)
            elif optional:  # `--x` alone means None
                section.add_argument(flag, dest=dest, type=kind, nargs="?", const=None, metavar=METAVARS[kind],
                                     help=shown)  # fmt: skip
            else:
                section.add_argument(flag, dest=dest, type=kind, metavar=METAVARS[kind], help=shown)
    return parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def help_text(width: int | None = None) -> str:
    """What --help prints (`width`: see build_parser)."""
    return build_parser(with_help=True, width=width).format_help()


class Parsed(NamedTuple):
    """A command line, parsed: its flags by group, and the names of those the user typed."""

    args: LaunchArgs
    explicit: set[str]


def parse(argv: Sequence[str]) -> Parsed:
    """argv as LaunchArgs and the flags typed. --help prints the help and exits 0; a line argparse refuses, its
    message (a secret redacted) and exit 2, as argparse does."""
    argv = list(argv)
    if any(tok in ("-h", "--help") or tok.startswith("--help=") for tok in argv):
        print(help_text(), end="")
        sys.exit(0)
    parser = _parser()
    namespace, extras = parser.parse_known_args(argv)
    if extras:
        _unrecognized(parser, argv, extras)
    given = vars(namespace)  # only the flags typed: every default is SUPPRESS
    for dest, value in given.items():
        if isinstance(value, list):  # argparse's reading of `--x=--`: the '--' taken away, nothing left
            parser.error(f"argument --{dest.rsplit('.', 1)[-1]}: expected one argument")
    groups: dict[str, dict[str, object]] = {name: {} for name in GROUPS}
    for dest, value in given.items():
        if dest != "run_name":
            group_name, name = dest.split(".")
            groups[group_name][name] = value
    args = LaunchArgs(given["run_name"], **{name: GROUPS[name](**fields) for name, fields in groups.items()})
    return Parsed(args, explicit_flags(argv) - _derived_alone(given))


def _derived_alone(given: dict[str, object]) -> set[str]:
    """The flags typed alone (None) whose default is None, "derive it" (`--hidden_size` alone: the preset's): no
    choice, so that the preset, the --config YAML or the job's size still decide them."""
    defaults = {f"{g}.{f.name}": f.default for g, group in GROUPS.items() for f in dataclasses.fields(group)}
    return {dest.rsplit(".", 1)[-1] for dest, value in given.items() if value is None and defaults.get(dest) is None}


def _unrecognized(parser: argparse.ArgumentParser, argv: list[str], extras: list[str]) -> NoReturn:
    """argparse's refusal of what it could not place, naming the flag where the stray word is a value that starts
    with a dash given after a flag whose value is optional (`--partition -x` reads as `--partition` alone, then
    `-x`): the way to give it is `--partition=-x`."""
    stray = extras[0]
    at = argv.index(stray) if stray in argv else -1
    before = argv[at - 1] if at > 0 else ""
    if before.startswith("--") and "=" not in before and stray.startswith("-"):
        parser.error(f"argument {before}: its value {stray!r} starts with a dash: give it as {before}={stray}")
    parser.error(f"unrecognized arguments: {' '.join(extras)}")
