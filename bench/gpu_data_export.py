"""Two more parts of a GPU session (issue 39, docs/nanotron-gpu.md): training on a Nanoset against the same text
tokenized on the fly, and the HF export of a GPU-trained bf16 checkpoint against nanotron's own forward.

    python bench/gpu_data_export.py --out DIR --data /tmp/gpu-data --main-src SRC --deadline 400
    python bench/gpu_data_export.py --out DIR --data /tmp/gpu-data --rehearse     # on a CPU: tiny, seq 128

A rehearsal runs every step on a CPU, nanotron's trainer and forward with the test-side CPU patches
(tests/cpu_nanotron) and nanotron main's source at 2411b02 (as the tests find it): the orchestration's mistakes are
found before the device time is spent.

DATA holds `dataset/` (a save_to_disk folder), `tokenizer/` and `tokenized/` (that dataset through `python -m
launcher.data tokenize`, made on the CPU machine: its metadata names the tokenizer by this absolute path, so the
folder is copied to the same path on the GPU machine).

4. Nanoset: the 1b preset at sequence 2048, micro batch 4, 40 steps, one engine at a time, the same text as a
   dataset folder (the job tokenizes and packs it at start) and as a Nanoset (memory-mapped token files): tokens/s
   over steps 11-40 and the time from the job's start to its first step.
5. The export: nanotron (each dialect) trains the 1b preset for 20 steps on the GPU in bf16 and saves; the export
   (`launcher.export`, as `python -m launcher.jobs export` runs it) writes a bf16 transformers folder; nanotron's own
   forward on the GPU (tests/nanotron_forward.py, one process) and transformers' (`from_pretrained`, bf16, on the
   GPU) score the same tokens: the largest and mean logit difference, the share of positions whose top token agrees,
   and both greedy continuations. A float32 export loaded in float32 shows what part of it is bf16 rounding.
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

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import gpu_session as gs  # noqa: E402

NANOSET_CASE, NANOSET_MB, NANOSET_STEPS = "1b:2048:data", 4, 40
EXPORT_CASE, EXPORT_STEPS = "1b:2048:data", 20
REHEARSAL_CASE = "tiny:128:data"


def case(s: gs.Session, case: str) -> str:
    return REHEARSAL_CASE if s.peak is None else case


def nanoset(s: gs.Session, data: Path, engines: list[str]) -> None:
    s.say(f"\n## 4. Nanoset vs the same text tokenized at start ({NANOSET_CASE}, micro batch {NANOSET_MB}, "
          f"{NANOSET_STEPS} steps; tokens/s after step {gs.WARMUP})")  # fmt: skip
    s.say(f"{'run':<40}{'tokens/s':>12}{'MFU':>9}{'causal':>9}{'alloc':>9}{'reserv':>9}  loss   first step s  wall s")
    sources = {"dataset": ["--dataset", str(data / "dataset")], "nanoset": ["--dataset", str(data / "tokenized")]}
    for engine in engines:
        for name, flags in sources.items():
            label = f"nanoset-{engine}-{name}"
            work = s.work / label
            config = gs.bn.write_config(case(s, NANOSET_CASE), NANOSET_STEPS, NANOSET_MB, work, dialect="main",
                                        data_flags=(*flags, "--tokenizer", str(data / "tokenizer")))  # fmt: skip
            result = s.run(engine, config, label)
            if result is None:
                continue
            first = result["metrics"][1]["time"] - result["started_at"]
            line = gs.summarize(label, result, yaml.safe_load(config.read_text()), s.peak)
            s.say(f"{line}  {first:>12.1f}  {result['wall']:>6.0f}")


def held_out(data: Path, length: int) -> list[list[int]]:
    """Two windows of real text's tokens from the dataset's last documents (the tokenizer's own)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(data / "tokenizer"))
    text = " ".join(load_from_disk(str(data / "dataset"))["text"][-400:])
    ids = tokenizer(text)["input_ids"]
    return [ids[:length], ids[length : 2 * length]]


def nanotron_logits(s: gs.Session, step: Path, tokens: list[list[int]], vocab: int, dialect: str) -> dict:
    """nanotron's forward on the checkpoint, one process on the GPU (tests/nanotron_forward.py)."""
    where = s.work / f"forward-{dialect}"
    where.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((step / "config.yaml").read_text())
    config["parallelism"].update(dp=1, tp=1, pp=1)
    config["model"]["init_method"] = {"path": str(step)}
    config["checkpoints"].update(checkpoints_path=str(where / "ckpt"), resume_checkpoint_path=None)
    (where / "one.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (where / "tokens.json").write_text(json.dumps(tokens))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
               str(ROOT / "tests" / "nanotron_forward.py"), str(where / "one.yaml"), str(where / "tokens.json"),
               str(vocab), str(where / "out.json")]  # fmt: skip
    env = dict(os.environ)
    if dialect == "main" and s.main_src:
        env["PYTHONPATH"] = s.main_src + os.pathsep + env.get("PYTHONPATH", "")
    with open(s.work / f"forward-{dialect}.log", "w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=max(s.left(), 30),
                       check=True)  # fmt: skip
    return json.loads((where / "out.json").read_text())


def transformers_logits(folder: Path, tokens: list[list[int]], dtype: str) -> tuple[object, list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).to(device).eval()
    ids = torch.tensor(tokens, device=device)
    with torch.no_grad():
        logits = model(ids).logits.float().cpu()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, min_new_tokens=5,
                             do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return logits, out.tolist()


def export_part(s: gs.Session, data: Path, dialects: list[str]) -> None:
    import torch

    from launcher.export import checkpoints, folder, weights

    s.say(f"\n## 5. The export of a GPU-trained checkpoint ({EXPORT_CASE}, {EXPORT_STEPS} steps, bf16) against "
          "nanotron's own forward on the same GPU")  # fmt: skip
    tokens = held_out(data, 32 if s.peak is None else 256)
    for dialect in dialects:
        engine = "nanotron-main" if dialect == "main" else "nanotron"
        label = f"export-{dialect}"
        config = gs.bn.write_config(case(s, EXPORT_CASE), EXPORT_STEPS, 2, s.work / label, dialect=dialect,
                                    data_flags=("--dataset", str(data / "dataset"), "--tokenizer",
                                                str(data / "tokenizer")))  # fmt: skip
        if s.run(engine, config, label, keep=True) is None:
            continue
        root = Path(yaml.safe_load(config.read_text())["checkpoints"]["checkpoints_path"])
        try:
            checkpoint = checkpoints.find(root, None, config)
            vocab = checkpoint.shape.vocab_size
            theirs = nanotron_logits(s, checkpoint.directory, tokens, vocab, dialect)
            reference = torch.tensor(theirs["logits"])[..., :vocab]
            for dtype in ("bfloat16", "float32"):
                started = time.monotonic()
                out = s.work / f"{label}-hf-{dtype}"
                size = folder.write(out, checkpoint, weights.groups(checkpoint), dtype, {"run": label})
                took = time.monotonic() - started
                ours, greedy = transformers_logits(out, tokens, dtype)
                diff = (ours - reference).abs()  # type: ignore[operator]
                agree = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()  # type: ignore[attr-defined]
                s.say(f"  nanotron {dialect}, step {checkpoint.step}, export {dtype}: {size / 2**30:.2f} GiB in "
                      f"{took:.1f} s; logits |max| {reference.abs().max():.2f}; difference max {diff.max():.4f}, "
                      f"mean {diff.mean():.5f}; top token agrees at {100 * agree:.2f}% of {reference.shape[0]} x "
                      f"{reference.shape[1]} positions; greedy equal: {greedy == theirs['greedy']}")  # fmt: skip
                shutil.rmtree(out, ignore_errors=True)
        except Exception as e:  # noqa: BLE001  # a bench: say it and go on
            s.say(f"  {label}: the comparison failed: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="dataset/, tokenizer/ and tokenized/")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-data-export"))
    parser.add_argument("--main-src", default=None, help="nanotron main's src/")
    parser.add_argument("--deadline", type=float, default=400)
    parser.add_argument("--parts", default="45", help="4, 5, in the order given")
    parser.add_argument("--nanoset-engines", nargs="+", default=["torch"], help="torch, nanotron-main")
    parser.add_argument("--dialects", nargs="+", default=["main", "0.4"])
    parser.add_argument("--rehearse", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rehearse:  # nanotron's trainer on CPU, as the tests run it (the job's environment: every child inherits it)
        sys.path.insert(0, str(ROOT / "tests"))
        from cpu_nanotron import environment
        from nanotron_main import source

        os.environ.update(environment())
        args.main_src = str(source() / "src")
    # not the Session's own rehearsal (which trains the torch engine for every engine): its shapes come from case()
    s = gs.Session(args.out, args.work, time.monotonic() + args.deadline, args.main_src, False)
    rehearsal = " (REHEARSAL on CPU)" if args.rehearse else ""
    s.say(f"# GPU session, data and export {time.strftime('%Y-%m-%d %H:%M:%S')}{rehearsal}")
    gs.environment(s)
    if not args.rehearse:
        import torch

        from launcher.train.metrics import peak_flops

        s.peak = peak_flops(torch.device("cuda")) if torch.cuda.is_available() else None
    try:
        for part in args.parts:  # in the order given
            if part == "4":
                nanoset(s, args.data, args.nanoset_engines)
            elif part == "5":
                export_part(s, args.data, args.dialects)
    finally:
        gs.pack(s)


if __name__ == "__main__":
    main()
