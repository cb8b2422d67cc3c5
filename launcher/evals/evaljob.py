"""`python -m launcher.evals.evaljob BUNDLE/job.json STEP KEY`: one eval job (the bundle's eval.sbatch, submitted by
the run's supervisor for an evaluated step, or by `jobs evaluate`; docs/evals.md). It reads the job's settings
(job.json) and the step's submission record (its settings: what to score). What it does, in order:

1. the step's result (in the bundle, launcher/evals/record.py) says it runs; a lease holds the step;
2. the step is exported as `jobs export` exports it (launcher/export/), into a scratch folder under the job's
   TMPDIR, float32 on a CPU (bfloat16 on a GPU), from the bucket's copy where the step is only there
   (--checkpoints_remote: fetched into the scratch folder too); the scratch folders of eval jobs killed before
   (SIGKILL at their time limit) are removed first;
3. lm-eval scores it on the tasks (its `hf` backend; `vllm` where the job's Python has vLLM and the job a GPU);
4. with held-out data, each domain's loss and bits per byte, and its documents' totals (`python -m
   launcher.train.domains`, in a child process: the launcher's side never imports the job's code);
5. the result: the bundle's evals/step-STEP-KEY.json (every task's metrics, the held-out figures, lm-eval's whole
   results but its samples, the job's seconds and GPU-hours, what ran, the items file), each item's row beside it
   (evals/step-STEP-KEY.items.npz, launcher/evals/items.py: from lm-eval's samples, which are not kept), the run's
   own W&B run (its id beside the checkpoints) keyed by step and tokens;
6. the lease dropped, the scratch folder removed.

A failure is recorded with its cause and the job exits 1; a SIGTERM (a preemption, a cancel, the time limit) records
"interrupted": Slurm requeues a preempted eval job, which starts the step again. Training never waits for an eval
job, nor hears of its end.
"""

from __future__ import annotations

import contextlib
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

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.errors import SlurmUnavailable
from launcher.evals import items, record, taskbuild
from launcher.evals.settings import EvalSettings
from launcher.export import checkpoints as found
from launcher.export.exporter import write
from launcher.nanotron_config.nanoset import heldout_domains
from launcher.node import job as job_file
from launcher.node.job import Job
from launcher.remote import fetch
from launcher.slurm import client

CPU_BATCH = 8  # lm-eval's batch on a CPU (lm_eval --batch_size 8 gives the same scores)
SCRATCH = "launcher-eval-"  # <TMPDIR>/launcher-eval-<job>-<step>-<random>: an eval job's scratch folder


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


def score(model: Path, settings: EvalSettings, backend: str, device: str, dtype: str) -> dict:
    """lm-eval's results for the exported model (its `results`, `groups`, `config`, ...), and its per-sample output
    under `samples` (log_samples: what launcher/evals/items.py keeps of it)."""
    import lm_eval

    args: dict[str, Any] = {"pretrained": str(model), "dtype": dtype}
    if backend == "vllm":
        args.update(tensor_parallel_size=1, gpu_memory_utilization=0.8)
    manager = taskbuild.manager(list(settings.tasks), list(settings.include))
    results = lm_eval.simple_evaluate(model=backend, model_args=args, tasks=list(settings.tasks), device=device,
                                      batch_size=CPU_BATCH if device == "cpu" else "auto", limit=settings.limit,
                                      task_manager=manager, log_samples=True)  # fmt: skip
    if not results:
        raise RuntimeError("lm-eval returned no results")
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


def heldout(job: Job, model: Path, where: str, scratch: Path) -> tuple[dict, dict[str, dict]]:
    """The held-out figures of each domain of `where` (--eval_heldout NAME=SOURCE,...: `python -m
    launcher.train.domains`, with this Python), and each domain's documents as per-item columns."""
    result = scratch / "heldout.json"
    argv = [sys.executable, "-m", "launcher.train.domains", "--config", str(job.config), "--model", str(model),
            "--result", str(result)]  # fmt: skip
    for name, source in heldout_domains(where):
        argv += ["--domain", name, source]
    done = subprocess.run(argv, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["the held-out loss failed"])[-1])
    found = json.loads(result.read_text(encoding="utf-8"))["domains"]
    figures = {name: {k: v for k, v in f.items() if k != "per_document"} for name, f in found.items()}
    return figures, {f"{items.HELDOUT}{name}": items.documents(f["per_document"]) for name, f in found.items()}


