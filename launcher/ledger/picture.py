"""Where the GPU-hours of several runs went (a sweep's points, a period's runs), as one PNG: a bar a run, split
into trained (kept), start-up, wind-down and thrown away; the lost part's causes in the run's label."""

from __future__ import annotations

from pathlib import Path

from launcher.ledger.breakdown import HOUR, Ledger, plural
from launcher.report.pictures import _pyplot

PARTS = (  # (what, colour)
    ("trained", "tab:green"),
    ("start-up", "tab:blue"),
    ("wind-down", "tab:gray"),
    ("thrown away", "tab:red"),
)


def _parts(ledger: Ledger) -> list[float]:
    return [ledger.useful / HOUR, ledger.total("start_up") / HOUR, ledger.total("wind_down") / HOUR,
            ledger.total("thrown_away") / HOUR]  # fmt: skip


def draw(runs: list[tuple[str, Ledger]], png: Path, title: str) -> Path | None:
    """One horizontal bar a run (label, ledger), longest on top; None when there is no run."""
    if not runs:
        return None
    plt = _pyplot()
    height = max(2.5, 0.45 * len(runs) + 1.6)
    fig, ax = plt.subplots(figsize=(10, height), dpi=100)
    labels = []
    for row, (label, ledger) in enumerate(runs):
        left = 0.0
        for (name, colour), value in zip(PARTS, _parts(ledger), strict=True):
            ax.barh(row, value, left=left, color=colour, label=name if row == 0 else None, height=0.6)
            left += value
        causes = ", ".join(plural(n, cause) for cause, n in ledger.causes.items())
        labels.append(f"{label}" + (f"\n({causes})" if causes else ""))
    ax.set_yticks(range(len(runs)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GPU-hours")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, fontsize=9, ncol=len(PARTS))
    total = sum(ledger.allocated for _, ledger in runs) / HOUR
    lost = sum(ledger.lost for _, ledger in runs) / HOUR
    ax.set_title(f"{title}: {total:.3g} GPU-hours, {lost:.3g} lost", fontsize=11, pad=24)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png
