"""Shared fixtures. Training job: a tiny local dataset and tokenizer, and nanotron configs that train on them."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is first imported: set it before that
# One OpenMP thread in every process of the suite (read when torch loads libgomp): the workers' own torch, what they
# start, and the local cluster's jobs, whose virtual nodes share the machine's two cores. With two, libgomp's idle
# thread spins between the tiny model's ops: tests/test_train_engine.py took 112 CPU s against 62 with one.
# (A job still derives its own where nothing is inherited: test_operations.py's SBATCH_EXPORT=NONE run.)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "configs" / "nanotron-0.4-base.yaml"


@dataclass(frozen=True)
class DemoData:
    dataset: Path
    tokenizer: Path
    vocab: int  # len(tokenizer)


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> DemoData:
    """A small save_to_disk dataset (~150 windows of 65 tokens) and its word-level tokenizer."""
    from transformers import AutoTokenizer

    from launcher.localcluster.demo_data import make_demo

    dataset, tokenizer = make_demo(tmp_path_factory.mktemp("demo"), num_docs=150, seed=0)
    return DemoData(dataset, tokenizer, len(AutoTokenizer.from_pretrained(str(tokenizer))))


@pytest.fixture(scope="session")
def second_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another demo dataset like `demo_data`'s (150 documents, other sentences, the same words: its tokenizer
    reads it), for mixtures."""
    from launcher.localcluster.demo_data import make_dataset

    return make_dataset(tmp_path_factory.mktemp("demo-b") / "dataset", num_docs=150, seed=1)


@pytest.fixture(scope="session")
def nanoset_folders(demo_data: DemoData, second_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """`demo_data`'s dataset and `second_dataset` tokenized (datatrove, through `launcher.data tokenize`) with the
    demo tokenizer: two Nanoset folders of 2-byte tokens."""
    from launcher.data.__main__ import main

    made = []
    for n, dataset in enumerate((demo_data.dataset, second_dataset)):
        output = tmp_path_factory.mktemp("nanoset") / f"out{n}"
        argv = ["tokenize", "--dataset", str(dataset), "--tokenizer", str(demo_data.tokenizer), "--output", str(output)]
        assert main(argv) == 0
        made.append(output)
    return made


@pytest.fixture
def restore_flash_attn() -> Iterator[None]:
    """Whatever flash_attn modules sys.modules holds now, it holds again after the test (the stand-in's tests)."""
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}
    yield
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def bundle_of(where: Path, name: str) -> Path:
    """A folder standing for a job's bundle (LAUNCHER_BUNDLE: training writes its metrics, outcome, ... there by
    their protocol names), made under `where`."""
    folder = where / f"bundle-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def tiny_config(demo: DemoData, checkpoints: Path, **overrides: Any) -> dict:
    """A nanotron 0.4 config dict for a tiny Llama (hidden 32, 2 layers, 4 heads, 2 kv heads) on the demo data.

    `overrides` maps dotted paths to values, e.g. `{"tokens.train_steps": 20}` (pass as `**{...}`).
    The LR schedule is fully explicit, so it does not depend on train_steps.
    """
    with open(BASE_CONFIG, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    values = {
        "general.project": "tests",
        "general.run": "tiny",
        "general.seed": 7,
        "model.model_config.hidden_size": 32,
        "model.model_config.intermediate_size": 64,
        "model.model_config.num_hidden_layers": 2,
        "model.model_config.num_attention_heads": 4,
        "model.model_config.num_key_value_heads": 2,
        "model.model_config.vocab_size": 128,
        "model.model_config.max_position_embeddings": 64,
        "tokenizer.tokenizer_name_or_path": str(demo.tokenizer),
        "data.dataset.hf_dataset_or_datasets": str(demo.dataset),
        "data.seed": 3,
        "tokens.sequence_length": 64,
        "tokens.micro_batch_size": 4,
        "tokens.batch_accumulation_per_replica": 2,
        "tokens.train_steps": 30,
        "optimizer.learning_rate_scheduler.learning_rate": 0.01,
        "optimizer.learning_rate_scheduler.min_decay_lr": 0.001,
        "optimizer.learning_rate_scheduler.lr_warmup_steps": 3,
        "optimizer.learning_rate_scheduler.lr_decay_steps": 27,
        "optimizer.learning_rate_scheduler.lr_decay_starting_step": 3,
        "checkpoints.checkpoints_path": str(checkpoints),
        "checkpoints.checkpoint_interval": 1000,
        "logging.iteration_step_info_interval": 1,
        **overrides,
    }
    for dotted, value in values.items():
        *parents, leaf = dotted.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[leaf] = value
    return config


def write_config(path: Path, config: dict) -> Path:
    """Write a config dict as YAML; returns the path."""
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# The long test files first, and where the time goes (tests/timeline.py); the session's S3 server (tests/s3_server.py).
pytest_plugins = ["timeline", "s3_server"]

# The session's real Slurm cluster (tests/slurm_cluster.py).
from slurm_cluster import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    slurm_accounting,
    slurm_accounting_spec,
    slurm_cluster,
    slurm_cluster_spec,
    slurm_env,
    slurm_nanoset,
)
