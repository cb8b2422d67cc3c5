"""The training job end to end on CPU: real torch, real gloo process groups, real torchrun, no mocks."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pytest
import torch
import torch.distributed as dist
import yaml
from conftest import ROOT, bundle_of, tiny_config, write_config
from torch.utils.data import DataLoader

from launcher import protocol as P
from launcher.errors import TrainError
from launcher.train.data import PackedWindows, RandomTokens, load_texts, pack
from launcher.train.environment import JobEnvironment
from launcher.train.settings import TrainConfig, load_train_config
from launcher.train.stop import StopRequest, deaf_workers
from launcher.train.torch_engine import engine as torch_engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import DemoData

STEP_LINE = re.compile(
    r"^step (\d+)/(\d+) \| loss \d+\.\d{4} \| lr \d\.\d{4}e[+-]\d\d \| grad_norm \d+\.\d{3} \| tokens/s \d+ \| "
    r"tokens/s/gpu \d+ \| mfu -$"
)


def _load_door() -> Any:
    spec = importlib.util.spec_from_file_location("run_train", ROOT / "run_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_train = _load_door()


def door(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    """run_train.py in this process: (exit code, stdout, stderr)."""
    code = run_train.main(["--config-file", str(config), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def metrics(path: Path) -> dict[int, dict]:
    """The metrics file by step (the last line of a step wins, as the launcher reads it)."""
    return {m["step"]: m for m in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for name in ("LAUNCHER_BUNDLE", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_tiny_llama_learns_the_demo_data(
    demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # wandb must work without network
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("LAUNCHER_BUNDLE", str(tmp_path))  # its metrics.jsonl
    config = write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))

    code, out, err = door(config, capsys)

    assert code == 0, err
    assert "engine: torch (auto: no CUDA GPU, so no nanotron)" in out
    assert (
        "engine torch | world size 1 | device cpu | dtype torch.float32 | parameters 26,784 | global batch 8 "
        "sequences (512 tokens) | steps 1..30" in out
    )
    assert "note: model.dtype is bfloat16; on CPU the torch engine trains in float32" in out
    step_lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(step_lines) == 30 and all(STEP_LINE.match(line) for line in step_lines), step_lines[:2]
    m = metrics(tmp_path / P.METRICS)
    assert sorted(m) == list(range(1, 31))
    losses = [m[s]["loss"] for s in range(1, 31)]
    assert np.mean(losses[:5]) - np.mean(losses[-5:]) > 1.0, losses
    assert all(m[s]["mfu"] is None and m[s]["tokens_per_s"] > 0 and m[s]["grad_norm"] > 0 for s in m)
    assert m[1]["lr"] == 0.0 and m[4]["lr"] == pytest.approx(0.01)  # nanotron's warmup: step s uses lambda(s-1)
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "30"
    assert list((tmp_path / "wandb").glob("offline-run-*")), "wandb offline run not written"


@pytest.mark.parametrize("mixed", [False, True], ids=["one-dataset", "mixture"])
def test_stop_and_resume_continue_exactly_like_an_uninterrupted_run(
    demo_data: DemoData,
    second_dataset: Path,
    mixed: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = {str(demo_data.dataset): 0.5, str(second_dataset): 0.3} if mixed else str(demo_data.dataset)

    def leg(name: str, ckpt: str, **overrides: Any) -> tuple[int, str]:
        overrides = {"checkpoints.checkpoint_interval": 5, "data.dataset.hf_dataset_or_datasets": data, **overrides}
        config = tiny_config(demo_data, tmp_path / ckpt, **overrides)
        monkeypatch.setenv("LAUNCHER_BUNDLE", str(bundle_of(tmp_path, ckpt)))
        code, out, err = door(write_config(tmp_path / f"{name}.yaml", config), capsys)
        assert code == 0, err
        return code, out

    _, out = leg("straight", "a", **{"tokens.train_steps": 20})
    assert "data: the dataset is exhausted; epoch 2 begins at step" in out  # the run loops over the data

    leg("first", "b", **{"tokens.train_steps": 10})  # same schedule (explicit decay steps): stops at 10
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        ".data-cache",
        "10",
        "5",
        "engine",
        "latest",
        "nanotron-dialect",
        "saves",  # the steps the engine saved: 5, 10 (retention's to remove, where asked)
    ]
    assert (tmp_path / "b" / "saves").read_text() == "5\n10\n"
    stop_file, outcome = bundle_of(tmp_path, "b") / P.STOP_FILE, bundle_of(tmp_path, "b") / P.OUTCOME_FILE
    stop_file.touch()
    _, out = leg("second", "b", **{"tokens.train_steps": 20})
    assert f"resumed from checkpoint step 10 ({tmp_path / 'b' / '10'})" in out
    assert out.strip().endswith("stop requested: checkpoint saved at step 11; exiting")
    assert not stop_file.exists(), "the stop request must be consumed so the requeued job trains on"
    assert outcome.read_text() == "stopped 11\n", "the batch script requeues on this"
    _, out = leg("third", "b", **{"tokens.train_steps": 20})
    assert "resumed from checkpoint step 11" in out and "training finished at step 20" in out
    assert outcome.read_text() == "finished 20\n", "and never requeues this"

    straight, resumed = metrics(bundle_of(tmp_path, "a") / P.METRICS), metrics(bundle_of(tmp_path, "b") / P.METRICS)
    assert sorted(resumed) == sorted(straight) == list(range(1, 21))
    for key in ("loss", "lr", "grad_norm"):
        a = torch.tensor([straight[s][key] for s in range(1, 21)], dtype=torch.float64)
        b = torch.tensor([resumed[s][key] for s in range(1, 21)], dtype=torch.float64)
        assert torch.allclose(a, b, rtol=1e-7, atol=0), (key, a - b)
    final_a = torch.load(tmp_path / "a" / "20" / "state.pt", weights_only=True)["model"]
    final_b = torch.load(tmp_path / "b" / "20" / "state.pt", weights_only=True)["model"]
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)

    _, out = leg("again", "b", **{"tokens.train_steps": 20})
    assert "run already finished: checkpoint step 20, train_steps 20" in out

    # a request that lands on the last step: checkpointed, consumed, and the run counts as finished (no marker)
    stop_file.touch()
    _, out = leg("fourth", "b", **{"tokens.train_steps": 21})
    assert "training finished at step 21" in out and "preempted" not in out
    assert not stop_file.exists() and outcome.read_text() == "finished 21\n"


def test_half_written_checkpoints_are_never_loaded(
    demo_data: DemoData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"

    def run(steps: int) -> str:
        config = tiny_config(demo_data, ckpt, **{"tokens.train_steps": steps, "checkpoints.checkpoint_interval": 5})
        code, out, err = door(write_config(tmp_path / "c.yaml", config), capsys)
        assert code == 0, err
        return out

    def steps_on_disk() -> list[str]:
        return sorted((p.name for p in ckpt.iterdir() if p.name.isdigit()), key=int)

    run(5)
    for broken in (ckpt / ".tmp-8-dead", ckpt / "8"):  # an interrupted save, and one whose pointer never moved
        broken.mkdir()
        (broken / "state.pt").write_bytes(b"half a checkpoint")
    out = run(8)
    assert f"checkpoint {ckpt / '8'} cannot be read" in out and ".tmp-8-dead" in out  # named, skipped, cleaned
    assert "resumed from checkpoint step 5" in out and "training finished at step 8" in out
    assert (ckpt / "latest").read_text().strip() == "8" and not list(ckpt.glob(".tmp-*"))
    assert torch.load(ckpt / "8" / "state.pt", weights_only=True)["step"] == 8  # the broken 8/ was replaced

    # A damaged pointer costs a warning, never the run: the newest complete checkpoint is taken, nothing is deleted.
    for pointer, said, resumed, steps in (
        ("9\n", "names step 9, which is not a complete checkpoint", 8, 10),  # dangling
        ("", "does not name a step", 10, 12),  # empty
        ("\x00garbage", "does not name a step", 12, 14),  # damaged
    ):
        (ckpt / "latest").write_text(pointer)
        out = run(steps)
        assert said in out and f"resumed from checkpoint step {resumed} " in out, out
        assert steps_on_disk() == ["5", "8", "10", "12", "14"][: ["5", "8", "10", "12", "14"].index(str(steps)) + 1]
    (ckpt / "latest").unlink()
    (ckpt / "14" / "state.pt").write_bytes((ckpt / "14" / "state.pt").read_bytes()[:1000])  # a truncated newest
    out = run(16)
    assert "latest is missing" in out and f"checkpoint {ckpt / '14'} cannot be read" in out
    assert "resumed from checkpoint step 12 " in out and steps_on_disk() == ["5", "8", "10", "12", "14", "15", "16"]
    assert (ckpt / "14" / "state.pt").stat().st_size == 1000  # skipped, and left as it was for a person to look at


def test_a_save_that_fails_keeps_the_previous_checkpoint(
    demo_data: DemoData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real full disk: a tmpfs with room for two checkpoints and a half holds them (root mounts it; CI runs as
    root). The run saves every 2 steps of 6: the third save fails."""
    probe = tiny_config(demo_data, tmp_path / "probe", **{"tokens.train_steps": 1})
    assert door(write_config(tmp_path / "p.yaml", probe), capsys)[0] == 0
    one = sum(f.stat().st_size for f in (tmp_path / "probe" / "1").iterdir())
    disk = tmp_path / "small"
    disk.mkdir()
    size = f"size={int(2.5 * one) // 4096 * 4096 + 8192}"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(disk)], capture_output=True)
    assert mounted.returncode == 0, mounted.stderr  # the test needs root, as the local cluster does
    try:
        config = tiny_config(
            demo_data, disk / "ckpt", **{"tokens.train_steps": 6, "checkpoints.checkpoint_interval": 2}
        )
        code, out, err = door(write_config(tmp_path / "c.yaml", config), capsys)
        assert code == 2 and err.count("\n") == 1, err  # one line, no traceback
        assert "checkpoint step" in err and "No space left on device" in err and "is still step" in err
        saved = sorted(p.name for p in (disk / "ckpt").iterdir() if not p.name.startswith("."))
        assert (disk / "ckpt" / "latest").read_text().strip() in saved  # the pointer names a whole checkpoint
        assert not list((disk / "ckpt").glob(".tmp-*"))  # the failed save left nothing behind
    finally:
        gc.collect()  # the failed run's frames (its traceback) still hold the memory-mapped data cache on the tmpfs
        unmounted = subprocess.run(["umount", str(disk)], capture_output=True, text=True)
        assert unmounted.returncode == 0, unmounted.stderr


