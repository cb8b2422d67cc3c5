"""The eval job on its own (`python -m launcher.evals.evaljob JOB STEP KEY`, as eval.sbatch runs it), against
a tiny run the torch engine trained in one process: two tasks of the test's own over local JSONL (a multiple-choice
task and a perplexity task) score exactly what `lm_eval` run by hand gives on `jobs export` of that step; the
held-out loss and bits per byte; the result in the bundle; the lease dropped and the scratch folder gone. A failure
(a tokenizer that cannot be saved with the model, a task whose data went away) is recorded with its cause, and nothing
of the run is lost."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_runs import wait_for
from launcher_helpers import ROOT

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.bundle import manifest
from launcher.evals import record as eval_record
from launcher.node import job as job_file
from launcher.runs import launch

STEP = 5
SUBJECTS = ["the happy dog", "the quiet dog", "the young cat", "the happy baker", "the happy farmer"]
RIGHT = ["fetches the paper", "chases the ball", "ignores the rain", "slices the cheese"]
WRONG = ["cheese the slices", "rain ball the", "paper fetches garden"]
TASKS = ("evals_mc", "evals_ppl")


def write_tasks(folder: Path) -> Path:
    """A multiple-choice task and a perplexity task (lm-eval YAMLs over local JSONL) in `folder`/tasks."""
    rng, tasks = random.Random(1), folder / "tasks"
    tasks.mkdir(parents=True)
    with open(tasks / "mc.jsonl", "w") as f:
        for _ in range(24):
            choices = [rng.choice(RIGHT), *rng.sample(WRONG, 2)]
            rng.shuffle(choices)
            label = next(i for i, c in enumerate(choices) if c in RIGHT)
            f.write(json.dumps({"query": rng.choice(SUBJECTS), "choices": choices, "label": label}) + "\n")
    with open(tasks / "ppl.jsonl", "w") as f:
        for _ in range(6):
            f.write(json.dumps({"text": " . ".join(f"{rng.choice(SUBJECTS)} {rng.choice(RIGHT)}" for _ in range(5))})
                    + "\n")  # fmt: skip
    data = {"dataset_path": "json", "test_split": "test"}
    mc = {"task": TASKS[0], **data, "dataset_kwargs": {"data_files": {"test": str(tasks / "mc.jsonl")}},
          "output_type": "multiple_choice", "doc_to_text": "{{query}}", "doc_to_choice": "{{choices}}",
          "doc_to_target": "{{label}}", "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}  # fmt: skip
    ppl = {"task": TASKS[1], **data, "dataset_kwargs": {"data_files": {"test": str(tasks / "ppl.jsonl")}},
           "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
           "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]}  # fmt: skip
    (tasks / "mc.yaml").write_text(json.dumps(mc))  # (JSON is YAML)
    (tasks / "ppl.yaml").write_text(json.dumps(ppl))
    return tasks


def write_domains(folder: Path) -> str:
    """Two held-out domains of short documents (each one window), as --eval_heldout names them."""
    rng = random.Random(3)
    paths = {}
    for name, words in (("animals", SUBJECTS[:3]), ("people", SUBJECTS[3:])):
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text(
            "".join(
                json.dumps({"text": " . ".join(f"{rng.choice(words)} {rng.choice(RIGHT)}" for _ in range(3))}) + "\n"
                for _ in range(12)
            )
        )
    return ",".join(f"{name}={path}" for name, path in paths.items())


def trained_run(where: Path, demo, *flags: str, dataset: Path | None = None) -> manifest.Manifest:
    """A launcher bundle (dry run) with --eval_tasks, trained STEP steps by the torch engine in one process, on
    `dataset` (the demo's by default)."""
    cwd = os.getcwd()
    os.chdir(where)
    try:
        argv = ["--run_name", "evaluated", "--nodes", "1", "--gpus_per_node", "1", "--engine", "torch",
                "--dataset", str(dataset or demo.dataset), "--tokenizer", str(demo.tokenizer),
                "--micro_batch_size", "2", "--grad_accum_steps", "1", "--train_steps", str(STEP), "--save_interval",
                str(STEP), "--wandb_disabled", "--tmp_dir", str(where / "tmp"), "--dry_run", *flags]  # fmt: skip
        (where / "tmp").mkdir(exist_ok=True)
        run = manifest.load(launch.prepare(argv).paths.bundle_dir)
    finally:
        os.chdir(cwd)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "run_train.py"), "--config-file", str(run.data["files"]["config"]["path"]),
               "--engine", "torch"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run


