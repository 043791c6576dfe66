"""Transformer layers, each with a readable reference path and an optimized one (``impl=``).

    RMSNorm(dim, impl="eager"|"triton")             norm.py   (+ fused residual add)
    SwiGLU(dim, hidden, impl="eager"|"triton")      mlp.py
    RotaryCache, apply_rope(..., impl=...)           rope.py   (one cos/sin cache for all layers)
    Attention(dim, n_heads, n_kv_heads, impl="manual"|"sdpa"|"chunked", backend=...)  attention.py
"""
# The functional ``attention`` dispatcher stays in ``mahia.layers.attention`` (importing it here
# would shadow the submodule of the same name).
from .attention import (Attention, StaticKVCache, attention_bytes, attention_flops,
                        available_backends, chunked_attention, manual_attention, resolve_backend,
                        rope_rows, sdpa_attention)
from .mlp import SwiGLU, swiglu_eager
from .norm import RMSNorm, add_rms_norm_eager, rms_norm_eager
from .rope import RotaryCache, apply_rope, apply_rope_eager

__all__ = [
    "Attention", "StaticKVCache", "attention_bytes", "attention_flops",
    "available_backends", "chunked_attention", "manual_attention", "resolve_backend", "rope_rows",
    "sdpa_attention", "SwiGLU", "swiglu_eager", "RMSNorm", "add_rms_norm_eager", "rms_norm_eager",
    "RotaryCache", "apply_rope", "apply_rope_eager",
]