def test_resume_checkpoint_path_starts_a_new_run_from_another_runs_checkpoint(
    demo_data: DemoData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tiny_config(demo_data, tmp_path / "first", **{"tokens.train_steps": 4})
    assert door(write_config(tmp_path / "first.yaml", first), capsys)[0] == 0
    for given in (tmp_path / "first", tmp_path / "first" / "4"):  # a checkpoints root (its latest), or a checkpoint
        shutil.rmtree(tmp_path / "second", ignore_errors=True)
        second = tiny_config(
            demo_data,
            tmp_path / "second",
            **{"tokens.train_steps": 6, "checkpoints.resume_checkpoint_path": str(given)},
        )
        code, out, err = door(write_config(tmp_path / "second.yaml", second), capsys)
        assert code == 0, err
        assert f"resumed from checkpoint step 4 ({tmp_path / 'first' / '4'})" in out and "steps 5..6" in out
        assert (tmp_path / "second" / "latest").read_text().strip() == "6"

    bad = tiny_config(demo_data, tmp_path / "third", **{"checkpoints.resume_checkpoint_path": str(tmp_path)})
    code, _, err = door(write_config(tmp_path / "third.yaml", bad), capsys)
    assert code == 2 and f"error: resume_checkpoint_path {tmp_path} is not a checkpoint of this engine" in err


TORCHRUN_WITH_SIGTERM_BLOCKED = (
    "import os, signal, sys\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'torch.distributed.run', *sys.argv[1:]])"
)


def torchrun_two_ranks(config: Path, env: dict, cwd: Path) -> subprocess.Popen:
    """torchrun with two ranks, started as the node step starts it (SIGTERM blocked)."""
    argv = [sys.executable, "-c", TORCHRUN_WITH_SIGTERM_BLOCKED, "--nproc_per_node", "2", "--standalone",
            str(ROOT / "run_train.py"), "--config-file", str(config)]  # fmt: skip
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def signal_tree(pid: int, sig: int) -> list[int]:
    """Send `sig` to a process and all its descendants at once, as slurmstepd signals every process of a step
    (torchrun starts each rank in a session of its own, so a process group would not reach them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, sig)
    return tree


def test_two_ranks_stopped_by_sigterm_resume_to_the_same_weights(demo_data: DemoData, tmp_path: Path) -> None:
    from launcher.train.torch_engine import checkpoint

    ddp = {"parallelism.dp": 2, "tokens.batch_accumulation_per_replica": 1, "checkpoints.checkpoint_interval": 1000}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}

    def run(name: str, ckpt: str, steps: int, stop_after: int | None = None) -> str:
        config = tiny_config(demo_data, tmp_path / ckpt, **ddp, **{"tokens.train_steps": steps})
        metrics_file = bundle_of(tmp_path, name) / P.METRICS
        job_env = {**env, "LAUNCHER_BUNDLE": str(bundle_of(tmp_path, name))}
        proc = torchrun_two_ranks(write_config(tmp_path / f"{name}.yaml", config), job_env, tmp_path)
        if stop_after is not None:
            deadline = time.monotonic() + 120
            while not (metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= stop_after):
                assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            assert len(signal_tree(proc.pid, signal.SIGTERM)) >= 3  # torchrun (which has it blocked) and both ranks
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-2000:] + err[-3000:]
        return out

    steps = 120  # long enough that the signal lands well before the end on any machine
    run("straight", "a", steps)
    out = run("first", "b", steps, stop_after=3)
    first = (bundle_of(tmp_path, "first") / P.OUTCOME_FILE).read_text()
    stopped = int(first.split()[1])
    assert first.startswith("stopped ") and 3 <= stopped < steps, out
    assert f"stop requested: checkpoint saved at step {stopped}; exiting" in out

    # The RNG states saved with the checkpoint are replaced by others: the resumed run must report exactly those
    # (a restore that did nothing would report the fresh run's states).
    saved = torch.load(tmp_path / "b" / str(stopped) / "state.pt", weights_only=False)
    before = checkpoint.capture_rng()
    try:
        torch.manual_seed(1234)
        np.random.seed(1234)
        random.seed(1234)
        planted = checkpoint.capture_rng()
        expected = checkpoint.rng_digest()
    finally:
        checkpoint.restore_rng(before)
    saved["rng"] = [planted, planted]
    torch.save(saved, tmp_path / "b" / str(stopped) / "state.pt")

    out = run("second", "b", steps)
    assert f"resumed from checkpoint step {stopped} ({tmp_path / 'b' / str(stopped)}); rng digest {expected}" in out
    straight = torch.load(tmp_path / "a" / str(steps) / "state.pt", weights_only=True)["model"]
    resumed = torch.load(tmp_path / "b" / str(steps) / "state.pt", weights_only=True)["model"]
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_two_torchrun_ranks_stay_in_sync_and_match_one_process(
    demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = {"tokens.train_steps": 6, "checkpoints.checkpoint_interval": 3}
    config = tiny_config(
        demo_data, tmp_path / "ddp", **steps, **{"parallelism.dp": 2, "tokens.batch_accumulation_per_replica": 1}
    )
    env = {**os.environ, "LAUNCHER_BUNDLE": str(bundle_of(tmp_path, "ddp")), "OMP_NUM_THREADS": "1"}
    cwd = tmp_path / "elsewhere"  # run_train.py must work from any directory
    cwd.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            str(ROOT / "run_train.py"),
            "--config-file",
            str(write_config(tmp_path / "ddp.yaml", config)),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "engine torch | world size 2 | device cpu" in proc.stdout
    assert len(list((tmp_path / "ddp" / ".data-cache").glob("windows-*.npy"))) == 1  # tokenized once, shared
    for step in ("3", "6"):
        meta = json.loads((tmp_path / "ddp" / step / "meta.json").read_text())
        checksums = meta["parameter_checksums"]
        assert len(checksums) == 2 and checksums[0] == checksums[1], checksums
    final = torch.load(tmp_path / "ddp" / "6" / "state.pt", weights_only=True)
    assert len(final["rng"]) == 2  # every rank's RNG state is kept

    # The same global batch on one process (2 micro-batches accumulated) sees the same windows per step, so the
    # losses agree up to float summation order: gradients really are averaged across the two ranks.
    single = tiny_config(demo_data, tmp_path / "one", **steps)
    monkeypatch.setenv("LAUNCHER_BUNDLE", str(bundle_of(tmp_path, "one")))
    code, _, err = door(write_config(tmp_path / "one.yaml", single), capsys)
    assert code == 0, err
    two, one = metrics(bundle_of(tmp_path, "ddp") / P.METRICS), metrics(bundle_of(tmp_path, "one") / P.METRICS)
    assert sorted(two) == sorted(one) == list(range(1, 7))
    assert [two[s]["loss"] for s in two] == pytest.approx([one[s]["loss"] for s in one], rel=1e-4)
    assert two[6]["tokens_per_s_per_gpu"] == pytest.approx(two[6]["tokens_per_s"] / 2)


@pytest.mark.parametrize(
    ("overrides", "extra", "expected"),
    [
        ({"data.dataset.hf_dataset_or_datasets": "/no/such/dataset"}, (), "dataset path /no/such/dataset does not"),
        ({"data.dataset.hf_dataset_or_datasets": "someone/not-cached"}, (), "could not load dataset 'someone/not-"),
        ({"model.model_config.vocab_size": 16}, (), "but the model's vocab_size is 16: use --vocab_size"),
        ({"tokenizer.tokenizer_name_or_path": "/no/such/tokenizer"}, (), "could not load tokenizer '/no/such/tok"),
        ({"data.dataset.text_column_name": "body"}, (), "has no column 'body' (columns: text)"),
        ({"parallelism.dp": 2}, (), "cannot train with 1 process(es):\n  - --dp"),
        ({}, ("--engine", "nanotron"), "the nanotron engine needs a CUDA GPU"),
        ({"model.init_method": {"path": "/ckpt/x"}}, (), "the torch engine cannot start from nanotron weights"),
    ],
)
def test_user_errors_are_one_message_and_exit_2(
    demo_data: DemoData,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    overrides: dict,
    extra: tuple[str, ...],
    expected: str,
) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt", **overrides))
    code, _, err = door(config, capsys, *extra)
    assert code == 2
    assert err.startswith("error: ") and expected in err, err
    assert "Traceback" not in err
    assert not dist.is_initialized()  # the process group is torn down after a failure


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = door(tmp_path / "nope.yaml", capsys)
    assert (code, err.count("\n")) == (2, 1) and err.startswith(f"error: cannot read config file {tmp_path}")


def test_tensor_or_pipeline_parallel_needs_the_nanotron_engine(demo_data: DemoData, tmp_path: Path) -> None:
    cfg = load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))
    for change in ({"tp": 2}, {"pp": 2}):
        with pytest.raises(TrainError, match="data parallel only.*--engine nanotron"):
            torch_engine.train(dataclasses.replace(cfg, **change))


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_stop_request_by_signal_reaches_every_rank(sig: int) -> None:
    before = signal.getsignal(sig)
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})  # as the node step starts torchrun: blocked until training
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # A notice that comes while the job starts: pending, not lost. (To this thread: in the job every thread has it
    # blocked, inherited from the node step; here other tests' threads may not, and would take a process signal.)
    signal.pthread_kill(threading.main_thread().ident, sig)
    stop = StopRequest(torch.device("cpu"), JobEnvironment())
    try:
        assert sig not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # unblocked by the request
        assert stop.agreed()
    finally:
        stop.close()
        dist.destroy_process_group()
    assert signal.getsignal(sig) is before  # the handler that was there is back


def record_the_threads(into: Path) -> Callable[[int], None]:
    """A loader worker's own init (under the launcher's): the names of the worker's threads, written to `into`."""
    return lambda worker_id: into.write_text(" ".join(sorted(t.name for t in threading.enumerate())))


