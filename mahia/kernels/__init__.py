"""Triton kernels for the pointwise and normalization ops of a transformer block.

Public functions (each the same function as its eager reference in :mod:`mahia.layers` or
:mod:`mahia.model.moe`):

    rms_norm(x, weight, eps=1e-6) -> y                       mahia.layers.norm.rms_norm_eager
    add_rms_norm(x, residual, weight, eps=1e-6) -> (y, h)    mahia.layers.norm.add_rms_norm_eager
    swiglu(a, b) -> silu(a) * b                              mahia.layers.mlp.swiglu_eager
    rope(q, k, cos, sin) -> (q_rot, k_rot)                   mahia.layers.rope.apply_rope_eager
    moe_combine(out, inverse, gates, dtype) -> y             mahia.model.moe.moe_combine_eager

Each is a ``torch.library`` custom op (``mahia::rms_norm_fwd`` ...) with fake and autograd rules, so
``torch.compile`` traces through it without a graph break. Where a kernel cannot run (no triton,
``MAHIA_DISABLE_TRITON=1``, a CPU tensor without ``TRITON_INTERPRET=1``) the eager reference runs
instead, with one warning per kernel; float64 inputs always take the eager path (the kernels compute
in float32). ``status()`` says which kernels are active.
"""
from __future__ import annotations

import torch

from mahia.kernels._registry import (
    KERNELS,
    reset_fallback_warnings,
    status,
    triton_available_for,
    triton_import_error,
    warn_fallback_once,
)

__all__ = [
    "rms_norm",
    "add_rms_norm",
    "swiglu",
    "rope",
    "moe_combine",
    "status",
    "triton_available_for",
    "reset_fallback_warnings",
    "KERNELS",
]

if triton_import_error() is None:
    from mahia.kernels import moe_combine as _moe_combine
    from mahia.kernels import rmsnorm as _rmsnorm
    from mahia.kernels import rope as _rope
    from mahia.kernels import swiglu as _swiglu


def _use_triton(kernel: str, t: torch.Tensor) -> bool:
    if not isinstance(t, torch.Tensor) or t.dtype == torch.float64:
        # float64 is reference precision, which the eager path computes exactly; a non-tensor gets
        # the eager path's TypeError.
        return False
    if not triton_available_for(t):
        warn_fallback_once(kernel, t)
        return False
    return True


# The eager references are imported inside the functions: mahia.layers and mahia.model.moe import
# this package.

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight (float32 math, output in x.dtype).  x: (..., N)."""
    if _use_triton("rms_norm", x):
        return _rmsnorm.rms_norm(x, weight, eps)
    from mahia.layers.norm import rms_norm_eager
    return rms_norm_eager(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; y = rms_norm(h, weight, eps). Returns (y, h)."""
    if _use_triton("add_rms_norm", x):
        return _rmsnorm.add_rms_norm(x, residual, weight, eps)
    from mahia.layers.norm import add_rms_norm_eager
    return add_rms_norm_eager(x, residual, weight, eps)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = silu(a) * b (float32 math, output in a.dtype).  a, b: (..., H)."""
    if _use_triton("swiglu", a):
        return _swiglu.swiglu(a, b)
    from mahia.layers.mlp import swiglu_eager
    return swiglu_eager(a, b)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, T, Hq, D) and k (B, T, Hkv, D) by cos/sin (T, D/2), rotate-half convention."""
    if _use_triton("rope", q):
        return _rope.rope(q, k, cos, sin)
    from mahia.layers.rope import apply_rope_eager
    return apply_rope_eager(q, k, cos, sin)


def moe_combine(out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """y[n] = sum_j gates[n, j] * out[inverse[n*k + j]]: the MoE layer's un-permute + gated sum, one pass.

    out (N*k, D) in expert order, inverse (N*k,) int64 permutation, gates (N, k); y (N, D) in ``dtype``
    (None: out.dtype). The kernel computes in float32 and rounds once; the eager reference gates in
    out.dtype and sums in ``dtype``.
    """
    if (_use_triton("moe_combine", out) and isinstance(gates, torch.Tensor)
            and gates.dtype != torch.float64 and dtype != torch.float64):
        return _moe_combine.moe_combine(out, inverse, gates, dtype)
    from mahia.model.moe import moe_combine_eager
    return moe_combine_eager(out, inverse, gates, dtype)
