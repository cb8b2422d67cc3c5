"""bench/bench_nanotron.py's pieces that need no GPU: its refusal without one, the configs it has the launcher
write (nanotron's parser accepts them), and its FLOP convention (nanotron's own get_flops, the torch engine's)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import ROOT

from launcher.train.nanotron_engine.compat import import_nanotron_config
from launcher.train.settings import to_train_config
from launcher.train.torch_engine.model import flops_per_token


def _load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_nanotron", ROOT / "bench" / "bench_nanotron.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def test_without_a_gpu_it_fails_at_once_and_says_why(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_nanotron.py"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: bench_nanotron.py compares the engines on a CUDA GPU and this machine")


@pytest.mark.parametrize("case", ["tiny:1024:random", "1b:4096:random"])
def test_its_configs_are_the_launchers_one_gpu_jobs_and_its_flops_are_nanotrons(case: str, tmp_path: Path) -> None:
    path = bench.write_config(case, 40, 2, tmp_path)
    parsed = import_nanotron_config().get_config_from_file(str(path))
    p, t = parsed.parallelism, parsed.tokens
    assert (p.dp, p.tp, p.pp, t.micro_batch_size, t.batch_accumulation_per_replica) == (1, 1, 1, 2, 1)
    assert t.sequence_length == int(case.split(":")[1]) and t.train_steps == 40
    assert parsed.logging.iteration_step_info_interval == 1 and parsed.data.dataset is None
    config = yaml.safe_load(path.read_text())

    # nanotron's get_flops (its MFU's numerator), per token
    from launcher.train.nanotron_engine import compat as nanotron_compat
    from launcher.train.nanotron_engine import flash_attn_compat

    nanotron_compat.apply()
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}
    flash_attn_compat.install(is_main=False)
    import nanotron.trainer  # noqa: F401  # first: nanotron.models alone is an import circle in nanotron 0.4
    from nanotron.models.llama import get_flops

    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]
    sys.modules.update(saved)
    m, seq = config["model"]["model_config"], t.sequence_length
    model_flops, _ = get_flops(
        num_layers=m["num_hidden_layers"], hidden_size=m["hidden_size"], num_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"], vocab_size=m["vocab_size"], seq_len=seq,
        ffn_hidden_size=m["intermediate_size"], batch_size=1,
    )  # fmt: skip
    assert bench.flops_per_token(config, causal=False) == pytest.approx(model_flops / seq, rel=1e-12)
    attention = 12.0 * m["num_hidden_layers"] * m["hidden_size"] * seq
    assert bench.flops_per_token(config, causal=True) == pytest.approx(model_flops / seq - attention / 2, rel=1e-12)
    if case.startswith("tiny"):  # and the torch engine's convention, on the model it builds
        shape = to_train_config(config).model
        with torch.device("meta"):  # shapes only
            model = _meta_model(shape)
        assert flops_per_token(model, shape, seq) == pytest.approx(model_flops / seq, rel=1e-12)


def _meta_model(shape: Any) -> Any:
    from transformers import LlamaForCausalLM

    from launcher.train.torch_engine.model import llama_config

    return LlamaForCausalLM(llama_config(shape))


def test_the_gpu_session_script_is_sound_shell() -> None:
    script = ROOT / "bench" / "nanotron_gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    checker = shutil.which("shellcheck")
    if checker is None:
        assert os.environ.get("CI") != "true", "shellcheck must be installed in CI (scripts/setup.sh)"
        pytest.skip("shellcheck not installed")
    done = subprocess.run([checker, "-S", "style", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_a_memory_run_without_saves_builds_the_trainer_as_the_engine_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU session's memory runs (save=False) replace the engine's trainer_class: the replacement takes what the
    engine passes (a GPU session found it one argument short), and its class saves nothing."""
    import inspect

    from launcher.train.nanotron_engine import engine, trainer
    from launcher.train.torch_engine import engine as torch_engine

    class Trainer:
        iteration_step = 7

    made: list[tuple] = []
    monkeypatch.setattr(engine, "trainer_class", lambda *args: made.append(args) or Trainer)
    monkeypatch.setattr(torch_engine.checkpoint, "save", torch_engine.checkpoint.save)  # restored after the test
    bench._skip_saves()
    assert list(inspect.signature(engine.trainer_class).parameters) == list(
        inspect.signature(trainer.trainer_class).parameters
    )
    no_saves = engine.trainer_class("cfg", "job")()
    no_saves.save_checkpoint()
    assert made == [("cfg", "job")] and no_saves.last_saved_step == 7
