"""nanotron engine vs torch engine on one GPU, the same launcher-written config, side by side (not a test).

    python bench/bench_nanotron.py --out DIR                               # every case below, both engines
    python bench/bench_nanotron.py --out DIR --cases 1b:4096:random --engines nanotron

A case is PRESET:SEQUENCE:DATA (DATA: `random` tokens, or `local`, a small dataset and tokenizer made on the spot
by launcher.localcluster.demo_data). For each case the launcher's own flag pipeline writes the config of a
one-GPU job (`--nodes 1 --gpus_per_node 1`: tp = pp = dp = 1, micro batch --micro-batch-size, no accumulation,
--steps steps, logging every step); each engine trains it in its own `torchrun --standalone --nproc_per_node 1`
process, as the job does (`--engine nanotron|torch`), with the metrics file on, wandb off and the checkpoints
deleted afterwards. The nanotron engine's attention is flash_attn's where it imports, else torch SDPA (the
stand-in); its metrics file is named after the one it used, so a second pass with flash-attn installed sits
beside the first and the loss curves are compared.

Reported per run, over the steps after --warmup: tokens/s (tokens of those steps over the wall-clock between
their metrics lines), MFU against the GPU's dense bf16 peak under two FLOP conventions, and the peak of
torch.cuda.max_memory_allocated and max_memory_reserved. FLOPs per token: 6 x matmul weights (q, k, v, o,
gate, up, down, lm_head; not the embedding) + 12 x layers x hidden x sequence for attention over the full
sequence x sequence (nanotron's get_flops and the torch engine's flops_per_token both count so); the
causal-aware figure counts the attention term half (6 x layers x hidden x sequence): a causal kernel computes
about half the scores. It fails at once, saying so, on a machine without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = ("tiny:1024:random", "tiny:1024:local", "1b:4096:random", "1b:4096:local")


def fail(message: str) -> None:
    """Say what is wrong on stderr and exit 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def flops_per_token(config: dict, causal: bool) -> float:
    """Training FLOPs per token of a nanotron Llama config (see the module's docstring for the convention)."""
    m, seq = config["model"]["model_config"], config["tokens"]["sequence_length"]
    d, layers, inter, vocab = m["hidden_size"], m["num_hidden_layers"], m["intermediate_size"], m["vocab_size"]
    kv = m["num_key_value_heads"] * d // m["num_attention_heads"]
    matmul = layers * (2 * d * d + 2 * d * kv + 3 * d * inter) + d * vocab
    return 6.0 * matmul + (6.0 if causal else 12.0) * layers * d * seq


def write_config(
    case: str,
    steps: int,
    micro_batch: int,
    work: Path,
    save_interval: int | None = None,
    *,
    dialect: str = "0.4",
    grad_accum: int = 1,
    warmup: int = 10,
    data_flags: tuple[str, ...] = (),
) -> Path:
    """The config the launcher writes for this case as a one-GPU job (its own flags, resolution and checks), in
    `dialect`'s dialect; without `save_interval`, only the last step is saved; `data_flags` (e.g. `--dataset DIR
    --tokenizer DIR`) stand for the case's DATA where given. Beside it, `<name>.estimate.json`:
    the launcher's memory estimate for that layout (launcher.perf.memory, as the fit check computes it)."""
    from launcher.config.cli import parse
    from launcher.config.resolve import resolve
    from launcher.config.validate import validate
    from launcher.nanotron_config.schema import dump, written
    from launcher.perf.fit import layout_of
    from launcher.perf.memory import estimate

    preset, seq, data = case.split(":")
    work.mkdir(parents=True, exist_ok=True)
    flags = ["--run_name", f"bench-{preset}-{seq}-{data}", "--nodes", "1", "--gpus_per_node", "1", "--tp", "1",
             "--pp", "1", "--model_size", preset, "--max_seq_len", seq, "--micro_batch_size", str(micro_batch),
             "--grad_accum_steps", str(grad_accum), "--train_steps", str(steps), "--warmup_steps", str(warmup),
             "--save_interval", str(save_interval or 10 * steps), "--log_interval", "1",
             "--nanotron_dialect", dialect, "--skip_memory_check", "true"]  # fmt: skip  # measured, not refused
    if data_flags:
        flags += list(data_flags)
    elif data == "local":
        from launcher.localcluster.demo_data import make_demo

        demo = work / "demo"
        if (demo / "dataset").exists() and (demo / "tokenizer").exists():
            dataset, tokenizer = demo / "dataset", demo / "tokenizer"
        else:
            dataset, tokenizer = make_demo(demo, num_docs=4000)
        flags += ["--dataset", str(dataset), "--tokenizer", str(tokenizer)]
    else:
        flags += ["--dataset", "none"]
    args, explicit = parse(flags)
    spec, problems = resolve(args, explicit, cwd=work)
    problems += validate(spec)
    if problems:
        fail("the launcher refuses the case " + case + ":\n" + "\n".join(f"  - {p}" for p in problems))
    name = f"{case.replace(':', '-')}-mb{micro_batch}-ga{grad_accum}-{dialect}"
    path = work / f"{name}.yaml"
    checkpoints = work / "checkpoints" / path.stem  # emptied by each run (`child`)
    path.write_text(dump(written(spec.config, spec.dialect.dialect, str(checkpoints))))
    est = estimate(spec.shape, layout_of(spec))
    record = {"peak": est.peak, "total": est.total, "headroom": est.headroom, "parts": est.parts, "stage": est.stage}
    path.with_suffix(".estimate.json").write_text(json.dumps(record))
    return path


