"""A run's pictures, as PNGs in its bundle: training.png (loss, learning rate, gradient norm and throughput over
steps, from metrics.jsonl) and gpus.png (utilisation, memory, power and temperature of every GPU over time, one
colour a node, from the `nvidia-smi dmon` logs the job writes beside its log). matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from launcher.bundle import manifest
from launcher.report import dmon
from launcher.report.plots import read_metrics

TRAINING = (  # metrics.jsonl field -> panel title, y label
    ("loss", "loss", "loss"),
    ("lr", "learning rate", "lr"),
    ("grad_norm", "gradient norm (before clipping)", "L2 norm"),
    ("tokens_per_s", "throughput", "tokens/s (all GPUs)"),
)
MAX_LEGEND_NODES = 12


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def steps_and_resumes(rows: list[dict]) -> tuple[dict[int, dict], list[int]]:
    """The last line of each step (a requeued run logs some steps twice: the later attempt's line wins), and the
    steps where an attempt resumed (a step no later than the one before it)."""
    by_step: dict[int, dict] = {}
    resumes, previous = [], None
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        if previous is not None and step <= previous:
            resumes.append(step)
        by_step[step], previous = row, step
    return by_step, resumes


def training_png(metrics: Path, png: Path, title: str) -> Path | None:
    """Loss, learning rate, gradient norm and tokens/s against step; None when the file has no step yet."""
    by_step, resumes = steps_and_resumes(read_metrics(metrics))
    if not by_step:
        return None
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter

    steps = sorted(by_step)
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), dpi=100, sharex=True)
    for ax, (key, name, unit) in zip(axes.flat, TRAINING, strict=True):
        points = [(s, by_step[s][key]) for s in steps if isinstance(by_step[s].get(key), (int, float))]
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], color="tab:blue", linewidth=1.4, marker="." if
                    len(points) <= 60 else None, markersize=4)  # fmt: skip
        else:
            why = " (the nanotron engine computes it only\nwith clipping on: --grad_clip)" if key == "grad_norm" else ""
            ax.text(0.5, 0.5, f"not logged{why}", transform=ax.transAxes, ha="center", va="center", color="gray")
        for i, step in enumerate(resumes):
            label = f"resumed at step {', '.join(map(str, resumes))}" if i == 0 else None
            ax.axvline(step, color="tab:red", linestyle=":", linewidth=1.2, label=label)
        ax.set_title(name, fontsize=11)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        if key == "tokens_per_s" and points:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
            values = sorted(v for _, v in points)
            ax.set_ylim(0, values[int(0.95 * (len(values) - 1))] * 1.25)  # a slow first step must not flatten it
    if resumes:
        axes.flat[0].legend(frameon=False, fontsize=9)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(f"{title}: {len(steps)} steps logged ({steps[0]}..{steps[-1]})", fontsize=12)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


GPU_PANELS = (  # dmon column, title, y label, scale
    ("sm", "utilisation (SM busy)", "%", 1.0),
    ("fb", "memory used", "GiB", 1 / 1024),
    ("pwr", "power", "W", 1.0),
    ("gtemp", "temperature", "°C", 1.0),
)


GAP = timedelta(seconds=4 * 15)  # dmon samples every 15 s: a longer silence is the node between attempts


def node_series(log: dmon.DmonLog, column: str, scale: float = 1.0) -> tuple[list[datetime], list[tuple[float, ...]]]:
    """A node's GPUs at each sample time: (mean, lowest, highest) of the column's reported values. Where the samples
    stop for longer than GAP (the job requeued, waiting), a NaN point breaks the line instead of bridging it."""
    at: dict[datetime, list[float]] = {}
    for s in log.samples:
        value = s.values.get(column)
        if value is not None:
            at.setdefault(s.time, []).append(value * scale)
    times: list[datetime] = []
    stats: list[tuple[float, ...]] = []
    for t in sorted(at):
        if times and t - times[-1] > GAP:
            times.append(times[-1] + (t - times[-1]) / 2)
            stats.append((math.nan, math.nan, math.nan))
        times.append(t)
        stats.append((sum(at[t]) / len(at[t]), min(at[t]), max(at[t])))
    return times, stats


def gpus_png(logs: list[dmon.DmonLog], png: Path, title: str) -> Path | None:
    """Utilisation, memory, power and temperature over time, one colour a node: the line is the mean of its GPUs,
    the band their range (a GPU apart from its node's others shows as a wide band). None without samples."""
    logs = [log for log in logs if log.samples]
    if not logs:
        return None
    plt = _pyplot()
    from matplotlib.dates import DateFormatter

    colours = plt.get_cmap("tab10" if len(logs) <= 10 else "tab20")
    band = 0.25 if len(logs) <= 4 else 0.1  # many nodes' bands overlap: lighter, so the lines stay readable
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.8), dpi=100, sharex=True)
    for ax, (column, name, unit, scale) in zip(axes.flat, GPU_PANELS, strict=True):
        for n, log in enumerate(logs):
            times, stats = node_series(log, column, scale)
            colour = colours(n % colours.N)
            label = f"{log.host} ({len(log.gpus)} GPUs)" if n < MAX_LEGEND_NODES else None
            ax.plot(times, [m for m, _, _ in stats], color=colour, linewidth=1.4, label=label)
            ax.fill_between(times, [lo for _, lo, _ in stats], [hi for _, _, hi in stats], color=colour, alpha=band,
                            linewidth=0)  # fmt: skip
        ax.set_title(name, fontsize=11)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0, top=105 if column == "sm" else None)
    for ax in axes[1]:
        ax.xaxis.set_major_formatter(DateFormatter("%H:%M"))
        ax.set_xlabel(f"time on {_first_time(logs):%Y-%m-%d} (nvidia-smi dmon samples)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    more = f" (+{len(logs) - MAX_LEGEND_NODES} more)" if len(logs) > MAX_LEGEND_NODES else ""
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=min(len(labels), 6),
               frameon=False, fontsize=9, title=f"line: a node's mean over its GPUs, band: their range{more}",
               title_fontsize=9)  # fmt: skip
    gpus = sum(len(log.gpus) for log in logs)
    fig.suptitle(f"{title}: {gpus} GPUs on {len(logs)} node(s)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    fig.savefig(png)
    plt.close(fig)
    return png


def _first_time(logs: list[dmon.DmonLog]) -> datetime:
    return min(s.time for log in logs for s in log.samples)


def dmon_logs(log_dir: Path, job_id: str) -> list[dmon.DmonLog]:
    """Every node's monitor log of a job, beside the job's log: gpu-JOBID-HOST.log, and gpu-JOBID-HOST.log.N of its
    later attempts on that node, joined."""
    logs = []
    for path in sorted(log_dir.glob(f"gpu-{job_id}-*.log*")):
        if not dmon.is_log_of(path, job_id):
            continue
        try:
            logs.append(dmon.parse(path.read_text(encoding="utf-8", errors="replace"), dmon.host_of(path, job_id)))
        except OSError:
            continue
    return dmon.joined(logs)


def render(bundle_dir: Path) -> dict[str, Path]:
    """Draw a bundle's pictures (those it has data for) into it; returns {"training": PNG, "gpus": PNG}."""
    run = manifest.load(bundle_dir)
    title = f"{run.data.get('run_name', bundle_dir.parent.name)} ({bundle_dir.name})"
    drawn: dict[str, Path] = {}
    if run.metrics.is_file() and (png := training_png(run.metrics, bundle_dir / "training.png", title)):
        drawn["training"] = png
    log = run.data.get("outputs", {}).get("log")
    if (
        run.job_id
        and log
        and (png := gpus_png(dmon_logs(Path(log).parent, run.job_id), bundle_dir / "gpus.png", title))
    ):
        drawn["gpus"] = png
    return drawn
