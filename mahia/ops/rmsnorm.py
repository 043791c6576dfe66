"""RMSNorm and residual-add + RMSNorm in Triton, forward and backward.

Forward, per row x of length N (math in float32):

    rstd = 1 / sqrt(mean(x^2) + eps)          (recomputed by the backward from the x it loads anyway)
    y    = x * rstd * w

With a residual (``add_rms_norm``) the kernel first forms h = x + residual, writes it (rounded to the
input dtype, as eager PyTorch does) and normalizes that rounded h. Backward, with x_hat = x * rstd and
g = w * dy:

    dx = rstd * (g - x_hat * mean(x_hat * g))          (+ the incoming gradient of h, for add_rms_norm)
    dw = sum over rows of dy * x_hat

The backward runs a persistent grid (a few programs per SM): each program walks a contiguous block of
rows and keeps its partial dw in float32 registers; a second small kernel sums the partials (a single
program writes dw itself). Bytes: 5 passes over an (M, N) tensor, everything else O(M + N).

Edges: any leading dims (the last dim is made contiguous if it is not); hidden sizes past ``MAX_HIDDEN``
(the row lives in registers) run the eager reference with the one-time warning; float64 anywhere runs it
silently (reference precision; the output keeps x's dtype); eps is any real >= 0, converted once with
``float`` (at eps = 0 a row of zeros is 0/0, NaN, on every path, and only there); empty inputs give empty
outputs and a zero weight gradient; ``meta`` tensors get their shapes from the eager reference.
"""

from __future__ import annotations

import functools
import numbers

import torch

from mahia.measure.checks import check_float_tensor
from mahia.ops._launch import (
    Launcher,
    _hooks_installed,
    c_apply,
    cdiv,
    current_device,
    current_stream,
    direct_launch_available,
    next_pow2,
    pow2_divisor,
    sm_count,
)
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import use_triton

__all__ = ["rms_norm", "add_rms_norm", "rms_norm_eager", "add_rms_norm_eager", "MAX_HIDDEN"]

MAX_HIDDEN = 65536
_Tensor = torch.Tensor


# The one input check, and the eager reference (the readable "before"; float64 inputs make it the reference)


def check_rms_norm_inputs(
    fn: str, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None, eps=1e-6, out_dtype=None
) -> float:
    """x (..., N) and weight (N,) floating point, residual like x, one device, eps a real number >= 0, out_dtype
    None or a floating dtype. Returns eps as a float; errors name ``fn`` and the argument."""
    if out_dtype is not None and not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):
        raise TypeError(f"{fn}: out_dtype must be None or a floating-point torch.dtype, got {out_dtype!r}")
    if not (isinstance(x, _Tensor) and x.is_floating_point() and x.dim()):
        check_float_tensor(fn, "x", x)
    if not (isinstance(weight, _Tensor) and weight.is_floating_point()):
        check_float_tensor(fn, "weight", weight)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{fn}: weight must have shape ({x.shape[-1]},) to match the last dim of x "
            f"{tuple(x.shape)}, got {tuple(weight.shape)}"
        )
    if residual is not None:
        check_float_tensor(fn, "residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"{fn}: residual must have the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"{fn}: residual must have the dtype of x ({x.dtype}), got {residual.dtype}")
        if residual.device != x.device:
            raise ValueError(
                f"{fn}: all inputs must be on the same device, got x on {x.device}, residual on {residual.device}"
            )
    if weight.device != x.device:
        raise ValueError(f"{fn}: all inputs must be on the same device, got x on {x.device}, weight on {weight.device}")
    if type(eps) is not float:
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
            raise TypeError(f"{fn}: eps must be a real number >= 0, got {type(eps).__name__} {eps!r}")
        eps = float(eps)
    if not eps >= 0.0:  # also rejects NaN
        raise ValueError(f"{fn}: eps must be >= 0, got {eps}")
    return eps


def _rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype=None) -> torch.Tensor:
    # float32 math for half types; float64 stays float64 so the eager path doubles as the reference
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return (xf * rstd * weight.to(xf.dtype)).to(out_dtype or x.dtype)


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out_dtype=None) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, in float32, returned in ``out_dtype`` (default x.dtype).
    x: (..., N)."""
    eps = check_rms_norm_inputs("rms_norm_eager", x, weight, None, eps, out_dtype)
    return _rms_norm_eager(x, weight, eps, out_dtype)


def add_rms_norm_eager(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out_dtype=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual (in ``x.dtype``); y = rms_norm(h) in ``out_dtype``.  Returns (y, h): a pre-norm block's."""
    eps = check_rms_norm_inputs("add_rms_norm_eager", x, weight, residual, eps, out_dtype)
    h = x + residual
    return _rms_norm_eager(h, weight, eps, out_dtype), h


