"""`python -m launcher.evals.evaljob BUNDLE STEP`: one eval job (the bundle's eval.sbatch, submitted by the run's
supervisor for an evaluated step; docs/evals.md). What the eval job does, in order:

1. the step's record (under the checkpoints, launcher/node/evals.py) says it runs; a lease holds the step (checkpoint
   retention leaves a leased step);
2. the step is exported as `jobs export` exports it (launcher/export/), into a scratch folder under TMPDIR, float32
   on a CPU (bfloat16 on a GPU);
3. lm-eval scores it on the run's tasks (its `hf` backend; `vllm` where the job's Python has vLLM and the job a GPU);
4. with --eval_heldout, its held-out loss and bits per byte (`python -m launcher.train.evaluate`, in a child
   process: the launcher's side never imports the job's code);
5. the results: the bundle's evals/step-STEP.json (lm-eval's whole results) and a line of evals.jsonl (step, tokens
   consumed, every task's metrics, the held-out figures, the job's seconds and GPU-hours, what ran), the run's own
   W&B run (its id beside the checkpoints) keyed by step and tokens, the record "done";
6. the lease dropped, the scratch folder removed.

A failure is recorded with its cause (evals.jsonl's line "failed", the record) and the job exits 1; a SIGTERM (a
preemption, a cancel, the time limit) records "interrupted": Slurm requeues a preempted eval job, which starts the
step again. Training never waits for an eval job, nor hears of its end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from launcher import checkpoint_layout as layout
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.evals import record as submissions
from launcher.evals.record import append, write_step
from launcher.export.command import export, run_config

CPU_BATCH = 8  # lm-eval's batch on a CPU (lm_eval --batch_size 8 gives the same scores)


class Interrupted(BaseException):
    """Slurm's SIGTERM: a preemption (Slurm requeues the job), a cancel or the time limit (a BaseException: no
    library's `except Exception` swallows it)."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signal.Signals(signum).name} (preempted, cancelled or out of time)")


def engine(gpus: int) -> tuple[str, str, str]:
    """(lm-eval's backend, the device, the weights' type): vLLM where installed and a GPU is there, else `hf`."""
    import torch

    on_gpu = gpus > 0 and torch.cuda.is_available()
    if on_gpu and importlib.util.find_spec("vllm") is not None:
        return "vllm", "cuda", "bfloat16"
    return "hf", "cuda" if on_gpu else "cpu", "bfloat16" if on_gpu else "float32"


def score(model: Path, plan: dict, backend: str, device: str, dtype: str) -> dict:
    """lm-eval's results for the exported model (its `results`, `groups`, `config`, ...; no samples)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    args: dict[str, Any] = {"pretrained": str(model), "dtype": dtype}
    if backend == "vllm":
        args.update(tensor_parallel_size=1, gpu_memory_utilization=0.8)
    manager = TaskManager(include_path=plan.get("include") or None)
    results = lm_eval.simple_evaluate(model=backend, model_args=args, tasks=list(plan["tasks"]), device=device,
                                      batch_size=CPU_BATCH if device == "cpu" else "auto", limit=plan.get("limit"),
                                      task_manager=manager, log_samples=False)  # fmt: skip
    if not results:
        raise RuntimeError("lm-eval returned no results")
    results.pop("samples", None)
    return results


def metrics_of(results: dict) -> dict[str, dict[str, float]]:
    """task -> metric -> value, from lm-eval's results (`acc,none` as `acc`; other filters keep their name)."""
    out: dict[str, dict[str, float]] = {}
    for task, values in (results.get("results") or {}).items():
        row = {}
        for key, value in values.items():
            name, _, kept = key.partition(",")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in ("alias", "sample_len"):
                row[name if kept in ("", "none") else f"{name},{kept}"] = float(value)
        out[task] = row
    return out


def samples_of(results: dict) -> dict[str, int]:
    """task -> the samples it was scored on."""
    counts = results.get("n-samples") or {}
    return {task: int(n.get("effective", 0)) for task, n in counts.items() if isinstance(n, dict)}


def heldout(run: manifest.Manifest, model: Path, where: str, scratch: Path) -> dict:
    """The held-out figures (`python -m launcher.train.evaluate --heldout`, with this Python)."""
    result = scratch / "heldout.json"
    result.write_text(json.dumps({"output": str(model)}) + "\n", encoding="utf-8")
    argv = [sys.executable, "-m", "launcher.train.evaluate", "--config", str(run_config(run)), "--result",
            str(result), "--heldout", where]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["the held-out loss failed"])[-1])
    figures = json.loads(result.read_text(encoding="utf-8"))
    return {k: figures[k] for k in ("loss", "perplexity", "bits_per_byte", "tokens", "held_out")}