def project_of(job: Job) -> str | None:
    """The run's W&B project (its config's general.project)."""
    import yaml

    try:
        config = yaml.safe_load(job.config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    return (config.get("general") or {}).get("project")


def to_wandb(job: Job, row: dict) -> str:
    """The step's scores in the run's own W&B run (resumed by its id), keyed by step and tokens; what happened."""
    if job.wandb_disabled or os.environ.get("WANDB_MODE") == "disabled":
        return "disabled"
    id_file = job.checkpoints / P.WANDB_RUN_ID_FILE
    if not id_file.is_file():
        return f"not logged: the run has no W&B run ({id_file})"
    import wandb

    values = {f"eval/{task}/{metric}": v for task, metrics in row["tasks"].items() for metric, v in metrics.items()}
    values.update({f"eval/heldout/{name}/{k}": figures[k] for name, figures in (row["heldout"] or {}).items()
                   for k in ("loss", "bits_per_byte")})  # fmt: skip
    shared = os.environ.get("WANDB_MODE", "online") == "online"  # training writes to the same run meanwhile
    settings = wandb.Settings(mode="shared", x_primary=False, x_label=f"eval-{row['step']}") if shared else None
    w = wandb.init(project=project_of(job), id=id_file.read_text(encoding="utf-8").strip(), resume="allow",
                   settings=settings)  # fmt: skip
    w.define_metric("eval/tokens")
    w.define_metric("eval/*", step_metric="eval/tokens")
    w.log({"eval/step": row["step"], "eval/tokens": row["tokens"], **values})
    w.finish()
    return f"logged to W&B run {w.id}"


def evaluate(job: Job, settings: EvalSettings, step: int, scratch: Path, started: float) -> dict:
    backend, device, dtype = engine(settings.gpus)
    model = scratch / "model"
    marks = [time.time()]
    root = job.checkpoints
    if job.remote is not None and step not in ckpt.complete_steps(root):  # only in the bucket: a copy in the scratch
        root, bucket = scratch / "remote", fetch.bucket_of(job.remote, job.python)
        fetch.scratch_copy(bucket, step, root)
        print(f"eval: step {step} is not on disk: fetched from {bucket.step_url(step)}", flush=True)
    checkpoint = found.find(root, step, job.config)
    write(root, checkpoint, model, dtype, lambda c: {"run": job.run_name, "step": str(step),
                                                       "bundle": str(job.bundle)})  # fmt: skip
    marks.append(time.time())
    results = score(model, settings, backend, device, dtype)
    marks.append(time.time())
    figures, documents = heldout(job, model, settings.heldout, scratch) if settings.heldout else (None, {})
    marks.append(time.time())
    kept = items.write(job.bundle, step, settings.key, results.pop("samples", None) or {}, documents)
    marks.append(time.time())
    seconds = time.time() - started
    names = ("export", "lm_eval", "heldout", "items")
    phases = {name: round(b - a, 2) for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)}
    gpus = settings.gpus
    row = {"state": "done", "ended": round(time.time(), 3), "tokens": step * job.tokens_per_step,
           "tasks": metrics_of(results), "samples": samples_of(results), "items": kept, "heldout": figures,
           "job": os.environ.get("SLURM_JOB_ID", ""), "seconds": round(seconds, 1), "gpus": gpus,
           "gpu_hours": round(seconds * gpus / 3600, 6),
           "phases_s": phases, "engine": backend, "device": device, "dtype": dtype, "limit": settings.limit,
           "settings": settings.to_dict(), "lm_eval": results.get("lm_eval_version") or _version()}  # fmt: skip
    row["wandb"] = to_wandb(job, {**row, "step": step})
    return {**row, "lm_eval_results": results}


def _version() -> str:
    from importlib import metadata

    return metadata.version("lm_eval")


def remove_stale_scratch(tmp: Path, job: str) -> list[str]:
    """The scratch folders that eval jobs killed outright left under `tmp` (a SIGKILL at the time limit runs no
    `finally`), removed: those of jobs Slurm says have ended (one query for them all). Their names."""
    folders = {p: p.name[len(SCRATCH) :].split("-")[0] for p in tmp.glob(f"{SCRATCH}*") if p.is_dir()}
    others = {p: owner for p, owner in folders.items() if owner.isdigit() and owner != job}
    if not others:
        return []
    try:
        states = client.job_states_many(sorted(set(others.values())))
    except SlurmUnavailable:
        return []
    gone = [p for p, owner in others.items() if owner not in states or states[owner].terminal]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in gone]


