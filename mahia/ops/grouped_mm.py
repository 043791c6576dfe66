"""Grouped matrix multiply for mixture-of-experts layers: ``c[rows of group g] = a[rows of group g] @ b[g]``.

a (M, K) holds the rows of every group back to back, b (G, K, N) one matrix per group, and offs (G,)
int32 the cumulative group ends (offs[g] = end of group g's rows); c is (M, N). The group sizes stay on
the device, so nothing here waits for the GPU (no host sync): every shape is known from M, K, N, G.

``grouped_mm`` has three backends computing the same product (``grouped_mm_backend`` says which runs):

* ``"torch._grouped_mm"``: PyTorch's grouped GEMM (CUTLASS). Used where it is sync-free: on CUDA only
  for bfloat16 on compute capability 9.0 or 10.x (elsewhere PyTorch's CUDA fallback copies ``offs`` to the
  host); on the CPU for float32/bfloat16/float16 when this torch build has the CPU kernel (a CPU has no
  device queue to wait for). Row strides must be multiples of 16 bytes.
* ``"triton"``: a Triton grouped GEMM in this module. Rows are cut into BLOCK_M-row tiles that each
  belong to one expert; the tile -> (expert, first row) table is computed on the device from ``offs``.
  The number of tiles is data-dependent, but never more than ceil(N*k / BLOCK_M) + E, a bound known
  from the shapes alone: that many programs are launched and the spare ones return at once. The
  weight gradient has its own kernel that loops over an expert's rows, reading the bounds on the
  device. Used on CUDA where the PyTorch kernel is not (e.g. A100, or float16/float32).
* ``"padded-bmm"``: pure PyTorch, same tile table: the tiles are zero-padded into a (T, BLOCK_M, K)
  batch and multiplied with ``torch.bmm`` by the gathered (T, K, N) expert weights. Sync-free and
  exact, but it copies one weight matrix per tile: a fallback for the CPU (older torch, float64,
  unaligned sizes) and for CUDA without Triton, not a fast path.

Behaviour at the edges: empty inputs (M, K or N of 0, empty groups) give empty or zero results; a
and b share one dtype, float64 included (float64 runs the padded bmm: reference precision); ``meta``
tensors get their shapes from the padded bmm (``why_not`` refuses Triton for them: no data for the
interpreter). ``offs`` is not checked against M (that needs its values on the host); the Triton
kernels guard every row index (0 <= row < M), so bad group ends never make them read or write out of
bounds, though the result is then undefined. Any hidden size runs.
"""

from __future__ import annotations

import threading
import warnings

import torch

from mahia.ops._launch import Launcher
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import why_not

__all__ = ["grouped_mm", "grouped_mm_backend", "choose_backend", "BACKENDS"]

BACKENDS = ("torch._grouped_mm", "triton", "padded-bmm")

# Rows per tile of the padded-bmm fallback (a multiple of 16 keeps bmm on aligned shapes).
_PAD_BLOCK_M = 32


# ---------------------------------------------------------------------------------------------------
# Grouped matrix multiply: c[rows of group g] = a[rows of group g] @ b[g]
# ---------------------------------------------------------------------------------------------------


def _check_grouped_mm_inputs(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> None:
    fn = "grouped_mm"
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{fn}: {name} must be a floating-point tensor, got dtype {t.dtype}")
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"{fn}: offs must be a torch.Tensor, got {type(offs).__name__}")
    if a.dim() != 2:
        raise ValueError(f"{fn}: a must be 2-D (M, K), got shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"{fn}: b must be 3-D (G, K, N), got shape {tuple(b.shape)}")
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"{fn}: b must be (G, K, N) with K = a.shape[1] = {a.shape[1]}, got {tuple(b.shape)}")
    if b.dtype != a.dtype:
        raise TypeError(f"{fn}: a and b must have the same dtype, got a {a.dtype} and b {b.dtype}")
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.numel() != b.shape[0]:
        raise ValueError(
            f"{fn}: offs must be a 1-D int32 tensor of G = {b.shape[0]} group ends, "
            f"got dtype {offs.dtype}, shape {tuple(offs.shape)}"
        )
    if not (a.device == b.device == offs.device):
        raise ValueError(f"{fn}: a, b and offs must be on one device, got {a.device}, {b.device}, {offs.device}")


