"""The export of a 1b-preset checkpoint in nanotron's layout at tp 2 x pp 2: wall time and peak memory (RSS) of
`python -m launcher.jobs export`, against the largest tensor's size, the model's size, and transformers loading the
exported model (`AutoModelForCausalLM.from_pretrained`).

    python bench/bench_export.py --out DIR [--keep]

The checkpoint is written by nanotron itself, as the tests' multi-rank runs write theirs: a launcher bundle (a dry
run of the launcher's own flags: `--model_size 1b --vocab_size 128256 --tp 2 --pp 2`, nanotron 0.4's dialect, bf16
weights, the demo data and tokenizer), then 4 ranks of the nanotron engine on CPU through tests/cpu_nanotron's
patches, whose trainer, once nanotron has built and randomly initialised the model, saves it (nanotron's own
`save_checkpoint`: its file names, its `local_global_slices_pairs` and `unsharded_shape` metadata, bfloat16) and
trains nothing. Each measured command runs in a child process of its own; its peak RSS is the kernel's (wait4's
ru_maxrss). A child that imports what the export imports (torch, safetensors, transformers) gives the floor.
Not a test: ~10 GB of disk and a few minutes. The figures go in docs/performance.md and docs/export.md.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

STEP = 1  # the step the checkpoint is saved as
VOCAB = 128256  # the 1b preset's (Llama 3's)
FLAGS = ["--nodes", "1", "--gpus_per_node", "4", "--tp", "2", "--pp", "2", "--model_size", "1b",
         "--vocab_size", str(VOCAB), "--micro_batch_size", "1", "--grad_accum_steps", "1", "--train_steps", "1",
         "--nanotron_dialect", "0.4", "--engine", "nanotron", "--dry_run"]  # fmt: skip
# no fp32 copy of the weights for gradient accumulation: the trainer is built, never steps
USER_YAML = "optimizer:\n  accumulate_grad_in_fp32: false\n"


def saving_only(trainer_class: Any) -> Any:
    """The engine's trainer, whose train() saves the freshly initialised model as step STEP and returns."""

    def made(*args: Any) -> Any:
        class SaveOnly(trainer_class(*args)):  # type: ignore[misc]
            def train(self, *ignored: Any, **also_ignored: Any) -> None:
                self.iteration_step = STEP
                self.save_checkpoint()

        return SaveOnly

    return made


def write_checkpoint(config: str) -> None:
    """(One rank of torchrun.) nanotron builds the model of `config` and saves it."""
    from launcher.train.nanotron_engine import engine
    from launcher.train.settings import load_train_config

    engine.trainer_class = saving_only(engine.trainer_class)
    engine.train(config, load_train_config(config))


def bundle(where: Path) -> Any:
    from launcher.bundle import manifest
    from launcher.localcluster.demo_data import make_demo
    from launcher.runs import launch

    dataset, tokenizer = make_demo(where / "demo")
    # the demo's word-level tokenizer grown to the 128256 tokens of --vocab_size (words of its vocabulary, as a Llama
    # 3 tokenizer holds its own), so that the export keeps every row of the embedding
    grown = json.loads((tokenizer / "tokenizer.json").read_text())
    words = grown["model"]["vocab"]
    first = 1 + max([*words.values(), *(t["id"] for t in grown.get("added_tokens", []))])
    words.update({f"<extra_{i}>": i for i in range(first, VOCAB)})
    (tokenizer / "tokenizer.json").write_text(json.dumps(grown))
    (where / "user.yaml").write_text(USER_YAML)
    cwd = os.getcwd()
    os.chdir(where)
    try:
        argv = ["--run_name", "export-bench", "--dataset", str(dataset), "--tokenizer", str(tokenizer),
                "--config", str(where / "user.yaml"), *FLAGS]  # fmt: skip
        return manifest.load(launch.prepare(argv).paths.bundle_dir)
    finally:
        os.chdir(cwd)


