"""Rotary position embedding in Triton: q and k rotated in one launch, forward and backward.

Rotate-half convention (Llama / Hugging Face). For a head vector x = [x1, x2] (halves of D/2) at
position t, with cos/sin the (T, D/2) float32 tables:

    forward:  [x1 * cos - x2 * sin,  x2 * cos + x1 * sin]
    backward: the transpose of a rotation is the rotation by -angle: the same formula with sin negated

One program per token (b, t) loads its cos/sin row once and rotates all Hq query and Hkv key heads (GQA).
Out of place, outputs contiguous (B, T, H, D); q and k may be strided (views of a fused qkv projection)
with a contiguous last dim. cos and sin are constants: tables that require grad (while grad mode is on)
are refused with a ValueError, on every path.

Under torch.compile the custom op ``mahia::rope`` runs (its ``backward`` flag negates sin). Edges: float64 anywhere runs the eager reference silently (q's dtype out); empty inputs give empty
outputs; ``meta`` tensors get their shapes from the eager reference.
"""

from __future__ import annotations

import torch

from mahia.measure.checks import check_float_tensor, check_same_device
from mahia.ops._launch import Launcher, c_apply, pow2_divisor
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import use_triton

__all__ = ["rope", "apply_rope_eager"]


# Input checks and the eager reference


