"""`--plan`: the planner's table as the user reads it, best first, with why the best wins. A pure function of the
spec and the planner's plans."""

from __future__ import annotations

from launcher.config.spec import RunSpec
from launcher.perf import fit, planner
from launcher.perf.sizes import human_count, parameters

ROWS = 10  # layouts shown; yours is added below them when it is not among them
HEADER = ("#", "tp", "pp", "dp", "ZeRO", "micro", "accum", "pp engine", "tp mode", "memory/GPU", "s/step", "MFU")


def _row(rank: str, plan: planner.Plan, mark: str = "") -> tuple[str, ...]:
    lay = plan.layout
    return (
        rank,
        str(lay.tp),
        str(lay.pp),
        str(lay.dp),
        str(lay.zero_stage),
        str(lay.micro_batch),
        str(lay.grad_accum),
        lay.pp_engine if lay.pp > 1 else "-",
        lay.tp_mode if lay.tp > 1 else "-",
        fit.gib(plan.memory.total) + ("" if plan.fits else " (no)"),
        f"{plan.step_s:.2f}",
        f"{plan.mfu:.1%}" + (f"  {mark}" if mark else ""),
    )


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    right = {0, 1, 2, 3, 4, 5, 6, 9, 10}
    lines = []
    for row in rows:
        cells = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def render(spec: RunSpec, plans: list[planner.Plan], fixed: dict[str, object]) -> str:
    """The text `--plan` prints."""
    a, gpu = spec.args, spec.gpu
    batch = fit.global_batch(spec)
    fitting = [p for p in plans if p.fits]
    lines = [
        f"Layouts for {a.model.model_size} ({human_count(parameters(spec))} parameters, seq {a.model.max_seq_len}) "
        f"on {a.slurm.nodes} node{'s' if a.slurm.nodes != 1 else ''} x {a.slurm.gpus_per_node} GPUs, {batch} sequences "
        f"({human_count(batch * spec.shape.max_seq_len)} tokens) a step",
        f"GPU: {gpu.gpu.name}, {fit.gib(gpu.gpu.memory_bytes)} ({gpu.origin})"
        + (f"; {gpu.gpu.note}" if gpu.gpu.note else ""),
    ]
    if fixed:
        lines.append("Kept as you typed: " + " ".join(f"--{k} {v}" for k, v in fixed.items()))
    current = fit.layout_of(spec)
    mine = next((i for i, p in enumerate(plans) if _same(p.layout, current)), None)
    shown = fitting[:ROWS] or plans[: ROWS // 2]
    rows = [HEADER] + [_row(str(i + 1), p, "<- yours" if i == mine else "") for i, p in enumerate(shown)]
    if mine is not None and mine >= len(shown):
        rows.append(_row(str(mine + 1), plans[mine], "<- yours"))
    lines += _table(rows)
    lines.append(f"{len(fitting)} of {len(plans)} layouts nanotron accepts fit; '(no)': estimated not to fit.")
    if fitting:
        best = fitting[0]
        lay = best.layout
        lines.append(
            f"Best: tp {lay.tp} x pp {lay.pp} x dp {lay.dp}, micro batch {lay.micro_batch}, accumulation "
            f"{lay.grad_accum}, ZeRO-{lay.zero_stage}: {planner.why(best, plans)}."
        )
        flags = " ".join(f"--{k} {v}" for k, v in best.flags().items())
        lines.append(f"Launch it with --layout auto, or: {flags}")
    else:
        lines.append("None fits: add nodes (--nodes), or a smaller --micro_batch_size or --max_seq_len.")
    lines.append(
        f"Estimates (docs/planning.md): memory from nanotron 0.4's code; time at {planner.EFFICIENCY:.0%} of peak "
        f"FLOP/s ({gpu.gpu.tflops:g} TFLOP/s), {gpu.gpu.nvlink_gbps:g} GB/s in a node, {planner.NIC_GBPS:g} GB/s "
        "per NIC between nodes. Nothing was written or submitted."
    )
    return "\n".join(lines)


def _same(a: object, b: object) -> bool:
    keys = ("dp", "tp", "pp", "micro_batch", "grad_accum", "zero_stage", "pp_engine", "tp_mode")
    return all(getattr(a, k) == getattr(b, k) for k in keys)