def writable_caches(scratch: Path) -> list[str]:
    """Where the caches the eval job's libraries write cannot be written (a container's read-only home: the image's
    ~/.cache), they go under the scratch folder: the datasets' (HF_DATASETS_CACHE: a task over local files caches
    its Arrow tables there; a Hub dataset must then be in a mounted HF_HOME, as the checks before the queue say) and
    the others' (XDG_CACHE_HOME). What was moved, in words."""
    moved = []
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    caches = {"HF_DATASETS_CACHE": home / "datasets", "XDG_CACHE_HOME": Path.home() / ".cache"}
    for name, default in caches.items():
        where = Path(os.environ.get(name) or default)
        existing = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
        if not os.access(existing, os.W_OK):
            os.environ[name] = str(scratch / name.lower())
            moved.append(f"{name} ({where} cannot be written here)")
    return moved


def settings_of(job: Job, step: int, key: str) -> EvalSettings:
    """What to score: the step's submission record's settings (the run's --eval_tasks where it holds none)."""
    sub = record.submission(job.checkpoints, step, key) or {}
    if isinstance(sub.get("settings"), dict):
        return EvalSettings.from_dict(sub["settings"])
    if job.evals is not None and job.evals.key == key:
        return job.evals
    where = ckpt.eval_submission(job.checkpoints, step, key)
    raise RuntimeError(f"no eval settings for step {step} and key {key} in {where}")


def main(argv: list[str]) -> int:
    job, step, key = job_file.load(argv[0]), int(argv[1]), argv[2]
    started, slurm_job = time.time(), os.environ.get("SLURM_JOB_ID", "")
    os.environ.update({"TMPDIR": str(job.tmp_dir), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    if job.wandb_disabled:
        os.environ["WANDB_MODE"] = "disabled"
    signal.signal(signal.SIGTERM, _terminated)
    print(f"eval: job {slurm_job or '-'} on {os.uname().nodename}, step {step} of {job.bundle}", flush=True)
    row: dict = {"state": "running", "job": slurm_job, "started": round(started, 3)}
    lease, scratch, settings = None, None, None
    try:
        record.write_result(job.bundle, step, key, row)
        settings = settings_of(job, step, key)
        if removed := remove_stale_scratch(job.tmp_dir, slurm_job):
            print(f"eval: removed what eval jobs killed before left: {', '.join(removed)}", flush=True)
        lease = ckpt.take_lease(job.checkpoints, step, "eval")
        scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH}{slurm_job or os.getpid()}-{step}-", dir=job.tmp_dir))
        if moved := writable_caches(scratch):
            print(f"eval: caches under the scratch folder: {', '.join(moved)}", flush=True)
        row = evaluate(job, settings, step, scratch, started)
    except Interrupted as e:
        with contextlib.suppress(OSError):
            record.write_result(job.bundle, step, key, {**row, "state": "interrupted", "cause": str(e)})
        print(f"eval: step {step} interrupted: {e}", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    except Exception as e:  # noqa: BLE001  whatever failed, recorded with its cause: training is not affected
        cause = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        seconds = time.time() - started
        gpus = settings.gpus if settings is not None else 0
        with contextlib.suppress(OSError):
            record.write_result(job.bundle, step, key, {"state": "failed", "ended": round(time.time(), 3),
                                                        "cause": cause, "job": slurm_job,
                                                        "seconds": round(seconds, 1), "gpus": gpus,
                                                        "gpu_hours": round(seconds * gpus / 3600, 6)})  # fmt: skip
        print(f"eval: step {step} failed: {cause}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if lease is not None:
            ckpt.drop_lease(lease)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    record.write_result(job.bundle, step, key, row)
    scores = "; ".join(f"{t} " + ", ".join(f"{m} {v:.4g}" for m, v in ms.items() if "stderr" not in m)
                       for t, ms in row["tasks"].items())  # fmt: skip
    print(f"eval: step {step} ({row['tokens']:,} tokens): {scores} [{row['engine']} on {row['device']}, "
          f"{row['seconds']:.0f} s; W&B {row['wandb']}]", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