class RunFailed(Exception):
    """A run that ended without its metrics (its log says why)."""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_engine(
    engine: str,
    config: Path,
    out: Path,
    label: str,
    *,
    pythonpath: str | None = None,
    save: bool = True,
    keep: bool = False,
    env: dict[str, str] | None = None,
    bundle: Path | None = None,
    timeout: float | None = None,
    compile_layers: bool = False,
) -> dict:
    """One torchrun process training `config` with `engine`, as the node step starts one: torchrun's c10d
    rendezvous (one node, its own port); its metrics lines, peak memory and wall time. `pythonpath` goes first on
    the job's path (nanotron main's source); `save=False` skips every checkpoint save (a memory run); the run's
    checkpoints are deleted afterwards unless `keep`; `bundle`: the job's bundle it writes its metrics, its outcome
    (and reads its stop file) in (LAUNCHER_BUNDLE; a new one named after `label` by default); `compile_layers`:
    run_train.py's --compile_layers."""
    metrics = (bundle or out / f"{label}.bundle") / "metrics.jsonl"
    memory = out / f"{label}.memory.json"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    if bundle is None:
        metrics.unlink(missing_ok=True)
    memory.unlink(missing_ok=True)
    env = {**os.environ, "LAUNCHER_BUNDLE": str(metrics.parent), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1", **(env or {})}  # fmt: skip  # nanotron asserts it with async TP
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", label,
               __file__, "--child", engine, str(config), str(memory)]  # fmt: skip
    command += ([] if save else ["--no-save"]) + (["--keep"] if keep else []) + ["--compile-layers"] * compile_layers
    started, started_at = time.monotonic(), time.time()
    with open(out / f"{label}.log", "a") as log:
        try:
            done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"{label} ran past {timeout:.0f} s; its log: {out / f'{label}.log'}") from None
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RunFailed(f"{label} failed (exit {done.returncode}); its log: {out / f'{label}.log'}")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    stats = json.loads(memory.read_text()) if memory.exists() else {}
    return {"metrics": {m["step"]: m for m in lines}, "wall": wall, "started_at": started_at, **stats}


def child(engine: str, config: str, memory: str, save: bool, keep: bool, compile_layers: bool = False) -> None:
    """Inside torchrun: train, then record this process's peak GPU memory (and the checkpoint's size)."""
    import torch
    import yaml

    from launcher.train.main import run

    if not save:
        _skip_saves()
    checkpoints = Path(yaml.safe_load(Path(config).read_text())["checkpoints"]["checkpoints_path"])
    try:
        run(config, engine, compile_layers)
    finally:
        on_gpu = torch.cuda.is_available()
        stats = {"allocated": torch.cuda.max_memory_allocated() if on_gpu else 0,
                 "reserved": torch.cuda.max_memory_reserved() if on_gpu else 0,
                 "checkpoint_bytes": sum(f.stat().st_size for f in checkpoints.rglob("*") if f.is_file())}  # fmt: skip
        Path(memory).write_text(json.dumps(stats))
        if not keep:
            shutil.rmtree(checkpoints, ignore_errors=True)  # a 1b checkpoint is ~15 GB: one at a time on the disk


