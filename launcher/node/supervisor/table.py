"""How a node step ended, as data: the notice, training's word (the first word of the outcome file) and srun's exit
status give the verdict. The first row that matches is the verdict.

  notice               training says   srun    verdict     what follows
  terminated           -               -       ended       exit with srun's status: a cancel or the time limit stands
  warned or preempted  finished        -       complete    exit 0 (the notice came as the run ended)
  warned or preempted  anything else   -       requeue     scontrol requeue (time limits: --max_requeues), else 3
  hung                 -               -       hung        the restart decision (else exit 1)
  node check           -               -       unhealthy   the restart decision (else exit 5)
  none                 stopped         0       stopped     exit 3: stopped on request (the stop file)
  none                 anything        0       complete    exit 0
  anything             anything        other   failed      the restart decision (else srun's status)

"anything else" includes no word at all: a report this node cannot see yet (another node wrote it; a filesystem's
cache) makes a requeue that finds the run finished, never a run that ends unfinished.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher import protocol as P
from launcher.node.supervisor.state import Notice, Verdict

NO_WORD = "unknown (no word from training)"  # what a requeue's record says of the step saved, without a report


@dataclass(frozen=True)
class Row:
    """One row of the table: None in a column matches anything."""

    notices: frozenset[Notice] | None
    words: frozenset[str] | None  # training's word: FINISHED, STOPPED, "" (none), or anything else it wrote
    status: int | None  # srun's exit status
    verdict: Verdict


def _row(notices: tuple[Notice, ...] | None, words: tuple[str, ...] | None, status: int | None, v: Verdict) -> Row:
    return Row(None if notices is None else frozenset(notices), None if words is None else frozenset(words), status, v)


N = Notice
VERDICTS: tuple[Row, ...] = (
    _row((N.TERMINATED,), None, None, Verdict.ENDED),
    _row((N.WARNED, N.PREEMPTED), (P.FINISHED,), None, Verdict.COMPLETE),
    _row((N.WARNED, N.PREEMPTED), None, None, Verdict.REQUEUE),
    _row((N.HUNG,), None, None, Verdict.HUNG),
    _row((N.NODE_CHECK,), None, None, Verdict.UNHEALTHY),
    _row((N.NONE,), (P.STOPPED,), 0, Verdict.STOPPED),
    _row((N.NONE,), None, 0, Verdict.COMPLETE),
    _row(None, None, None, Verdict.FAILED),
)


def word(outcome: str) -> str:
    """Training's word: the outcome file's first word ("finished 120" -> "finished"; "" where it wrote none)."""
    return outcome.split(" ", 1)[0]


def matches(row: Row, notice: Notice, outcome: str, status: int) -> bool:
    return (
        (row.notices is None or notice in row.notices)
        and (row.words is None or word(outcome) in row.words)
        and (row.status is None or status == row.status)
    )


def verdict(notice: Notice, outcome: str, status: int) -> Verdict:
    """The step's verdict: the first row that matches (the last matches everything)."""
    return next(row.verdict for row in VERDICTS if matches(row, notice, outcome, status))


def saved(outcome: str) -> str:
    """What the requeue's record and lines say was saved: the step after "stopped ", else the whole report."""
    prefix = P.STOPPED + " "
    return (outcome[len(prefix) :] if outcome.startswith(prefix) else outcome) or NO_WORD


def read_outcome(text: str | None) -> str:
    """The outcome file's text, trailing line breaks dropped; "" for none."""
    return (text or "").rstrip("\n")


def node_check_suspects(report: str) -> list[str]:
    """The nodes that failed their check: the first field of each "NODE: WHAT" line of the report, once each."""
    return sorted({line.split(":", 1)[0] for line in report.splitlines() if line})
