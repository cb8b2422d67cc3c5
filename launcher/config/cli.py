"""The command line: plain argparse over the flag dataclasses (`launcher.config.flags`), and `--help` as users know
it: the groups docs/flags.md names, each flag's comment with its default said once, switches shown as switches.

The help text is the fields' comments, read by simple-parsing's docstring reader only when --help is asked: a
command line that parses needs neither it nor the ~75 ms of reading source it costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import re
import shlex
import shutil
import sys
import typing
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

from launcher.config.flags import GROUPS, LaunchArgs, explicit_flags, flag_names, flag_types
from launcher.problems import one_line
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
    """Every word argparse could not place, said at once (exit 2): an unknown flag with the nearest known names,
    whatever comes before it (a switch's optional value is a true/false word, never a flag); a value that starts
    with a dash after a flag whose value is optional (`--partition -x` reads as `--partition` alone, then `-x`: the
    way to give it is `--partition=-x`); a word no flag takes."""
    kinds = flag_types()
    said: list[str] = []
    unknown: set[int] = set()  # where in argv the unknown flags are
    at = 0
    for stray in extras:
        at = argv.index(stray, at) if stray in argv[at:] else len(argv)
        before = argv[at - 1] if 0 < at <= len(argv) else ""
        typed = before[2:] if before.startswith("--") and "=" not in before else ""
        takes_value = kinds.get(typed, bool) is not bool  # a flag typed without its value; a switch takes none
        if stray == "--":  # argparse's end of the flags: every word after it is left over
            rest = f": what follows is no flag's ({shlex.join(argv[at + 1 :])})" if argv[at + 1 :] else ""
            fix = f"give it as {before}=--" if takes_value else "remove it"
            said.append(f"'--' after {before or 'nothing'} ends the flags{rest}; {fix}")
            break
        if re.match(r"--[A-Za-z]", stray):  # a flag's shape
            also = f"; as {before}'s value, give it as {before}={stray}" if takes_value else ""
            flag = stray.split("=", 1)[0]
            said.append(f"{flag}: not a flag the launcher knows; {_nearest(flag[2:])}{also}")
            unknown.add(at)
        elif stray.startswith("-") and takes_value:
            said.append(f"{before}: its value {stray!r} starts with a dash; give it as {before}={stray}")
        elif stray.startswith("-") and bool in (kinds.get(typed), kinds.get(typed.removeprefix("no"))):  # a switch
            said.append(f"{before}: {stray!r} is neither a flag nor a value it takes; every flag: --help")
        elif stray.startswith("-") and len(stray) > 1:
            said.append(f"{stray}: not a flag the launcher knows; {_nearest(stray.lstrip('-'))}")
        elif _flag_before(argv, at) not in unknown:  # (the words after an unknown flag are its value: it is said)
            said.append(_stray_word(argv, at, stray, kinds))
        at += 1
    lines = [one_line(line) for line in said]
    if len(lines) == 1:
        parser.error(lines[0])
    parser.error(
        f"{len(lines)} problems on the command line, nothing was written or submitted:\n"
        + "\n".join(f"  - {line}" for line in lines)
    )


def _nearest(name: str) -> str:
    """The known flags nearest to `name` (close in spelling, or holding it: `--gpus`, `--gpus_per_node`), as a fix."""
    names = flag_names()
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    near += [n for n in names if len(name) >= 3 and name in n and n not in near]
    listed = ", ".join(f"--{n}" for n in near[:3])
    return f"the nearest: {listed} (every flag: --help)" if near else "every flag: --help, and docs/flags.md"


def _flag_before(argv: list[str], at: int) -> int:
    """Where the last word that starts with a dash before argv[at] is (-1: none)."""
    return next((i for i in range(min(at, len(argv)) - 1, -1, -1) if argv[i].startswith("-")), -1)


def _stray_word(argv: list[str], at: int, word: str, kinds: dict[str, type]) -> str:
    """A word no flag takes: after a flag's value (`--run_name my run`), or where no flag is before it."""
    if at >= 1 and argv[at - 1].startswith("--") and "=" in argv[at - 1]:
        flag, value = argv[at - 1].split("=", 1)
    elif at >= 2 and argv[at - 2].startswith("--"):
        flag, value = argv[at - 2], argv[at - 1]
    else:
        return f"{word!r} is no flag's value; every value follows its flag (--flag VALUE or --flag=VALUE)"
    if kinds.get(flag[2:], str) is str:
        return (f"{word!r} follows {flag}'s value {value!r}: a flag takes one value; quote one that has spaces "
                f"({flag} {shlex.quote(f'{value} {word}')})")  # fmt: skip
    return f"{word!r} follows {flag}'s value {value!r}: a flag takes one value"
