"""Data ahead of training (issue 36, docs/data.md): tokenization throughput, and the time from a job's start to
its first step with a Nanoset vs the same text tokenized at start (not a test).

    python bench/bench_nanoset.py --work /tmp/bench-nanoset [--gb 1.0] [--budget-min 35] [--out bench/results/X.md]

1. A corpus of synthetic text (`--gb`, made here in seconds: the demo's templated sentences, which the demo's
   word-level tokenizer reads whole; 10000 documents drawn at random) as 8 .jsonl files, and 10 and 50 MB ones.
2. `python -m launcher.data tokenize` of the whole corpus (2 tasks): on this machine (LocalPipelineExecutor, 2
   workers) and as a Slurm array job on a local cluster of 2 nodes (`launcher.localcluster up --nodes 2`;
   datatrove's SlurmPipelineExecutor); MB of text and tokens per second, the files compared.
3. Start-up: `torchrun run_train.py` (one process, as the node step starts it) with each engine, on the same text
   tokenized at start (a save_to_disk folder: 10 MB and 50 MB) and as a Nanoset (10 MB and the whole
   corpus): the time from the process's start to its first logged step, on a first attempt (3 steps) and on a second
   one that resumes from the first's checkpoint (a requeue or a restart in the allocation: a new process, the same
   checkpoints, the tokenized-at-start path's pack cache there). The nanotron engine runs nanotron main's trainer on
   CPU with the test-side patches (tests/cpu_nanotron), as the tests run it.
4. `--parts larger --larger-mb N`: the same start-up on N MB of the corpus tokenized at start (1040: all of it).
5. `--parts restart`: a failure to the next step through a restart in the allocation, each engine on 50 MB
   tokenized at start and on the whole corpus's Nanoset (bench_goodput.py's run and measure, on a local cluster of
   2 nodes: the job's node and a spare); `--restart-mb N`: the text of `larger`'s N MB instead of 50 MB, `--kinds`
   to run one kind only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]
FILES = 8
MB = 1e6


class Bench:
    def __init__(self, work: Path, out: Path, budget_s: float) -> None:
        self.work, self.out, self.deadline = work, out, time.monotonic() + budget_s
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)
        self.out.write_text("\n".join(self.lines) + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def corpus(work: Path, gb: float) -> tuple[Path, Path, Path]:
    """`work/corpus/part-NN.jsonl` (`gb` in all), `work/small/part-00.jsonl` (10 MB), the demo tokenizer."""
    from launcher.localcluster.demo_data import make_texts, make_tokenizer, sentence

    rng = random.Random(0)
    pool = [sentence(rng) for _ in range(5000)]
    tokenizer = work / "tokenizer"
    if not tokenizer.exists():
        make_tokenizer(tokenizer, make_texts(2000, 0))

    # 10000 distinct documents (~2.5 KB each), drawn at random into each file: fast at any size
    docs = [json.dumps({"text": " ".join(rng.choices(pool, k=rng.randint(10, 60)))}) + "\n" for _ in range(10000)]

    def write(path: Path, size: float) -> None:
        if path.exists() and path.stat().st_size >= size:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with open(path.with_suffix(".tmp"), "w") as f:
            while written < size:
                chunk = "".join(rng.choices(docs, k=4000))
                f.write(chunk)
                written += len(chunk)
        path.with_suffix(".tmp").rename(path)

    for n in range(FILES):
        write(work / "corpus" / f"part-{n:02d}.jsonl", gb * 1e9 / FILES)
    write(work / "small" / "part-00.jsonl", 10 * MB)
    write(work / "medium" / "part-00.jsonl", 50 * MB)
    return work / "corpus", work / "small", tokenizer


def text_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.jsonl"))


def tokenize(args: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    started = time.monotonic()
    with open(log, "a") as out:
        done = subprocess.run([sys.executable, "-m", "launcher.data", "tokenize", *args], stdout=out,
                              stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"tokenize failed: {log}")
    return time.monotonic() - started


def throughput(b: Bench, corpus_dir: Path, tokenizer: Path) -> Path:
    from launcher.nanotron_config import nanoset

    size = text_bytes(corpus_dir)
    b.say(f"\n## Tokenization of {size / 1e9:.2f} GB of text ({FILES} .jsonl files, 2 datatrove tasks)\n")
    b.say("| where | wall s | MB of text/s | M tokens/s | load (1, 5, 15 min) |\n|---|---|---|---|---|")
    common = ["--dataset", str(corpus_dir), "--tokenizer", str(tokenizer), "--tasks", "2"]
    local = b.work / "tok-local"
    if not (local / "tokenize" / "record.json").exists() or nanoset.inspect(local)[0] is None:
        shutil.rmtree(local, ignore_errors=True)
        wall = tokenize([*common, "--output", str(local), "--workers", "2"], b.work / "tok-local.log")
        folder = nanoset.inspect(local)[0]
        assert folder is not None
        b.say(f"| this machine (LocalPipelineExecutor, 2 workers) | {wall:.0f} | {size / MB / wall:.1f} | "
              f"{folder.tokens / 1e6 / wall:.2f} | {load()} |")  # fmt: skip
    folder = nanoset.inspect(local)[0]
    assert folder is not None
    b.say(f"\n{folder.tokens / 1e6:.0f}M tokens in {folder.documents} documents, {len(folder.files)} files of "
          f"{folder.token_size}-byte tokens")  # fmt: skip
    return local


def on_slurm(b: Bench, corpus_dir: Path, tokenizer: Path, local: Path) -> None:
    from launcher import localcluster
    from launcher.nanotron_config import nanoset

    size, folder = text_bytes(corpus_dir), nanoset.inspect(local)[0]
    assert folder is not None
    common = ["--dataset", str(corpus_dir), "--tokenizer", str(tokenizer), "--tasks", "2"]
    if b.left() < 600:
        b.say("\nthe Slurm tokenization: skipped, out of time")
        return

    spec = localcluster.ClusterSpec(b.work / "cluster", nodes=2, gpus_per_node=2)
    env = localcluster.up(spec)
    try:
        on_slurm = b.work / "tok-slurm"
        shutil.rmtree(on_slurm, ignore_errors=True)
        wall = tokenize([*common, "--output", str(on_slurm), "--slurm", "--partition", "debug", "--time_limit",
                         "40:00", "--show_logs"], b.work / "tok-slurm.log", env)  # fmt: skip
        logs = on_slurm / "tokenize" / "logs"
        first = (logs / "executor.pik").stat().st_mtime  # written just before sbatch
        last = max(p.stat().st_mtime for p in (logs / "completions").iterdir())
        same = all((on_slurm / f.path.name).read_bytes() == f.path.read_bytes() for f in folder.files)
        b.say(f"\n| where | wall s | MB of text/s | M tokens/s | load (1, 5, 15 min) |\n|---|---|---|---|---|\n"
              f"| a Slurm array job, 2 nodes (SlurmPipelineExecutor) | {wall:.0f} (submit to end {last - first:.0f}) | "
              f"{size / MB / wall:.1f} | {folder.tokens / 1e6 / wall:.2f} | {load()} |")  # fmt: skip
        b.say(f"\nthe Slurm job's token files are the local run's, byte for byte: {same}")
    finally:
        localcluster.down(spec)


def on_disk(jsonl: Path, where: Path) -> Path:
    """A .jsonl file as a save_to_disk folder (what the job tokenizes at start)."""
    if not (where / "dataset_info.json").exists():
        from datasets import load_dataset

        load_dataset("json", data_files=str(jsonl), split="train").save_to_disk(str(where))
    return where


def config(work: Path, engine: str, steps: int, flags: tuple[str, ...]) -> Path:
    import bench_nanotron as bn

    return bn.write_config("tiny:128:data", steps, 4, work, dialect="main", warmup=1, data_flags=flags)


def start(engine: str, cfg: Path, log: Path, metrics: Path, timeout: float) -> tuple[float, int, float]:
    """One torchrun process of `engine` on `cfg`: (seconds from its start to its first logged step, that step,
    wall seconds)."""
    from cpu_nanotron import environment

    metrics.unlink(missing_ok=True)  # (`metrics`: <bundle>/metrics.jsonl, the job's bundle LAUNCHER_BUNDLE names)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **environment(main=engine == "nanotron"), "LAUNCHER_BUNDLE": str(metrics.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
               str(ROOT / "run_train.py"), "--config-file", str(cfg), "--engine", engine]  # fmt: skip
    started_at, started = time.time(), time.monotonic()
    with open(log, "a") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{log} (exit {done.returncode})")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    first = min(rows, key=lambda r: r["step"])
    return first["time"] - started_at, first["step"], time.monotonic() - started


def startup(b: Bench, sources: list[tuple[str, str, Path]], tokenizer: Path, engines: list[str]) -> None:
    b.say("\n## From the job's start to its first step (one process, tiny model, sequence 128)\n")
    b.say("| engine | data | size | 1st attempt: s to step 1 | 2nd attempt (resumes): s to its first step | "
          "load |\n|---|---|---|---|---|---|")  # fmt: skip
    for engine in engines:
        for kind, size, data in sources:
            label = f"{engine}-{kind}-{size}".replace(" ", "_")
            work = b.work / "runs" / label
            shutil.rmtree(work, ignore_errors=True)
            if b.left() < 240:
                b.say(f"| {engine} | {kind} | {size} | skipped, out of time | | |")
                continue
            flags = ("--dataset", str(data), "--tokenizer", str(tokenizer))
            try:
                one = start(
                    engine,
                    config(work, engine, 3, flags),
                    work / "run.log",
                    work / "1.bundle" / "metrics.jsonl",
                    b.left(),
                )
                two = start(
                    engine,
                    config(work, engine, 5, flags),
                    work / "run.log",
                    work / "2.bundle" / "metrics.jsonl",
                    b.left(),
                )
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                b.say(f"| {engine} | {kind} | {size} | FAILED: {e} | | |")
                continue
            b.say(f"| {engine} | {kind} | {size} | {one[0]:.1f} | {two[0]:.1f} (step {two[1]}) | {load()} |")
            shutil.rmtree(work / "checkpoints", ignore_errors=True)


def restart(b: Bench, sources: list[tuple[str, str, Path]], tokenizer: Path, engines: list[str]) -> None:
    """A failure to the next step through a restart in the allocation (bench_goodput.py's run: 1 node x 2
    processes and a spare, rank 1 SIGKILLed once step 25 is logged and step 20 saved), for each engine and data."""
    import bench_goodput as bg
    from cpu_nanotron import python

    from launcher import localcluster

    b.say("\n## A failure to the next step: a restart in the allocation (1 node x 2 processes, a spare node)\n")
    b.say("| engine | data | size | failure → next step (s) | resumed at step | load at the kill |\n"
          "|---|---|---|---|---|---|")  # fmt: skip
    spec = localcluster.ClusterSpec(b.work / "cluster-restart", nodes=2, gpus_per_node=2)
    env = {**os.environ, **localcluster.up(spec)}
    try:
        for engine in engines:
            for kind, size, data in sources:
                label = f"restart-{engine}-{kind}-{size}".replace(" ", "_").replace(".", "_")
                if b.left() < 300:
                    b.say(f"| {engine} | {kind} | {size} | skipped, out of time | | |")
                    continue
                flags = ["--nanotron_dialect", "main", "--max_seq_len", "128", "--micro_batch_size", "4",
                         "--engine", engine]  # fmt: skip
                if engine == "nanotron":  # nanotron main's trainer on CPU, as tests/test_nanotron_slurm.py runs it
                    flags += ["--python", str(python(b.work, main=True)), "--cpus_per_node", "2"]
                try:
                    run = bg.one_run("restart", 0, b.work, env, (data, tokenizer), *flags, name=label)
                except (TimeoutError, RuntimeError) as e:
                    b.say(f"| {engine} | {kind} | {size} | FAILED: {e} | | |")
                    continue
                b.say(f"| {engine} | {kind} | {size} | {run.to_next_step:.1f} | {run.resumed_at} | {run.load:.1f} |")
                shutil.rmtree(b.work / "checkpoints" / label, ignore_errors=True)
    finally:
        localcluster.down(spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--gb", type=float, default=1.0)
    p.add_argument("--budget-min", type=float, default=35)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--engines", nargs="+", default=["torch", "nanotron"])
    p.add_argument(
        "--parts",
        nargs="+",
        default=["tokenize", "startup"],
        help="or `larger` (with --larger-mb), `restart` (makes the login node's folder first, as `tokenize` does)",
    )
    p.add_argument("--kinds", nargs="+", default=["start", "Nanoset"], help="start-up's data: start, Nanoset")
    p.add_argument("--larger-mb", type=int, default=200, help="`larger`: the start-up tokenized at start of N MB")
    p.add_argument("--restart-mb", type=int, default=0, help="`restart`: text tokenized at start of `larger`'s N MB")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    out = a.out or a.work / "report.md"
    b = Bench(a.work, out, a.budget_min * 60)
    b.say(f"# bench_nanoset {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {os.cpu_count()} cores, load "
          f"{load()} at the start")  # fmt: skip
    made = time.monotonic()
    corpus_dir, small, tokenizer = corpus(a.work, a.gb)
    b.say(f"\nthe corpus: {text_bytes(corpus_dir) / 1e9:.2f} GB of text, made in {time.monotonic() - made:.0f} s")
    made_here = {"tokenize", "restart"} & set(a.parts)  # the login node's folder of the whole corpus
    local = throughput(b, corpus_dir, tokenizer) if made_here else a.work / "tok-local"
    if "startup" in a.parts:
        small_set = a.work / "tok-small"
        if not (small_set / "tokenize" / "record.json").exists():
            tokenize(["--dataset", str(small), "--tokenizer", str(tokenizer), "--output", str(small_set)],
                     a.work / "tok-small.log")  # fmt: skip
        sources = [
            ("tokenized at start", "10 MB", on_disk(small / "part-00.jsonl", a.work / "disk-small")),
            ("tokenized at start", "50 MB", on_disk(a.work / "medium" / "part-00.jsonl", a.work / "disk-medium")),
            ("Nanoset", "10 MB", small_set),
            ("Nanoset", f"{text_bytes(corpus_dir) / 1e9:.2f} GB", local),
        ]
        startup(b, [x for x in sources if x[0].split()[-1] in a.kinds], tokenizer, a.engines)
    if "tokenize" in a.parts:
        on_slurm(b, corpus_dir, tokenizer, local)
    if "restart" in a.parts:  # the failure -> next step of each engine, tokenized at start and a Nanoset
        if a.restart_mb:  # the text of `larger` (made there first)
            text = ("tokenized at start", f"{a.restart_mb} MB", a.work / f"disk-{a.restart_mb}")
        else:
            text = ("tokenized at start", "50 MB", on_disk(a.work / "medium" / "part-00.jsonl", a.work / "disk-medium"))
        sources = [text, ("Nanoset", f"{text_bytes(corpus_dir) / 1e9:.2f} GB", local)]
        restart(b, [x for x in sources if x[0].split()[-1] in a.kinds], tokenizer, a.engines)
    if "larger" in a.parts:  # one larger text tokenized at start: does its start-up grow with it?
        path = a.work / "larger" / "part-00.jsonl"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            left = a.larger_mb * 10**6
            with open(path, "wb") as out:
                for part in sorted(corpus_dir.glob("*.jsonl")):
                    chunk = part.read_bytes()[:left]
                    chunk = chunk if len(chunk) < left else chunk.rsplit(b"\n", 1)[0] + b"\n"  # whole lines
                    out.write(chunk)
                    left -= len(chunk)
                    if left <= 0 or len(chunk) < part.stat().st_size:
                        break
        data = on_disk(path, a.work / f"disk-{a.larger_mb}")
        startup(b, [("tokenized at start", f"{a.larger_mb} MB", data)], tokenizer, a.engines)
    b.say(f"\nload at the end: {load()}; {time.strftime('%H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
