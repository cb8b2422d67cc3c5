"""Every layout the launcher can write on 2 x 4 slots, for both nanotron dialects, trained by nanotron's own trainer
with several ranks on CPU (gloo, the test-side patches of tests/cpu_nanotron/) against the one-process run from the
same weights; one table: matches, or refused before the queue with the reason. No cell may train wrong.

    python bench/bench_layouts.py --out DIR [--dialects 0.4 main] [--only dp2-tp2-pp2]

Cells: dp, tp, pp in {1, 2}; ZeRO 0 and 1 (where dp > 1); with tp > 1, REDUCE_SCATTER with asynchronous
communication and without (asked through a --config, as a user's YAML would), and ALL_REDUCE; with pp > 1, the
1f1b and afab engines. Each: 5 steps of a tiny Llama (hidden 64, 2 layers, GQA 4/2) on the demo data, global
batch 8, bf16 with fp32 accumulation (the launcher's defaults). "matches": every step's loss within 1e-3 and its
grad norm within 1% of the reference's. Not a test (about 20 minutes on 2 cores); CI runs the 8-rank cell and the
bug cells (tests/test_nanotron_multirank.py). The table goes in docs/engines.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import cpu_nanotron as cpu  # noqa: E402

TOLERANCE = 1e-3


def cells() -> list[tuple[str, int, int, int, tuple[str, ...], bool | None]]:
    """(label, dp, tp, pp, flags, asynchronous asked by --config or None)."""
    out = []
    for dp, tp, pp in itertools.product((1, 2), repeat=3):
        for zero in (0, 1) if dp > 1 else (0,):
            modes = [("rs-async", (), True), ("rs-sync", (), False), ("ar", ("--tp_mode", "ALL_REDUCE"), None)]
            for (mode, mode_flags, asked), engine in itertools.product(
                modes if tp > 1 else [("", (), None)], ("1f1b", "afab") if pp > 1 else ("",)
            ):
                flags = (*mode_flags, "--zero_stage", str(zero)) + (("--pp_engine", engine) if engine else ())
                label = "-".join(x for x in (f"dp{dp}-tp{tp}-pp{pp}", f"zero{zero}", mode, engine) if x)
                out.append((label, dp, tp, pp, flags, asked))
    return out


def run_cell(where: Path, demo: SimpleNamespace, dialect: str, cell: tuple, init: Path, ref: dict) -> str:
    label, dp, tp, pp, flags, asked = cell
    if asked is not None:  # a user's YAML that asks for (a)synchronous TP communication
        user = where / f"{label}-user.yaml"
        user.write_text(f"parallelism:\n  tp_linear_async_communication: {str(asked).lower()}\n")
        flags = (*flags, "--config", str(user))
    spec, problems = cpu.layout_spec(where, demo, dialect, dp, tp, pp, *flags)
    if problems:
        return f"refused before the queue: {problems[0].message} (fix: {problems[0].fix})"
    note = " (written sync: 0.4's async backward is wrong)" if "tp_linear_async_communication" in spec.adapted else ""
    config = cpu.written_config(spec, where, label, **{"model.init_method": {"path": str(init)}})
    bundle, log = config.with_suffix(".bundle"), config.with_suffix(".log")  # (LAUNCHER_BUNDLE: its metrics.jsonl)
    metrics = bundle / "metrics.jsonl"
    bundle.mkdir(exist_ok=True)
    metrics.unlink(missing_ok=True)
    done = cpu.torchrun(config, dp * tp * pp, log, main=dialect == "main", env={"LAUNCHER_BUNDLE": str(bundle)})
    if done.returncode != 0:
        errors = [line for line in log.read_text().splitlines() if "Error" in line and "ChildFailed" not in line]
        return f"FAILS: {errors[-1].strip()[:160] if errors else 'exit ' + str(done.returncode)}"
    import json

    run = {m["step"]: m for m in map(json.loads, metrics.read_text().splitlines())}
    worst = max(abs(run[s]["loss"] - ref[s]["loss"]) for s in ref if s in run)
    norms = max(abs(run[s]["grad_norm"] / ref[s]["grad_norm"] - 1) for s in ref if s in run)
    if sorted(run) != sorted(ref) or worst > TOLERANCE or norms > 0.01:
        return f"TRAINS WRONG: loss off by {worst:.1e}, grad norm by {100 * norms:.1f}%"
    return f"matches (loss within {worst:.0e}){note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="configs, logs and table.md go here")
    parser.add_argument("--dialects", nargs="+", default=["0.4", "main"], choices=["0.4", "main"])
    parser.add_argument("--only", nargs="*", default=[], help="cells whose label holds one of these")
    args = parser.parse_args()
    from launcher.localcluster.demo_data import make_demo

    args.out.mkdir(parents=True, exist_ok=True)
    dataset, tokenizer = make_demo(args.out / "demo", num_docs=150, seed=0)
    demo = SimpleNamespace(dataset=dataset, tokenizer=tokenizer)
    chosen = [c for c in cells() if not args.only or any(o in c[0] for o in args.only)]
    results: dict[str, dict[str, str]] = {c[0]: {} for c in chosen}
    started = time.monotonic()
    for dialect in args.dialects:
        where = args.out / dialect
        where.mkdir(exist_ok=True)
        initial = {"checkpoints.save_initial_state": True}
        one = cpu.launcher_config(where, "reference", demo, dialect, 1, 1, 1, **initial)
        ref = cpu.train(one, 1, dialect)
        for cell in chosen:
            results[cell[0]][dialect] = run_cell(where, demo, dialect, cell, where / "ckpt" / "reference" / "0", ref)
            print(f"{cell[0]:<32} {dialect:<5} {results[cell[0]][dialect]}", flush=True)
    lines = ["| cell | " + " | ".join(f"nanotron {d}" for d in args.dialects) + " |",
             "| --- |" + " --- |" * len(args.dialects)]  # fmt: skip
    lines += [f"| {label} | " + " | ".join(r[d] for d in args.dialects) + " |" for label, r in results.items()]
    lines.append(f"\n{len(chosen)} cells x {len(args.dialects)} dialects in {time.monotonic() - started:.0f} s")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
