"""SwiGLU activation in Triton, forward and backward.

    c  = silu(a) * b = a * s * b,        s = sigmoid(a)             (float32 math)
    da = dc * b * s * (1 + a * (1 - s))
    db = dc * a * s

The backward recomputes s from a instead of saving it (one more exp per element is free in a kernel
bound by memory). Bytes: the forward reads a, b and writes c; the backward reads dc, a, b, writes da, db.
The kernel walks (rows, N) in 1-D blocks along N; when every operand is contiguous the tensor is one
long row, otherwise each operand needs a unit stride along N only.

``swiglu(h)``, one packed (..., 2N) tensor [a | b] as ``F.glu`` takes it (the output of a fused gate/up
projection): the halves are read in place and the backward writes dh = [da | db] into one tensor. Given
the halves apart, autograd would concatenate da and db into dh after the kernel: under torch.compile one
more copy kernel a call (a GPU's lowering of the cat), which Inductor cannot fuse into a custom op's output.

Edges: empty inputs give empty outputs and gradients; float64 runs the eager reference silently;
``meta`` tensors get their shapes from it.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.nn.functional as F

from mahia.measure.checks import check_float_tensor, check_same_device
from mahia.ops._launch import Launcher, c_apply, cdiv, pow2_divisor
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import use_triton

__all__ = ["swiglu", "swiglu_eager"]


# Input checks and the eager reference


def check_swiglu_inputs(fn: str, a: torch.Tensor, b: torch.Tensor | None) -> None:
    """a and b: same shape, dtype and device; b None: a packs both halves along an even last dim."""
    check_float_tensor(fn, "a", a)
    if b is None:
        if a.shape[-1] % 2:
            raise ValueError(f"{fn}: a packed [a | b] needs an even last dim, got shape {tuple(a.shape)}")
        return
    check_float_tensor(fn, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"{fn}: a and b must have the same shape, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{fn}: a and b must have the same dtype, got a {a.dtype} and b {b.dtype}")
    check_same_device(fn, a=a, b=b)


def _halves(a: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    n = a.shape[-1] // 2
    return (a[..., :n], a[..., n:]) if b is None else (a, b)  # views: the kernels read the halves in place


def _swiglu_eager(a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    a, b = _halves(a, b)
    dt = torch.promote_types(a.dtype, torch.float32)
    return (F.silu(a.to(dt)) * b.to(dt)).to(a.dtype)


def swiglu_eager(a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """c = silu(a) * b, computed in float32 and returned in ``a.dtype``.  a, b: (..., N); or a (..., 2N) = [a | b]."""
    check_swiglu_inputs("swiglu_eager", a, b)
    return _swiglu_eager(a, b)


@triton.jit
def _swiglu_fwd_kernel(
    A, B, C, n_cols, n_col_blocks, stride_a, stride_b, stride_c, BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,  # a power of two dividing n_cols and the row strides (pow2_divisor)
):  # fmt: skip
    # the same values, known to the compiler as multiples of ALIGN: vector loads for odd-sized rows too
    n_cols = n_cols // ALIGN * ALIGN
    stride_a = stride_a // ALIGN * ALIGN
    stride_b = stride_b // ALIGN * ALIGN
    stride_c = stride_c // ALIGN * ALIGN
    pid = tl.program_id(0)
    row = (pid // n_col_blocks).to(tl.int64)
    col0 = (pid % n_col_blocks).to(tl.int64) * BLOCK  # int64: one long row can pass 2**31 elements
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols - col0

    a = tl.load(A + row * stride_a + col0 + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + row * stride_b + col0 + offs, mask=mask, other=0.0).to(tl.float32)
    c = a * tl.sigmoid(a) * b
    tl.store(C + row * stride_c + col0 + offs, c.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    DC, A, B, DA, DB, n_cols, n_col_blocks,
    stride_dc, stride_a, stride_b, stride_da, stride_db, BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    n_cols = n_cols // ALIGN * ALIGN
    stride_dc = stride_dc // ALIGN * ALIGN
    stride_a = stride_a // ALIGN * ALIGN
    stride_b = stride_b // ALIGN * ALIGN
    stride_da = stride_da // ALIGN * ALIGN
    stride_db = stride_db // ALIGN * ALIGN
    pid = tl.program_id(0)
    row = (pid // n_col_blocks).to(tl.int64)
    col0 = (pid % n_col_blocks).to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols - col0

    dc = tl.load(DC + row * stride_dc + col0 + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + row * stride_a + col0 + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + row * stride_b + col0 + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    da = dc * b * s * (1.0 + a * (1.0 - s))
    db = dc * a * s
    tl.store(DA + row * stride_da + col0 + offs, da.to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + row * stride_db + col0 + offs, db.to(DB.dtype.element_ty), mask=mask)


_launch_fwd = Launcher(_swiglu_fwd_kernel)
_launch_bwd = Launcher(_swiglu_bwd_kernel)


def _config(n_cols: int) -> tuple[int, int]:
    """(BLOCK, num_warps): 1024 elements per program, 2 warps (16 per thread) for long rows.

    On an H100 (bf16, 2026-11-24, tools/probes/config_sweep.py; BLOCK 256-4096 x 1-16 warps at eight
    shapes from 1024 x 2048 to 16384 x 2048, contiguous operands being one row of rows x N elements)
    this choice was within 1% of the best configuration of each pass at every shape but one (the
    backward at 1024 x 2048, 4%); the earlier 2048 x 8 lost 11% in the forward at 1024 x 4096. On an
    H200 at 16384 x 11008 (2026-11-22) 2048 x 8 and 1024 x 4 had tied within 0.5%.
    """
    block = min(1024, max(128, 1 << (n_cols - 1).bit_length()))
    return block, max(1, min(2, block // 256))


def _as_rows(*tensors: torch.Tensor) -> tuple[int, int, list[torch.Tensor], list[int]]:
    """(rows, N, operands, row strides): same-shape operands seen as (rows, N) with unit stride along N.

    All contiguous: one row of numel elements, the tensors passed as they are (no view: a view costs
    host time, and the kernel only needs the pointer). Otherwise each keeps its own row stride; an
    input whose last dim is strided is copied to contiguous first (outputs never are).
    """
    if all(t.is_contiguous() for t in tensors):
        n = tensors[0].numel()
        return 1, n, list(tensors), [n] * len(tensors)
    out = []
    for t in tensors:
        if t.stride(-1) != 1:
            t = t.contiguous()
        out.append(t.reshape(-1, t.shape[-1]))
    return out[0].shape[0], out[0].shape[1], out, [t.stride(0) for t in out]


def _plan(*operands: torch.Tensor) -> tuple[tuple[int], tuple, dict]:
    """(grid, runtime arguments, meta) of a launch on checked same-shape operands with elements: the inputs,
    then the outputs (written in place: views of a fresh tensor, with a unit stride along N)."""
    n_rows, n_cols, operands, strides = _as_rows(*operands)
    block, num_warps = _config(n_cols)
    n_col_blocks = cdiv(n_cols, block)
    meta = dict(BLOCK=block, ALIGN=pow2_divisor(functools.reduce(operator.or_, strides, n_cols)), num_warps=num_warps)
    return (n_rows * n_col_blocks,), (*operands, n_cols, n_col_blocks, *strides), meta


def _fwd(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    a, b = _halves(a, b)
    c = a.new_empty(a.shape)
    if c.numel():
        grid, args, meta = _plan(a, b, c)
        _launch_fwd(grid, *args, **meta)
    return c


def _bwd(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None) -> list[torch.Tensor]:
    """[dh] for a packed h = a (b None), else [da, db]."""
    grads = [a.new_empty(a.shape) for _ in range(1 if b is None else 2)]
    if dc.numel():
        grid, args, meta = _plan(dc, *_halves(a, b), *_halves(grads[0], None) if b is None else grads)
        _launch_bwd(grid, *args, **meta)
    return grads


# The two registrations over the same launchers: an autograd.Function for eager calls (less host time than
# a custom op's dispatch), the custom ops for torch.compile (opaque to it, with fake and autograd rules).


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _fwd(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return (*_bwd(dc, a, b), None)[:2]  # (da, db), or (dh, None) for a packed h


@torch.library.custom_op("mahia::swiglu_fwd", mutates_args=())
def _fwd_op(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return _fwd(a, b)


_fwd_op.register_fake(lambda a, b: a.new_empty(_halves(a, b)[0].shape))


@torch.library.custom_op("mahia::swiglu_bwd", mutates_args=())
def _bwd_op(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    # (dh, an empty tensor) for a packed h: Inductor's C++ wrapper read a list return as one tensor (a segfault)
    da, *db = _bwd(dc, a, b)
    return da, db[0] if db else a.new_empty(0)


_bwd_op.register_fake(lambda dc, a, b: (a.new_empty(a.shape), a.new_empty(a.shape if b is not None else (0,))))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    da, db = _bwd_op(dc, a, b)
    return da, None if b is None else db


_fwd_op.register_autograd(_backward, setup_context=_setup)
_apply = c_apply(_SwiGLU)


def swiglu(a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """c = silu(a) * b (float32 math, output in a.dtype).  a, b: (..., N); or ``swiglu(h)``, h (..., 2N) = [a | b]
    (module docstring: one gradient tensor, no concatenation after the kernel).

    The Triton kernels where they can run (:mod:`mahia.ops.dispatch`), else :func:`swiglu_eager` (also
    for float64 and ``meta`` inputs). Inputs are checked once, here; errors name ``swiglu``.
    """
    check_swiglu_inputs("swiglu", a, b)
    if use_triton("swiglu", *(a,) if b is None else (a, b)):
        if torch.compiler.is_compiling():
            return _fwd_op(a, b)
        if (a.requires_grad or b is not None and b.requires_grad) and torch.is_grad_enabled():
            return _apply(a, b)
        return _fwd(a, b)  # no graph to record: no Function
    return _swiglu_eager(a, b)
