"""A problem found before submission: which flag, what is wrong, how to fix it."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.secrets_guard import redact


@dataclass(frozen=True)
class Problem:
    flag: str  # the flag's name without dashes, e.g. "tp"
    message: str  # what is wrong, with the values involved
    fix: str  # what to do instead
    # what the problem is about, where the flag does not say it alone: the --config YAML's key path
    # ("tokens.sequence_length"), so that two checks of one value report it once (not part of equality)
    key: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"--{self.flag}: {self.message}; {self.fix}"


def one_line(text: str) -> str:
    """`text` with what a terminal would not show as it is (a newline, a control character, a byte that is not
    UTF-8 in a value quoted into a message) escaped, as Python writes it: one line, shown as typed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def report(problems: list[Problem]) -> str:
    """All problems as one message, one line each; a value that looks like a secret is never repeated."""
    head = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found, nothing was written or submitted:"
    return "\n".join([head, *(f"  - {one_line(redact(str(p)))}" for p in problems)])
