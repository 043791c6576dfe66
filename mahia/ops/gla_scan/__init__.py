"""Gated linear attention (GLA): the public function, and the one custom op and one autograd.Function
through which it reaches the Triton kernels.

Math, per batch b and head h (K key channels, V value channels, state S_t in R^{K x V}, S_0 = 0):

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,        o_t = S_t^T q_t,        g_t <= 0 (log-decays)

The recurrence (``impl="loop"``, the float64 reference) and the PyTorch chunked form (``"logspace"``)
are in :mod:`mahia.ops.gla_scan.reference`; the Triton kernels of the same chunked form (``"triton"``)
in :mod:`mahia.ops.gla_scan.kernels`.

Chunked form (chunk of BT = 16 rows; b_i = g_1 + ... + g_i summed from the chunk start, so b <= 0 and
b_last = b_BT is the decay of the whole chunk; S is the state entering the chunk):

    o_i   = (q_i * exp(b_i)) S                                   inter-chunk: a matmul, exp(b_i) <= 1
          + sum_{j<=i} A_ij v_j,                                 intra-chunk: a masked matmul
      A_ij = sum_c q_ic k_jc exp(b_ic - b_jc)                    pairwise decays, exp(...) <= 1
    S'    = exp(b_last) * S + sum_j (k_j * exp(b_last - b_j)) v_j^T

Resets: a log-decay below RESET = -60 (exp(-60) = 9e-27; -inf included, e.g. log(sigmoid(-200)) in
float32) clears its key channel of the state, as exp(g) = 0 does in the recurrence. The chunked paths
leave it out of the cumulative sum b and set every decay across it to 0: summed in, a -inf would give
-inf - (-inf) = NaN in b_i - b_j, and a -1e30 would absorb every small gate added after it (float32
keeps 7 digits of b). Its gradient dg is 0, the float64 value of exp(g) times a finite sum.

NaN and Inf stay causal: a non-finite value at step t reaches no output before t, on every path, as
in the recurrence. The pairwise sums select their strictly-upper terms away with ``where`` (0 * NaN
would be NaN), and the intra-chunk product A v takes v with its non-finite entries zeroed, the
outputs of each value column from its first non-finite entry on being set to NaN (the recurrence
gives NaN or +-Inf there). Cost in the kernels: one select per pairwise term and a few per (row,
value column) element, nothing that touches memory; the log-space path does its (C, C) x (C, V)
product twice (with and without the non-finite entries). In the backward, dq, dk and dv of the steps
before t stay finite wherever the recurrence's do; dg of the steps of t's own chunk before t (at most
15) may not: it comes from pairwise differences b_i - b_j (the Triton path also from the identity
dg = reverse cumsum of q * dq - k * dk), sums whose NaN terms cancel only in exact arithmetic.

Behaviour at the edges: T = 0 returns an empty (B, H, 0, V) output that keeps q, k, v and g in the
autograd graph (zero gradients); a key dim K > 128 with ``impl="triton"`` runs the log-space path with
the one-time fallback warning; float64 in any input (e.g. a float64 g next to float32 q, k, v) takes the
log-space path silently; ``meta`` tensors get their shapes from the PyTorch paths, never the interpreter.
Inputs are validated once, by the public function, whose name the errors carry. g <= 0 is assumed, not
checked (a check would read the data: a host sync).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mahia.ops.dispatch import use_triton
from mahia.ops.gla_scan import kernels
from mahia.ops.gla_scan.kernels import MAX_K
from mahia.ops.gla_scan.reference import (
    LOGSPACE_CHUNK,
    _gla_logspace,
    _gla_loop,
    check_gla_inputs,
    gla_bytes,
    gla_flops,
    gla_logspace,
    gla_loop,
)

__all__ = ["IMPLS", "gated_linear_attention", "gla_loop", "gla_logspace", "gla_flops", "gla_bytes"]

IMPLS = ("loop", "logspace", "triton")

# torch.compile sees one custom op per kernel (fake and autograd rules below), registering the launchers themselves.
# flexible_layout: the kernels take any strides, so Inductor passes its padded views uncopied (H200, torch 2.11,
# 2026-12-05: else 3 copies a call each way, 48 kernels a step of the small hybrid).
_fwd_op = torch.library.custom_op("mahia::gla_fwd", kernels.gla_fwd, mutates_args=(), tags=(torch.Tag.flexible_layout,))
_bwd_op = torch.library.custom_op("mahia::gla_bwd", kernels.gla_bwd, mutates_args=(), tags=(torch.Tag.flexible_layout,))
_fwd_op.register_fake(lambda q, k, v, g, scale=1.0, inv_t=0.0: kernels.output_like(v))  # strides checked
_bwd_op.register_fake(lambda q, k, v, g, do, scale=1.0, inv_t=0.0: tuple(map(kernels.output_like, (q, k, v, g))))


def _save_inputs(ctx, inputs, output):
    *tensors, ctx.scale, ctx.inv_t = inputs
    ctx.save_for_backward(*tensors)  # q, k, v, g: the backward recomputes states instead of storing them


def _grads(bwd):
    return lambda ctx, do: (*bwd(*ctx.saved_tensors, do, ctx.scale, ctx.inv_t), None, None)  # none for the floats


_fwd_op.register_autograd(_grads(_bwd_op), setup_context=_save_inputs)


class _GLAFunction(torch.autograd.Function):
    """Eager autograd over the same launchers, without the custom op's dispatch (less host time)."""

    forward = staticmethod(kernels.gla_fwd)
    setup_context = staticmethod(_save_inputs)
    backward = staticmethod(_grads(kernels.gla_bwd))