def to_wandb(run: manifest.Manifest, row: dict) -> str:
    """The step's scores in the run's own W&B run (resumed by its id), keyed by step and tokens; what happened."""
    if run.flags.get("wandb_disabled") or os.environ.get("WANDB_MODE") == "disabled":
        return "disabled"
    id_file = run.checkpoints / P.WANDB_RUN_ID_FILE
    if not id_file.is_file():
        return f"not logged: the run has no W&B run ({id_file})"
    import wandb

    values = {f"eval/{task}/{metric}": v for task, metrics in row["tasks"].items() for metric, v in metrics.items()}
    values.update({f"eval/heldout/{k}": row["heldout"][k] for k in ("loss", "bits_per_byte")} if row["heldout"] else {})
    shared = os.environ.get("WANDB_MODE", "online") == "online"  # training writes to the same run meanwhile
    settings = wandb.Settings(mode="shared", x_primary=False, x_label=f"eval-{row['step']}") if shared else None
    w = wandb.init(project=run.flags.get("project"), id=id_file.read_text(encoding="utf-8").strip(), resume="allow",
                   settings=settings)  # fmt: skip
    w.define_metric("eval/tokens")
    w.define_metric("eval/*", step_metric="eval/tokens")
    w.log({"eval/step": row["step"], "eval/tokens": row["tokens"], **values})
    w.finish()
    return f"logged to W&B run {w.id}"


def evaluate(run: manifest.Manifest, step: int, scratch: Path, started: float) -> dict:
    plan = run.data["evals"]
    gpus = int(plan.get("gpus") or 0)
    backend, device, dtype = engine(gpus)
    model = scratch / "model"
    marks = [time.time()]
    export(run, step, model, dtype, ["export", str(run.bundle_dir), "--step", str(step), "--dtype", dtype])
    marks.append(time.time())
    results = score(model, plan, backend, device, dtype)
    marks.append(time.time())
    figures = heldout(run, model, plan["heldout"], scratch) if plan.get("heldout") else None
    marks.append(time.time())
    seconds = time.time() - started
    names = ("export", "lm_eval", "heldout")
    phases = {name: round(b - a, 2) for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)}
    per_step = int((run.data.get("derived") or {}).get("global_batch_tokens") or 0)
    row = {"step": step, "tokens": step * per_step, "state": "done", "tasks": metrics_of(results),
           "samples": samples_of(results), "heldout": figures,
           "job": os.environ.get("SLURM_JOB_ID", ""), "seconds": round(seconds, 1), "gpus": gpus,
           "gpu_hours": round(seconds * gpus / 3600, 6), "phases_s": phases, "engine": backend, "device": device,
           "dtype": dtype, "limit": plan.get("limit"),
           "lm_eval": results.get("lm_eval_version") or _version()}  # fmt: skip
    write_step(run.bundle_dir, step, {**row, "lm_eval_results": results})
    row["wandb"] = to_wandb(run, row)
    return row


def _version() -> str:
    from importlib import metadata

    return metadata.version("lm_eval")


def main(argv: list[str]) -> int:
    bundle, step = Path(argv[0]), int(argv[1])
    started = time.time()
    signal.signal(signal.SIGTERM, _terminated)
    run = manifest.load(bundle)
    root, job = run.checkpoints, os.environ.get("SLURM_JOB_ID", "")
    submissions.write_record(root, step, state="running", job=job, bundle=str(bundle))
    print(f"eval: job {job or '-'} on {os.uname().nodename}, step {step} of {bundle}", flush=True)
    lease = layout.take_lease(root, step, "eval")
    scratch = Path(tempfile.mkdtemp(prefix=f"launcher-eval-{job or os.getpid()}-{step}-"))
    try:
        row = evaluate(run, step, scratch, started)
    except Interrupted as e:
        submissions.write_record(root, step, state="interrupted", job=job, cause=str(e))
        print(f"eval: step {step} interrupted: {e}", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    except Exception as e:  # noqa: BLE001  whatever failed, recorded with its cause: training is not affected
        cause = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        seconds = time.time() - started
        gpus = int(run.data["evals"].get("gpus") or 0)
        append(run.bundle_dir, {"step": step, "state": "failed", "cause": cause, "job": job,
                                "seconds": round(seconds, 1), "gpus": gpus,
                                "gpu_hours": round(seconds * gpus / 3600, 6)})  # fmt: skip
        submissions.write_record(root, step, state="failed", job=job, cause=cause)
        print(f"eval: step {step} failed: {cause}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for held in [lease, *(h for h in layout.leases(root) if h.step == step and job and h.job == job)]:
            layout.drop_lease(held)  # its own, and the one the supervisor took in its name at the submission
        shutil.rmtree(scratch, ignore_errors=True)
    append(run.bundle_dir, row)
    submissions.write_record(root, step, state="done", job=job)
    scores = "; ".join(f"{t} " + ", ".join(f"{m} {v:.4g}" for m, v in ms.items() if "stderr" not in m)
                       for t, ms in row["tasks"].items())  # fmt: skip
    print(f"eval: step {step} ({row['tokens']:,} tokens): {scores} [{row['engine']} on {row['device']}, "
          f"{row['seconds']:.0f} s; W&B {row['wandb']}]", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
