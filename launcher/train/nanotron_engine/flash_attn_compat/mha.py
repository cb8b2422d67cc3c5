"""`flash_attn.modules.mha`: nanotron main's Qwen2 imports `flash_attn_varlen_kvpacked_func` from it."""

from __future__ import annotations

from launcher.train.nanotron_engine.flash_attn_compat.attention import flash_attn_varlen_kvpacked_func

__all__ = ["flash_attn_varlen_kvpacked_func"]
