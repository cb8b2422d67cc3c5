"""Throughput of the torch engine's training step, per preset (not a test).

    python bench/bench_train.py [--presets tiny small] [--seq-len 256] [--micro-batch-size 4]   # CPU, float32
    python bench/bench_train.py --presets 1b --seq-len 4096 --micro-batch-size 2                # one GPU, bf16

Each preset's model shape comes from configs/presets/<name>.yaml; the data is random tokens; each step is the
engine's own `TorchTrainer.train_step` (forward, backward, clip, AdamW) under its one-process DDP (`wrap`:
compiled on a GPU), on the GPU where there is one (in --dtype, bfloat16 by default there) and on the CPU in
float32 otherwise. The first steps are warm-up and are not timed. On a known GPU (H100, H200, A100) it prints the
model FLOPs utilisation as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402

from launcher.nanotron_config.shape import ModelShape  # noqa: E402
from launcher.train.environment import JobEnvironment  # noqa: E402
from launcher.train.metrics import peak_flops  # noqa: E402
from launcher.train.settings import LRSchedule, TrainConfig  # noqa: E402
from launcher.train.torch_engine.engine import Rank, TorchTrainer, init_distributed  # noqa: E402
from launcher.train.torch_engine.model import count_parameters, flops_per_token  # noqa: E402

STEPS = {"tiny": 10, "small": 3}  # timed steps per preset (after the warm-up steps); others: 3


def preset_shape(name: str) -> ModelShape:
    """The model shape a preset YAML gives (nanotron's defaults for what presets leave out)."""
    m = yaml.safe_load((ROOT / "configs" / "presets" / f"{name}.yaml").read_text())["model"]
    return ModelShape(
        hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"],
        num_layers=m["num_layers"],
        num_heads=m["num_heads"],
        num_kv_heads=m["num_kv_heads"],
        vocab_size=m["vocab_size"],
        max_seq_len=m["max_seq_len"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=m["tie_word_embeddings"],
        hidden_act="silu",
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
    )


def bench_config(shape: ModelShape, seq_len: int, micro_batch_size: int, checkpoints: str, dtype: str) -> TrainConfig:
    """A run on random tokens (no data loading in the timed steps)."""
    return TrainConfig(
        project="bench", run_name="bench", seed=0, model=shape, init_std=0.02, dtype=dtype, dp=1, tp=1, pp=1,
        sequence_length=seq_len, micro_batch_size=micro_batch_size, grad_accum_steps=1, train_steps=1000,
        lr=LRSchedule(3e-4, 3e-5, 0, "linear", "cosine", 1000, 0), weight_decay=0.01, adam_beta1=0.9,
        adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0, dataset=None, dataset_split="train",
        dataset_config_name=None, text_column="text", tokenizer=None, data_seed=0, num_loading_workers=1,
        checkpoints_path=checkpoints, checkpoint_interval=0, save_initial_state=False,
        resume_checkpoint_path=None, log_interval=1,
    )  # fmt: skip


def measure(cfg: TrainConfig, steps: int, where: Rank) -> dict:
    """Seconds per step, tokens/s and achieved GFLOP/s of `steps` timed training steps."""
    trainer = TorchTrainer(cfg, where, JobEnvironment.read())
    on_gpu = where.device.type == "cuda"
    ddp = trainer.wrap()  # the engine's own: compiled on a GPU
    warmup = 3 if on_gpu else 1
    times = []
    for _ in range(steps + warmup):
        trainer.step += 1
        start = time.perf_counter()
        loss, _ = trainer.train_step(ddp)
        loss.item()  # waits for the GPU
        times.append(time.perf_counter() - start)
    per_step = sum(times[warmup:]) / steps
    tokens_per_s = cfg.micro_batch_size * cfg.sequence_length / per_step
    params = count_parameters(trainer.model)
    flops = tokens_per_s * flops_per_token(trainer.model, cfg.model, cfg.sequence_length)
    peak = peak_flops(where.device)
    memory = torch.cuda.max_memory_allocated(where.device) / 2**30 if on_gpu else None
    return {
        "params": params,
        "step_s": per_step,
        "tokens_per_s": tokens_per_s,
        "gflops": flops / 1e9,
        "mfu": None if peak is None else flops / peak,
        "memory_gib": memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="GPU: bfloat16; CPU: float32")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: per preset)")
    args = parser.parse_args()
    where = init_distributed(JobEnvironment.read())
    dtype = args.dtype or ("bfloat16" if where.device.type == "cuda" else "float32")
    device = (
        torch.cuda.get_device_name(where.device)
        if where.device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    print(f"torch {torch.__version__}, {device}, seq {args.seq_len}, micro batch {args.micro_batch_size}, {dtype}")
    print(f"{'preset':<8}{'params':>14}{'s/step':>10}{'tokens/s':>12}{'GFLOP/s':>10}{'MFU':>8}{'GiB':>8}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.presets:
                shape = preset_shape(name)
                shape = dataclasses.replace(shape, max_seq_len=max(shape.max_seq_len, args.seq_len))
                cfg = bench_config(shape, args.seq_len, args.micro_batch_size, tmp, dtype)
                r = measure(cfg, args.steps or STEPS.get(name, 3), where)
                mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
                gib = "-" if r["memory_gib"] is None else f"{r['memory_gib']:.1f}"
                print(
                    f"{name:<8}{r['params']:>14,}{r['step_s']:>10.3f}{r['tokens_per_s']:>12,.0f}"
                    f"{r['gflops']:>10.1f}{mfu:>8}{gib:>8}"
                )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
