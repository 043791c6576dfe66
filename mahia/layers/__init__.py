"""Transformer layers, each with a readable reference path and an optimized one (``impl=``).

RMSNorm(dim, impl="eager"|"triton")             norm.py   (+ fused residual add)
SwiGLU(dim, hidden, impl="eager"|"triton")      mlp.py
RotaryCache, apply_rope(..., impl=...)           rope.py   (one cos/sin cache for all layers)
Attention(dim, n_heads, n_kv_heads, impl="manual"|"sdpa"|"chunked", backend=...)  attention.py
StaticKVCache(batch, max_len, n_kv_heads, head_dim), decode_mask, rope_rows  kv_cache.py
"""

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

__all__ = [
    "Attention",
    "StaticKVCache",
    "attention_bytes",
    "attention_flops",
    "available_backends",
    "fused_backends",
    "chunked_attention",
    "manual_attention",
    "rope_rows",
    "sdpa_attention",
    "SwiGLU",
    "RMSNorm",
    "RotaryCache",
    "apply_rope",
]
