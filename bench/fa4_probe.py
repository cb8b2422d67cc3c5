"""FlashAttention 4 against the SDPA stand-in, through the stand-in's own `flash_attn_varlen_func`, on one GPU
(docs/nanotron-gpu.md). Not a test: it prints what it measured, one JSON line at the end.

    python bench/fa4_probe.py [--seq 4096] [--batch 2] [--heads 32] [--kv-heads 8] [--head-dim 64]

The shapes default to the 1b preset's attention at sequence 4096, micro batch 2 (nanotron packs the batch as
(batch x seq, heads, head dim) with cu_seqlens). Measured: the first forward and backward (FA4 compiles its
kernels then: with FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 a second process reads them from disk), the steady
forward + backward time of each path (CUDA events, the median of 20 after 5 warm-ups), their attention TFLOP/s
(causal: half the square), and the largest differences of the output and the gradients, FA4 and SDPA each against
a float32 SDPA reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("seq", 4096), ("batch", 2), ("heads", 32), ("kv-heads", 8), ("head-dim", 64)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    import torch

    from launcher.train.nanotron_engine import flash_attn_compat
    from launcher.train.nanotron_engine.flash_attn_compat import attention, fa4

    flash_attn_compat.install(is_main=True)  # says which attention this process has
    result: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "backend": flash_attn_compat.backend()}
    s, b, d = args.seq, args.batch, args.head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)

    def make(heads: int) -> torch.Tensor:
        return torch.randn(b * s, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()

    q, k, v = make(args.heads), make(args.kv_heads), make(args.kv_heads)
    cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)
    grad = torch.randn(b * s, args.heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def step(use_fa4: bool, inputs: tuple[torch.Tensor, ...] = (q, k, v)) -> tuple[torch.Tensor, ...]:
        saved = fa4._varlen
        if not use_fa4:
            fa4._varlen = None
        try:
            out = attention.flash_attn_varlen_func(*inputs, cu, cu, s, s, causal=True)
            grads = torch.autograd.grad(out, inputs, grad.to(out.dtype))
        finally:
            fa4._varlen = saved
        return (out.detach(), *grads)

    have_fa4 = fa4.loaded()
    if have_fa4:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(True)
        torch.cuda.synchronize()
        result["first_call_s"] = round(time.perf_counter() - t0, 2)  # compile (or cache read) + one run

    def timed(use_fa4: bool) -> float:
        for _ in range(5):
            step(use_fa4)
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(use_fa4)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        return statistics.median(times)

    flops = 3.5 * 4 * b * s * s * args.heads * d / 2  # forward 4bs^2hd (two matmuls), backward 2.5x; causal: half
    for name, use in (("fa4", True), ("sdpa", False)):
        if use and not have_fa4:
            continue
        seconds = timed(use)
        result[f"{name}_fwd_bwd_ms"] = round(seconds * 1e3, 3)
        result[f"{name}_tflops"] = round(flops / seconds / 1e12, 1)
    reference = step(False, tuple(t.detach().float().requires_grad_() for t in (q, k, v)))
    for name, use in (("fa4", True), ("sdpa", False)):
        if use and not have_fa4:
            continue
        got = step(use)
        diffs = [float((g.float() - r).abs().max()) for g, r in zip(got, reference, strict=True)]
        result[f"{name}_max_diff_out_dq_dk_dv"] = diffs
    result["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
