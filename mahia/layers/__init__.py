"""Transformer layers, each with a readable reference path and an optimized one (``impl=``): RMSNorm
(norm.py, with a fused residual add), SwiGLU (mlp.py), RoPE (rope.py: one cos/sin cache for all layers),
Attention (attention.py: manual, sdpa, chunked) and the static KV cache (kv_cache.py)."""

# The functional ``attention`` dispatcher stays in ``mahia.layers.attention`` (importing it here
# would shadow the submodule of the same name).
from mahia.layers.attention import (
    Attention,
    attention_bytes,
    attention_flops,
    available_backends,
    chunked_attention,
    fused_backends,
    manual_attention,
    sdpa_attention,
)
from mahia.layers.kv_cache import StaticKVCache, rope_rows
from mahia.layers.mlp import SwiGLU
from mahia.layers.norm import RMSNorm
from mahia.layers.rope import RotaryCache, apply_rope

__all__ = ["Attention", "StaticKVCache", "attention_bytes", "attention_flops", "available_backends", "fused_backends"]
__all__ += ["chunked_attention", "manual_attention", "rope_rows", "sdpa_attention", "SwiGLU", "RMSNorm", "RotaryCache"]
__all__ += ["apply_rope"]
