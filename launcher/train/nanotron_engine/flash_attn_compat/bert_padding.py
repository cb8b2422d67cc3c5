"""`flash_attn.bert_padding`: nanotron 0.4 unpads with it only for inference (generation), never to train."""

from __future__ import annotations

from launcher.train.nanotron_engine.flash_attn_compat.attention import refuse


def unpad_input(*args: object, **kwargs: object) -> None:
    """Refused: used by nanotron only for inference."""
    refuse("bert_padding.unpad_input (inference only)")


def pad_input(*args: object, **kwargs: object) -> None:
    """Refused: used by nanotron only for inference."""
    refuse("bert_padding.pad_input (inference only)")
