"""The eval and retention parts of the GPU issue at a real size (docs/nanotron-gpu.md), in one call on a GPU node;
rehearsed on a CPU with the tiny preset. Not a test: it prints what it saw and writes OUT/report.md (and the job's
logs beside it).

    python bench/gpu_evals_retention.py --out DIR                 # the 1b preset (vocabulary 128,256), one GPU
    python bench/gpu_evals_retention.py --out DIR --rehearse      # the tiny preset, on a CPU

1. A bundle (a dry run of the launcher) of the preset on the demo data, its word-level tokenizer grown to the 1b
   preset's 128,256 words as bench_export.py grows it (so that the checkpoint and the exported model are the 1b's
   size), `--keep_last 2`, a save every SAVE steps, `--eval_tasks` on two local tasks (tests/test_evals_job.py's: a
   multiple-choice one and a perplexity one) with `--eval_heldout`. The torch engine trains it STEPS steps in one
   process (run_train.py, as tests/test_evals_job.py runs it), every save kept (no supervisor runs here).
2. Retention at that size: the job's own purge (`launcher.retention.purge.purge`, as the supervisor calls it after a
   save) with the run's rules, timed, the bytes it freed; what stays (the last two).
3. The eval job of the last step, `python -m launcher.evals.evaljob BUNDLE STEP` as its batch script runs it: the
   export,
   lm-eval's hf backend (bfloat16 on a GPU, float32 on a CPU) and the held-out loss, each phase timed, with the
   device, the dtype and the GPU-hours its record gives the ledger.
4. The run resumed from its newest step for SAVE more steps (its config's train_steps raised): its wall time, and
   the resume line the engine prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

VOCAB = 128256  # the 1b preset's (Llama 3's)


def grown_tokenizer(tokenizer: Path, words: int) -> None:
    """The demo's word-level tokenizer grown to `words` entries (extra words), in place."""
    grown = json.loads((tokenizer / "tokenizer.json").read_text())
    vocab = grown["model"]["vocab"]
    first = 1 + max([*vocab.values(), *(t["id"] for t in grown.get("added_tokens", []))])
    vocab.update({f"<extra_{i}>": i for i in range(first, words)})
    (tokenizer / "tokenizer.json").write_text(json.dumps(grown))


def prepared(work: Path, rehearse: bool, steps: int, save: int) -> object:
    """The bundle (its manifest) of the run, written by the launcher's own dry run."""
    from test_evals_job import TASKS, write_heldout, write_tasks

    from launcher.bundle import manifest
    from launcher.localcluster.demo_data import make_demo
    from launcher.runs import launch

    dataset, tokenizer = make_demo(work / "demo")
    size = ["--model_size", "tiny"] if rehearse else ["--model_size", "1b", "--vocab_size", str(VOCAB)]
    if not rehearse:
        grown_tokenizer(tokenizer, VOCAB)
    tasks = write_tasks(work)
    argv = ["--run_name", "gpu-evals", "--nodes", "1", "--gpus_per_node", "1", "--engine", "torch", *size,
            "--dataset", str(dataset), "--tokenizer", str(tokenizer), "--micro_batch_size", "1",
            "--grad_accum_steps", "1", "--train_steps", str(steps), "--save_interval", str(save), "--keep_last", "2",
            "--eval_tasks", ",".join(TASKS), "--eval_include", str(tasks), "--eval_heldout",
            str(write_heldout(work)), "--wandb_disabled", "--dry_run"]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(work)
    try:
        return manifest.load(launch.prepare(argv).paths.bundle_dir)
    finally:
        os.chdir(cwd)


def timed(command: list[str], log: Path, env: dict[str, str]) -> float:
    """`command`'s wall seconds; its output in `log`; it must succeed."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed ({done.returncode}): {log.read_text()[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rehearse", action="store_true", help="the tiny preset, on a CPU")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)
        (args.out / "report.md").write_text("\n".join(lines) + "\n")

    import torch

    from launcher import checkpoint_layout as ckpt
    from launcher.evals import record as eval_record
    from launcher.retention.purge import purge
    from launcher.retention.rules import Rules

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    say(f"# Evals and retention at size: {'tiny (rehearsal)' if args.rehearse else '1b'} on {device}")
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        work = Path(tmp)
        run = prepared(work, args.rehearse, args.steps, args.save)
        config = str(run.data["files"]["config"]["path"])  # type: ignore[attr-defined]
        root = run.checkpoints  # type: ignore[attr-defined]
        train = [sys.executable, str(ROOT / "run_train.py"), "--config-file", config, "--engine", "torch"]
        seconds = timed(train, args.out / "train.log", env)
        steps = sorted(ckpt.complete_steps(root))
        size = ckpt.size_of(ckpt.step_dir(root, max(steps)))
        say(f"- trained {args.steps} steps in {seconds:.1f} s; saved {steps}, {size / 2**20:,.1f} MiB each")

        done = purge(root, Rules(keep_last=2), "")
        say(f"- purge (keep_last 2): removed {[r['step'] for r in done.removed]}, {done.freed / 2**20:,.1f} MiB freed "
            f"in {done.seconds:.2f} s; kept {sorted(ckpt.complete_steps(root))}")  # fmt: skip

        last = max(steps)
        job = [sys.executable, "-m", "launcher.evals.evaljob", str(run.bundle_dir), str(last)]  # type: ignore[attr-defined]
        seconds = timed(job, args.out / "eval-job.log", {**env, "TMPDIR": str(work), "SLURM_JOB_ID": "bench"})
        row = eval_record.rows(run.bundle_dir)[last]  # type: ignore[attr-defined]
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in row["phases_s"].items())
        say(f"- eval job of step {last}: {seconds:.1f} s ({phases}); {row['engine']} on {row['device']} in "
            f"{row['dtype']}, {row['gpus']} GPU(s), {row['gpu_hours']:.4f} GPU-hours; held-out loss "
            f"{row['heldout']['loss']:.3f}; scores {json.dumps(row['tasks'])}")  # fmt: skip

        more = yaml.safe_load(Path(config).read_text())
        more["tokens"]["train_steps"] = args.steps + args.save
        longer = work / "longer.yaml"
        longer.write_text(yaml.safe_dump(more))
        resume = [*train[:3], str(longer), *train[4:]]
        seconds = timed(resume, args.out / "resume.log", env)
        said = [ln for ln in (args.out / "resume.log").read_text().splitlines() if "resumed from checkpoint" in ln]
        say(f"- resumed for {args.save} more steps in {seconds:.1f} s: {said[0] if said else 'NO RESUME LINE'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
