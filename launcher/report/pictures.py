"""A run's pictures, as PNGs in its bundle: loss.png (loss and learning rate over steps), training.png (loss,
learning rate, gradient norm and throughput over steps, from metrics.jsonl; the ranks training named as stragglers
marked on the throughput) and gpus.png (utilisation, memory, power and temperature of every GPU over time, one colour
a node, from the `nvidia-smi dmon` logs the job writes beside its log); a sweep's loss curves, one line a point.
matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
import warnings
from array import array
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from launcher import jsonl
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.report import dmon, stragglers

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


def sweep_curves(series: dict[str, Path], png: Path) -> Path:
    """A sweep's points on one plot: each one's loss against step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for name, metrics in series.items():
        rows = {r["step"]: r for r in jsonl.read(metrics) if "step" in r and "loss" in r} if metrics.exists() else {}
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


def evals_png(panels: dict[str, tuple[str, dict[str, list[tuple[int, float]]]]], png: Path, title: str) -> Path:
    """Eval scores against tokens consumed: a panel per task (its metric), a line per run in it (a sweep's points;
    one run: its own line). `panels`: task -> (metric, label -> [(tokens, value)])."""
    plt = _pyplot()
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), dpi=100, squeeze=False)
    for ax, (task, (metric, lines)) in zip(axes.flat, panels.items(), strict=False):
        for label, points in lines.items():
            ax.plot([t for t, _ in points], [v for _, v in points], marker="o", label=label)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(frameon=False, fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def loss_curve(metrics: Path, png: Path) -> Path:
    """Plot loss (and learning rate) against step; requeued attempts show as one continuous curve."""
    plt = _pyplot()
    rows = {r["step"]: r for r in jsonl.read(metrics) if "step" in r and "loss" in r}  # a resumed step wins
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


def training_png(metrics: Path, png: Path, title: str, slow: list[dict] | None = None) -> Path | None:
    """Loss, learning rate, gradient norm and tokens/s against step, the stragglers (`slow`: the stragglers file's
    records) shaded on the throughput over the steps they were slow; None when the file has no step yet."""
    by_step, resumes = steps_and_resumes(jsonl.read(metrics))
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
            for n, (who, rows) in enumerate(stragglers.by_who(slow or []).items()):
                label = f"straggler: {who}, {stragglers.ratio(rows):.1f}x"
                ax.axvspan(max(rows[0].get("since", rows[0]["step"]), steps[0]), rows[-1]["step"], alpha=0.2,
                           color=f"C{(n + 1) % 10}", label=label)  # fmt: skip
            if slow:
                ax.legend(frameon=False, fontsize=8, loc="lower right")
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


def _panel(ax: Any, name: str, unit: str, column: str) -> None:
    """A GPU panel's title, unit and grid; SM utilisation to 100 %."""
    ax.set_title(name, fontsize=11)
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0, top=105 if column == "sm" else None)


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
        _panel(ax, name, unit, column)
    for ax in axes[1]:
        ax.xaxis.set_major_formatter(DateFormatter("%H:%M"))
        ax.set_xlabel(f"time on {_first_time(logs):%Y-%m-%d} (nvidia-smi dmon samples)")
    more = f" (+{len(logs) - MAX_LEGEND_NODES} more)" if len(logs) > MAX_LEGEND_NODES else ""
    gpus = sum(len(log.gpus) for log in logs)
    return _legend_and_save(fig, axes, png, f"{title}: {gpus} GPUs on {len(logs)} node(s)", 0.91,
                            f"line: a node's mean over its GPUs, band: their range{more}", 6, 9)  # fmt: skip


def _legend_and_save(fig, axes, png: Path, suptitle: str, top: float, legend: str, ncol: int, size: int) -> Path:  # type: ignore[no-untyped-def]
    """The figure's legend (from its first panel) and title above the panels, then the file."""
    import matplotlib.pyplot as plt

    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=min(len(labels), ncol) or 1,
               frameon=False, fontsize=size, title=legend, title_fontsize=9)  # fmt: skip
    fig.suptitle(suptitle, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, top))
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


MAX_BINS = 360  # time bins of a picture of many nodes: its memory is nodes x bins, whatever the run's length
SLOWEST = 5  # the nodes drawn by name in a picture of many nodes: the lowest mean utilisation