def gated_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *, impl: str, scale: float = 1.0,
    gate_temperature: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """o_t = S_t^T (scale q_t) with S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T  (module docstring).

    q, k: (B, H, T, K); v: (B, H, T, V); g: (B, H, T, K) log-decays, <= 0 (not checked: a check
    reads the data, a host sync; below -60 a full reset), or with ``gate_temperature`` t the gate's logits z,
    the log-decays being logsigmoid(z) / t (GLA's gate; the Triton path computes them in its kernels, as it
    scales q, so neither is a tensor). Returns (B, H, T, V) in v's dtype. The Triton path
    reads transposed views of (B, T, H, d) tensors in place and then returns o as one, (B, T, H, V) in memory
    (a view to ``.transpose(1, 2).reshape(B, T, H * V)`` for free). ``impl``:
    "loop", "logspace" or "triton" (falls back to "logspace", with one warning, where Triton cannot run
    on the input, K > 128 included; float64 in any input takes "logspace" silently, since the kernels
    compute in float32; so do ``meta`` tensors). T = 0 gives an empty output with zero gradients for
    all four inputs. A NaN at step t reaches no output before t. Inputs are checked once, here.
    """
    fn, t = "gated_linear_attention", gate_temperature
    if impl not in IMPLS:
        raise ValueError(f"{fn}: impl must be one of {IMPLS}, got {impl!r}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"{fn}: scale must be a finite number, got {scale!r}")
    if not (t is None or (isinstance(t, (int, float)) and 0 < t < math.inf)):
        raise ValueError(f"{fn}: gate_temperature must be None or a positive finite number, got {t!r}")
    check_gla_inputs(fn, q, k, v, g)
    K = q.shape[-1]
    too_wide = None if K <= MAX_K else f"key dim K={K} exceeds the kernel's limit of {MAX_K} (registers)"
    if impl == "triton" and use_triton("gla", q, k, v, g, unsupported=too_wide):
        scale, inv_t = float(scale), 0.0 if t is None else 1.0 / t
        if torch.compiler.is_compiling():
            return _fwd_op(q, k, v, g, scale, inv_t)
        return _GLAFunction.apply(q, k, v, g, scale, inv_t)
    dt = torch.promote_types(q.dtype, torch.float32)  # the PyTorch paths compute in it: q and g enter unrounded
    q = q if scale == 1 else q.to(dt) * scale
    g = g if t is None else F.logsigmoid(g.to(dt)) / t
    return _gla_loop(q, k, v, g) if impl == "loop" else _gla_logspace(q, k, v, g, LOGSPACE_CHUNK)