# Kernels


@triton.jit
def _rms_norm_fwd_kernel(
    X,
    R,
    W,
    Y,
    H,  # R and H are only touched when HAS_RESIDUAL (else None)
    n_rows,
    n_cols,
    stride_x,
    stride_r,
    stride_y,
    stride_h,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per program (>1 only for small hidden sizes)
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ALIGN: tl.constexpr,  # a power of two dividing n_cols and every row stride (pow2_divisor)
):
    # the same values, now known to the compiler as multiples of ALIGN: vector loads for N = 1000 too
    n_cols = n_cols // ALIGN * ALIGN
    stride_x = stride_x // ALIGN * ALIGN
    stride_r = stride_r // ALIGN * ALIGN
    stride_y = stride_y // ALIGN * ALIGN
    stride_h = stride_h // ALIGN * ALIGN
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    rows = rows.to(tl.int64)  # rows * stride can pass 2**31 elements

    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)  # normalize the h we return, exactly as eager does

    rstd = tl.rsqrt(tl.where(row_ok, tl.sum(x * x, axis=1) / n_cols + eps, 1.0))  # (BLOCK_M,); 1: padding rows
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_pairs(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _rms_norm_bwd_kernel(
    DY,
    X,
    W,
    DH,
    DX,
    DW,  # DH is only touched when HAS_DH (else None)
    n_rows,
    n_cols,
    rows_per_program,  # rows_per_program is a multiple of BLOCK_M
    stride_dy,
    stride_x,
    stride_dh,
    stride_dx,
    eps,
    HAS_DH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr,  # as in the forward
):
    n_cols = n_cols // ALIGN * ALIGN
    stride_dy = stride_dy // ALIGN * ALIGN
    stride_x = stride_x // ALIGN * ALIGN
    stride_dh = stride_dh // ALIGN * ALIGN
    stride_dx = stride_dx // ALIGN * ALIGN
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # this program's share of dw

    first_row = pid * rows_per_program
    for start in range(first_row, first_row + rows_per_program, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows = rows.to(tl.int64)

        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = dy * w[None, :]
        # rstd again, from the x this pass loads anyway (one allocation and one store fewer per call
        # than saving it), in the same reduction as sum(x * g): two sums, one exchange between warps
        sum_xx, sum_xg = tl.reduce((x * x, x * g), axis=1, combine_fn=_add_pairs)  # (BLOCK_M,) each
        # padding rows (x = 0) get a mean square of 1: at eps = 0 theirs is 0, rstd inf, and 0 * inf = NaN
        # would reach dw through their x_hat
        rstd = tl.rsqrt(tl.where(row_ok, sum_xx / n_cols + eps, 1.0))
        x_hat = x * rstd[:, None]
        mean_xg = sum_xg * rstd / n_cols  # mean(x_hat * g)
        dx = (g - x_hat * mean_xg[:, None]) * rstd[:, None]
        if HAS_DH:
            dx += tl.load(DH + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * x_hat

    # One program: this is dw itself, in the weight's dtype. Several: float32 partials, one row each.
    tl.store(DW + pid * n_cols + cols, tl.sum(dw_acc, axis=0).to(DW.dtype.element_ty), mask=col_ok)


@triton.jit
def _sum_partials_kernel(P, OUT, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """OUT[j] = sum_i P[i, j] in float32, stored in OUT's dtype: dw from the backward's partials."""
    n_cols = n_cols // ALIGN * ALIGN
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_P):
        parts = start + tl.arange(0, BLOCK_P)
        mask = (parts < n_parts)[:, None] & col_ok[None, :]
        acc += tl.load(P + parts[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=col_ok)


_launch_fwd = Launcher(_rms_norm_fwd_kernel)
_fwd_plans: dict = {}  # see rms_norm_fwd_launch
_PLANS = direct_launch_available()
_launch_bwd = Launcher(_rms_norm_bwd_kernel)
_launch_sum = Launcher(_sum_partials_kernel)


# Launchers (no checks: their callers pass checked inputs)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (M, N) with a unit stride along N (copies only if it has to). A contiguous tensor is
    returned as it is: the kernels only need its row stride, N (a reshape costs host time)."""
    if t.is_contiguous():
        return t
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def _row_stride(t: torch.Tensor) -> int:
    """The row stride of what :func:`_rows` returned: N for a contiguous tensor of any rank."""
    return t.stride(-2) if t.dim() == 2 else t.shape[-1]


@functools.cache
def fwd_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the forward kernel for hidden size ``n_cols`` (<= MAX_HIDDEN)."""
    block_n = next_pow2(n_cols)
    block_m = max(1, 4096 // block_n)  # small rows: several per program, so each moves >= 4096 elements
    # 512 elements per warp (16 per thread), at most 16 warps. On an H100 (bf16, 2^26 elements) this
    # reached 0.93-0.95 of copy bandwidth for N = 512 .. 16384; too many warps for the tile (16 on 2048
    # elements) or too few (8 on 16384) lost 17-27%.
    num_warps = min(max((block_m * block_n) // 512, 1), 16)
    return block_m, block_n, num_warps


@functools.cache
def bwd_config(n_cols: int, rows: int, element_size: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs_per_sm) of the backward kernel for rows of ``n_cols``
    elements of ``element_size`` bytes; ``rows``: 0 up to 1024 rows, 1 below 4096, 2 from 4096."""
    block_m, block_n, num_warps = fwd_config(n_cols)
    # Programs per SM: all programs of the persistent grid must be resident at once, or the last
    # wave runs alone. Measured on an H100 (bf16): 2 per SM best up to N = 4096, 1 from N = 8192.
    per_sm = 2 if block_m * block_n <= 4096 else 1
    # Per row count and dtype (H100, 2026-11-24, tools/probes/config_sweep.py and fwd_variants.py):
    # up to 1024 rows of 512 < N <= 2048, 4-row tiles on one program per SM (fewer dw partials to sum)
    # were 6-13% faster in bf16; from 4096 rows of 4096 < N <= 8192, 2-row tiles were 3-7% faster in
    # bf16 and 9-27% slower in fp32 (twice the registers per element), where one row was best.
    if rows == 0 and 1024 <= block_n <= 2048:
        block_m, num_warps, per_sm = 4, 8, 1
    elif rows == 2 and 4096 < block_n <= 8192 and element_size <= 2:
        block_m = 2
    return block_m, block_n, num_warps, per_sm


def rms_norm_fwd_launch(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, eps: float, out_dtype=None
):
    """Run the forward kernel on checked inputs. Returns (y, h or None) of x's shape; h in x's dtype, y in
    ``out_dtype`` (default x's).

    Contiguous inputs launch through a plan per shape, dtypes, pointer alignments and device: the direct
    launch that the first such call compiled, with its grid and integer arguments, so that later calls
    compute nothing but y (h) before launching. The outputs need no key: PyTorch's allocators align them
    to 64 (CPU) or 512 bytes (CUDA), more than the 16 Triton specializes on.
    """
    plan_key = None
    if (
        _PLANS
        and x.is_contiguous()
        and weight.is_contiguous()
        and (residual is None or residual.is_contiguous())
        and not _hooks_installed()
    ):
        device = current_device()
        align = None if residual is None else residual.data_ptr() & 15
        plan_key = (device, x.shape, x.dtype, weight.dtype, out_dtype, x.data_ptr() & 15, weight.data_ptr() & 15, align)
        plan = _fwd_plans.get(plan_key)
        if plan is not None:
            (run, function, packed, tail), grid, ints = plan
            y = torch.empty_like(x, dtype=out_dtype)
            h = None if residual is None else torch.empty_like(x)
            # pointers as integers: Triton's launcher takes them as they are, where for a tensor it calls
            # data_ptr() and asks the driver to validate the address (cuPointerGetAttribute)
            r, hp = (None, None) if h is None else (residual.data_ptr(), h.data_ptr())
            run(
                *grid, current_stream(device), function, packed, None, None, None, x.data_ptr(), r,
                weight.data_ptr(), y.data_ptr(), hp, *ints, eps, *tail,
            )  # fmt: skip
            return y, h
    n_cols = x.shape[-1]
    block_m, block_n, num_warps = fwd_config(n_cols)
    x2 = _rows(x)
    n_rows = x2.numel() // n_cols if n_cols else 0
    yd = out_dtype or x.dtype
    y = torch.empty_like(x2, dtype=yd) if x2 is x else torch.empty(x.shape, dtype=yd, device=x.device)
    h = r2 = None
    if residual is not None:
        h, r2 = torch.empty_like(y, dtype=x.dtype), _rows(residual)
    if n_rows == 0:
        return y, h
    stride_x, stride_r = _row_stride(x2), _row_stride(r2) if r2 is not None else 0
    bits = n_cols | stride_x | stride_r  # every integer ALIGN must divide
    grid = ((n_rows + block_m - 1) // block_m, 1, 1)
    ints = (n_rows, n_cols, stride_x, stride_r, n_cols, n_cols)  # y and h are contiguous
    w = weight if weight.is_contiguous() else weight.contiguous()
    entry = _launch_fwd(
        grid, x2, r2, w, y, h, *ints, eps, num_warps=num_warps, HAS_RESIDUAL=residual is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, ALIGN=pow2_divisor(bits),
    )  # fmt: skip
    if plan_key is not None and entry is not None:
        if len(_fwd_plans) >= 4096:  # a process that sees ever new shapes
            _fwd_plans.clear()
        _fwd_plans[plan_key] = (entry, grid, ints)
    return y, h


def rms_norm_bwd_launch(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, dh: torch.Tensor | None):
    """Run the backward kernel on the forward's input x (or h) and eps. Returns (dx, dw); dx includes dh
    when it is given; dw has the weight's dtype."""
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    rows = 0 if n_rows <= 1024 else 1 if n_rows < 4096 else 2
    block_m, block_n, num_warps, per_sm = bwd_config(n_cols, rows, x.element_size())
    x2, dy2 = _rows(x), _rows(dy)
    dh2 = _rows(dh) if dh is not None else None  # None: not touched without dh
    dx = torch.empty_like(x2) if x2 is x else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return dx, torch.zeros_like(weight)

    # the persistent grid: at most per_sm programs per SM, each a contiguous run of whole row blocks
    row_blocks = cdiv(n_rows, block_m)
    per_program = cdiv(row_blocks, min(sm_count(x.device) * per_sm, row_blocks))
    rows_per_program = per_program * block_m
    n_programs = cdiv(n_rows, rows_per_program)
    # A single program writes dw itself; several write float32 partials that a second kernel sums.
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format)
    partials = dw if n_programs == 1 else torch.empty((n_programs, n_cols), dtype=torch.float32, device=x.device)
    stride_dy, stride_x = _row_stride(dy2), _row_stride(x2)
    stride_dh = _row_stride(dh2) if dh2 is not None else 0
    bits = n_cols | stride_dy | stride_x | stride_dh  # every integer ALIGN must divide
    _launch_bwd(
        (n_programs,), dy2, x2, weight if weight.is_contiguous() else weight.contiguous(), dh2, dx, partials, n_rows,
        n_cols, rows_per_program, stride_dy, stride_x, stride_dh, n_cols, eps,  # n_cols: dx's row stride
        num_warps=num_warps, HAS_DH=dh is not None, BLOCK_M=block_m, BLOCK_N=block_n, ALIGN=pow2_divisor(bits),
    )  # fmt: skip
    if n_programs > 1:
        # narrow column strips, all partial rows in one or two tiles: enough programs and loads in flight
        # for a reduction of a few MB (a few wide strips walking the rows one tile at a time took
        # ~40 us at 264 x 4096 on an H100)
        _launch_sum((cdiv(n_cols, 32),), partials, dw, n_programs, n_cols, num_warps=4, BLOCK_P=128,
                    BLOCK_N=32, ALIGN=pow2_divisor(n_cols))  # fmt: skip
    return dx, dw


# The two registrations over the same launchers:
# * ``_RMSNorm``, an autograd.Function, for eager calls that need a gradient (a custom op with
#   registered autograd cost more host time: on the H100 machine, tiny tensors, one forward + backward
#   took 521 us through the custom ops and 361 us through a Function);
# * the custom ops ``mahia::rms_norm_fwd`` / ``mahia::rms_norm_bwd`` for torch.compile (opaque to it, no
#   graph break, with fake and autograd rules). Without a residual the forward's h is an empty tensor.


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, out_dtype):
        y, h = rms_norm_fwd_launch(x, weight, residual, eps, out_dtype)
        ctx.save_for_backward(x if h is None else h, weight)  # h: what was normalized (an output)
        ctx.eps = eps
        if h is None:
            return y
        ctx.set_materialize_grads(False)  # an unused h (Block.delta) gets no zeros tensor to fill and read
        return y, h

    @staticmethod
    def backward(ctx, dy, dh=None):
        if dy is None:  # only h = x + residual was used
            return dh, dh, None, None, None
        x, weight = ctx.saved_tensors
        dx, dw = rms_norm_bwd_launch(dy, x, weight, ctx.eps, dh)  # dy in y's dtype, dx in x's
        return dx, dx if ctx.needs_input_grad[1] else None, dw, None, None  # h = x + residual: one gradient


@torch.library.custom_op("mahia::rms_norm_fwd", mutates_args=())
def _fwd_op(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = rms_norm_fwd_launch(x, weight, residual, eps, out_dtype)
    return y, x.new_empty(0) if h is None else h


_fwd_op.register_fake(
    lambda x, r, w, eps, dt: (x.new_empty(x.shape, dtype=dt), x.new_empty(x.shape if r is not None else (0,)))
)


@torch.library.custom_op("mahia::rms_norm_bwd", mutates_args=())
def _bwd_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, dh: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm_bwd_launch(dy, x, weight, eps, dh)


_bwd_op.register_fake(lambda dy, x, w, eps, dh: (x.new_empty(x.shape), w.new_empty(w.shape)))


def _setup(ctx, inputs, output):
    x, residual, weight, ctx.eps, _ = inputs
    ctx.residual = residual is not None
    ctx.save_for_backward(output[1] if ctx.residual else x, weight)
    ctx.set_materialize_grads(False)  # as in _RMSNorm


def _backward(ctx, dy, dh):
    if dy is None:
        return dh, dh if ctx.residual else None, None, None, None
    x, weight = ctx.saved_tensors
    dx, dw = _bwd_op(dy, x, weight, ctx.eps, dh if ctx.residual else None)
    return dx, dx if ctx.residual else None, dw, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup)
_apply = c_apply(_RMSNorm)


# The public functions


def _too_wide(x: torch.Tensor) -> str | None:
    """Why the kernels cannot take x (its row lives in registers), or None."""
    n = x.shape[-1]
    return (
        None if n <= MAX_HIDDEN else f"hidden size {n} exceeds the kernel's limit of {MAX_HIDDEN} (a row in registers)"
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out_dtype=None) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight (float32 math, output in ``out_dtype``, default x.dtype).
    x: (..., N). ``out_dtype``: e.g. bfloat16 for a float32 x under autocast, when y only feeds a matmul that
    would cast it anyway: the kernel writes the rounded y, the same bits, without a cast kernel after it.

    The Triton kernels where they can run (:mod:`mahia.ops.dispatch`), else :func:`rms_norm_eager`: also
    for a hidden size N > ``MAX_HIDDEN`` (65536; one warning), for float64 in x or weight (silently) and
    for ``meta`` tensors. Inputs are checked once, here; errors name ``rms_norm`` and the argument.
    """
    eps = check_rms_norm_inputs("rms_norm", x, weight, None, eps, out_dtype)
    if use_triton("rms_norm", x, weight, unsupported=_too_wide(x)):
        if torch.compiler.is_compiling():
            return _fwd_op(x, None, weight, eps, out_dtype)[0]
        if (x.requires_grad or weight.requires_grad) and torch.is_grad_enabled():
            return _apply(x, None, weight, eps, out_dtype)
        return rms_norm_fwd_launch(x, weight, None, eps, out_dtype)[0]  # no graph to record: no Function
    return _rms_norm_eager(x, weight, eps, out_dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out_dtype=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; y = rms_norm(h, weight, eps, out_dtype=out_dtype). Returns (y, h); h is rounded to x's
    dtype and that rounded h is normalized. Paths and edge cases as :func:`rms_norm`."""
    eps = check_rms_norm_inputs("add_rms_norm", x, weight, residual, eps, out_dtype)
    if use_triton("add_rms_norm", x, residual, weight, unsupported=_too_wide(x)):
        if torch.compiler.is_compiling():
            return _fwd_op(x, residual, weight, eps, out_dtype)
        if (x.requires_grad or residual.requires_grad or weight.requires_grad) and torch.is_grad_enabled():
            return _apply(x, residual, weight, eps, out_dtype)
        return rms_norm_fwd_launch(x, weight, residual, eps, out_dtype)
    h = x + residual
    return _rms_norm_eager(h, weight, eps, out_dtype), h
