"""The nanotron engine's choice and needs on CPU."""

from __future__ import annotations

import sys

import pytest
import torch

from launcher.train import flash_attn_compat, nanotron_engine


def test_auto_takes_nanotron_without_flash_attn_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.train import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nanotron_engine, "missing", lambda: [])
    monkeypatch.setattr(flash_attn_compat, "real_flash_attn_error", lambda: ImportError("no flash_attn"))
    assert main.choose_engine("auto") == ("nanotron", "auto; flash_attn not found: attention through torch SDPA")


def test_what_the_engine_needs_no_longer_includes_flash_attn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # unimportable
    assert nanotron_engine.missing() == ["a CUDA GPU", "NCCL"]  # this machine: no GPU, a CPU build of torch
    assert nanotron_engine.attention_note() == "flash_attn not found: attention through torch SDPA"