def measured(command: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of `command` in a child process (its output to `log`); it must succeed."""
    with open(log or os.devnull, "w") as out:
        started = time.monotonic()
        child = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        wall = time.monotonic() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{command[:4]} failed (exit {child.returncode}):\n{log.read_text()[-4000:] if log else ''}")
    return wall, usage.ru_maxrss * 1024  # Linux: kilobytes


def sizes(run: Any) -> tuple[str, int, int, int]:
    """(largest tensor's name, its bytes, the model's bytes, parameters) from the checkpoint's headers (bf16)."""
    from launcher.export import checkpoints, weights
    from launcher.export.exporter import run_config

    checkpoint = checkpoints.find(run.checkpoints, None, run_config(run))
    shapes = {n: weights._numel(s) for g in weights.groups(checkpoint) for n, s in g.shapes.items()}
    largest = max(shapes, key=lambda n: shapes[n])
    return largest, 2 * shapes[largest], 2 * sum(shapes.values()), sum(shapes.values())


# from_pretrained maps the safetensors files and reads a weight when it is used: with `read`, every weight is read
# (as a forward reads them), so the whole model is in memory
LOAD = """import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
if sys.argv[2:] == ["read"]:
    with torch.no_grad():
        print(sum(float(p.sum()) for p in model.parameters()))
print(sum(p.numel() for p in model.parameters()))"""
FLOOR = "import torch, safetensors.torch, transformers; from transformers import AutoTokenizer, LlamaConfig"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the bundle, checkpoint, export and table.md go here")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the export (~5 GB)")
    args = parser.parse_args()
    from cpu_nanotron import environment

    where = args.out.resolve()
    where.mkdir(parents=True, exist_ok=True)
    run = bundle(where)
    config = run.data["files"]["config"]["path"]
    gib, rows = 2**30, []
    load_before = os.getloadavg()

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", __file__,
                "--write", config]  # fmt: skip
    wall, rss = measured(torchrun, environment(), where / "write.log")
    saved = run.checkpoints / str(STEP)
    on_disk = sum(f.stat().st_size for f in (saved / "model").rglob("*.safetensors"))
    files = len(list((saved / "model").rglob("*.safetensors")))
    rows.append(("nanotron writes the checkpoint (4 ranks, one process's peak)", wall, rss))
    largest, largest_bytes, model_bytes, parameters = sizes(run)

    wall, rss = measured([sys.executable, "-c", FLOOR])
    rows.append(("a Python that imports torch, safetensors, transformers (the floor)", wall, rss))
    floor = rss
    out = where / "hf"
    wall, rss = measured([sys.executable, "-m", "launcher.jobs", "export", str(run.bundle_dir), "--output", str(out)],
                         {"PYTHONPATH": str(ROOT)}, where / "export.log")  # fmt: skip
    rows.append(("`jobs export` (bfloat16)", wall, rss))
    export_rss = rss
    wall, rss = measured([sys.executable, "-c", LOAD, str(out)], log=where / "load.log")
    loaded = int((where / "load.log").read_text().split()[-1])
    rows.append(("`AutoModelForCausalLM.from_pretrained` (bfloat16; weights mapped, not read)", wall, rss))
    wall, rss = measured([sys.executable, "-c", LOAD, str(out), "read"])
    rows.append(("the same, and every weight read (the whole model in memory)", wall, rss))
    load_after = os.getloadavg()
    index = json.loads((out / "model.safetensors.index.json").read_text())  # (a 1b model takes several files)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == VOCAB

    lines = [
        f"1b preset (tied, GQA 32/8, vocab 128256), nanotron 0.4 layout tp 2 x pp 2: {files} safetensors files, "
        f"{on_disk / gib:.2f} GiB, {parameters / 1e9:.3f}B parameters ({model_bytes / gib:.2f} GiB in bf16); the "
        f"largest tensor {largest} {largest_bytes / gib:.3f} GiB; the export: "
        f"{len(set(index['weight_map'].values()))} shards, {index['metadata']['total_size'] / gib:.2f} GiB; "
        f"transformers loaded {loaded / 1e9:.3f}B parameters.",
        f"load average {' '.join(f'{x:.1f}' for x in load_before)} before, "
        f"{' '.join(f'{x:.1f}' for x in load_after)} after ({os.cpu_count()} cores)",
        "",
        "| what | wall | peak RSS |",
        "| --- | --- | --- |",
        *(f"| {what} | {w:.1f} s | {r / gib:.2f} GiB |" for what, w, r in rows),
        "",
        f"export's peak RSS over the floor: {(export_rss - floor) / gib:.2f} GiB = "
        f"{(export_rss - floor) / largest_bytes:.1f}x the largest tensor, "
        f"{(export_rss - floor) / model_bytes:.2f}x the model",
    ]
    (where / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.keep:
        shutil.rmtree(run.checkpoints)
        shutil.rmtree(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        write_checkpoint(sys.argv[2])
    else:
        main()
