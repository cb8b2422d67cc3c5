"""A GPU session in one call (docs/nanotron-gpu.md): nanotron's own trainer, 0.4 and main, on configs the launcher
writes, beside the torch engine, under torchrun's c10d rendezvous on one GPU; its checkpoint, stop and resume;
and the memory model against measured peaks. Not a test: it prints and keeps what it saw.

    python bench/gpu_session.py --out DIR --main-src /tmp/nanotron-main/src --deadline 480
    python bench/gpu_session.py --out DIR --rehearse        # on a CPU: every step, tiny shapes, the torch engine

Three parts, each run as the node step runs the job (`torchrun --rdzv_backend c10d ... --engine E`):

1. throughput, one run at a time: tiny (seq 1024, a local dataset) and 1b (seq 4096, random tokens), 40 steps,
   micro batch 2: nanotron 0.4 and the torch engine, and on the 1b nanotron 0.4 with --compile_layers and
   nanotron main; tokens/s, MFU (two FLOP
   conventions: bench_nanotron.py), peak memory, the final checkpoint's size;
2. stop and resume, per dialect (tiny, local data): a straight run of 60 steps, and a run of 30 (saving at 20 and
   30), resumed, stopped by the stop file once step 40 is logged, resumed again to 60: the LR the optimizer used at
   every step against the schedule's, the loss against the straight run's;
3. memory: more layouts (sizes, sequence lengths, micro batches, accumulation), 6 steps and no save each, for
   nanotron 0.4 and the torch engine, several at once where the launcher's estimates fit the card together
   (each process's own `max_memory_allocated` is unaffected by the others): measured beside the estimate.

Parts 2 and 3 run side by side after part 1 (their timings are not reported). Nothing is left out silently: a run
that fails is reported with its log's tail, one past the deadline is reported as skipped. The report
(report.txt) is rewritten after every run; logs.tgz holds every log, metrics file and config.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import bench_nanotron as bn  # noqa: E402

GIB = 2**30
THROUGHPUT = (  # case, micro batch, engines (nanotron-main: nanotron main's trainer, on a config in its dialect;
    # nanotron-compiled: 0.4's with --compile_layers)
    ("tiny:1024:local", 2, ("nanotron", "torch")),
    ("1b:4096:random", 2, ("nanotron", "nanotron-compiled", "torch", "nanotron-main")),
)
MEMORY = (  # case, micro batch, accumulation: measured for nanotron 0.4 and the torch engine
    ("small:1024:random", 8, 1),  # MHA (12 kv heads of 12), tied
    ("base:2048:random", 4, 1),
    ("1b:2048:random", 4, 1),
    ("1b:8192:random", 1, 1),
    ("1b:4096:random", 2, 2),
    ("3b:4096:random", 1, 1),
)
STEPS, WARMUP = 40, 10


@dataclass
class Session:
    out: Path
    work: Path
    deadline: float  # time.monotonic() by which every run has ended
    main_src: str | None
    rehearse: bool
    only: tuple[str, ...] = ()  # part 1's runs whose label holds one of these (all where empty)
    memory_cases: tuple[str, ...] = ()  # part 3's cases that hold one of these (all where empty)
    peak: float | None = None
    lines: list[str] = field(default_factory=list)
    memory_rows: list[tuple] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)
            print(line, flush=True)
            (self.out / "report.txt").write_text("\n".join(self.lines) + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def case(self, case: str) -> str:
        """The case as run: on a rehearsal, every preset is tiny at sequence 128 (a CPU trains it in seconds)."""
        return "tiny:128:" + case.split(":")[2] if self.rehearse else case

    def config(self, case: str, steps: int, mb: int, work: Path, **kw) -> Path:  # type: ignore[no-untyped-def]
        return bn.write_config(self.case(case), steps, mb, work, **kw)

    def run(self, engine: str, config: Path, label: str, **kw) -> dict | None:  # type: ignore[no-untyped-def]
        """One job; None (reported) where it failed or there is no time left for it."""
        if self.left() < 30:
            self.say(f"  {label}: skipped, out of time")
            return None
        pythonpath = self.main_src if engine == "nanotron-main" else None
        real = "torch" if self.rehearse else engine.split("-")[0]
        try:
            return bn.run_engine(real, config, self.work, label, pythonpath=pythonpath, timeout=self.left() - 10,
                                 compile_layers=engine == "nanotron-compiled", **kw)  # fmt: skip
        except bn.RunFailed as e:
            log = self.work / f"{label}.log"
            tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
            self.say(f"  {label}: FAILED: {e}\n" + "\n".join("    | " + t for t in tail))
            return None


def throughput(s: Session) -> None:
    s.say(f"\n## 1. Throughput: {STEPS} steps, figures after step {WARMUP}, one run at a time (c10d rendezvous)")
    s.say(f"{'run':<40}{'tokens/s':>12}{'MFU':>9}{'causal':>9}{'alloc':>9}{'reserv':>9}  loss      ckpt GiB  wall s")
    for case, mb, engines in THROUGHPUT:
        for engine in engines:
            dialect = "main" if engine == "nanotron-main" else "0.4"
            config = s.config(case, STEPS, mb, s.work / "throughput", dialect=dialect)
            label = f"{case.replace(':', '-')}-{engine}"
            if s.only and not any(o in label for o in s.only):
                continue
            result = s.run(engine, config, label)
            if result is None:
                continue
            cfg = yaml.safe_load(config.read_text())
            line = summarize(label, result, cfg, s.peak)
            s.say(f"{line}  {result.get('checkpoint_bytes', 0) / GIB:>8.2f}  {result['wall']:>6.0f}")
            record_memory(s, label, engine, config, result)


def summarize(label: str, result: dict, cfg: dict, peak: float | None) -> str:
    if peak is not None:
        return bn.summarize(label, result, cfg, WARMUP, peak)
    m = result["metrics"]
    return f"{label:<40}{'(rehearsal: no GPU figures)':>56}  {m[1]['loss']:.3f} -> {m[max(m)]['loss']:.3f}"


def record_memory(s: Session, label: str, engine: str, config: Path, result: dict) -> None:
    est = json.loads(config.with_suffix(".estimate.json").read_text())
    with s.lock:
        s.memory_rows.append((label, engine, est, result.get("allocated", 0), result.get("reserved", 0)))


def resume_chain(s: Session, dialect: str, configs: dict[str, Path]) -> None:
    """Part 2 for one dialect (its configs written beforehand, in the main thread); what goes wrong is reported."""
    try:
        _resume_chain(s, dialect, configs)
    except Exception:  # noqa: BLE001  # a bench: say it and go on with the other parts
        import traceback

        s.say(f"\n## 2. Stop and resume, nanotron {dialect}: the bench failed:\n{traceback.format_exc()[-3000:]}")


def _resume_chain(s: Session, dialect: str, configs: dict[str, Path]) -> None:
    engine = "nanotron-main" if dialect == "main" else "nanotron"
    work = configs["straight"].parent
    a, b = work / "a.bundle", work / "b.bundle"  # the two jobs' bundles (LAUNCHER_BUNDLE)
    stop, outcome = b / "stop-requested", b / "outcome"
    for f in (a / "metrics.jsonl", b / "metrics.jsonl", stop, outcome):
        f.unlink(missing_ok=True)
    env: dict[str, str] = {}
    tag = f"resume-{dialect}"
    if s.run(engine, configs["straight"], f"{tag}-straight", bundle=a, env=env, keep=True) is None:
        return
    if s.run(engine, configs["first"], f"{tag}-first", bundle=b, env=env, keep=True) is None:
        return
    ckpt_b = Path(yaml.safe_load(configs["first"].read_text())["checkpoints"]["checkpoints_path"])
    saved_after_30 = sorted(p.name for p in ckpt_b.iterdir())

    def stop_at_40() -> None:  # as the batch script makes one on Slurm's warning
        while s.left() > 0 and '"step": 40,' not in _read(b / "metrics.jsonl"):
            time.sleep(0.05)
        stop.touch()

    watcher = threading.Thread(target=stop_at_40, daemon=True)
    watcher.start()
    stopped = s.run(
        engine,
        configs["rest"],
        f"{tag}-stopped",
        bundle=b,
        keep=True,
        env={**env, "LAUNCHER_STOP_FILE_EVERY_S": "0.01"},
    )
    watcher.join(timeout=1)
    after_stop = (outcome.read_text().strip() if outcome.exists() else "?", _read(ckpt_b / "latest.txt"))
    if stopped is None or s.run(engine, configs["rest"], f"{tag}-rest", bundle=b, env=env, keep=True) is None:
        return
    final = outcome.read_text().strip() if outcome.exists() else "?"
    judge_resume(
        s,
        dialect,
        a / "metrics.jsonl",
        b / "metrics.jsonl",
        configs["rest"],
        saved_after_30,
        after_stop,
        final,
        s.work / f"{tag}-stopped.log",
    )


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else "(none)"


def judge_resume(s, dialect, a_file, b_file, rest, saved_after_30, after_stop, final, stopped_log):  # type: ignore[no-untyped-def]
    from launcher.train.schedule import lr_at
    from launcher.train.settings import load_train_config

    a, b = ({m["step"]: m for m in map(json.loads, f.read_text().splitlines())} for f in (a_file, b_file))
    schedule = load_train_config(str(rest)).lr
    steps_ok = sorted(a) == sorted(b) == list(range(1, 61))
    lr_ok = all(abs(m["lr"] - lr_at(k, schedule)) <= 1e-12 for run in (a, b) for k, m in run.items())
    worst = max(abs(a[k]["loss"] - b[k]["loss"]) for k in a.keys() & b.keys())
    resumed = [line for line in stopped_log.read_text().splitlines() if "resum" in line.lower()]
    s.say(f"\n## 2. Stop and resume, nanotron {dialect} (tiny, seq 1024, local data; saves every 20)")
    s.say(f"  after 30 steps the checkpoints are {saved_after_30}")
    s.say(f"  the stopped run: {resumed[-1] if resumed else '(no resume line)'}; outcome {after_stop[0]!r}, "
          f"latest.txt {after_stop[1]!r}")  # fmt: skip
    s.say(f"  resumed again: outcome {final!r}")
    s.say(f"  steps 1..60 logged once each in both runs: {'yes' if steps_ok else 'NO: ' + str(sorted(b))}")
    s.say(f"  the LR the optimizer used, every step, equals the launcher's schedule: {'yes' if lr_ok else 'NO'}")
    s.say(f"  largest loss difference, straight vs stopped and resumed: {worst:.2e}")
    shown = [k for k in (1, 30, 31, 41, 60) if k in a and k in b]
    s.say("  loss (straight/resumed) at 1, 30, 31, 41, 60: "
          + ", ".join(f"{k}: {a[k]['loss']:.4f}/{b[k]['loss']:.4f}" for k in shown))  # fmt: skip


def resume_configs(s: Session, dialect: str) -> dict[str, Path]:
    work = s.work / f"resume-{dialect}"
    configs = {}
    for name, steps, ckpt in (("straight", 60, "a"), ("first", 30, "b"), ("rest", 60, "b")):
        path = s.config("tiny:1024:local", steps, 2, work / name, save_interval=20, dialect=dialect)
        config = yaml.safe_load(path.read_text())
        config["checkpoints"]["checkpoints_path"] = str(work / ckpt)
        lr = config["optimizer"].get("learning_rate_scheduler") or config["optimizer"]
        lr["lr_decay_steps"] = 50  # one schedule for the runs of 30 and of 60 steps
        configs[name] = work / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump(config, sort_keys=False))
    return configs


class GpuMemory:
    """Runs start while the estimates of those running add up to at most `cap` bytes (one always may), `most` at
    a time."""

    def __init__(self, cap: float, most: int) -> None:
        self.cap, self.most, self.used, self.running, self.cond = cap, most, 0.0, 0, threading.Condition()

    def hold(self, need: float):  # type: ignore[no-untyped-def]
        gate = self

        class Held:
            def __enter__(self) -> None:
                with gate.cond:
                    gate.cond.wait_for(
                        lambda: gate.running == 0 or (gate.used + need <= gate.cap and gate.running < gate.most)
                    )
                    gate.used += need
                    gate.running += 1

            def __exit__(self, *exc: object) -> None:
                with gate.cond:
                    gate.used -= need
                    gate.running -= 1
                    gate.cond.notify_all()

        return Held()


def memory(s: Session, card: float) -> None:
    gate = GpuMemory(0.9 * card, 1 if s.rehearse else 4)
    jobs = []
    for case, mb, ga in MEMORY:
        if s.memory_cases and not any(m in case for m in s.memory_cases):
            continue
        config = s.config(case, 6, mb, s.work / "memory", grad_accum=ga, warmup=2)
        est = json.loads(config.with_suffix(".estimate.json").read_text())
        label = f"{case.replace(':', '-')}-mb{mb}-ga{ga}"
        if est["total"] > 0.95 * card:
            s.say(f"  {label}: not run, the estimate ({est['total'] / GIB:.1f} GiB) exceeds this card")
            continue
        for engine in ("nanotron", "torch"):
            jobs.append((est["total"] * 1.2 + 2 * GIB, f"{label}-{engine}", engine, config))
    threads = []
    for need, label, engine, config in sorted(jobs, key=lambda j: -j[0]):

        def one(need=need, label=label, engine=engine, config=config) -> None:  # type: ignore[no-untyped-def]
            with gate.hold(need):
                result = s.run(engine, config, label, save=False)
            if result is not None:
                record_memory(s, label, engine, config, result)

        threads.append(threading.Thread(target=one))
        threads[-1].start()
        time.sleep(1)  # largest first, in order
    for t in threads:
        t.join()


def memory_table(s: Session) -> None:
    s.say("\n## 3. Peak memory per process: measured (torch.cuda.max_memory_*) beside the launcher's estimate")
    s.say("   estimate: the allocator's peak (`peak`, to compare with allocated) and with headroom (`total`, the fit "
          "check's figure, to compare with reserved)")  # fmt: skip
    s.say(f"{'run':<40}{'est peak':>10}{'alloc':>9}{'diff':>8}{'est total':>11}{'reserved':>10}{'diff':>8}  parts")
    for label, _, est, alloc, reserved in sorted(s.memory_rows):
        d1 = f"{100 * (alloc - est['peak']) / est['peak']:+.0f}%" if alloc else "-"
        d2 = f"{100 * (reserved - est['total']) / est['total']:+.0f}%" if reserved else "-"
        parts = " ".join(f"{k[:4]} {v / GIB:.1f}" for k, v in est["parts"].items())
        s.say(f"{label:<40}{est['peak'] / GIB:>10.2f}{alloc / GIB:>9.2f}{d1:>8}{est['total'] / GIB:>11.2f}"
              f"{reserved / GIB:>10.2f}{d2:>8}  {parts}")  # fmt: skip


def environment(s: Session) -> float:
    """The versions and the card; returns the card's memory in bytes."""
    probe = ("import json, torch, nanotron; from launcher.train.main import choose_engine\n"
             "from launcher.train.nanotron_engine import engine as e\n"
             "cuda = torch.cuda.is_available()\n"
             "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'nccl': "
             "'.'.join(map(str, torch.cuda.nccl.version())) if cuda else None, 'gpu': torch.cuda.get_device_name() if "
             "cuda else None, 'memory': torch.cuda.mem_get_info()[1] if cuda else 0, 'nanotron': nanotron.__version__, "
             "'where': nanotron.__file__, 'attention': e.attention_note()}))")  # fmt: skip
    found = {}
    for name, extra in (("0.4", None), ("main", s.main_src)):
        env = {**os.environ, "PYTHONPATH": ":".join(p for p in (extra, str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            s.say(f"nanotron {name}: the probe failed:\n{done.stderr[-2000:]}")
            continue
        found[name] = json.loads(done.stdout.splitlines()[-1])
        s.say(f"nanotron {name}: {found[name]}")
    card = next((f["memory"] for f in found.values() if f.get("memory")), 0)
    return float(card or 64 * GIB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="report.txt and logs.tgz go here")
    parser.add_argument("--work", type=Path, default=None, help="configs, data, checkpoints (default: under /tmp)")
    parser.add_argument("--main-src", default=None, help="nanotron main's src/ (its trainer runs from there)")
    parser.add_argument("--deadline", type=float, default=480, help="seconds: no run goes on past it")
    parser.add_argument("--rehearse", action="store_true", help="on a CPU: tiny shapes, the torch engine for all")
    parser.add_argument("--parts", default="123", help="which parts to run (1, 2, 3)")
    parser.add_argument("--only", nargs="*", default=[], help="part 1: only the runs whose label holds one of these")
    parser.add_argument("--memory", nargs="*", default=[], help="part 3: only the cases that hold one of these")
    args = parser.parse_args()
    work = args.work or Path("/tmp/gpu-session")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    s = Session(args.out, work, time.monotonic() + args.deadline, args.main_src, args.rehearse, tuple(args.only),
                tuple(args.memory))  # fmt: skip
    s.say(f"# GPU session {time.strftime('%Y-%m-%d %H:%M:%S')}{' (REHEARSAL on CPU)' if args.rehearse else ''}")
    card = environment(s)
    if not args.rehearse:
        import torch

        from launcher.train.metrics import peak_flops

        s.peak = peak_flops(torch.device("cuda")) if torch.cuda.is_available() else None
    try:
        if "1" in args.parts:
            throughput(s)
            pack(s)
        chains = []
        if "2" in args.parts:
            dialects = ("0.4", "main") if args.main_src else ("0.4",)
            configs = {d: resume_configs(s, d) for d in dialects}
            chains = [threading.Thread(target=resume_chain, args=(s, d, configs[d])) for d in dialects]
            for t in chains:
                t.start()
        if "3" in args.parts:
            memory(s, card)
        for t in chains:
            t.join()
        memory_table(s)
    finally:
        pack(s)


def pack(s: Session) -> None:
    """logs.tgz: every log, metrics and estimate file and config (no checkpoints, no data)."""
    with tarfile.open(s.out / "logs.tgz", "w:gz") as tar:
        for path in sorted(s.work.rglob("*")):
            kept = path.suffix in (".log", ".jsonl", ".json", ".yaml") and not {"checkpoints", "demo"} & set(path.parts)
            if kept and path.is_file() and path.stat().st_size < 20 * 2**20:
                tar.add(path, arcname=str(path.relative_to(s.work)))


if __name__ == "__main__":
    main()