def binned_logs(log_dir: Path, job_id: str) -> list[dmon.Binned]:
    """Every node's monitor logs as time bins on one grid (MAX_BINS over the job's samples), streamed."""
    paths = [p for p in sorted(log_dir.glob(f"gpu-{job_id}-*.log*")) if dmon.is_log_of(p, job_id)]
    spans = [s for p in paths if (s := _span(p))]
    if not spans:
        return []
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    width = max(15.0, math.ceil((end - start).total_seconds() / MAX_BINS + 1e-9))
    bins = int((end - start).total_seconds() // width) + 1
    by_host: dict[str, dmon.Binned] = {}
    for path in paths:
        host = dmon.host_of(path, job_id)
        columns = [c for c, *_ in GPU_PANELS]
        sums, counts = {c: array("d", [0.0]) * bins for c in columns}, {c: array("l", [0]) * bins for c in columns}
        into = by_host.get(host) or dmon.Binned(host, start, width, sums, counts)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                by_host[host] = dmon.bin_into(into, f)
        except OSError:
            continue
    return list(by_host.values())


def _span(path: Path) -> tuple[datetime, datetime] | None:
    try:
        return dmon.span(path)
    except OSError:
        return None


def cluster_png(nodes: list[dmon.Binned], png: Path, title: str) -> Path | None:
    """Many nodes at once: per time bin, the median of the nodes' means, the band of the middle 90% and the
    lowest-highest range, and the SLOWEST nodes (lowest mean utilisation) by name."""
    if not nodes:
        return None
    import numpy as np

    plt = _pyplot()
    from matplotlib.dates import DateFormatter

    first = nodes[0]
    times = [first.start + timedelta(seconds=first.width * (i + 0.5)) for i in range(len(first.sums["sm"]))]
    means = {c: np.array([n.means(c) for n in nodes], dtype=np.float32) for c, *_ in GPU_PANELS}
    with np.errstate(all="ignore"):
        busy = np.nanmean(means["sm"], axis=1)
    slowest = [int(i) for i in np.argsort(np.nan_to_num(busy, nan=np.inf))[:SLOWEST]]
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.8), dpi=100, sharex=True)
    for ax, (column, name, unit, scale) in zip(axes.flat, GPU_PANELS, strict=True):
        m = means[column] * scale
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a bin no node reported in: NaN, said once by numpy per bin
            lo, p5, mid, p95, hi = np.nanpercentile(m, [0, 5, 50, 95, 100], axis=0)
        ax.fill_between(times, lo, hi, color="tab:blue", alpha=0.12, linewidth=0, label="lowest-highest node")
        ax.fill_between(times, p5, p95, color="tab:blue", alpha=0.3, linewidth=0, label="middle 90% of nodes")
        ax.plot(times, mid, color="tab:blue", linewidth=1.4, label="median node")
        for n, i in enumerate(slowest):
            ax.plot(times, m[i], linewidth=1.0, color=plt.get_cmap("tab10")((n + 1) % 10),
                    label=f"{nodes[i].host} (mean SM {busy[i]:.0f}%)")  # fmt: skip
        _panel(ax, name, unit, column)
    for ax in axes[1]:
        ax.xaxis.set_major_formatter(DateFormatter("%H:%M"))
        ax.set_xlabel(f"time on {first.start:%Y-%m-%d} ({first.width:.0f} s bins of nvidia-smi dmon samples)")
    gpus = sum(len(n.gpus) for n in nodes)
    return _legend_and_save(fig, axes, png, f"{title}: {gpus} GPUs on {len(nodes)} nodes", 0.88,
                            f"each node: its GPUs' mean; the {SLOWEST} least busy by name", 4, 8)  # fmt: skip


def gpus_picture(log_dir: Path, job_id: str, png: Path, title: str) -> Path | None:
    """gpus.png: a line a node up to MAX_LEGEND_NODES nodes, else the nodes' distribution (bounded memory)."""
    hosts = {dmon.host_of(p, job_id) for p in log_dir.glob(f"gpu-{job_id}-*.log*") if dmon.is_log_of(p, job_id)}
    if len(hosts) <= MAX_LEGEND_NODES:
        return gpus_png(dmon_logs(log_dir, job_id), png, title)
    return cluster_png(binned_logs(log_dir, job_id), png, title)


def render(run: manifest.Manifest) -> dict[str, Path]:
    """Draw a bundle's pictures (those it has data for) into it, from its manifest in hand; returns
    {"training": PNG, "gpus": PNG}."""
    bundle_dir = run.bundle_dir
    title = f"{run.data.get('run_name', bundle_dir.parent.name)} ({bundle_dir.name})"
    drawn: dict[str, Path] = {}
    slow = stragglers.rows(bundle_dir / P.STRAGGLERS_FILE)
    if run.metrics.is_file() and (png := training_png(run.metrics, bundle_dir / "training.png", title, slow)):
        drawn["training"] = png
    log = run.data.get("outputs", {}).get("log")
    if run.job_id and log and (png := gpus_picture(Path(log).parent, run.job_id, bundle_dir / "gpus.png", title)):
        drawn["gpus"] = png
    return drawn
