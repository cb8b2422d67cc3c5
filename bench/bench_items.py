"""What keeping per-item rows costs the eval job (launcher/evals/items.py): lm-eval with `log_samples=True` against
`log_samples=False` on the same model and tasks (alternated, each run in a child process of its own: its wall time
and its CPU time, the kernel's user + system seconds, which a busy machine disturbs less), then the rows written
(`items.write`: time, and the file's bytes per item). Not a test.

    python bench/bench_items.py [--items 500] [--documents 100] [--runs 3]

The model is a tiny random Llama (2 layers, 32 wide) with the demo's word-level tokenizer; the tasks are a
multiple-choice task of `--items` rows (4 choices) and a perplexity task of `--documents` documents, local JSONL
written here. The figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORDS = ["the", "happy", "quiet", "young", "dog", "cat", "baker", "farmer", "fetches", "chases", "ignores", "slices",
         "paper", "ball", "rain", "cheese", "garden", "at", "night"]  # fmt: skip


def prepare(where: Path, items: int, documents: int) -> tuple[Path, Path]:
    """The model (a tiny random Llama, the demo's tokenizer) and the two tasks' folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from launcher.localcluster.demo_data import make_demo

    _, tokenizer_dir = make_demo(where / "demo", num_docs=20, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    model = where / "model"
    LlamaForCausalLM(config).save_pretrained(model)
    tokenizer.save_pretrained(model)
    rng, tasks = random.Random(0), where / "tasks"
    tasks.mkdir()
    phrase = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    with open(tasks / "mc.jsonl", "w") as f:
        for _ in range(items):
            row = {"query": phrase(6), "choices": [phrase(3) for _ in range(4)], "label": rng.randrange(4)}
            f.write(json.dumps(row) + "\n")
    with open(tasks / "ppl.jsonl", "w") as f:
        for _ in range(documents):
            f.write(json.dumps({"text": phrase(60)}) + "\n")
    data = {"dataset_path": "json", "test_split": "test"}
    mc = {"task": "bench_mc", **data, "dataset_kwargs": {"data_files": {"test": str(tasks / "mc.jsonl")}},
          "output_type": "multiple_choice", "doc_to_text": "{{query}}", "doc_to_choice": "{{choices}}",
          "doc_to_target": "{{label}}", "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}  # fmt: skip
    ppl = {"task": "bench_ppl", **data, "dataset_kwargs": {"data_files": {"test": str(tasks / "ppl.jsonl")}},
           "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
           "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]}  # fmt: skip
    (tasks / "mc.yaml").write_text(json.dumps(mc))
    (tasks / "ppl.yaml").write_text(json.dumps(ppl))
    return model, tasks


def child(model: str, tasks: str, log_samples: bool, out: str) -> None:
    """One lm-eval run, timed; its samples pickled to `out` where kept."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=[tasks])
    start = time.perf_counter()
    results = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": model, "dtype": "float32"},
                                      tasks=["bench_mc", "bench_ppl"], device="cpu", batch_size=8,
                                      task_manager=manager, log_samples=log_samples)  # fmt: skip
    wall = time.perf_counter() - start
    if log_samples:
        Path(out).write_bytes(pickle.dumps(results["samples"]))
    print(json.dumps({"wall_s": wall}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.child[2] == "1", args.child[3])
        return
    from launcher.evals import items

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        model, tasks = prepare(where, args.items, args.documents)
        walls: dict[bool, list[float]] = {False: [], True: []}
        cpus: dict[bool, list[float]] = {False: [], True: []}
        env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
        for _ in range(args.runs):
            for kept in (False, True):
                argv = [sys.executable, __file__, "--child", str(model), str(tasks), "1" if kept else "0",
                        str(where / "samples.pkl")]  # fmt: skip
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                walls[kept].append(json.loads(done.stdout.strip().splitlines()[-1])["wall_s"])
                cpus[kept].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        samples = pickle.loads((where / "samples.pkl").read_bytes())
        writes = []
        for _ in range(5):
            start = time.perf_counter()
            kept_file = items.write(where / "bundle", 1, "bench", samples)
            writes.append(time.perf_counter() - start)
        count = sum(kept_file["items"].values())
        off, on = statistics.median(cpus[False]), statistics.median(cpus[True])
        figures = {"items": kept_file["items"], "lm_eval_wall_s": walls, "lm_eval_cpu_s": cpus,
                   "added_cpu_s": round(on - off, 2), "added_fraction": round((on - off) / off, 3),
                   "write_s": round(statistics.median(writes), 4), "bytes": kept_file["bytes"],
                   "bytes_per_item": round(kept_file["bytes"] / count, 1)}  # fmt: skip
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
