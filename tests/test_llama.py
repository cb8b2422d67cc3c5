"""The torch engine's Llama (launcher/train/torch_engine/llama.py) is transformers' LlamaForCausalLM in plain torch: the
same parameter names, the same initialisation for a seed, the same logits and gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from launcher.nanotron_config.shape import ModelShape
from launcher.train.torch_engine.model import build_model, init_like_nanotron, llama_config

SHAPE = ModelShape(hidden_size=64, intermediate_size=160, num_layers=2, num_heads=8, num_kv_heads=2, vocab_size=97,
                   max_seq_len=64, tie_word_embeddings=False, rms_norm_eps=1e-5, hidden_act="silu",
                   rope_theta=10000.0, bos_token_id=1, eos_token_id=2)  # fmt: skip


def reference(shape: ModelShape, seed: int):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config(shape))
    torch.manual_seed(seed)
    init_like_nanotron(model, 0.02, shape.num_layers)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_same_parameters_same_init_same_logits_and_gradients(tied: bool):
    shape = dataclasses.replace(SHAPE, tie_word_embeddings=tied)
    ours, theirs = build_model(shape, 0.02, seed=3), reference(shape, seed=3)
    assert list(ours.state_dict()) == list(theirs.state_dict())  # names and order: checkpoints read alike
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True))
    tokens = torch.randint(0, shape.vocab_size, (3, 37), generator=torch.Generator().manual_seed(0))
    mine, ref = ours(tokens), theirs(input_ids=tokens).logits
    assert torch.allclose(mine, ref, atol=1e-5, rtol=1e-5), (mine - ref).abs().max()
    mine.square().mean().backward()
    ref.square().mean().backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name


def test_bfloat16_autocast_agrees_with_transformers():
    ours, theirs = build_model(SHAPE, 0.02, seed=5), reference(SHAPE, seed=5)
    tokens = torch.randint(0, SHAPE.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mine, ref = ours(tokens), theirs(input_ids=tokens).logits
    assert mine.dtype == ref.dtype and torch.allclose(mine.float(), ref.float(), atol=2e-2)


def test_the_engine_does_not_import_transformers_to_train():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from launcher.train.torch_engine.model import build_model\n"
        "from launcher.nanotron_config.shape import ModelShape\n"
        f"build_model(ModelShape(**{dataclasses.asdict(SHAPE)!r}), 0.02, 0)\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_engines_tokenizer_reads_as_transformers_does(demo_data, tmp_path):
    """launcher.train.data.tokenize reads a tokenizer.json with `tokenizers` itself: the same ids, eos and
    vocabulary check as transformers' AutoTokenizer."""
    from conftest import tiny_config, write_config

    from launcher.errors import TrainError
    from launcher.train.data import load_texts, load_tokenizer, tokenize
    from launcher.train.settings import load_train_config

    cfg = load_train_config(str(write_config(tmp_path / "c.yaml", tiny_config(demo_data, tmp_path / "ck"))))
    texts = load_texts(cfg)[:200]
    ids, eos = tokenize(cfg, texts)
    reference = load_tokenizer(cfg)
    assert ids == reference(texts, add_special_tokens=False)["input_ids"]
    assert reference.eos_token_id is not None and eos == reference.eos_token_id
    small = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=len(reference) - 1))
    with pytest.raises(TrainError, match=f"has {len(reference)} tokens"):
        tokenize(small, texts)
