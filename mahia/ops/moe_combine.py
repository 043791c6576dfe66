"""The MoE layer's combine step in Triton: un-permute, gate and sum the k expert outputs of each token.

Row r of ``out`` (N*k, D) holds assignment ``order[r]`` (expert order); ``inverse`` (N*k,) maps
assignment n*k + j back to its row. With the gates g (N, k):

    y[n, :]               = sum_{j<k} g[n, j] * out[inverse[n*k + j], :]      (float32 math, y in ``dtype``)
    d_out[inverse[n*k+j]] = g[n, j] * dy[n, :]                                 (in out.dtype)
    d_g[n, j]             = sum_d dy[n, d] * out[inverse[n*k + j], d]          (float32 sum, in g.dtype)

``inverse`` is a permutation, so every row of d_out is written exactly once (no atomics, no zero fill).
:func:`moe_combine`'s ``check`` says what is checked of its values, the same on every path: None
(default) that every entry is in range on the CPU (an ``aminmax``, no sync; not while torch.compile
traces), nothing on CUDA (a sync per call); True that it is a permutation (a sync on CUDA); False
nothing. Unchecked, the kernels still never leave bounds: each index load is masked to 0 <= inverse <
N*k, so an entry out of range adds 0 to y and gets no gradient (the eager gather raises a device-side
assert). For an in-range ``inverse`` that is not a permutation y is still the formula, but d_out is
undefined where it is broken (the eager path's scatter-add is exact there).

The eager reference takes three kernels (gather, gate multiply in out.dtype, k-sum) and two (N, k, D)
intermediates; here one pass reads each row of ``out`` once and writes y once, rounding once. Bytes at
bf16, N=16384, k=2, D=1024: 97 MB forward, 161 MB backward. Each program takes BLOCK_T tokens and walks
D in BLOCK_D chunks of a (BLOCK_T, KP, BLOCK_D) tile (KP = k rounded up to a power of two, masked).

Edges: float64 out, gates or ``dtype`` run the eager reference silently (reference precision); empty inputs return an empty or
zero y; ``meta`` tensors get their shapes from the eager reference.
"""

from __future__ import annotations

import torch

from mahia.measure.checks import check_float_tensor, check_same_device
from mahia.ops._launch import Launcher, c_apply, cdiv, next_pow2, pow2_divisor
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import KERNEL_DTYPES, use_triton

__all__ = ["moe_combine", "moe_combine_eager"]


# Input checks and the eager reference


def check_moe_combine_inputs(
    fn: str, out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype | None = None
) -> None:
    """out (N*k, D) and gates (N, k) floating point, inverse (N*k,) int64, one device; dtype None or floating.

    The values of ``inverse`` are checked by :func:`moe_combine`'s ``check`` (they need a read on the host).
    """
    check_float_tensor(fn, "out", out)
    check_float_tensor(fn, "gates", gates)
    if gates.dim() != 2:
        raise ValueError(f"{fn}: gates must be 2-D (N, k), got shape {tuple(gates.shape)}")
    N, k = gates.shape
    if out.dim() != 2 or out.shape[0] != N * k:
        raise ValueError(
            f"{fn}: out must be (N*k, D) with N*k = {N}*{k} = {N * k} rows (gates is (N, k) = "
            f"{tuple(gates.shape)}), got shape {tuple(out.shape)}"
        )
    if not isinstance(inverse, torch.Tensor):
        raise TypeError(f"{fn}: inverse must be a torch.Tensor, got {type(inverse).__name__}")
    if inverse.dtype != torch.int64:
        raise TypeError(
            f"{fn}: inverse must be an int64 tensor (row of out for each assignment n*k + j), got dtype {inverse.dtype}"
        )
    if inverse.dim() != 1 or inverse.shape[0] != N * k:
        raise ValueError(f"{fn}: inverse must have shape (N*k,) = ({N * k},), got {tuple(inverse.shape)}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{fn}: dtype must be None or a floating torch.dtype, got {dtype!r}")
    check_same_device(fn, out=out, inverse=inverse, gates=gates)


def _check_in_range(fn: str, inverse: torch.Tensor) -> None:
    """Raise ValueError naming ``fn`` unless every entry of ``inverse`` (n,) lies in 0 .. n-1 (inverse on
    the CPU: an aminmax, no device sync)."""
    n = inverse.numel()
    lo, hi = inverse.aminmax()
    if lo < 0 or hi >= n:
        i = int(((inverse < 0) | (inverse >= n)).nonzero()[0, 0])
        raise ValueError(
            f"{fn}: inverse must be a permutation of 0..{n - 1} (the row of out of each assignment); "
            f"inverse[{i}] = {int(inverse[i])} is out of range"
        )