# dtype -> whether this torch build has a CPU torch._grouped_mm (with autograd) for it; probed once.
_cpu_grouped_mm_probe: dict[torch.dtype, bool] = {}


def _probe_native_cpu(dtype: torch.dtype, result: list) -> None:
    try:
        a = torch.zeros(4, 8, dtype=dtype, requires_grad=True)
        b = torch.zeros(2, 8, 8, dtype=dtype, requires_grad=True)
        c = torch._grouped_mm(a, b, offs=torch.tensor([2, 4], dtype=torch.int32))
        c.backward(torch.ones_like(c))
        result.append(True)
    except (RuntimeError, NotImplementedError, TypeError):
        result.append(False)


def _native_cpu_supported(dtype: torch.dtype) -> bool:
    """Whether this torch build has a CPU kernel (and autograd) for torch._grouped_mm in ``dtype``."""
    if dtype not in _cpu_grouped_mm_probe:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            # The first call may come from inside a model's forward: under no_grad, inference_mode or
            # activation checkpointing, whose state (grad mode, saved-tensor hooks, dispatch modes) is
            # per thread. A thread of its own runs the probe's backward outside all of them.
            result: list[bool] = []
            thread = threading.Thread(target=_probe_native_cpu, args=(dtype, result), name="mahia-grouped-mm-probe")
            thread.start()
            thread.join()
            ok = bool(result and result[0])
        _cpu_grouped_mm_probe[dtype] = ok
    return _cpu_grouped_mm_probe[dtype]


# torch.compile calls the probe instead of tracing it. This is what torch.compiler.assume_constant_result
# does (tests/test_ops_grouped_mm.py checks that it still is), set here by hand: the public decorator imports
# torch._dynamo, and `import mahia.ops` would pay that in every process (about 6 s on the H100 machine's
# host, 2026-11-27, in each notebook that never compiles).
_native_cpu_supported._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _why_not_native(device: torch.device, dtype: torch.dtype, k: int, n: int) -> str | None:
    """None if torch._grouped_mm runs sync-free for (M, k) @ (G, k, n) in ``dtype`` on ``device``.

    Evaluated where the matmul is traced: under torch.compile a float32 CPU input therefore gets the
    padded bmm (or Triton), although eager would use torch._grouped_mm.
    """
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm (added in 2.8)"
    if dtype != torch.bfloat16 and torch.compiler.is_compiling():
        return f"torch.compile traces torch._grouped_mm with a meta kernel that takes bfloat16 only, got {dtype}"
    if device.type == "cuda":
        if dtype != torch.bfloat16:
            return f"its CUDA kernel takes bfloat16 only, got {dtype}"
        cap = torch.cuda.get_device_capability(device)
        if not (cap == (9, 0) or cap[0] == 10):
            # PyTorch runs a fallback there that copies offs to the host: a sync per call.
            return f"its CUDA kernel needs compute capability 9.0 or 10.x, this device is {cap[0]}.{cap[1]}"
    elif device.type == "cpu":
        if dtype not in (torch.float32, torch.bfloat16, torch.float16) or not _native_cpu_supported(dtype):
            return f"this torch build has no CPU torch._grouped_mm for {dtype}"
    else:
        return f"not used on {device.type} devices"
    if (k * dtype.itemsize) % 16 or (n * dtype.itemsize) % 16:
        return f"row strides must be multiples of 16 bytes, got K={k} and N={n} in {dtype}"
    return None


def _why_not_triton(a: torch.Tensor) -> str | None:
    """None if the Triton kernels can run on ``a`` (see mahia.ops.status()), else the reason."""
    reason = why_not(a)
    if reason is None and a.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        reason = f"the Triton kernel takes float32, float16 or bfloat16, got {a.dtype}"
    return reason


