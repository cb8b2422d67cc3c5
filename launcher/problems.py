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


def report(problems: list[Problem]) -> str:
    """All problems as one message, one per line; a value that looks like a secret is never repeated."""
    head = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found, nothing was written or submitted:"
    return "\n".join([head, *(f"  - {redact(str(p))}" for p in problems)])