def test_a_loader_worker_leaves_slurms_notice_to_its_training_process(tmp_path: Path) -> None:
    """Slurm's SIGTERM reaches every process of the step: a loader worker keeps loading through it (the training
    process saves, then ends), and goes when its own training process terminates it, as torch's shutdown does.
    So with a thread that a library starts in every forked child before the worker's init: wandb, logging online,
    runs OpenTelemetry's export threads, restarted in each child by an at-fork hook (here OpenTelemetry's own
    periodic metric reader); with SIGTERM open in such a thread the notice ended the worker (one run in three)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=io.StringIO()), export_interval_millis=3600_000)
    provider = MeterProvider(metric_readers=[reader])
    try:
        threads = tmp_path / "threads"
        loader = DataLoader(range(4000), batch_size=2, num_workers=1, worker_init_fn=record_the_threads(threads))
        deaf_workers(loader)
        batches = iter(loader)
        first = next(batches)
        assert "OtelPeriodicExportingMetricReader" in threads.read_text()  # the at-fork thread, there before init
        worker = batches._workers[0]  # type: ignore[attr-defined]
        subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # another sender, as slurmstepd
        assert [int(b[0]) for b in [first, *batches]] == list(range(0, 4000, 2))  # every batch, none lost
        again = iter(loader)
        next(again)
        worker = again._workers[0]  # type: ignore[attr-defined]
        os.kill(worker.pid, signal.SIGTERM)  # from its training process
        worker.join(timeout=120)
        assert worker.exitcode == 0
        del again
    finally:
        provider.shutdown()


def test_windows_overlap_by_one_token_like_nanotron() -> None:
    windows = pack([[10, 11, 12], [13, 14], [15, 16, 17, 18]], eos_id=2, sequence_length=3)
    # stream: 10 11 12 2 13 14 2 15 16 17 18 2 -> (12 - 1) // 3 = 3 windows of 4 tokens, stride 3
    assert windows.tolist() == [[10, 11, 12, 2], [2, 13, 14, 2], [2, 15, 16, 17]]


def test_windows_are_sharded_over_ranks_and_reshuffled_each_epoch() -> None:
    windows = np.arange(11 * 3, dtype=np.int64).reshape(11, 3)  # window i starts with token 3 i
    ranks = [PackedWindows(windows, micro_batch_size=1, seed=5, rank=r, dp=2) for r in range(2)]
    assert ranks[0].per_rank == 5  # 11 windows over 2 ranks: 5 each, one left out per epoch

    def taken(r: int, epoch: int) -> list[int]:
        return [int(ranks[r].micro_batch(k)[0, 0]) // 3 for k in range(epoch * 5, epoch * 5 + 5)]

    order = np.random.default_rng([5, 0]).permutation(11)
    assert taken(0, 0) == order[0:10:2].tolist() and taken(1, 0) == order[1:10:2].tolist()
    assert taken(0, 1) != taken(0, 0)  # epoch 2 reshuffles
    assert ranks[0].epoch(4) == 0 and ranks[0].epoch(5) == 1
    again = PackedWindows(windows, micro_batch_size=1, seed=5, rank=0, dp=2)
    assert [int(again.micro_batch(k)[0, 0]) for k in (7, 2, 7)] == [
        int(ranks[0].micro_batch(k)[0, 0]) for k in (7, 2, 7)
    ]
    with pytest.raises(TrainError, match="fewer than the 12 data-parallel ranks"):
        PackedWindows(windows, micro_batch_size=1, seed=5, rank=0, dp=12)


def test_random_tokens_depend_on_seed_rank_and_position() -> None:
    a = RandomTokens(vocab_size=50, sequence_length=8, micro_batch_size=2, seed=1, rank=0)
    assert a.micro_batch(3).shape == (2, 9) and int(a.micro_batch(3).max()) < 50
    assert torch.equal(a.micro_batch(3), a.micro_batch(3))
    assert not torch.equal(a.micro_batch(3), a.micro_batch(4))
    assert not torch.equal(a.micro_batch(3), RandomTokens(50, 8, 2, seed=1, rank=1).micro_batch(3))


@pytest.fixture
def base_cfg(demo_data: DemoData, tmp_path: Path) -> TrainConfig:
    return load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ckpt"))))


def test_a_corpus_tokenized_a_chunk_at_a_time_packs_the_same_windows(base_cfg: TrainConfig) -> None:
    """The torch engine's tokenization at start (`tokenize_and_pack`) takes the texts a chunk at a time, so that
    only the tokens and the windows of a large corpus are held (bench_nanoset.py: 1.04 GB of text took over 24 GB
    all at once): the windows are those of the whole text list tokenized and packed in one go, however it is cut."""
    from launcher.train.data import build_windows, tokenize, tokenize_and_pack

    texts = load_texts(base_cfg)
    whole = pack(*tokenize(base_cfg, texts), base_cfg.sequence_length)
    assert len(whole) > 10
    for chunk in (1, 7, len(texts) - 1, len(texts) + 5):
        assert np.array_equal(tokenize_and_pack(base_cfg, texts, chunk=chunk), whole), chunk
    assert np.array_equal(build_windows(base_cfg), whole)


def test_data_files_and_splits(base_cfg: TrainConfig, tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"text": "a b"}\n{"text": "c"}\n')
    (tmp_path / "d.txt").write_text("first line\nsecond line\n")
    assert load_texts(dataclasses.replace(base_cfg, dataset=str(tmp_path / "d.jsonl"))) == ["a b", "c"]
    assert load_texts(dataclasses.replace(base_cfg, dataset=str(tmp_path / "d.txt"))) == ["first line", "second line"]
    shutil.copy(tmp_path / "d.txt", tmp_path / "d.xml")
    with pytest.raises(TrainError, match="unknown type"):
        load_texts(dataclasses.replace(base_cfg, dataset=str(tmp_path / "d.xml")))

    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["t"]}),
            "validation": datasets.Dataset.from_dict({"text": ["v"]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "dd"))
    cfg = dataclasses.replace(base_cfg, dataset=str(tmp_path / "dd"), dataset_split="validation")
    assert load_texts(cfg) == ["v"]
    with pytest.raises(TrainError, match=r"no split 'test'; it has \['train', 'validation'\]"):
        load_texts(dataclasses.replace(cfg, dataset_split="test"))


def test_nanotron_engine_uses_nanotron_04s_real_api() -> None:
    """The nanotron engine cannot run on CPU; check what it calls against nanotron 0.4's source instead."""
    import ast
    import inspect

    from launcher.train.nanotron_engine import engine as nanotron_engine

    spec = importlib.util.find_spec("nanotron")
    assert spec is not None and spec.submodule_search_locations, "nanotron (a dependency) is not installed"
    package = Path(next(iter(spec.submodule_search_locations)))

    def functions(module: str) -> dict[str, list[str]]:
        tree = ast.parse((package / module).read_text())
        return {f.name: [a.arg for a in f.args.args + f.args.kwonlyargs] for f in ast.walk(tree)
                if isinstance(f, ast.FunctionDef)}  # fmt: skip

    trainer, loader = functions("trainer.py"), functions("dataloader.py")
    for hook in ("post_init", "post_train_step", "train_step_logs", "save_checkpoint"):
        assert hook in trainer, hook
    assert trainer["train_step_logs"] == ["self", "outputs", "loss_avg"]
    trainer_source = (package / "trainer.py").read_text()
    for fact in ("self.post_init()", "self.post_train_step()", "self.iteration_start_time = time.time()",
                 "self.consumed_train_samples += self.global_batch_size", "self.logger_ranks ="):  # fmt: skip
        assert fact in trainer_source, fact
    ours = inspect.getsource(nanotron_engine._dataloader) + inspect.getsource(nanotron_engine.packed_dataset)
    for name in ("get_train_dataloader", "dummy_infinite_data_generator"):
        call = next(
            n for n in ast.walk(ast.parse(ours)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == name
        )
        # (`**extra` carries main's use_position_ids, for main's loader only: tests/test_nanotron_main_cpu.py)
        assert {k.arg for k in call.keywords if k.arg is not None} <= set(loader[name]), name


@pytest.mark.parametrize("form", ["save_to_disk", "DatasetDict", "jsonl"])
def test_nanotron_engine_packs_every_local_dataset_form(form: str, base_cfg: TrainConfig, tmp_path: Path) -> None:
    """nanotron 0.4's get_datasets (load_dataset(path)) reads none of these but the DatasetDict, and its
    clm_process calls a tokenizer method transformers 5 removed: the engine packs them as the torch engine does."""
    from launcher.train.data import load_tokenizer
    from launcher.train.nanotron_engine.engine import packed_dataset

    texts = [f"the {'old' if i % 2 else 'young'} cat chases the mouse at night ." for i in range(40)]
    if form == "save_to_disk":
        datasets.Dataset.from_dict({"body": texts}).save_to_disk(str(tmp_path / "ds"))
        target = tmp_path / "ds"
    elif form == "DatasetDict":
        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": texts})}).save_to_disk(str(tmp_path / "ds"))
        target = tmp_path / "ds"
    else:
        target = tmp_path / "d.jsonl"
        target.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    cfg = dataclasses.replace(
        base_cfg, dataset=str(target), text_column="body", sequence_length=16, checkpoints_path=str(tmp_path / "ck")
    )
    tokenizer = load_tokenizer(cfg)
    before = sorted(tmp_path.rglob("*"))

    packed = packed_dataset(cfg, tokenizer, overwrite_cache=True)

    # the cache never lands beside the dataset (which may be read-only): under checkpoints_path, one per packing
    made = [p for p in sorted(tmp_path.rglob("*")) if p not in before and p.is_file()]
    assert made and all(p.is_relative_to(tmp_path / "ck" / ".data-cache") for p in made), made
    assert [c["filename"] for c in packed.cache_files] == [str(p) for p in made if p.suffix == ".arrow"]
    shorter = packed_dataset(dataclasses.replace(cfg, sequence_length=8), tokenizer)
    assert shorter.cache_files != packed.cache_files and len(shorter[0]["input_ids"]) == 9

    rows = packed["input_ids"]
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert np.array_equal(np.array(rows), pack(token_lists, tokenizer.eos_token_id, 16))  # one batch: same windows
    assert tokenizer.convert_ids_to_tokens(rows[0])[:5] == ["the", "young", "cat", "chases", "the"]
    if form == "jsonl":
        _check_nanotron_dataloader(packed, micro_batch_size=2, sequence_length=16)


def _check_nanotron_dataloader(packed: datasets.Dataset, micro_batch_size: int, sequence_length: int) -> None:
    """nanotron 0.4's own get_train_dataloader over the packed rows, in a one-process gloo group (its
    ParallelContext needs NCCL; the dataloader only asks it for the pp and dp groups)."""
    import types

    from launcher.train.nanotron_engine import compat as nanotron_compat

    nanotron_compat.apply()
    from nanotron.dataloader import get_train_dataloader

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        groups = types.SimpleNamespace(pp_pg=dist.group.WORLD, dp_pg=dist.group.WORLD)
        loader = get_train_dataloader(
            train_dataset=packed, sequence_length=sequence_length, parallel_context=groups, input_pp_rank=0,
            output_pp_rank=0, micro_batch_size=micro_batch_size, consumed_train_samples=0, dataloader_num_workers=0,
            seed_worker=1, dataloader_drop_last=True, dataloader_pin_memory=False,
        )  # fmt: skip
        batch = next(iter(loader))
    finally:
        dist.destroy_process_group()
    assert batch["input_ids"].shape == (micro_batch_size, sequence_length)
    assert batch["label_ids"].shape == (micro_batch_size, sequence_length)
    assert torch.equal(batch["input_ids"][:, 1:], batch["label_ids"][:, :-1])  # labels: the inputs shifted by one


def test_the_loss_module_is_the_causal_lm_loss_and_the_gpu_wrapping_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from launcher.nanotron_config.shape import ModelShape
    from launcher.train.torch_engine.model import WithLoss, build_model, compile_for_gpu

    shape = ModelShape(32, 64, 2, 4, 2, 128, 64, tie_word_embeddings=True, rms_norm_eps=1e-5)
    model = build_model(shape, init_std=0.02, seed=0)
    tokens = torch.randint(0, 128, (3, 17), generator=torch.Generator().manual_seed(0))
    # the loss of the model's own logits (lm_head included) predicting each next token
    reference = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert torch.allclose(WithLoss(model)(tokens), reference, rtol=1e-6)

    # on a GPU each layer and the loss are compiled; with compilation off (as TORCH_COMPILE_DISABLE=1 does) the
    # wrapped module is the same function over the same parameters
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)
    wrapped = compile_for_gpu(model)
    assert torch._dynamo.config.suppress_errors  # a failed compilation falls back to eager, not to a dead job
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in model.model.layers)
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    assert {id(p) for p in wrapped.parameters()} == {id(p) for p in model.parameters()}
    assert torch.allclose(wrapped(tokens), reference, rtol=1e-6)