def check_rope_inputs(fn: str, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """q (B, T, Hq, D), k (B, T, Hkv, D) of one dtype, D even, cos and sin (T, D/2) that do not require
    grad (they are constants), one device."""
    for name, t in (("q", q), ("k", k)):
        check_float_tensor(fn, name, t)
        if t.dim() != 4:
            raise ValueError(f"{fn}: {name} must be 4-D (B, T, H, D), got shape {tuple(t.shape)}")
    check_float_tensor(fn, "cos", cos)
    check_float_tensor(fn, "sin", sin)
    B, T, _, D = q.shape
    if k.shape[0] != B or k.shape[1] != T or k.shape[3] != D:
        raise ValueError(
            f"{fn}: k must be (B, T, Hkv, D) = ({B}, {T}, Hkv, {D}) to match q {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if k.dtype != q.dtype:
        raise TypeError(f"{fn}: k must have the dtype of q ({q.dtype}), got {k.dtype}")
    if D % 2 != 0:
        raise ValueError(f"{fn}: head dim D must be even, got {D}")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (T, D // 2):
            raise ValueError(f"{fn}: {name} must have shape (T, D/2) = ({T}, {D // 2}), got {tuple(t.shape)}")
    check_same_device(fn, q=q, k=k, cos=cos, sin=sin)
    if (cos.requires_grad or sin.requires_grad) and torch.is_grad_enabled():
        raise ValueError(
            f"{fn}: cos and sin must not require grad (they are constants: no gradient flows to them); "
            "pass detached tables, e.g. from RotaryCache.get"
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dt = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x.to(dt).chunk(2, dim=-1)  # (B, T, H, D/2) each
    cos, sin = cos.to(dt)[:, None, :], sin.to(dt)[:, None, :]  # (T, 1, D/2): broadcast over heads
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def apply_rope_eager(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, T, Hq, D) and k (B, T, Hkv, D) by cos/sin (T, D/2); math in fp32, output in input dtype."""
    check_rope_inputs("apply_rope_eager", q, k, cos, sin)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


@triton.jit
def _load_halves(X, row, stride_h, n_heads, half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """The two halves (BLOCK_H, BLOCK_HALF) of one token's n_heads head vectors; X + row is its first element."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    mask = (h < n_heads)[:, None] & (d < half)[None, :]
    src = X + row + h[:, None] * stride_h + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _rotate_heads(OUT, row, x1, x2, cos, sin, n_heads, half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate one token's heads and store them, contiguous, at OUT + row: (x1 cos - x2 sin, x2 cos + x1 sin)."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    mask = (h < n_heads)[:, None] & (d < half)[None, :]
    dst = OUT + row + h[:, None] * (2 * half) + d[None, :]
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(OUT.dtype.element_ty), mask=mask)
    tl.store(dst + half, (x2 * cos[None, :] + x1 * sin[None, :]).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, T, n_qh, n_kh, half,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_cos, stride_sin,
    BACKWARD: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ALIGN: tl.constexpr,  # a power of two dividing half and every stride (pow2_divisor)
):  # fmt: skip
    # the same values, known to the compiler as multiples of ALIGN: vector loads for any head dim
    half = half // ALIGN * ALIGN
    stride_qb = stride_qb // ALIGN * ALIGN
    stride_qt = stride_qt // ALIGN * ALIGN
    stride_qh = stride_qh // ALIGN * ALIGN
    stride_kb = stride_kb // ALIGN * ALIGN
    stride_kt = stride_kt // ALIGN * ALIGN
    stride_kh = stride_kh // ALIGN * ALIGN
    stride_cos = stride_cos // ALIGN * ALIGN
    stride_sin = stride_sin // ALIGN * ALIGN
    pid = tl.program_id(0).to(tl.int64)  # one token: pid = b * T + t
    b = pid // T
    t = pid % T

    # Every load before the first store: the compiler cannot move k's loads above q's stores (the
    # pointers might alias), so stores in between cost each program a second memory latency. On an
    # H100 (bf16, tools/probes/fwd_variants.py, 2026-11-24): 1-5% faster at 1-2 k tokens, equal at 16 k.
    d = tl.arange(0, BLOCK_HALF)
    cos = tl.load(COS + t * stride_cos + d, mask=d < half, other=0.0).to(tl.float32)
    sin = tl.load(SIN + t * stride_sin + d, mask=d < half, other=0.0).to(tl.float32)
    q1, q2 = _load_halves(Q, b * stride_qb + t * stride_qt, stride_qh, n_qh, half, BLOCK_QH, BLOCK_HALF)
    k1, k2 = _load_halves(K, b * stride_kb + t * stride_kt, stride_kh, n_kh, half, BLOCK_KH, BLOCK_HALF)
    if BACKWARD:
        sin = -sin

    _rotate_heads(QO, pid * n_qh * 2 * half, q1, q2, cos, sin, n_qh, half, BLOCK_QH, BLOCK_HALF)
    _rotate_heads(KO, pid * n_kh * 2 * half, k1, k2, cos, sin, n_kh, half, BLOCK_KH, BLOCK_HALF)


_launch_rope = Launcher(_rope_kernel)


def _num_warps(block_qh: int, block_half: int) -> int:
    """~8 elements of each q half-tile per thread: 8 warps for 32 heads of 128 (H100, bf16: 2% faster
    than 4 warps, 0.93 of copy bandwidth per pass; 16 warps lost 10%)."""
    return max(1, min(8, block_qh * block_half // 256))


def _empty(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor like t (empty_like keeps t's strides when t is a permuted dense view)."""
    return torch.empty_like(t) if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def rope_launch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate checked q (B, T, Hq, D) and k (B, T, Hkv, D) by cos/sin (T, D/2); ``backward`` negates sin."""
    # the kernel needs a unit stride along D only
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    B, T, n_qh, D = q.shape
    n_kh = k.shape[2]
    q_out, k_out = _empty(q), _empty(k)
    if B * T == 0 or D == 0:
        return q_out, k_out
    half = D // 2
    block_qh, block_kh, block_half = (
        1 << (n_qh - 1).bit_length(),
        1 << (n_kh - 1).bit_length(),
        1 << (half - 1).bit_length(),
    )
    (sqb, sqt, sqh), (skb, skt, skh) = q.stride()[:3], k.stride()[:3]
    scos, ssin = cos.stride(0), sin.stride(0)
    _launch_rope(
        (B * T,), q, k, q_out, k_out, cos, sin, T, n_qh, n_kh, half, sqb, sqt, sqh, skb, skt, skh, scos, ssin,
        BACKWARD=backward,
        BLOCK_QH=block_qh,
        BLOCK_KH=block_kh,
        BLOCK_HALF=block_half,
        ALIGN=pow2_divisor(half | sqb | sqt | sqh | skb | skt | skh | scos | ssin),
        num_warps=_num_warps(block_qh, block_half),
    )  # fmt: skip
    return q_out, k_out


# The two registrations over the same launcher: an autograd.Function for eager calls (less host time than
# a custom op's dispatch), the custom op for torch.compile (opaque to it, with fake and autograd rules).


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_launch(q, k, cos, sin)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = rope_launch(dq, dk, cos, sin, backward=True)
        return dq, dk, None, None


@torch.library.custom_op("mahia::rope", mutates_args=())
def _op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_launch(q, k, cos, sin, backward=backward)


_op.register_fake(lambda q, k, cos, sin, backward: (q.new_empty(q.shape), k.new_empty(k.shape)))


def _setup(ctx, inputs, output):
    _q, _k, cos, sin, ctx.backward = inputs
    ctx.save_for_backward(cos, sin)


def _backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    dq, dk = _op(dq, dk, cos, sin, not ctx.backward)  # the transpose of a rotation: the opposite angle
    return dq, dk, None, None, None


_op.register_autograd(_backward, setup_context=_setup)
_apply = c_apply(_Rope)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, T, Hq, D) and k (B, T, Hkv, D) by cos/sin (T, D/2), rotate-half convention.

    The Triton kernel where it can run (:mod:`mahia.ops.dispatch`), else :func:`apply_rope_eager` (also
    for float64 q, k, cos or sin, silently, and for ``meta`` tensors). cos and sin are constants (tables
    that require grad are refused). Inputs are checked once, here; errors name ``rope`` and the argument.
    """
    check_rope_inputs("rope", q, k, cos, sin)
    if use_triton("rope", q, k, cos, sin):
        if torch.compiler.is_compiling():
            return _op(q, k, cos, sin, False)
        if (q.requires_grad or k.requires_grad) and torch.is_grad_enabled():
            return _apply(q, k, cos, sin)
        return rope_launch(q, k, cos, sin)  # no graph to record: no Function
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
