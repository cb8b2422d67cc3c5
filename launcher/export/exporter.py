"""`python -m launcher.jobs export BUNDLE|JOB_ID [--step N] [--output DIR] [--dtype bfloat16|float32]`: a run's
checkpoint as a transformers Llama folder (docs/export.md). The run is read from its bundle: the checkpoints'
directory and the config from the manifest, the data and the command for the model card. A step that is only in the
run's bucket (--checkpoints_remote: removed from the disk by --keep_last, or a wiped scratch) is fetched into a
scratch folder first, and that folder removed after (launcher/remote/fetch.py)."""

from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from launcher import checkpoint_layout as ckpt
from launcher.bundle.manifest import Manifest
from launcher.export import checkpoints as found
from launcher.export.checkpoints import Checkpoint, ExportError
from launcher.node import job as job_file
from launcher.remote import fetch
from launcher.remote.client import RemoteError

DEFAULT_DTYPE = "bfloat16"


def default_output(run: Manifest, step: int) -> Path:
    """Beside the run's checkpoints (the engines read only step-numbered folders there)."""
    return run.checkpoints / f"hf-step-{step}"


def run_config(run: Manifest) -> Path:
    path = ((run.data.get("files") or {}).get("config") or {}).get("path")
    return Path(path) if path else run.bundle_dir / "config.yaml"


def _data(checkpoint: Checkpoint, run: Manifest) -> str:
    flags = run.flags
    said = str(flags.get("dataset") or "")
    stages = [s for s in checkpoint.config.get("data_stages") or [] if isinstance(s, dict)]
    if len(stages) > 1:
        said += " (stages: " + ", ".join(f"{s.get('name')} from step {s.get('start_training_step')}" for s in stages)
        said += ")"
    return said or "not recorded"


def card(run: Manifest, checkpoint: Checkpoint, dtype: str, argv: list[str]) -> dict[str, str]:
    parallel = checkpoint.config.get("parallelism") or {}
    layout = " x ".join(f"{k} {parallel[k]}" for k in ("dp", "tp", "pp") if k in parallel)
    trained_by = checkpoint.engine + (f" (nanotron {checkpoint.dialect})" if checkpoint.engine == "nanotron" else "")
    shape = checkpoint.shape
    return {
        "run": str(run.data.get("run_name") or run.bundle_dir.parent.name),
        "bundle": str(run.bundle_dir.resolve()),
        "job": str(run.job_id or "not submitted"),
        "step": str(checkpoint.step),
        "checkpoint": f"{checkpoint.directory} (engine {trained_by}; layout {layout or 'not recorded'})",
        "model": f"Llama, {shape.num_layers} layers, hidden {shape.hidden_size}, heads {shape.num_heads} "
        f"(kv {shape.num_kv_heads}), vocabulary {shape.vocab_size}, tied embeddings {shape.tie_word_embeddings}, "
        f"RoPE theta {shape.rope_theta:g}"
        + (
            " (trained with interleaved pairs; rows reordered for transformers)" if checkpoint.rope_interleaved else ""
        ),  # fmt: skip
        "data": _data(checkpoint, run),
        "trained by": f"`{run.data.get('command', 'not recorded')}` (in {run.data.get('cwd', '?')})",
        "exported by": f"`{shlex.join([sys.executable, '-m', 'launcher.jobs', *argv])}`",
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z") + f", weights in {dtype}",
    }


@contextlib.contextmanager
def readable(run: Manifest, step: int | None) -> Iterator[tuple[Path, int | None, str]]:
    """(a checkpoints folder that holds `step`, the step, where it came from): the run's own, or, for a step only its
    bucket has (the newest there where no step is asked and the disk has none), a scratch copy, leased on the run's
    folder while it is read (the bucket's retention leaves it be) and removed after."""
    local = ckpt.complete_steps(run.checkpoints)
    try:
        remote = job_file.load(run.bundle_dir).remote
    except job_file.JobFileError:
        remote = None
    if remote is None or (step in local if step is not None else bool(local)):
        yield run.checkpoints, step, ""
        return
    bucket = fetch.bucket_of(remote, sys.executable)
    try:
        step = step if step is not None else bucket.listing().newest
        if step is None:
            raise ExportError(
                f"neither {run.checkpoints} nor the run's bucket {bucket.url} holds a complete checkpoint"
            )
        with tempfile.TemporaryDirectory(prefix="launcher-fetch-") as scratch, ckpt.leased(run.checkpoints, step,
                                                                                            "export"):  # fmt: skip
            started = time.monotonic()
            there = fetch.scratch_copy(bucket, step, Path(scratch))
            print(f"Step {step} is not on disk: fetched from {bucket.step_url(step)} ({there.bytes / 1e6:.1f} MB in "
                  f"{time.monotonic() - started:.1f} s)", flush=True)  # fmt: skip
            yield Path(scratch), step, bucket.step_url(step)
    except RemoteError as e:
        raise ExportError(f"step {step} could not be fetched from the run's bucket: {e}") from None


def export(run: Manifest, step: int | None, output: Path | None, dtype: str, argv: list[str]) -> int:
    """Export the run's checkpoint at `step` (default: the newest complete one); prints where it went."""
    started = time.monotonic()
    with readable(run, step) as (root, step, url):
        checkpoint = found.find(root, step, run_config(run))
        target = output or default_output(run, checkpoint.step)

        def card_of(c: Checkpoint) -> dict[str, str]:
            said = card(run, c, dtype, argv)
            return {**said, "checkpoint": said["checkpoint"].replace(str(c.directory), url)} if url else said

        size = write(root, checkpoint, target, dtype, card_of)
    print(f"Exported step {checkpoint.step} of {run.bundle_dir.resolve()} ({checkpoint.engine} engine) to {target}: "
          f"{size / 2**20:.1f} MiB of {dtype} weights in {time.monotonic() - started:.1f} s.")  # fmt: skip
    print(f"  load it: AutoModelForCausalLM.from_pretrained({str(target)!r})")
    return 0


def write(checkpoints: Path, checkpoint: Checkpoint, target: Path, dtype: str,
          card_of: Callable[[Checkpoint], dict[str, str]]) -> int:  # fmt: skip
    """`checkpoint` (found in `checkpoints` by `found.find`) written as a transformers folder at `target`, its step
    leased while it is read (the run's retention leaves it be); the bytes of weights written. `jobs export` and the
    eval job both export through here."""
    from launcher.export import folder, weights  # torch and safetensors: only for an export

    if dtype not in folder.DTYPES:
        raise ExportError(f"--dtype {dtype}: not one of {', '.join(folder.DTYPES)}")
    with ckpt.leased(checkpoints, checkpoint.step, "export") as lease:
        if checkpoint.step not in ckpt.complete_steps(checkpoints):
            raise found.StepNotFound(f"checkpoint step {checkpoint.step} was removed as the export began (the run "
                                     "keeps only what --keep_last/--keep_every say): export a step it keeps "
                                     "(`python -m launcher.jobs checkpoints` lists them)")  # fmt: skip
        if lease is None:
            print(f"warning: no lease could be taken in {checkpoints} (not writable): the run's retention may "
                  f"remove step {checkpoint.step} while it is read")  # fmt: skip
        if checkpoint.tokenizer:  # the tokenizer's vocabulary, not the config's rounding of it nor the engine's padding
            checkpoint = checkpoint.with_vocabulary(folder.vocabulary(checkpoint.tokenizer))
        groups = weights.groups(checkpoint)
        return folder.write(target, checkpoint, groups, dtype, card_of(checkpoint))