def settings(run: manifest.Manifest) -> job_file.Job:
    return job_file.load(run.bundle_dir)


def key_of(run: manifest.Manifest) -> str:
    return settings(run).evals.key  # type: ignore[union-attr]


def command(run: manifest.Manifest, step: int) -> list[str]:
    """The eval job's command, as its script runs it: the job's settings, the step, the key of what it scores."""
    return [sys.executable, "-m", "launcher.evals.evaljob", str(run.bundle_dir / P.JOB_FILE), str(step), key_of(run)]


def eval_job(run: manifest.Manifest, step: int, job_id: str = "4242") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": job_id}
    return subprocess.run(command(run, step), env=env, capture_output=True, text=True, timeout=900)


def result(run: manifest.Manifest, step: int = STEP) -> dict:
    found = eval_record.result(run.bundle_dir, step, key_of(run))
    assert found is not None
    return found


def scratch(run: manifest.Manifest) -> list[Path]:
    return list(settings(run).tmp_dir.glob("launcher-eval-*"))  # (torch's own caches may lie beside)


def by_hand(run: manifest.Manifest, tasks: Path, where: Path, step: int = STEP) -> dict:
    """`jobs export --step STEP --dtype float32`, then `lm_eval` on it as its README says: its results."""
    model = where / f"hf-{step}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    export = [sys.executable, "-m", "launcher.jobs", "export", str(run.bundle_dir), "--step", str(step), "--dtype",
              "float32", "--output", str(model)]  # fmt: skip
    subprocess.run(export, env=env, check=True, capture_output=True)
    done = subprocess.run(["lm_eval", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32", "--device",
                           "cpu", "--batch_size", "8", "--tasks", ",".join(TASKS), "--include_path", str(tasks),
                           "--output_path", str(where / f"out-{step}")], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = (where / f"out-{step}").rglob("results_*.json")
    return json.loads(found.read_text())["results"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory, demo_data):
    where = tmp_path_factory.mktemp("evaluated")
    tasks = write_tasks(where)
    run = trained_run(where, demo_data, "--eval_tasks", ",".join(TASKS), "--eval_include", str(tasks),
                      "--eval_heldout", write_domains(where))  # fmt: skip
    return run, tasks, where


def test_the_eval_job_scores_the_step_as_lm_eval_does_by_hand(evaluated, tmp_path: Path):
    run, tasks, _ = evaluated
    done = eval_job(run, STEP)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = result(run)
    hand = by_hand(run, tasks, tmp_path)
    for task, metrics in row["tasks"].items():  # (lm-eval's whole results beside them: lm_eval_results)
        for metric, value in metrics.items():
            assert math.isclose(value, hand[task][f"{metric},none"], rel_tol=1e-9), (task, metric, value)
    assert set(row["tasks"]) == set(TASKS) and {"acc", "acc_norm"} <= set(row["tasks"]["evals_mc"])
    assert {"word_perplexity", "bits_per_byte"} <= set(row["tasks"]["evals_ppl"])
    assert row["samples"] == {"evals_mc": 24, "evals_ppl": 6}
    per_step = run.data["derived"]["global_batch_tokens"]
    assert row["step"] == STEP and row["tokens"] == STEP * per_step and row["job"] == "4242"
    assert (row["engine"], row["device"], row["dtype"]) == ("hf", "cpu", "float32")
    assert row["gpus"] == 0 and row["gpu_hours"] == 0 and row["seconds"] > 0 and row["wandb"] == "disabled"
    assert set(row["phases_s"]) == {"export", "lm_eval", "items", "heldout"}
    assert sum(row["phases_s"].values()) < row["seconds"]
    held = row["heldout"]
    assert list(held) == ["animals", "people"] and all(held[d]["held_out"].endswith(f"{d}.jsonl") for d in held)
    assert all(math.isclose(h["perplexity"], math.exp(h["loss"])) and h["documents"] == 12 for h in held.values())
    assert row["lm_eval_results"]["results"]["evals_mc"]["acc,none"] == row["tasks"]["evals_mc"]["acc"]
    assert "samples" not in row["lm_eval_results"] and row["state"] == "done"
    assert ckpt.leases(run.checkpoints) == [] and scratch(run) == []  # the lease, the scratch gone
    said = done.stdout + done.stderr
    assert f"eval: step {STEP} ({row['tokens']:,} tokens): evals_mc" in said and "[hf on cpu" in said
    per_item_rows_agree(run, row, tasks, tmp_path / f"hf-{STEP}")
    domains_by_hand(run, row, tmp_path / f"hf-{STEP}")


def domains_by_hand(run: manifest.Manifest, row: dict, model_dir: Path) -> None:
    """Each held-out domain's loss and bits per byte, by hand on the exported model: each document alone, the eos
    before it, every one of its tokens' cross-entropy from the logits; the sums over the domain's documents. And
    the documents' rows in the items file (`heldout:NAME`) give the same."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.evals import items

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tables = items.read(run.bundle_dir / row["items"]["file"])
    losses = {}
    for name, figures in row["heldout"].items():
        texts = [json.loads(line)["text"] for line in Path(figures["held_out"]).read_text().splitlines()]
        nll = tokens = size = 0.0
        for text in texts:
            ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
            nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
            tokens += ids.shape[1] - 1
            size += len(text.encode("utf-8"))
        assert math.isclose(figures["loss"], nll / tokens, rel_tol=1e-5), (name, figures, nll / tokens)
        assert math.isclose(figures["bits_per_byte"], nll / math.log(2) / size, rel_tol=1e-5), name
        assert (figures["tokens"], figures["bytes"]) == (tokens, size)
        table = tables[f"heldout:{name}"]
        assert math.isclose(-table["ll"].sum() / table["tokens"].sum(), figures["loss"], rel_tol=1e-12)
        losses[name] = figures["loss"]
    assert losses["animals"] != losses["people"]  # two domains, two losses


def gold_log_likelihood(model, tokenizer, context: str, continuation: str) -> float:
    """The continuation's log-likelihood after the context, from the model's logits: the context and the whole
    text tokenized, the continuation the whole's tokens past the context's, each one's log-softmax summed."""
    import torch

    whole = tokenizer(context + continuation)["input_ids"]
    first = len(tokenizer(context)["input_ids"])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([whole])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[i - 1, whole[i]] for i in range(first, len(whole))))


