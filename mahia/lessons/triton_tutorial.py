"""Teaching code for notebook 03 (Triton fusion): a first RMSNorm kernel, the weight-gradient
strategies the production backward avoids, and thin helpers around the kernel benchmarks.

Not used by the model: the production kernels are :mod:`mahia.ops.rmsnorm`, ``swiglu`` and ``rope``.

**v1 forward**, one program per row x of length N (float32 math)::

    rstd = 1 / sqrt(sum_j x_j^2 / N + eps)
    y_j  = x_j * rstd * w_j

The program loads the whole row (``BLOCK_N`` = next power of two >= N, masked), reduces it, scales
it and stores it: one read of x, one write of y, the fewest bytes RMSNorm can move. It uses Triton's
default of 4 warps whatever N is; the production kernel adds several rows per program for small N,
a warp count that grows with the tile, and an optional residual add in the same pass.

**v1 backward**, one program per row, with x_hat = x * rstd and g = w * dy::

    dx_j = rstd * (g_j - x_hat_j * sum_k(x_hat_k * g_k) / N)
    dw_j = sum over rows of dy_j * x_hat_j

dx is per row, but dw sums over all M rows, so programs must combine their contributions:

* ``dw="atomic"``: every program adds its row's N products into one float32 dw with
  ``tl.atomic_add``: M * N read-modify-writes on only N addresses, which the memory system serializes,
  and a summation order that changes from run to run (dw is not bitwise reproducible);
* ``dw="second_pass"``: the dx kernel ignores dw; a second kernel (one program per block of
  ``DW_BLOCK_N`` columns, walking all rows) reads x and dy again: 5 passes over (M, N) instead of 3;
* ``dw=None`` (launcher only): dx alone, to time the reduction apart.

The production backward (:func:`mahia.ops.rmsnorm.rms_norm_bwd_launch`) runs a persistent grid:
a few programs per SM, each keeps a float32 partial dw for its block of rows in registers and
writes it once; a second small kernel sums the (programs, N) partials into dw. It recomputes rstd from
the x it loads instead of reading a saved one. Three passes, no atomics, deterministic.

The helpers at the end (:func:`measure`, :func:`op_traffic`, :func:`min_bytes`, ...) wrap
:mod:`mahia.bench.kernels` so that the notebook measures exactly what the benchmark suite measures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pandas as pd
import torch
import triton
import triton.language as tl

from mahia.lessons.prose import spreads_overlap
from mahia.measure.instruments import ByteTraffic
from mahia.ops.dispatch import why_not
from mahia.ops.rmsnorm import MAX_HIDDEN, check_rms_norm_inputs, sm_count

__all__ = [
    "DW_STRATEGIES",
    "DW_BLOCK_N",
    "KINDS",
    "rms_norm_v1",
    "rms_norm_v1_fwd",
    "rms_norm_v1_bwd",
    "rms_norm_v1_bwd_persistent",
    "add_rms_norm_v1_fwd",
    "min_traffic",
    "HOST_BOUND_FACTOR",
    "dw_second_pass_programs",
    "check_kernels",
    "op_traffic",
    "min_bytes",
    "op_flops",
    "make_inputs",
    "liger_ops",
    "measure",
    "host_crossover",
    "host_crossover_sentence",
]

DW_STRATEGIES = ("atomic", "second_pass")
DW_BLOCK_N = 32  # columns per program of the dw second pass: N / 32 programs (128 for N = 4096)
DW_BLOCK_M = 64  # rows per step of the dw second pass (a 64 x 32 tile, 4 warps)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HOST_BOUND_FACTOR = 1.5  # host_crossover: a call is host-bound where its eager time exceeds this x its device time
TIE_FRACTION = 0.03  # host_crossover, rows without spreads: eager times this close (relative) are a tie


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rms_norm_v1_kernel(X, W, Y, RSTD, n_cols, stride_x, stride_y, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one program per row; int64: row * stride can pass 2**31
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)  # masked lanes are 0: they add nothing
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_norm_v1_bwd_kernel(
    DY, X, W, RSTD, DX, DW, n_cols, stride_dy, stride_x, stride_dx, ATOMIC_DW: tl.constexpr, BLOCK_N: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    x_hat = x * rstd
    g = dy * w
    dx = (g - x_hat * (tl.sum(x_hat * g, axis=0) / n_cols)) * rstd
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if ATOMIC_DW:
        tl.atomic_add(DW + cols, dy * x_hat, mask=mask)  # N atomics per row, all rows on the same N


@triton.jit
def _rms_norm_dw_kernel(
    DY, X, RSTD, DW, n_rows, n_cols, stride_dy, stride_x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # this program's columns, all rows
    col_ok = cols < n_cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        acc += dy * x * rstd[:, None]
    tl.store(DW + cols, tl.sum(acc, axis=0), mask=col_ok)


@triton.jit
def _add_rms_norm_v1_kernel(X, R, W, H, Y, n_cols, stride_x, stride_r, stride_h, stride_y, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # the v1 kernel with a residual: h = x + r is stored and normalized
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(H.dtype.element_ty)  # rounded to the input dtype, as the eager add_rms_norm rounds it
    tl.store(H + row * stride_h + cols, h, mask=mask)
    hf = h.to(tl.float32)  # normalized from registers: h is not read back
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (hf * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_v1_bwd_persistent_kernel(
    DY, X, W, RSTD, DX, PARTIAL, n_rows, n_cols, n_programs, stride_dy, stride_x, stride_dx, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(0).to(tl.int64)  # a fixed grid: program pid takes rows pid, pid + n_programs, ...
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)  # this program's share of dw, in registers
    for row in range(pid, n_rows, n_programs):  # int64 from pid: row * stride can pass 2**31
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        g = dy * w
        dx = (g - x_hat * (tl.sum(x_hat * g, axis=0) / n_cols)) * rstd
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * x_hat
    tl.store(PARTIAL + pid * n_cols + cols, dw, mask=mask)  # one float32 row per program, written once


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------


def _require_triton(fn: str, t: torch.Tensor) -> None:
    reason = why_not(t)
    if reason is not None:  # teaching kernels have no eager fallback: say why they cannot run
        raise RuntimeError(
            f"{fn}: cannot run the Triton kernel: {reason} "
            "(use a CUDA tensor, or set TRITON_INTERPRET=1 before importing triton)"
        )


def _check_kernel_dtypes(fn: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise TypeError(f"{fn}: {name} must be float32, float16 or bfloat16, got {t.dtype}")


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (M, N) with unit stride along N (a copy only if needed)."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def rms_norm_v1_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, num_warps: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): the v1 forward, one program per row.  x (..., N), weight (N,); rstd is x.shape[:-1] float32.
    ``num_warps``: the warps of each program (None: Triton's default, 4)."""
    fn = "rms_norm_v1"
    check_rms_norm_inputs(fn, x, weight, eps=eps)
    if num_warps is not None and (isinstance(num_warps, bool) or num_warps not in (1, 2, 4, 8, 16, 32)):
        raise ValueError(f"{fn}: num_warps must be None or a power of two from 1 to 32, got {num_warps!r}")
    _check_kernel_dtypes(fn, x=x, weight=weight)
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"{fn}: hidden size {x.shape[-1]} exceeds {MAX_HIDDEN} (the row is held in registers)")
    _require_triton(fn, x)
    x2 = _as_rows(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if x2.shape[0] == 0:
        return y, rstd
    y2 = y.view(-1, x.shape[-1])
    _rms_norm_v1_kernel[(x2.shape[0],)](
        x2,
        weight.contiguous(),
        y2,
        rstd,
        x2.shape[1],
        x2.stride(0),
        y2.stride(0),
        eps,
        BLOCK_N=triton.next_power_of_2(x2.shape[1]),
        **({} if num_warps is None else {"num_warps": num_warps}),
    )
    return y, rstd


def add_rms_norm_v1_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) with h = x + residual and y = rms_norm(h) * weight, as ``add_rms_norm_eager``: the v1 kernel with a
    residual add in the same pass (notebook 03, exercise 1). Reads x and r once, writes h and y once."""
    fn = "add_rms_norm_v1"
    check_rms_norm_inputs(fn, x, weight, residual, eps)
    _check_kernel_dtypes(fn, x=x, residual=residual, weight=weight)
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"{fn}: hidden size {x.shape[-1]} exceeds {MAX_HIDDEN} (the row is held in registers)")
    _require_triton(fn, x)
    x2, r2 = _as_rows(x), _as_rows(residual)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0] == 0:
        return y, h
    h2, y2 = h.view(-1, x.shape[-1]), y.view(-1, x.shape[-1])
    _add_rms_norm_v1_kernel[(x2.shape[0],)](
        x2,
        r2,
        weight.contiguous(),
        h2,
        y2,
        x2.shape[1],
        x2.stride(0),
        r2.stride(0),
        h2.stride(0),
        y2.stride(0),
        eps,
        BLOCK_N=triton.next_power_of_2(x2.shape[1]),
    )
    return y, h


def dw_second_pass_programs(n_cols: int) -> int:
    """Grid size of the dw second pass: one program per ``DW_BLOCK_N`` columns."""
    return triton.cdiv(n_cols, DW_BLOCK_N)


def _check_bwd_inputs(fn: str, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor) -> None:
    """The checks both v1 backward launchers make: x and weight as the forward takes them, dy like x, and
    rstd the forward's float32 (x.shape[:-1])."""
    check_rms_norm_inputs(fn, x, weight)
    _check_kernel_dtypes(fn, dy=dy, x=x, weight=weight)
    if dy.shape != x.shape:
        raise ValueError(f"{fn}: dy must have the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    if rstd.shape != x.shape[:-1] or rstd.dtype != torch.float32:
        raise ValueError(
            f"{fn}: rstd must be float32 of shape {tuple(x.shape[:-1])}, got {rstd.dtype} {tuple(rstd.shape)}"
        )


def rms_norm_v1_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, *, dw: str | None = "atomic"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, dw) of y = rms_norm(x, weight) with one program per row; ``dw`` picks how dw is summed
    over rows: ``"atomic"`` (atomic adds from every row) or ``"second_pass"`` (a second kernel that
    reads x and dy again). ``dw=None`` computes dx only and returns (dx, None): the time of the
    reduction is the difference.  dy, x (..., N); rstd (x.shape[:-1]) float32 from :func:`rms_norm_v1_fwd`."""
    fn = "rms_norm_v1 backward"
    if dw is not None and dw not in DW_STRATEGIES:
        raise ValueError(f"{fn}: dw must be one of {DW_STRATEGIES} or None, got {dw!r}")
    _check_bwd_inputs(fn, dy, x, weight, rstd)
    _require_triton(fn, x)
    x2, dy2 = _as_rows(x), _as_rows(dy)
    rstd1 = rstd.reshape(-1).contiguous()
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw_acc = torch.zeros(n_cols, dtype=torch.float32, device=x.device)  # atomics need a zeroed float32 target
    if n_rows == 0:
        return dx, (dw_acc.to(weight.dtype) if dw is not None else None)
    dx2 = dx.view(-1, n_cols)
    _rms_norm_v1_bwd_kernel[(n_rows,)](
        dy2,
        x2,
        weight.contiguous(),
        rstd1,
        dx2,
        dw_acc,
        n_cols,
        dy2.stride(0),
        x2.stride(0),
        dx2.stride(0),
        ATOMIC_DW=dw == "atomic",
        BLOCK_N=triton.next_power_of_2(n_cols),
    )
    if dw == "second_pass":
        _rms_norm_dw_kernel[(dw_second_pass_programs(n_cols),)](
            dy2,
            x2,
            rstd1,
            dw_acc,
            n_rows,
            n_cols,
            dy2.stride(0),
            x2.stride(0),
            BLOCK_M=DW_BLOCK_M,
            BLOCK_N=DW_BLOCK_N,
        )
    return dx, (dw_acc.to(weight.dtype) if dw is not None else None)


def rms_norm_v1_bwd_persistent(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, *, programs: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) like :func:`rms_norm_v1_bwd`, on a persistent grid (notebook 03, exercise 2): ``programs``
    programs (None: min(M, 2 x the SM count)), each walking every ``programs``-th row, keeping its share of dw
    in float32 registers and writing it once; dw is the sum of those (programs, N) partials. No atomics:
    the summation order is fixed, so dw is the same bit for bit on every run."""
    fn = "rms_norm_v1 backward (persistent)"
    _check_bwd_inputs(fn, dy, x, weight, rstd)
    if programs is not None and (isinstance(programs, bool) or not isinstance(programs, int) or programs < 1):
        raise ValueError(f"{fn}: programs must be None or a positive int, got {programs!r}")
    _require_triton(fn, x)
    x2, dy2 = _as_rows(x), _as_rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return dx, torch.zeros(n_cols, dtype=weight.dtype, device=x.device)
    n_prog = min(n_rows, programs or 2 * sm_count(x.device))
    partial = torch.empty((n_prog, n_cols), dtype=torch.float32, device=x.device)
    dx2 = dx.view(-1, n_cols)
    _rms_norm_v1_bwd_persistent_kernel[(n_prog,)](
        dy2,
        x2,
        weight.contiguous(),
        rstd.reshape(-1).contiguous(),
        dx2,
        partial,
        n_rows,
        n_cols,
        n_prog,
        dy2.stride(0),
        x2.stride(0),
        dx2.stride(0),
        BLOCK_N=triton.next_power_of_2(n_cols),
    )
    return dx, partial.sum(0).to(weight.dtype)


