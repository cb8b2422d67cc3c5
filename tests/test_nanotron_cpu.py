"""nanotron 0.4's own code on CPU, through the flash_attn stand-in: its modules import, its ParallelContext builds
its process groups in a one-process gloo group, and its LlamaForTraining (embedding, decoder layers with
CausalSelfAttention, rotary and RMSNorm, MLP, lm_head, sharded cross-entropy) trains forward and backward.

Two things are patched, both CUDA-only plumbing that a CPU cannot run: ParallelContext.set_device
(torch.cuda.set_device) and the P2P of nanotron's LlamaModel (it allocates its metadata buffers on "cuda"; with
pp=1 it sends nothing). The rest is nanotron's code as installed.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from nanotron_names import as_transformers as named_as_transformers

from launcher.nanotron_config.parallel import ParallelDims, check_layout
from launcher.nanotron_config.shape import ModelShape
from launcher.train.nanotron_engine import compat as nanotron_compat
from launcher.train.nanotron_engine import flash_attn_compat
from launcher.train.torch_engine.model import llama_config

SHAPE = ModelShape(32, 64, 2, 4, 2, 96, 32, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def nanotron() -> Iterator[SimpleNamespace]:
    """nanotron imported through the stand-in (a real flash_attn, were one here, would be used instead)."""
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}
    nanotron_compat.apply()
    flash_attn_compat.install(is_main=False)
    import nanotron.config
    import nanotron.models.llama
    import nanotron.models.starcoder2
    import nanotron.parallel
    import nanotron.trainer

    yield SimpleNamespace(
        config=nanotron.config, llama=nanotron.models.llama, parallel=nanotron.parallel, trainer=nanotron.trainer
    )
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.fixture
def context(nanotron: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """nanotron's own ParallelContext (tp = pp = dp = 1) over a one-process gloo group."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(nanotron.parallel.ParallelContext, "set_device", lambda self: None)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield nanotron.parallel.ParallelContext(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1)
    finally:
        dist.destroy_process_group()


def test_nanotrons_trainer_and_models_import_through_the_stand_in(nanotron: SimpleNamespace) -> None:
    assert nanotron.trainer.DistributedTrainer is not None
    assert sys.modules["nanotron.models.starcoder2"]._flash_supports_window_size  # its import-time inspection
    assert nanotron.llama.flash_attn_varlen_func is flash_attn_compat.attention.flash_attn_varlen_func
    assert nanotron.llama.FlashRotaryEmbedding is flash_attn_compat.rotary.RotaryEmbedding