def test_a_run_keeps_the_engine_that_wrote_its_checkpoints(
    demo_data: DemoData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    config = write_config(tmp_path / "c.yaml", tiny_config(demo_data, ckpt, **{"tokens.train_steps": 2}))
    code, _, err = door(config, capsys)
    assert code == 0, err
    assert (ckpt / "engine").read_text() == "torch\n"  # recorded by the first attempt
    # A node where the auto choice falls on the other engine (nanotron's checkpoints here) must not switch:
    (ckpt / "engine").write_text("nanotron\n")
    code, out, err = door(config, capsys)
    assert code == 2 and "were written by the nanotron engine, but here the torch engine would run" in err, err
    assert "Traceback" not in err and sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["2"]
    # Before anything is saved, any engine may start the run (the first attempt died early)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "engine").write_text("nanotron\n")
    config = write_config(tmp_path / "f.yaml", tiny_config(demo_data, fresh, **{"tokens.train_steps": 1}))
    assert door(config, capsys)[0] == 0 and (fresh / "engine").read_text() == "torch\n"
    # A run saved before the record existed is known by its pointer: nanotron's latest.txt
    old = tmp_path / "old"
    old.mkdir()
    (old / "latest.txt").write_text("10\n")
    config = write_config(tmp_path / "o.yaml", tiny_config(demo_data, old, **{"tokens.train_steps": 1}))
    code, _, err = door(config, capsys)
    assert code == 2 and "written by the nanotron engine" in err


def test_a_full_disk_is_found_behind_torch_saves_runtime_error() -> None:
    from launcher.train.torch_engine import checkpoint

    full = OSError(28, "No space left on device")
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 122688 vs 122580")  # noqa: B904
    except RuntimeError as e:
        wrapped = e
    assert checkpoint._io_error(wrapped) is full and checkpoint._io_error(full) is full
    assert checkpoint._io_error(RuntimeError("a bug, not the disk")) is None  # raised as it is, not explained away


@pytest.mark.parametrize("key", ["h100", "h100_pcie", "h100_nvl", "h200", "a100"])
def test_the_gpu_peak_the_mfu_uses_is_the_one_of_the_gpus_whole_name(monkeypatch: pytest.MonkeyPatch, key: str):
    """configs/gpus.yaml's peak for the name torch reports: the PCIe H100 is not taken for the SXM one."""
    from launcher.nanotron_config import gpus
    from launcher.train.metrics import peak_flops

    listed = yaml.safe_load(gpus.GPUS_FILE.read_text())
    names = [n for entry in listed.values() for n in entry.get("device_names", [])]
    assert len(names) == len(set(names))  # one GPU per name
    cuda = torch.device("cuda", 0)
    for name in listed[key]["device_names"]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_flops(cuda) == listed[key]["tflops"] * 1e12
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: f"{name} (unlisted)")
        assert peak_flops(cuda) is None  # a name is matched whole, never by a part of it
    assert peak_flops(torch.device("cpu")) is None
    assert listed["h100_pcie"]["tflops"] != listed["h100"]["tflops"]