def per_item_rows_agree(run: manifest.Manifest, row: dict, tasks: Path, model_dir: Path) -> None:
    """The items file the result names: each task's rows; their acc's mean is the result's acc, exactly; the
    perplexity task's summed log-likelihood over its bytes is its bits per byte; the gold answer's bits per byte of
    a few items is what the exported model's logits give by hand (the target delimiter, a space, counted)."""
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.evals import items

    assert row["items"]["file"] == f"evals/step-{STEP}-{key_of(run)}.items.npz"
    assert row["items"]["items"] == {"evals_mc": 24, "evals_ppl": 6, "heldout:animals": 12, "heldout:people": 12}
    assert row["items"]["bytes"] > 0
    tables = items.read(run.bundle_dir / row["items"]["file"])
    mc, ppl = tables["evals_mc"], tables["evals_ppl"]
    for metric in ("acc", "acc_norm"):
        assert mc[metric].sum() / len(mc[metric]) == row["tasks"]["evals_mc"][metric], metric
    bpb = -ppl["ll"].sum() / (math.log(2) * ppl["bytes"].sum())
    assert math.isclose(bpb, row["tasks"]["evals_ppl"]["bits_per_byte"], rel_tol=1e-12)
    assert "doc_hash" not in json.dumps(row)  # lm-eval's samples are not in the result
    docs = [json.loads(line) for line in (tasks / "mc.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    gold_bpb = items.values(mc, "gold_bpb")[0]
    for i in (0, 7, 23):
        doc = docs[int(mc["doc_id"][i])]
        continuation = " " + doc["choices"][doc["label"]]
        ll = gold_log_likelihood(model, tokenizer, doc["query"], continuation)
        assert mc["gold_bytes"][i] == len(continuation.encode("utf-8"))
        assert math.isclose(mc["gold_ll"][i], ll, rel_tol=1e-4), (i, mc["gold_ll"][i], ll)
        assert math.isclose(gold_bpb[i], -ll / (math.log(2) * len(continuation.encode("utf-8"))), rel_tol=1e-4)
    assert len(set(items.ids(mc))) == 24 and np.array_equal(mc["doc_id"], np.arange(24))


def test_a_failing_eval_job_is_recorded_with_its_cause_and_loses_nothing(evaluated, tmp_path: Path):
    run, tasks, where = evaluated
    before = sorted(p.relative_to(run.checkpoints) for p in run.checkpoints.rglob("*") if ".evals" not in p.parts)
    tokenizer = Path(run.flags["tokenizer"])
    aside = where / "tokenizer-aside"
    shutil.move(tokenizer, aside)  # the tokenizer cannot be saved with the model
    try:
        done = eval_job(run, STEP)
    finally:
        shutil.move(aside, tokenizer)
    assert done.returncode == 1
    row = result(run)
    assert row["state"] == "failed" and "tokenizer" in row["cause"] and "cannot be read here" in row["cause"]
    assert row["job"] == "4242" and f"eval: step {STEP} failed: ExportError" in done.stderr
    after = sorted(p.relative_to(run.checkpoints) for p in run.checkpoints.rglob("*") if ".evals" not in p.parts)
    assert after == before or set(after) - set(before) <= {Path(P.LEASES)}  # the checkpoint whole, no lease left
    assert ckpt.leases(run.checkpoints) == [] and scratch(run) == []

    data = tasks / "ppl.jsonl"
    shutil.move(data, where / "ppl-aside.jsonl")  # a task's data gone after the launch
    try:
        done = eval_job(run, STEP)
    finally:
        shutil.move(where / "ppl-aside.jsonl", data)
    row = result(run)
    assert done.returncode == 1 and row["state"] == "failed" and "ppl.jsonl" in row["cause"], row


def in_a_fork(make: Any) -> Any:
    """`make()` in a forked child of this process, its result sent back (an exception's text raised here): wandb
    keeps the settings of its first run in a process (WANDB_DIR, read once) for every later run there, so a test that
    ran wandb in pytest's own process pointed a later test's run (test_train_engine's) at its own folder."""
    import multiprocessing
    import traceback

    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)

    def child() -> None:
        try:
            writer.send((True, make()))
        except BaseException:  # noqa: BLE001  sent back, raised in the test
            writer.send((False, traceback.format_exc()))

    process = context.Process(target=child)
    process.start()
    ok, value = reader.recv() if reader.poll(300) else (False, "no answer from the child in 300 s")
    process.join(60)
    if not ok:
        raise AssertionError(value)
    return value


def test_the_scores_go_to_the_runs_own_wandb_run_keyed_by_step_and_tokens(
    evaluated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from wandb_records import records

    from launcher.evals import evaljob as job

    run, _, _ = evaluated
    on = dataclasses.replace(settings(run), wandb_disabled=False)  # the same run, launched with W&B on
    row = {"step": STEP, "tokens": 1280, "tasks": {"evals_mc": {"acc": 0.5}}, "heldout": {"web": {"loss": 4.0,
           "bits_per_byte": 1.2}}}  # fmt: skip
    assert job.to_wandb(on, row).startswith("not logged: the run has no W&B run")
    (run.checkpoints / P.WANDB_RUN_ID_FILE).write_text("evalrun1\n")  # training's run id, beside the checkpoints
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    try:
        assert in_a_fork(lambda: job.to_wandb(on, row)) == "logged to W&B run evalrun1"
    finally:
        (run.checkpoints / P.WANDB_RUN_ID_FILE).unlink()
    (written,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")

    def history() -> list:  # (wandb's service may still be writing the file as finish() returns, beside other tests)
        return [r for r in records(written) if r.WhichOneof("record_type") == "history"]  # type: ignore[attr-defined]

    logged = wait_for(history, timeout=60, every=0.5)
    keys = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in logged[-1].history.item}
    assert keys["eval/step"] == STEP and keys["eval/tokens"] == 1280 and keys["eval/evals_mc/acc"] == 0.5
    assert keys["eval/heldout/web/bits_per_byte"] == 1.2 and keys["eval/heldout/web/loss"] == 4.0
    runs = [r for r in records(written) if r.WhichOneof("record_type") == "run"]  # type: ignore[attr-defined]
    assert runs[0].run.run_id == "evalrun1"


def test_an_eval_job_killed_by_slurms_sigterm_records_it_and_leaves_nothing_behind(evaluated, tmp_path: Path):
    """A cancel, the time limit or a preemption (which Slurm requeues: the step starts again) reaches the eval job
    as SIGTERM: the record says `interrupted` and why, its lease is dropped and its scratch folder removed."""
    import signal

    run, _, _ = evaluated
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "4343"}
    job = subprocess.Popen(command(run, STEP), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (scratch(run) and list(scratch(run)[0].glob("model/*.safetensors"))):  # (exported: lm-eval next)
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM, err[-3000:]
    row = result(run)
    assert row["state"] == "interrupted" and row["job"] == "4343" and "SIGTERM" in row["cause"]
    assert ckpt.leases(run.checkpoints) == [] and scratch(run) == []
    assert f"eval: step {STEP} interrupted: signal SIGTERM" in err