def nanotron_llama(nanotron: SimpleNamespace, context: Any, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> Any:
    """nanotron's LlamaForTraining, built, tied and initialised by nanotron's own functions, on the CPU."""
    from nanotron.models.base import build_model
    from nanotron.parallel.pipeline_parallel.p2p import P2P

    llama = nanotron.llama
    monkeypatch.setattr(llama, "P2P", lambda pg, device: P2P(pg, torch.device("cpu")))
    config = nanotron.config.LlamaConfig(
        hidden_size=SHAPE.hidden_size, intermediate_size=SHAPE.intermediate_size,
        num_hidden_layers=SHAPE.num_layers, num_attention_heads=SHAPE.num_heads,
        num_key_value_heads=SHAPE.num_kv_heads, vocab_size=SHAPE.vocab_size,
        max_position_embeddings=SHAPE.max_seq_len, rms_norm_eps=SHAPE.rms_norm_eps,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = build_model(
        model_builder=lambda: llama.LlamaForTraining(config=config, parallel_context=context, parallel_config=None),
        parallel_context=context,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    nanotron.trainer.mark_tied_parameters(model=model, parallel_context=context, parallel_config=None)
    torch.manual_seed(0)
    init = SimpleNamespace(init_method=SimpleNamespace(std=0.05), model_config=config)
    model.init_model_randomly(config=SimpleNamespace(model=init))
    return model


def as_transformers(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """nanotron Llama tensors (weights or gradients) under transformers' names and layout.

    nanotron 0.4's rotary pairs channels (2i, 2i+1) of each head where transformers' pairs (i, i + d/2), so q and
    k rows are reordered (q.k is unchanged by the same reordering of both). v and o_proj are not rotated.
    """
    heads, kv_heads, d = SHAPE.num_heads, SHAPE.num_kv_heads, SHAPE.hidden_size // SHAPE.num_heads

    def unpair(rows: torch.Tensor, n: int) -> torch.Tensor:
        return rows.view(n, d // 2, 2, -1).transpose(1, 2).reshape(n * d, -1)

    return named_as_transformers(named, heads, kv_heads, d, 64, rotary=unpair)


def test_nanotrons_llama_trains_through_the_stand_in_like_transformers_llama(
    nanotron: SimpleNamespace, context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same weights, same tokens: nanotron's loss and every gradient equal transformers' Llama's (whose
    attention, rotary and RMSNorm are its own), so the stand-in computes what nanotron's model expects."""
    from transformers import LlamaForCausalLM

    model = nanotron_llama(nanotron, context, torch.float32, monkeypatch)
    tokens = torch.randint(0, SHAPE.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1))
    ids, labels, mask = tokens[:, :-1], tokens[:, 1:], torch.ones(3, 16, dtype=torch.bool)
    loss = model(input_ids=ids, input_mask=mask, label_ids=labels, label_mask=mask)["loss"]
    loss.backward()

    reference = LlamaForCausalLM(llama_config(SHAPE))
    weights = as_transformers({n: p.detach() for n, p in model.named_parameters()})
    assert set(weights) == set(reference.state_dict()), "every weight mapped, none left over"
    reference.load_state_dict(weights)
    logits = reference(input_ids=ids).logits
    ref_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    ref_loss.backward()

    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    grads = as_transformers({n: p.grad for n, p in model.named_parameters()})
    for name, param in reference.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_nanotrons_llama_trains_in_bf16_through_the_stand_in(
    nanotron: SimpleNamespace, context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nanotron's model dtype (bf16, buffers included): loss near the fp32 model's, finite gradients everywhere."""
    tokens = torch.randint(0, SHAPE.vocab_size, (2, 17), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 16, dtype=torch.bool)
    losses, fp32_weights = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        model = nanotron_llama(nanotron, context, dtype, monkeypatch)
        if dtype == torch.float32:
            fp32_weights = {k: v.clone() for k, v in model.state_dict().items()}
        else:  # the fp32 model's weights, rounded
            model.load_state_dict({k: v.to(dtype) for k, v in fp32_weights.items()})
        loss = model(input_ids=tokens[:, :-1], input_mask=mask, label_ids=tokens[:, 1:], label_mask=mask)["loss"]
        loss.backward()
        assert all(p.grad is not None and p.grad.dtype == dtype and p.grad.isfinite().all() for p in model.parameters())
        losses[dtype] = loss.item()
    assert losses[torch.bfloat16] == pytest.approx(losses[torch.float32], rel=2e-2)


def test_nanotrons_parallel_context_accepts_exactly_the_layouts_the_launcher_accepts(
    nanotron: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ParallelContext's world-size assertions run before it touches a GPU: stop it right after them (at
    set_device) and compare its verdict with launcher.nanotron_config.parallel's on every small layout."""

    class Accepted(Exception):
        pass

    def accepted(self: object) -> None:
        raise Accepted

    monkeypatch.setattr(nanotron.parallel.ParallelContext, "set_device", accepted)
    for world, tp, pp, dp in itertools.product((1, 2, 4, 6, 8), (1, 2, 4), (1, 2, 3), (1, 2, 4)):
        monkeypatch.setenv("WORLD_SIZE", str(world))
        try:
            nanotron.parallel.ParallelContext(tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp)
        except Accepted:
            theirs = True
        except (AssertionError, ValueError):
            theirs = False
        shape = ModelShape(96, 96, 12, 12, 12, 96, 32)  # sizes every tp divides
        problems = check_layout(shape, ParallelDims(world, dp, tp, pp, grad_accum_steps=4))
        assert theirs == (problems == []), (world, tp, pp, dp, problems)