def _check_permutation(fn: str, inverse: torch.Tensor) -> None:
    """Raise ValueError naming ``fn`` unless ``inverse`` (n,) holds every one of 0 .. n-1 exactly once.

    Reads the values on the host: a device sync (not for CUDA graphs or torch.compile'd regions).
    ``meta`` tensors have no values and pass.
    """
    n = inverse.numel()
    if n == 0 or inverse.device.type == "meta":
        return
    _check_in_range(fn, inverse)
    counts = torch.bincount(inverse, minlength=n)
    if bool((counts != 1).any()):
        rep = int((counts > 1).nonzero()[0, 0])
        miss = int((counts == 0).nonzero()[0, 0])
        raise ValueError(
            f"{fn}: inverse must be a permutation of 0..{n - 1}; row {rep} appears "
            f"{int(counts[rep])} times and row {miss} never"
        )


def _moe_combine_eager(
    out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype | None
) -> torch.Tensor:
    N, k = gates.shape
    dtype = out.dtype if dtype is None else dtype
    out = out.index_select(0, inverse).view(N, k, out.shape[1])  # (N, k, D) back in token order
    return (out * gates.to(out.dtype).unsqueeze(-1)).to(dtype).sum(dim=1)  # (N, D)


def moe_combine_eager(
    out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """y[n] = sum_j gates[n, j] * out[inverse[n*k + j]] in plain PyTorch: three kernels (gather, gate
    multiply, k-sum) and two (N, k, D) intermediates. ``mahia.ops.moe_combine`` fuses them.

    out (N*k, D) in expert order, inverse (N*k,) int64, gates (N, k); y (N, D) in ``dtype`` (None:
    out.dtype). Like the loop: gate in the experts' dtype, accumulate the k terms in ``dtype``.
    """
    check_moe_combine_inputs("moe_combine_eager", out, inverse, gates, dtype)
    return _moe_combine_eager(out, inverse, gates, dtype)


@triton.jit
def _moe_combine_fwd_kernel(
    OUT, INV, G, Y, n_tokens, n_slots, n_cols,
    n_rows,  # n_rows = n_tokens * n_slots: the rows of OUT
    stride_out,
    stride_gn,
    stride_gk,
    stride_y,
    KP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,  # a power of two dividing n_cols and the row strides (pow2_divisor)
):  # fmt: skip
    # the same values, known to the compiler as multiples of ALIGN: vector loads for D = 1000 too
    n_cols = n_cols // ALIGN * ALIGN
    stride_out = stride_out // ALIGN * ALIGN
    stride_y = stride_y // ALIGN * ALIGN
    pid = tl.program_id(0)
    tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
    slot = tl.arange(0, KP)  # (KP,)
    cols = tl.arange(0, BLOCK_D)
    tok_ok = tok < n_tokens
    pair_ok = tok_ok[:, None] & (slot[None, :] < n_slots)  # (BLOCK_T, KP)
    row = tl.load(INV + tok[:, None] * n_slots + slot[None, :], mask=pair_ok, other=0)  # int64 rows of out
    pair_ok = pair_ok & (row >= 0) & (row < n_rows)  # an index out of range reads nothing, adds 0
    g = tl.load(G + tok[:, None] * stride_gn + slot[None, :] * stride_gk, mask=pair_ok, other=0.0).to(tl.float32)
    src = OUT + row[:, :, None] * stride_out  # (BLOCK_T, KP, 1)
    dst = Y + tok[:, None] * stride_y  # (BLOCK_T, 1)
    for d0 in range(0, n_cols, BLOCK_D):
        c = d0 + cols
        col_ok = c < n_cols
        x = tl.load(src + c[None, None, :], mask=pair_ok[:, :, None] & col_ok[None, None, :], other=0.0).to(
            tl.float32
        )  # (BLOCK_T, KP, BLOCK_D)
        y = tl.sum(x * g[:, :, None], axis=1)  # (BLOCK_T, BLOCK_D)
        tl.store(dst + c[None, :], y.to(Y.dtype.element_ty), mask=tok_ok[:, None] & col_ok[None, :])


@triton.jit
def _moe_combine_bwd_kernel(
    DY, OUT, INV, G, DOUT, DG, n_tokens, n_slots, n_cols, n_rows,
    stride_dy, stride_out, stride_gn, stride_gk, stride_dout,
    GATE_GRAD: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    n_cols = n_cols // ALIGN * ALIGN
    stride_dy = stride_dy // ALIGN * ALIGN
    stride_out = stride_out // ALIGN * ALIGN
    stride_dout = stride_dout // ALIGN * ALIGN
    pid = tl.program_id(0)
    tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.arange(0, KP)
    cols = tl.arange(0, BLOCK_D)
    tok_ok = tok < n_tokens
    in_gates = tok_ok[:, None] & (slot[None, :] < n_slots)  # (token, slot) exists
    row = tl.load(INV + tok[:, None] * n_slots + slot[None, :], mask=in_gates, other=0)
    pair_ok = in_gates & (row >= 0) & (row < n_rows)  # an index out of range writes nothing
    g = tl.load(G + tok[:, None] * stride_gn + slot[None, :] * stride_gk, mask=pair_ok, other=0.0).to(tl.float32)
    src = OUT + row[:, :, None] * stride_out
    dst = DOUT + row[:, :, None] * stride_dout
    dy_ptr = DY + tok[:, None] * stride_dy
    acc = tl.zeros((BLOCK_T, KP), dtype=tl.float32)  # d_g of the tile's pairs
    for d0 in range(0, n_cols, BLOCK_D):
        c = d0 + cols
        col_ok = c < n_cols
        dy = tl.load(dy_ptr + c[None, :], mask=tok_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        mask = pair_ok[:, :, None] & col_ok[None, None, :]
        tl.store(dst + c[None, None, :], (g[:, :, None] * dy[:, None, :]).to(DOUT.dtype.element_ty), mask=mask)
        if GATE_GRAD:
            x = tl.load(src + c[None, None, :], mask=mask, other=0.0).to(tl.float32)
            acc += tl.sum(x * dy[:, None, :], axis=2)
    if GATE_GRAD:  # every (token, slot) gets its d_g: 0 where the index was out of range
        tl.store(DG + tok[:, None] * n_slots + slot[None, :], acc.to(DG.dtype.element_ty), mask=in_gates)


_launch_fwd = Launcher(_moe_combine_fwd_kernel)
_launch_bwd = Launcher(_moe_combine_bwd_kernel)


def _config(n_tokens: int, k: int, n_cols: int, tile: int) -> tuple[int, int, int, int]:
    """(KP, BLOCK_T, BLOCK_D, num_warps): tiles of about ``tile`` gathered elements, 4 warps at most.

    BLOCK_D covers D up to tile / KP, BLOCK_T fills the rest of the tile with tokens (up to 16 for narrow
    D). The forward takes tile = 4096, the backward (which reads dy and out and writes d_out per element)
    2048. On an H200 (bf16, N = 16384, k = 2, D = 1024, 2026-11-22, tools/probes/moe_combine.py) these
    were the fastest of the sweep: forward (2 tokens, 1024, 4 warps) 31.3 us, backward (1, 1024, 4)
    49.5 us; 8 warps took 32.2 and 61.5 us.
    """
    kp = next_pow2(max(1, k))
    bd = max(16, min(next_pow2(max(1, n_cols)), tile // kp))
    bt = max(1, min(16, tile // (kp * bd), next_pow2(max(1, n_tokens))))
    return kp, bt, bd, max(1, min(4, bt * kp * bd // 512))


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def moe_combine_fwd_launch(out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype):
    """y (N, D) in ``dtype`` with y[n] = sum_j gates[n, j] * out[inverse[n*k + j]], on checked inputs
    (out-of-range indices are masked)."""
    N, k = gates.shape
    D = out.shape[1]
    y = torch.empty(N, D, dtype=dtype, device=out.device)
    if y.numel() == 0:
        return y
    out, inverse = _unit_stride(out), inverse.contiguous()
    kp, bt, bd, warps = _config(N, k, D, 4096)
    _launch_fwd(
        (cdiv(N, bt),), out, inverse, gates, y, N, k, D, N * k, out.stride(0), gates.stride(0),
        gates.stride(1), y.stride(0), KP=kp, BLOCK_T=bt, BLOCK_D=bd,
        ALIGN=pow2_divisor(D | out.stride(0) | y.stride(0)), num_warps=warps,
    )  # fmt: skip
    return y


def moe_combine_bwd_launch(
    dy: torch.Tensor,
    out: torch.Tensor,
    inverse: torch.Tensor,
    gates: torch.Tensor,
    gate_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_out (N*k, D) in out.dtype, d_gates (N, k) in gates.dtype) given dy (N, D).

    ``gate_grad=False`` skips reading out (d_gates comes back as zeros): a third fewer bytes.
    """
    N, k = gates.shape
    D = out.shape[1]
    d_out = torch.empty(out.shape, dtype=out.dtype, device=out.device)
    d_gates = (torch.empty if gate_grad else torch.zeros)(N, k, dtype=gates.dtype, device=gates.device)
    if N * k == 0:
        return d_out, d_gates
    dy, out, inverse = _unit_stride(dy), _unit_stride(out), inverse.contiguous()
    kp, bt, bd, warps = _config(N, k, D, 2048)
    _launch_bwd(
        (cdiv(N, bt),), dy, out, inverse, gates, d_out, d_gates, N, k, D, N * k, dy.stride(0), out.stride(0),
        gates.stride(0), gates.stride(1), d_out.stride(0), GATE_GRAD=bool(gate_grad), KP=kp, BLOCK_T=bt, BLOCK_D=bd,
        ALIGN=pow2_divisor(D | dy.stride(0) | out.stride(0) | d_out.stride(0)), num_warps=warps,
    )  # fmt: skip
    return d_out, d_gates


# The two registrations over the same launchers: an autograd.Function for eager calls (less host time than
# a custom op's dispatch), the custom ops for torch.compile (opaque to it, with fake and autograd rules).


class _MoECombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, inverse, gates, dtype):
        ctx.save_for_backward(out, inverse, gates)
        return moe_combine_fwd_launch(out, inverse, gates, dtype)

    @staticmethod
    def backward(ctx, dy):
        out, inverse, gates = ctx.saved_tensors
        need_out, _, need_gates, _ = ctx.needs_input_grad
        d_out, d_gates = moe_combine_bwd_launch(dy, out, inverse, gates, need_gates)
        return (d_out if need_out else None), None, (d_gates if need_gates else None), None


@torch.library.custom_op("mahia::moe_combine_fwd", mutates_args=())
def _fwd_op(out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return moe_combine_fwd_launch(out, inverse, gates, dtype)


_fwd_op.register_fake(lambda out, inverse, gates, dtype: out.new_empty(gates.shape[0], out.shape[1], dtype=dtype))


@torch.library.custom_op("mahia::moe_combine_bwd", mutates_args=())
def _bwd_op(
    dy: torch.Tensor, out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor, gate_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return moe_combine_bwd_launch(dy, out, inverse, gates, gate_grad)


@_bwd_op.register_fake
def _(dy, out, inverse, gates, gate_grad):
    return out.new_empty(out.shape), gates.new_empty(gates.shape)


def _setup(ctx, inputs, output):
    out, inverse, gates, _dtype = inputs
    ctx.save_for_backward(out, inverse, gates)


def _backward(ctx, dy):
    out, inverse, gates = ctx.saved_tensors
    need_out, _, need_gates, _ = ctx.needs_input_grad
    d_out, d_gates = _bwd_op(dy, out, inverse, gates, need_gates)
    return (d_out if need_out else None), None, (d_gates if need_gates else None), None


_fwd_op.register_autograd(_backward, setup_context=_setup)
_apply = c_apply(_MoECombine)


def moe_combine(
    out: torch.Tensor,
    inverse: torch.Tensor,
    gates: torch.Tensor,
    dtype: torch.dtype | None = None,
    *,
    check: bool | None = None,
) -> torch.Tensor:
    """y[n] = sum_j gates[n, j] * out[inverse[n*k + j]]: the MoE layer's un-permute + gated sum, one pass.

    out (N*k, D) in expert order, inverse (N*k,) int64 permutation, gates (N, k); y (N, D) in ``dtype``
    (None: out.dtype). The kernel computes in float32 and rounds once; the eager reference gates in
    out.dtype and sums in ``dtype``. float64 out, gates or dtype take the eager reference silently.

    ``check`` (module docstring), the same on every path: None (default) checks on the CPU that each
    entry of ``inverse`` is a row of out (no device sync; a ValueError naming the entry otherwise), True
    that ``inverse`` is a permutation of 0..N*k-1 on any device (a sync on CUDA), False nothing.
    Unchecked, an invalid ``inverse`` never makes the kernels read or write out of bounds, but the result
    is undefined (module docstring).
    """
    check_moe_combine_inputs("moe_combine", out, inverse, gates, dtype)
    if check:
        _check_permutation("moe_combine", inverse)
    elif check is None and inverse.device.type == "cpu" and inverse.numel() and not torch.compiler.is_compiling():
        _check_in_range("moe_combine", inverse)
    if (dtype is None or dtype in KERNEL_DTYPES) and use_triton("moe_combine", out, gates):
        dtype = out.dtype if dtype is None else dtype
        if torch.compiler.is_compiling():
            return _fwd_op(out, inverse, gates, dtype)
        if (out.requires_grad or gates.requires_grad) and torch.is_grad_enabled():
            return _apply(out, inverse, gates, dtype)
        return moe_combine_fwd_launch(out, inverse, gates, dtype)  # no graph to record: no Function
    return _moe_combine_eager(out, inverse, gates, dtype)
