"""The loss curve of a run, as a PNG, from the metrics file the training job appends to (one JSON per line)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill mid-write
    return rows


def sweep_curves(series: dict[str, Path], png: Path) -> Path:
    """A sweep's points on one plot: each one's loss against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for name, metrics in series.items():
        rows = {r["step"]: r for r in read_metrics(metrics) if "step" in r and "loss" in r} if metrics.exists() else {}
        steps = sorted(rows)
        ax.plot(steps, [rows[s]["loss"] for s in steps], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    ax.set_title(f"sweep of {len(series)} runs: loss")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def loss_curve(metrics: Path, png: Path) -> Path:
    """Plot loss (and learning rate) against step; requeued attempts show as one continuous curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["step"]: r for r in read_metrics(metrics) if "step" in r and "loss" in r}  # a resumed step wins
    steps = sorted(rows)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, [rows[s]["loss"] for s in steps], color="tab:blue", label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    lr_ax = ax.twinx()
    lr_ax.plot(steps, [rows[s].get("lr", 0.0) for s in steps], color="tab:orange", alpha=0.6, label="lr")
    lr_ax.set_ylabel("learning rate")
    lines = ax.get_lines() + lr_ax.get_lines()  # one legend for both axes
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper right", frameon=False)
    ax.set_title(f"{metrics.parent.parent.name}: loss over {len(steps)} steps")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png