def choose_backend(a: torch.Tensor, gemms: list[tuple[int, int]]) -> str:
    """One backend for every (K, N) GEMM of ``gemms`` with left operands like ``a``: native if it
    suits all of them, else Triton, else the padded bmm."""
    if all(_why_not_native(a.device, a.dtype, k, n) is None for k, n in gemms):
        return "torch._grouped_mm"
    if _why_not_triton(a) is None:
        return "triton"
    if a.is_cuda:
        warnings.warn(
            "grouped_mm: neither torch._grouped_mm nor Triton can run here; using the padded-bmm "
            "fallback (sync-free and exact, but it copies one expert weight per tile: slow)",
            RuntimeWarning,
            stacklevel=3,
        )
    return "padded-bmm"


def grouped_mm_backend(a: torch.Tensor, b: torch.Tensor) -> str:
    """The backend ``grouped_mm(a, b, offs)`` runs with ``backend="auto"``: one of ``BACKENDS``.

    Asked in eager, it answers for eager; inside torch.compile torch._grouped_mm is used for bfloat16
    only (its meta kernel rejects other dtypes), so there the answer can differ.
    """
    return choose_backend(a, [(b.shape[1], b.shape[2])])


def _check_backend(backend: str, a: torch.Tensor, k: int, n: int) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"grouped_mm: backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    reason = None
    if backend == "torch._grouped_mm":
        reason = _why_not_native(a.device, a.dtype, k, n)
    elif backend == "triton":
        reason = _why_not_triton(a)
    if reason is not None:
        raise ValueError(f"grouped_mm: backend {backend!r} cannot run here: {reason}")