class _RMSNormV1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, dw):
        y, rstd = rms_norm_v1_fwd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.dw = dw
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_v1_bwd(dy, x, weight, rstd, dw=ctx.dw)
        return dx, dw, None, None


def rms_norm_v1(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, dw: str = "atomic") -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight with the v1 kernels (differentiable).

    ``dw`` is the weight-gradient strategy of the backward (see :func:`rms_norm_v1_bwd`). No eager
    fallback: raises RuntimeError where Triton cannot run (CPU tensor without ``TRITON_INTERPRET=1``).
    """
    if dw not in DW_STRATEGIES:
        raise ValueError(f"rms_norm_v1: dw must be one of {DW_STRATEGIES}, got {dw!r}")
    return _RMSNormV1.apply(x, weight, float(eps), dw)


# --------------------------------------------------------------------------------------------------
# Correctness of every kernel the notebook times, against float64
# --------------------------------------------------------------------------------------------------


def check_kernels(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    rms_shape: Sequence[int] = (3, 37, 1000),
    swiglu_shape: Sequence[int] = (3, 37, 1000),
    rope_shape: Sequence[int] = (2, 37, 4, 2, 64),
    seed: int = 0,
) -> list[dict]:
    """Outputs and input gradients of the Triton kernels against a float64 run of the eager reference.

    Checks the v1 RMSNorm (both dw strategies), the production RMSNorm and add+RMSNorm, SwiGLU and
    RoPE (shapes: RMSNorm/SwiGLU (..., N), RoPE (B, T, Hq, Hkv, D)). The production kernels through
    their public functions: where Triton runs (checked first) and at a kernel dtype they take the kernels.
    Raises :class:`mahia.measure.checks.CorrectnessError` on the first error over ``tolerance(dtype)``;
    returns one dict per kernel: name, shape, dtype, max_error, tol and the per-tensor errors.
    Run on a CPU only with ``TRITON_INTERPRET=1`` (in a subprocess: see notebook 03).
    """
    from mahia.layers.rope import RotaryCache
    from mahia.measure.checks import compare_fn, tolerance
    from mahia.ops import add_rms_norm, rms_norm, rope, swiglu
    from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager
    from mahia.ops.rope import apply_rope_eager
    from mahia.ops.swiglu import swiglu_eager

    if len(rope_shape) != 5:
        raise ValueError(f"check_kernels: rope_shape must be (B, T, Hq, Hkv, D), got {tuple(rope_shape)}")
    dev = torch.device(device)
    _require_triton("check_kernels", torch.empty(0, device=dev))
    tol = tolerance(dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(dev, dtype)

    N = rms_shape[-1]
    x, r, w = randn(*rms_shape), randn(*rms_shape), randn(N, scale=0.1, shift=1.0)
    a, b = randn(*swiglu_shape), randn(*swiglu_shape)
    B, T, Hq, Hkv, D = rope_shape
    cos, sin = RotaryCache(D, T, device=dev).get(T)
    q, k = randn(B, T, Hq, D), randn(B, T, Hkv, D)
    cases: list[tuple[str, Callable, Callable, list, Sequence[int]]] = [
        ("rms_norm_v1 (dw=atomic)", lambda x, w: rms_norm_v1(x, w, dw="atomic"), rms_norm_eager, [x, w], rms_shape),
        (
            "rms_norm_v1 (dw=second_pass)",
            lambda x, w: rms_norm_v1(x, w, dw="second_pass"),
            rms_norm_eager,
            [x, w],
            rms_shape,
        ),
        ("rms_norm (production)", rms_norm, rms_norm_eager, [x, w], rms_shape),
        ("add_rms_norm (production)", add_rms_norm, add_rms_norm_eager, [x, r, w], rms_shape),
        ("swiglu", swiglu, swiglu_eager, [a, b], swiglu_shape),
        ("rope", rope, apply_rope_eager, [q, k, cos, sin], rope_shape),
    ]
    rows = []
    for name, fast, ref, inputs, shape in cases:
        grad_inputs = [0, 1] if name == "rope" else None  # cos/sin are constants
        cmp = compare_fn(fast, ref, inputs, tol=tol, name=name, grad_inputs=grad_inputs)
        rows.append(
            {
                "kernel": name,
                "shape": "x".join(map(str, shape)),
                "dtype": str(dtype).replace("torch.", ""),
                "max_error": cmp.max_error,
                "tol": tol,
                "errors": dict(cmp.errors),
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------
# Counting the bytes an eager function moves
# --------------------------------------------------------------------------------------------------


def op_traffic(
    fn: Callable, *inputs: torch.Tensor, backward: bool = False, grad_inputs: Sequence[int] | None = None, seed: int = 0
) -> pd.DataFrame:
    """One row per op that ``fn(*inputs)`` runs (and its backward, if ``backward``) and that launches a
    kernel: the op, the bytes it reads (its tensor inputs) and writes (its outputs), and the output shape.

    In eager PyTorch each such op is (at least) one kernel that reads its inputs from memory and
    writes its outputs back, so ``read_bytes + written_bytes`` summed over rows is the traffic of the
    eager version. Views (and allocations, ``.item()``) move no data and are left out: the rows are
    those of :class:`mahia.measure.instruments.ByteTraffic`. For ``backward`` the inputs listed in
    ``grad_inputs`` (default: all floating ones) require grad and random output gradients flow back;
    building those gradients is not counted.
    """
    idx = set(range(len(inputs))) if grad_inputs is None else set(grad_inputs)
    ins = [
        t.detach().requires_grad_(backward and i in idx and t.is_floating_point()) if isinstance(t, torch.Tensor) else t
        for i, t in enumerate(inputs)
    ]
    mode = ByteTraffic()
    with torch.enable_grad() if backward else torch.no_grad():
        with mode:
            outs = fn(*ins)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if backward:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            grads = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
            leaves = [t for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]
            with mode:
                torch.autograd.grad(outs, leaves, grads)
    return pd.DataFrame(mode.rows, columns=["op", "read_bytes", "written_bytes", "out_shape"])


# --------------------------------------------------------------------------------------------------
# The benchmark, as mahia.bench.kernels runs it
# --------------------------------------------------------------------------------------------------

# experiment -> (op, backward). These are the experiment names of mahia.bench.kernels and the headlines.
KINDS: dict[str, tuple[str, bool]] = {
    "rmsnorm_fwd": ("rms_norm", False),
    "rmsnorm_fwdbwd": ("rms_norm", True),
    "swiglu_fwd": ("swiglu", False),
    "swiglu_fwdbwd": ("swiglu", True),
    "rope_fwdbwd": ("rope", True),
}


def _kind(kind: str) -> tuple[str, bool]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    return KINDS[kind]


def _check_shape(kind: str, shape: Sequence[int]) -> tuple[int, ...]:
    op, _ = _kind(kind)
    want = 5 if op == "rope" else 2
    if len(shape) != want or not all(isinstance(s, int) and s > 0 for s in shape):
        what = "(B, T, Hq, Hkv, D)" if op == "rope" else "(M, N)"
        raise ValueError(f"{kind}: shape must be {what} of positive ints, got {tuple(shape)}")
    return tuple(shape)


def min_bytes(kind: str, shape: Sequence[int], dtype: torch.dtype) -> int:
    """The fewest bytes ``kind`` must move (each input read once, each output written once), as
    counted by :mod:`mahia.bench.kernels`:

        rmsnorm_fwd     read x, write y                                 (2 MN + N) elements
        rmsnorm_fwdbwd  + read x, dy; write dx; read w, write dw        (5 MN + 3 N)
        swiglu_fwd      read a, b; write c                              3 MN
        swiglu_fwdbwd   + read dc, a, b; write da, db                   8 MN
        rope_fwdbwd     read and write q and k, forward and backward    4 B T (Hq + Hkv) D, + 2 T D float32
    """
    from mahia.bench.kernels import min_bytes as bench_min_bytes

    return bench_min_bytes(kind, _check_shape(kind, shape), dtype)


def min_traffic(kind: str, shape: Sequence[int], dtype: torch.dtype) -> tuple[int, int]:
    """:func:`min_bytes` split into (bytes read, bytes written): the read-to-write mix of each kind, e.g. SwiGLU's
    forward reads two tensors for each one it writes, while a copy (the copy ceiling) reads one."""
    shape = _check_shape(kind, shape)
    es = torch.empty((), dtype=dtype).element_size()
    if kind.startswith("rope"):
        B, T, Hq, Hkv, D = shape
        qk = B * T * (Hq + Hkv) * D * es
        return 2 * (qk + T * D * 4), 2 * qk  # each way: read q, k and the float32 tables; write q, k
    M, N = shape
    reads, writes, w_reads, w_writes = {
        "rmsnorm_fwd": (1, 1, 1, 0),
        "rmsnorm_fwdbwd": (3, 2, 2, 1),
        "swiglu_fwd": (2, 1, 0, 0),
        "swiglu_fwdbwd": (5, 3, 0, 0),
    }[kind]
    return (reads * M * N + w_reads * N) * es, (writes * M * N + w_writes * N) * es


def op_flops(kind: str, shape: Sequence[int]) -> int:
    """Floating-point operations of ``kind``, counting exp, rsqrt and division as one each:

    rmsnorm  forward 4 per element (square, sum, * rstd, * w); backward 9
             (x_hat, g, x_hat * g, sum, * mean, -, * rstd, dy * x_hat, sum over rows)
    swiglu   forward 5 (exp, +1, divide, * a, * b); backward 11 (sigmoid 3, 1 - s, a (1 - s),
             1 + ..., b s, product, * dc, a s * dc counted as 2)
    rope     3 per element of q and k each way (per pair: 4 multiplies and 2 adds)
    """
    shape = _check_shape(kind, shape)
    if kind.startswith("rope"):
        B, T, Hq, Hkv, D = shape
        return 2 * 3 * B * T * (Hq + Hkv) * D
    M, N = shape
    per = {"rmsnorm_fwd": 4, "rmsnorm_fwdbwd": 13, "swiglu_fwd": 5, "swiglu_fwdbwd": 16}[kind]
    return per * M * N


def make_inputs(
    kind: str, shape: Sequence[int], device: str | torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """Fresh random inputs as :mod:`mahia.bench.kernels` makes them: RMSNorm (x, w) with w near 1;
    SwiGLU (a, b); RoPE (q, k, cos, sin) with float32 tables from ``RotaryCache``."""
    from mahia.layers.rope import RotaryCache

    op, _ = _kind(kind)
    shape = _check_shape(kind, shape)
    dev = torch.device(device)
    if op == "rope":
        B, T, Hq, Hkv, D = shape
        cos, sin = RotaryCache(D, T, device=dev).get(T)
        return (
            torch.randn(B, T, Hq, D, device=dev, dtype=dtype),
            torch.randn(B, T, Hkv, D, device=dev, dtype=dtype),
            cos,
            sin,
        )
    M, N = shape
    if op == "swiglu":
        return torch.randn(M, N, device=dev, dtype=dtype), torch.randn(M, N, device=dev, dtype=dtype)
    return torch.randn(M, N, device=dev, dtype=dtype), torch.randn(N, device=dev, dtype=dtype) * 0.1 + 1.0


def _references() -> dict[str, tuple[Callable, Callable]]:
    from mahia import ops
    from mahia.ops.rmsnorm import rms_norm_eager
    from mahia.ops.rope import apply_rope_eager
    from mahia.ops.swiglu import swiglu_eager

    return {
        "rms_norm": (rms_norm_eager, ops.rms_norm),
        "swiglu": (swiglu_eager, ops.swiglu),
        "rope": (apply_rope_eager, ops.rope),
    }


def liger_ops():
    """Liger-Kernel's RMSNorm, SwiGLU and RoPE autograd functions for :func:`measure`, or None (with the
    reason printed) when ``import liger_kernel`` fails."""
    from mahia.bench import kernels as bk

    return bk._liger_ops()


def measure(
    recorder,
    kind: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    *,
    experiment: str | None = None,
    liger=None,
    skip: Sequence[str] = (),
    eager_time: bool = False,
) -> pd.DataFrame:
    """Check, then time every variant of ``kind`` at ``shape`` exactly as ``python -m mahia.bench
    kernels`` does, and record one row per variant in ``recorder``; returns those rows (not the benchmark's
    metric rows, such as the copy of the same bytes, which it records too).

    ``eager_time=True`` also records the time an eager program sees (back-to-back calls from Python,
    one synchronize: host overhead included where the host is slower), under ``<experiment>_eager``,
    beside the device time (on a GPU a CUDA-graph replay, which hides the host).

    Variants (from :mod:`mahia.bench.kernels`): eager (baseline), F.rms_norm (peer, RMSNorm only),
    torch.compile (peer), liger (peer, CUDA, when ``liger`` is what :func:`liger_ops` returned),
    mahia_triton (optimized, where Triton runs). On the CPU the benchmark suite leaves torch.compile
    out; here it is added (Inductor's C++ code), unless skipped.
    ``skip`` names variants to leave out. ``experiment`` defaults to ``kind`` (use another name for
    sweeps). Each variant is checked against float64 first; a wrong one raises CorrectnessError.
    """
    from mahia.bench import kernels as bk

    op, backward = _kind(kind)
    shape = _check_shape(kind, shape)
    dev = torch.device(recorder.device)
    eager, fast = _references()[op]
    unknown = set(skip) - set(bk.ROLE)
    if unknown:
        raise ValueError(f"measure: skip names unknown variants {sorted(unknown)}; known: {sorted(bk.ROLE)}")
    variants = bk._variants(op, eager, fast, dev, liger)
    if dev.type != "cuda" and "torch.compile" not in skip:
        variants.insert(
            1,
            bk.Variant(
                "torch.compile", torch.compile(eager, dynamic=False), notes="CPU: Inductor's C++ code, not a GPU figure"
            ),
        )
    variants = [v for v in variants if v.name not in skip]
    if any(v.name == "torch.compile" for v in variants):
        # A compile for this shape alone, as the benchmark does: without it a sweep of shapes (and the
        # grad-mode switch between a forward and a backward check) reaches Dynamo's recompile limit, and
        # past it the "compiled" variant silently runs eager (seen at notebook 03's host rows).
        import torch._dynamo as dynamo  # (a plain `import torch._dynamo` would make `torch` local here)

        dynamo.reset()
    before = len(recorder.rows)
    bk._measure(
        recorder,
        experiment or kind,
        variants,
        lambda: make_inputs(kind, shape, dev, dtype),
        eager,
        backward=backward,
        grad_inputs=[0, 1],
        modes={"device": experiment or kind, **({"eager": f"{experiment or kind}_eager"} if eager_time else {})},
        nbytes=min_bytes(kind, shape, dtype),
        shape=shape,
        dtype=dtype,
    )
    # the timings only: the copy reference at the same bytes (a metric row, CUDA) stays in the records and the log
    return pd.DataFrame([r for r in recorder.rows[before:] if r.get("role") != "metric"])


def host_crossover(df: pd.DataFrame, mine: str = "mahia_triton", peer: str = "F.rms_norm") -> dict:
    """From rows of one sweep over row counts (``experiment`` ending in ``_eager`` for eager time, else
    device time; ``shape`` "MxN"): per variant the host floor (eager time at the fewest rows), and the
    fewest rows at which ``mine``'s eager time is at most ``peer``'s or ties with it (None: never in the sweep).

    A tie: the two eager times' 20-80% spreads (``p20_ms``-``p80_ms``) overlap, where the rows have them; else
    the two medians within :data:`TIE_FRACTION` of ``peer``'s.

    Returns ``{"floor_ms": {variant: ms}, "crossover_rows": int | None, "tie": "spreads" | "fraction" | None
    (how the two matched there; None: ``mine`` was faster), "rows": [...], "host_bound_rows": {variant: the
    largest row count where eager time > HOST_BOUND_FACTOR x device time}}``.
    """
    need = {"experiment", "variant", "shape", "median_ms"}
    if not need <= set(df.columns):
        raise ValueError(f"host_crossover: rows need columns {sorted(need)}, got {sorted(df.columns)}")
    d = df[df["median_ms"].notna()].copy()
    d["rows"] = d["shape"].astype(str).str.split("x").str[0].astype(int)
    d["mode"] = d["experiment"].astype(str).str.endswith("_eager").map({True: "eager", False: "device"})
    t = d.pivot_table(index="rows", columns=["mode", "variant"], values="median_ms")
    spread = {"p20_ms", "p80_ms"} <= set(d.columns)
    if spread:
        lo = d.pivot_table(index="rows", columns=["mode", "variant"], values="p20_ms")
        hi = d.pivot_table(index="rows", columns=["mode", "variant"], values="p80_ms")
    rows = sorted(t.index)
    out: dict = {"rows": rows, "floor_ms": {}, "crossover_rows": None, "tie": None, "host_bound_rows": {}}
    if "eager" not in t.columns.get_level_values(0):
        return out
    eager = t["eager"]
    out["floor_ms"] = {v: float(eager[v].iloc[0]) for v in eager.columns}
    if mine in eager.columns and peer in eager.columns:
        for i, r in enumerate(rows):
            a, b = eager.loc[r, mine], eager.loc[r, peer]
            spreads = [x.loc[r, ("eager", v)] for v in (mine, peer) for x in (lo, hi)] if spread else [None]
            if all(pd.notna(spreads)):  # p20 and p80 of mine, then of peer
                tie = "spreads" if spreads_overlap((a, *spreads[:2]), (b, *spreads[2:])) else None
            else:
                tie = "fraction" if abs(a - b) <= TIE_FRACTION * b else None
            if a <= b or tie:
                out["crossover_rows"], out["tie"] = r, tie
                out["peer_over_mine"] = float(b / a)  # > 1: mine is faster there
                if i:  # the row before, where mine was still slower: the crossover lies between the two
                    out["before"] = (rows[i - 1], float(eager.loc[rows[i - 1], peer] / eager.loc[rows[i - 1], mine]))
                break
    if "device" in t.columns.get_level_values(0):
        device = t["device"]
        for v in eager.columns:
            if v in device.columns:
                bound = [r for r in rows if eager.loc[r, v] > HOST_BOUND_FACTOR * device.loc[r, v]]
                out["host_bound_rows"][v] = bound[-1] if bound else None
    return out


def host_crossover_sentence(
    cross: Mapping, n_cols: int, mine: str = "mahia_triton", peer: str = "F.rms_norm", label: str = "mahia"
) -> str:
    """Where ``mine``'s eager time (``label``) first matches ``peer``'s, from :func:`host_crossover`'s ``cross``
    for rows of ``n_cols`` columns, and who decides there: the host (``mine`` still host-bound; ``peer`` too or
    not) or the device. Where ``mine`` is already ahead at that size (no tie), it says by how much, and where it
    was behind at the size before (the crossover lies between the two)."""
    c_rows, rows = cross["crossover_rows"], cross["rows"]
    if not c_rows:
        return (
            f"{label}'s eager time stays above `{peer}`'s at every row count here (up to {rows[-1]:,}): its per-call "
            "host cost is larger, and the host decides at all these sizes."
        )
    how = {"spreads": " (a tie: their 20–80% spreads overlap)", "fraction": f" (a tie: within {TIE_FRACTION:.0%})"}
    if cross["tie"] is None and cross.get("peer_over_mine", 1.0) > 1 + TIE_FRACTION:  # ahead, not level: by how much
        text = (
            f"{label}'s eager time is first at most `{peer}`'s at {c_rows:,} rows × {n_cols}, where it is already "
            f"{cross['peer_over_mine']:.2f}× faster"
        )
        if cross.get("before"):
            prev, ratio = cross["before"]
            text += f" (at {prev:,} rows it was {1 / ratio:.2f}× slower: the two cross between those sizes)"
    else:
        text = f"{label}'s eager time first matches `{peer}`'s at {c_rows:,} rows × {n_cols}{how.get(cross['tie'], '')}"
    bound = cross["host_bound_rows"]
    if (bound.get(mine) or 0) < c_rows:
        return text + ": from there on the device decides."
    if (bound.get(peer) or 0) >= c_rows:
        return text + (
            ", where both are still host-bound: the two tie on host costs there, and the device decides only at "
            "larger sizes."
        )
    return text + (
        f", where {label} is still host-bound and `{peer}` no longer is: `{peer}`'s device work has grown to "
        f"{label}'s host cost per call, and {label}'s kernel decides only at larger sizes."
    )


# ---------------------------------------------------------------------------------------------------
# Where a peer still wins: the kernel benchmark's sweep, read back from a results folder
# ---------------------------------------------------------------------------------------------------


def sweep_worst_cases(folder, *, tie: float = 0.97) -> str:
    """Markdown: where a peer still wins in the kernel benchmark's sweep (``python -m mahia.bench kernels``; every
    kernel, three dtypes, forward and forward+backward, device and eager time) recorded in ``folder`` (a device's
    results folder with ``bench_kernels_summary.json`` and ``bench_kernels.csv``). For each worst-case key below
    ``tie`` (closer is a tie within the timing's noise): the shape, mahia's and the best peer's times there, and
    what the records show of the cause. For eager time, the device time of the same call: an eager call more
    than ``HOST_BOUND_FACTOR`` times its kernels is host-bound (Python, autograd, the launch). For device time, the
    gap in a kernel of that length; the records alone do not say why. The best peer is the fastest row of a
    role in ``PEER_ROLES`` (eager PyTorch included), as the keys take it (:mod:`mahia.bench.kernels`)."""
    import json
    from pathlib import Path

    from mahia.bench.kernels import PEER_ROLES, SUMMARY_STEM, newest_rows
    from mahia.measure.files import profile_file

    folder = Path(folder)
    summary, csv = profile_file(folder, SUMMARY_STEM, "full"), folder / "bench_kernels.csv"
    if not (summary.exists() and csv.exists()):
        return (
            f"*No kernel benchmark for this device in `{folder.name}`: `python -m mahia.bench kernels`, on a GPU, sweeps every "
            "kernel against its peers.*"
        )
    doc = json.loads(summary.read_text())
    df = pd.read_csv(csv, dtype={"shape": str, "commit": str})
    df = newest_rows(df[df["profile"].astype(str) == doc.get("profile", "full")])
    med = df.set_index(["experiment", "shape", "dtype", "variant"])["median_ms"]
    peer_names = set(df.loc[df["role"].isin(PEER_ROLES), "variant"])
    lines, ties = [], []
    for key, value in doc["metrics"].items():
        if not key.endswith("_worst_vs_best_peer") or value is None or value >= 1:
            continue
        if value >= tie:
            ties.append(f"`{key}` {value:.3f}")
            continue
        w = doc["where"][key]
        at = (w["experiment"], w["shape"], w["dtype"])
        if (*at, "mahia_triton") not in med.index:
            continue  # the records behind the key are not in this folder's CSV
        mine = float(med[(*at, "mahia_triton")])
        peers = {v: float(med[(*at, v)]) for v in peer_names if (*at, v) in med.index}
        best = min(peers, key=peers.get)
        head = f"* **{key}** {value:.3f}: `{w['experiment']}` at {w['shape']} {w['dtype']}"
        if w["experiment"].endswith("_eager"):
            kernels = med.get((w["experiment"].removesuffix("_eager"), w["shape"], w["dtype"], "mahia_triton"))
            cause = ""
            if kernels and kernels > 0:
                cause = (
                    f"; its kernels take {kernels * 1e3:,.0f} µs of it: host-bound, so the host's time per call "
                    f"(Python, autograd, the launch) is what is behind, not the kernel"
                    if mine > HOST_BOUND_FACTOR * kernels
                    else f"; its kernels take {kernels * 1e3:,.0f} µs of it: the device sets the time"
                )
            lines.append(
                f"{head}, a call from Python: mahia {mine * 1e3:,.0f} µs, {best} {peers[best] * 1e3:,.0f} µs{cause}."
            )
        else:
            gap = mine - peers[best]
            lines.append(
                f"{head}, device time: mahia {mine * 1e3:,.1f} µs, {best} {peers[best] * 1e3:,.1f} µs: {gap * 1e3:,.1f} µs "
                f"({gap / mine:.0%} of mahia's kernel) behind; the records do not say why (PERFORMANCE.md has the probes)."
            )
    commits = ", ".join(doc.get("commits", [])) or "unknown"
    tied = f" Within {1 - tie:.0%} (a tie): {', '.join(ties)}." if ties else ""
    if not lines:
        return f"No peer is ahead by more than {1 - tie:.0%} at any shape of the sweep in `{folder.name}` (commit {commits}).{tied}"
    return (
        f"Where a peer is still ahead over the whole sweep in `{folder.name}` (commit {commits}):\n\n"
        + "\n".join(lines)
        + (f"\n\n{tied.strip()}" if ties else "")
    )