def _skip_saves() -> None:
    """No checkpoint is written (a memory run measures training, not a 15-45 GB save): the torch engine's save and
    the nanotron trainer's are replaced by nothing, here in the bench's process, never in the job."""
    from launcher.train.nanotron_engine import engine as nanotron_engine
    from launcher.train.torch_engine import engine as torch_engine

    torch_engine.checkpoint.save = lambda *args, **kwargs: None
    make_class = nanotron_engine.trainer_class

    def without_saves(cfg, job):  # type: ignore[no-untyped-def]  # trainer_class's own parameters
        class NoSaves(make_class(cfg, job)):  # type: ignore[misc, valid-type]
            def save_checkpoint(self):  # type: ignore[no-untyped-def]
                self.last_saved_step = self.iteration_step

        return NoSaves

    nanotron_engine.trainer_class = without_saves


def summarize(label: str, result: dict, config: dict, warmup: int, peak: float) -> str:
    m = result["metrics"]
    last = max(m)
    t = config["tokens"]
    tokens = (last - warmup) * t["micro_batch_size"] * t["batch_accumulation_per_replica"] * t["sequence_length"]
    tokens_per_s = tokens / (m[last]["time"] - m[warmup]["time"])
    mfu = [tokens_per_s * flops_per_token(config, causal) / peak for causal in (False, True)]
    gib = [result[k] / 2**30 for k in ("allocated", "reserved")]
    loss = f"{m[1]['loss']:.3f} -> {m[last]['loss']:.3f}"
    return (
        f"{label:<34}{tokens_per_s:>12,.0f}{100 * mfu[0]:>8.1f}%{100 * mfu[1]:>8.1f}%{gib[0]:>9.1f}{gib[1]:>9.1f}"
        f"  {loss}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="metrics, logs and the table go here (required)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), help="PRESET:SEQUENCE:random|local")
    parser.add_argument("--engines", nargs="+", choices=("nanotron", "torch"), default=["nanotron", "torch"])
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (at least 30)")
    parser.add_argument("--warmup", type=int, default=10, help="first steps left out of the figures")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-layers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child, save=not args.no_save, keep=args.keep, compile_layers=args.compile_layers)
    if args.out is None:
        parser.error("the following arguments are required: --out")
    import torch
    import yaml

    if not torch.cuda.is_available():
        fail("bench_nanotron.py compares the engines on a CUDA GPU and this machine has none (the nanotron "
                 "engine needs CUDA and NCCL); run it on a GPU node, see docs/nanotron-gpu.md")  # fmt: skip
    if args.steps < 30 or args.warmup >= args.steps:
        fail("--steps must be at least 30 and more than --warmup")
    from launcher.train.metrics import peak_flops
    from launcher.train.nanotron_engine import flash_attn_compat

    peak = peak_flops(torch.device("cuda"))
    if peak is None:
        fail(f"no known bf16 peak for {torch.cuda.get_device_name()} (configs/gpus.yaml's device_names)")
    attention = flash_attn_compat.backend()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps, figures after step "
             f"{args.warmup}, micro batch {args.micro_batch_size}",
             f"{'run':<34}{'tokens/s':>12}{'MFU':>9}{'causal':>9}{'alloc':>9}{'reserv':>9}  loss (GiB)"]  # fmt: skip
    print("\n".join(lines), flush=True)
    for case in args.cases:
        config_path = write_config(case, args.steps, args.micro_batch_size, args.out / "work")
        config = yaml.safe_load(config_path.read_text())
        for engine in args.engines:
            label = f"{case.replace(':', '-')}-{engine}" + (f"-{attention}" if engine == "nanotron" else "")
            try:
                result = run_engine(engine, config_path, args.out, label)
            except RunFailed as e:
                fail(str(e))
            lines.append(summarize(label, result, config, args.warmup, peak))
            print(lines[-1], flush=True)
        lines += compare_attention(args.out, case.replace(":", "-"))
    (args.out / "table.txt").write_text("\n".join(lines) + "\n")


def compare_attention(out: Path, case: str) -> list[str]:
    """Where both exist, the nanotron engine's losses through flash_attn and through the stand-in, step by step."""
    runs = [out / f"{case}-nanotron-{a}.jsonl" for a in ("flash_attn", "sdpa")]
    if not all(p.exists() for p in runs):
        return []
    a, b = ({m["step"]: m["loss"] for m in map(json.loads, p.read_text().splitlines())} for p in runs)
    worst = max(abs(a[s] - b[s]) for s in a.keys() & b.keys())
    steps = len(a.keys() & b.keys())
    line = f"{case}: nanotron's loss, flash_attn vs the SDPA stand-in: largest difference in {steps} steps {worst:.2e}"
    print(line, flush=True)
    return [line]


if __name__ == "__main__":
    main()