def _tile_table(offs: torch.Tensor, n_rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut every group's rows into ``block_m``-row tiles, on the device: (tile_group, tile_row0), int32.

    Group g holds rows [offs[g-1], offs[g]) and needs ceil(count_g / block_m) tiles. The table has the
    fixed length ceil(n_rows / block_m) + G (an upper bound on the tile count that needs no data);
    spare tiles at the end get group -1.
    """
    G = offs.numel()
    ends = offs.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))  # (G,)
    tiles = (counts + block_m - 1) // block_m  # (G,) tiles per group
    tile_end = tiles.cumsum(0)  # (G,) one past each group's last tile
    t = torch.arange((n_rows + block_m - 1) // block_m + G, device=offs.device)
    group = torch.searchsorted(tile_end, t, right=True)  # (T,) group of tile t; G for spares
    g = group.clamp(max=G - 1)
    row0 = (ends - counts).gather(0, g) + (t - (tile_end - tiles).gather(0, g)) * block_m
    group = group.masked_fill(group >= G, -1)
    return group.to(torch.int32), row0.to(torch.int32)


def _grouped_mm_padded(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Sync-free grouped matmul in plain PyTorch: zero-padded tiles, one ``bmm``. Differentiable."""
    M, K = a.shape
    G, _, N = b.shape
    bm = _PAD_BLOCK_M
    group, row0 = _tile_table(offs, M, bm)
    T = group.numel()
    valid_tile = group >= 0
    g = group.clamp(min=0).long()
    src = row0.long()[:, None] + torch.arange(bm, device=a.device)  # (T, bm) source row of each slot
    valid = valid_tile[:, None] & (src < offs.long().gather(0, g)[:, None])  # slot holds a real row
    src = torch.where(valid, src, M).reshape(-1)  # padding slots -> dump row M
    a_ext = torch.cat([a, a.new_zeros(1, K)])  # (M+1, K), row M is zeros
    a_tiles = a_ext.index_select(0, src).view(T, bm, K)  # (T, bm, K)
    c_tiles = torch.bmm(a_tiles, b.index_select(0, g))  # (T, bm, N)
    c_ext = a.new_zeros(M + 1, N).index_add(0, src, c_tiles.reshape(T * bm, N))  # one write per real row
    return c_ext[:M]


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """c[r] = a[r] @ b[g] for every row r of group g, where group g is rows [start_g, offs[g]) with
    start_0 = 0 and start_g = offs[g-1] (empty groups allowed).

    a: (M, K), b: (G, K, N), offs: (G,) int32 cumulative group ends, offs[G-1] = M (rows past it are
    not computed). Returns (M, N) in a.dtype, differentiable in a and b. No backend reads ``offs`` on
    the host.
    ``backend``: "auto" (see ``grouped_mm_backend``) or one of ``BACKENDS``.
    """
    _check_grouped_mm_inputs(a, b, offs)
    if backend == "auto":
        backend = grouped_mm_backend(a, b)
    else:
        _check_backend(backend, a, b.shape[1], b.shape[2])
    if backend == "torch._grouped_mm":
        return torch._grouped_mm(a, b, offs=offs)
    if backend == "triton":
        return _grouped_mm_triton(a, b, offs)
    return _grouped_mm_padded(a, b, offs)


# ---------------------------------------------------------------------------------------------------
# Triton grouped GEMM: kernels, launchers, custom ops with autograd
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _grouped_mm_kernel(
    A,
    B,
    C,
    offs_ptr,
    tile_group_ptr,
    tile_row_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) tile of C = A[rows of g] @ B[g]; the tile's group comes from the table."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.load(tile_group_ptr + pid_m)
    if g < 0:  # a spare tile of the static upper bound
        return
    row_end = tl.load(offs_ptr + g)
    rm = tl.load(tile_row_ptr + pid_m) + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = (rm < row_end) & (rm >= 0) & (rm < M)  # 0 <= row < M even if offs is wrong
    mask_n = rn < N
    a_ptrs = A + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + g.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = rk < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IEEE:  # full fp32 products, like the loop path (no TF32)
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _grouped_mm_wgrad_kernel(
    A,
    DC,
    DB,
    offs_ptr,
    M,
    K,
    N,
    stride_am,
    stride_ak,
    stride_cm,
    stride_cn,
    stride_bg,
    stride_bk,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One (BLOCK_K, BLOCK_N) tile of dB[g] = A[rows of g]^T @ dC[rows of g], looping over g's rows."""
    g = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    start = tl.maximum(tl.load(offs_ptr + g - 1, mask=g > 0, other=0), 0)
    end = tl.minimum(tl.load(offs_ptr + g), M)  # rows stay in 0 .. M-1 even if offs is wrong
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_k = rk < K
    mask_n = rn < N
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for m0 in range(start, end, BLOCK_M):  # an empty group leaves acc = 0
        rows = m0 + tl.arange(0, BLOCK_M)
        mask_m = rows < end
        rows = rows.to(tl.int64)
        a_t = tl.load(
            A + rows[None, :] * stride_am + rk[:, None] * stride_ak, mask=mask_k[:, None] & mask_m[None, :], other=0.0
        )  # (BLOCK_K, BLOCK_M)
        dc = tl.load(
            DC + rows[:, None] * stride_cm + rn[None, :] * stride_cn, mask=mask_m[:, None] & mask_n[None, :], other=0.0
        )  # (BLOCK_M, BLOCK_N)
        if IEEE:
            acc = tl.dot(a_t.to(tl.float32), dc.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a_t, dc, acc)
    db_ptrs = DB + g.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    tl.store(db_ptrs, acc.to(DB.dtype.element_ty), mask=mask_k[:, None] & mask_n[None, :])


_launch_mm = Launcher(_grouped_mm_kernel)
_launch_wgrad = Launcher(_grouped_mm_wgrad_kernel)


def _triton_blocks(t: torch.Tensor, kernel: str) -> dict:
    """Tile sizes for ``kernel`` ("mm" or "wgrad"): small under the CPU interpreter (test speed),
    GEMM-sized on a GPU. Rules of thumb, not autotuned (the tile table depends on BLOCK_M)."""
    if not t.is_cuda:
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=1)
    wide = t.dtype != torch.float32  # 16-bit operands: twice the tile for the same shared memory
    if kernel == "mm":  # output tile BLOCK_M x BLOCK_N, reduction over BLOCK_K
        return dict(
            BLOCK_M=128 if wide else 64,
            BLOCK_N=128 if wide else 64,
            BLOCK_K=64 if wide else 32,
            num_warps=8 if wide else 4,
            num_stages=3,
        )
    # wgrad: output tile BLOCK_K x BLOCK_N, reduction over the group's rows in steps of BLOCK_M
    return dict(
        BLOCK_M=64 if wide else 32, BLOCK_N=128 if wide else 64, BLOCK_K=64, num_warps=8 if wide else 4, num_stages=3
    )


def _ieee_dot(t: torch.Tensor) -> bool:
    """float32 inputs get full-precision products; so do 16-bit ones under the CPU interpreter,
    whose 16-bit tl.dot is wrong (triton 3.9) while the products of 16-bit values are exact in fp32."""
    return t.dtype == torch.float32 or not t.is_cuda


def grouped_mm_triton_launch(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """c = grouped_mm(a, b, offs) with the Triton kernel. a (M, K), b (G, K, N) with any strides."""
    _check_grouped_mm_inputs(a, b, offs)
    M, K = a.shape
    G, _, N = b.shape
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    cfg = _triton_blocks(a, "mm")
    group, row0 = _tile_table(offs, M, cfg["BLOCK_M"])
    grid = (group.numel(), triton.cdiv(N, cfg["BLOCK_N"]))
    _launch_mm(
        grid,
        a,
        b,
        c,
        offs,
        group,
        row0,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        IEEE=_ieee_dot(a),
        **cfg,
    )
    return c


def grouped_mm_wgrad_launch(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """db (G, K, N) with db[g] = a[rows of g]^T @ dc[rows of g]. a (M, K), dc (M, N)."""
    M, K = a.shape
    N = dc.shape[1]
    G = offs.numel()
    db = torch.empty(G, K, N, dtype=a.dtype, device=a.device)
    if M == 0:
        return db.zero_()
    cfg = _triton_blocks(a, "wgrad")
    grid = (G, triton.cdiv(K, cfg["BLOCK_K"]), triton.cdiv(N, cfg["BLOCK_N"]))
    _launch_wgrad(
        grid,
        a,
        dc,
        db,
        offs,
        M,
        K,
        N,
        a.stride(0),
        a.stride(1),
        dc.stride(0),
        dc.stride(1),
        db.stride(0),
        db.stride(1),
        db.stride(2),
        IEEE=_ieee_dot(a),
        **cfg,
    )
    return db


@torch.library.custom_op("mahia::moe_grouped_mm", mutates_args=())
def _grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return grouped_mm_triton_launch(a, b, offs)


@_grouped_mm_op.register_fake
def _(a, b, offs):
    return a.new_empty(a.shape[0], b.shape[2])


@torch.library.custom_op("mahia::moe_grouped_mm_wgrad", mutates_args=())
def _grouped_mm_wgrad_op(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return grouped_mm_wgrad_launch(a, dc, offs)


@_grouped_mm_wgrad_op.register_fake
def _(a, dc, offs):
    return a.new_empty(offs.shape[0], a.shape[1], dc.shape[1])


def _grouped_mm_setup(ctx, inputs, output):
    a, b, offs = inputs
    ctx.save_for_backward(a, b, offs)


def _grouped_mm_backward(ctx, dc):
    a, b, offs = ctx.saved_tensors
    da = _grouped_mm_op(dc, b.transpose(1, 2), offs) if ctx.needs_input_grad[0] else None  # dC B^T
    db = _grouped_mm_wgrad_op(a, dc, offs) if ctx.needs_input_grad[1] else None  # A^T dC
    return da, db, None


_grouped_mm_op.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


def _grouped_mm_triton(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _grouped_mm_op(a, b, offs)
