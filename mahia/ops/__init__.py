"""The model's hot ops, one file each: the eager reference, the Triton kernels, their launchers, the
``torch.library`` custom ops (fake and autograd rules, so ``torch.compile`` traces through them) and
the public function that picks a path.

    rms_norm(x, weight, eps) -> y                        rmsnorm.py      reference: rms_norm_eager
    add_rms_norm(x, residual, weight, eps) -> (y, h)     rmsnorm.py      reference: add_rms_norm_eager
    swiglu(a, b) or swiglu([a | b]) -> silu(a) * b       swiglu.py       reference: swiglu_eager
    rope(q, k, cos, sin) -> (q_rot, k_rot)               rope.py         reference: apply_rope_eager
    moe_combine(out, inverse, gates, dtype) -> y         moe_combine.py  reference: moe_combine_eager
    grouped_mm(a, b, offs, backend="auto") -> c          grouped_mm.py   three backends, one product
    gated_linear_attention(q, k, v, g, impl=...) -> o    gla_scan/       references: gla_loop, gla_logspace

Each public function validates its inputs once (errors name it and the argument) and launches the
Triton kernels where they can run (:mod:`mahia.ops.dispatch`), else the eager reference, with one
warning per op. Each op file's docstring lists its edge cases; ``status()`` says which kernels are active.
"""

from __future__ import annotations

from mahia.ops.dispatch import KERNELS, reset_fallback_warnings, status, triton_available_for, why_not
from mahia.ops.gla_scan import gated_linear_attention, gla_logspace, gla_loop
from mahia.ops.grouped_mm import grouped_mm, grouped_mm_backend
from mahia.ops.moe_combine import moe_combine, moe_combine_eager
from mahia.ops.rmsnorm import add_rms_norm, add_rms_norm_eager, rms_norm, rms_norm_eager
from mahia.ops.rope import apply_rope_eager, rope
from mahia.ops.swiglu import swiglu, swiglu_eager

__all__ = ["rms_norm", "add_rms_norm", "swiglu", "rope", "moe_combine", "grouped_mm", "gated_linear_attention"]
__all__ += ["rms_norm_eager", "add_rms_norm_eager", "swiglu_eager", "apply_rope_eager", "moe_combine_eager", "gla_loop"]
__all__ += ["gla_logspace", "grouped_mm_backend", "status", "triton_available_for", "why_not"]
__all__ += ["reset_fallback_warnings", "KERNELS"]
