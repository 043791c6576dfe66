"""Grouped matrix multiply for mixture-of-experts layers: ``c[rows of group g] = a[rows of group g] @ b[g]``.

a (M, K) holds the rows of every group back to back, b (G, K, N) one matrix per group, offs (G,) int32
the cumulative group ends; c is (M, N). The group sizes stay on the device: nothing here waits for the
GPU, every shape is known from M, K, N, G.

**The rule for offs**, the same on every backend and device. offs is meant to be non-decreasing with
offs[G-1] = M; its values are never read on the host (a check would sync). Each backend reads the ends
e_g = min(max(0, offs[0], ..., offs[g]), M): an end past M is cut at M, a negative one reads as 0, one
below its predecessor gives an empty group. Rows past e_{G-1} (all rows when G = 0) belong to no group:
their rows of c and of the gradient of a are 0. No index ever leaves [0, M).

Backends, one product (``grouped_mm_backend`` says which ``backend="auto"`` runs):

* ``"torch._grouped_mm"`` (CUTLASS), where it is sync-free: on CUDA for bfloat16 on compute capability
  9.0 or 10.x (elsewhere PyTorch's fallback copies ``offs`` to the host), on the CPU where this build has
  the kernel. K and N positive with 16-byte rows; operands with strides it rejects are copied. It leaves
  the rows past the last end unwritten: a small Triton kernel zeroes them (one launch that returns at
  once where there are none), or a masked fill without Triton.
* ``"triton"``: rows cut into BLOCK_M-row tiles of one group each (the rows past the last end form one
  more group, written as zeros), the tile table computed on the device. At most ceil(M / BLOCK_M) + G
  tiles, a bound from the shapes alone: that many programs launch and spare ones return at once. The
  weight gradient's kernel loops over a group's rows.
* ``"padded-bmm"``: pure PyTorch on the same tile table (zero-padded tiles, one ``torch.bmm``); exact and
  sync-free but it copies one weight matrix per tile: for float64, ``meta`` tensors and machines where
  neither of the others runs.

Eager calls go through one ``torch.autograd.Function`` (``_GroupedMM``); under torch.compile each of its two
products is one custom op (``mahia::moe_grouped_mm``, ``mahia::moe_grouped_mm_wgrad``) on either backend:
Inductor, given torch._grouped_mm itself, wrote a^T of the weight gradient row-major, which CUTLASS takes only
for groups of a multiple of 16 bytes (a device-side assert in notebook 07, H200, 2026-12-03). Empty inputs give
empty or zero results; a and b share one dtype.
"""

from __future__ import annotations

import threading
import warnings

import torch

from mahia.ops._launch import Launcher, cdiv
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import why_not

__all__ = ["grouped_mm", "grouped_mm_backend", "choose_backend", "BACKENDS"]

BACKENDS = ("torch._grouped_mm", "triton", "padded-bmm")

# Rows per tile of the padded-bmm fallback (a multiple of 16 keeps bmm on aligned shapes).
_PAD_BLOCK_M = 32


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """c[r] = a[r] @ b[g] for every row r of group g, where group g is rows [e_{g-1}, e_g) with e_{-1} = 0
    and e_g = min(max(0, offs[0], ..., offs[g]), M) (offs[g] itself for non-decreasing ends <= M; empty groups
    allowed); rows past e_{G-1} give c[r] = 0 (module docstring).

    a: (M, K), b: (G, K, N), offs: (G,) int32. Returns (M, N) in a.dtype, differentiable in a and b:
    da[r] = dc[r] @ b[g]^T, db[g] = a[rows of g]^T @ dc[rows of g]. No backend reads ``offs`` on the host.
    ``backend``: "auto" (see ``grouped_mm_backend``) or one of ``BACKENDS``.
    """
    _check(a, b, offs)
    if backend == "auto":
        backend = grouped_mm_backend(a, b)
    else:
        _check_backend(backend, a, b.shape[1], b.shape[2])
    ends = offs.clamp(0, a.shape[0]).cummax(0).values  # the rule for offs, on the device
    if backend == "padded-bmm":
        return _grouped_mm_padded(a, b, ends)
    return _GroupedMM.apply(a, b, ends, backend == "torch._grouped_mm")


def _check(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> None:
    fn = "grouped_mm"
    for name, t in (("a", a), ("b", b), ("offs", offs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if name != "offs" and not t.is_floating_point():
            raise TypeError(f"{fn}: {name} must be a floating-point tensor, got dtype {t.dtype}")
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


# Which backend runs

# dtype -> whether this torch build has a CPU torch._grouped_mm for it (both forms: (M, K) x (G, K, N)
# and the weight gradient's (K, M) x (M, N)); probed once.
_cpu_grouped_mm_probe: dict[torch.dtype, bool] = {}


def _probe_native_cpu(dtype: torch.dtype, result: list) -> None:
    try:
        a, offs = torch.zeros(4, 8, dtype=dtype), torch.tensor([2, 4], dtype=torch.int32)
        c = torch._grouped_mm(a, torch.zeros(2, 8, 8, dtype=dtype), offs=offs)
        torch._grouped_mm(a.t(), c, offs=offs)
        result.append(True)
    except (RuntimeError, NotImplementedError, TypeError):
        result.append(False)


def _native_cpu_supported(dtype: torch.dtype) -> bool:
    """Whether this torch build has a CPU kernel for torch._grouped_mm in ``dtype``."""
    if dtype not in _cpu_grouped_mm_probe:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            # The first call may come from inside a model's forward, under dispatch modes (an instrument,
            # checkpointing) that are per thread: a thread of its own runs the probe outside all of them.
            result: list[bool] = []
            thread = threading.Thread(target=_probe_native_cpu, args=(dtype, result), name="mahia-grouped-mm-probe")
            thread.start()
            thread.join()
            ok = bool(result and result[0])
        _cpu_grouped_mm_probe[dtype] = ok
    return _cpu_grouped_mm_probe[dtype]


# torch.compile calls the probe instead of tracing it: torch.compiler.assume_constant_result's mark (as of
# torch 2.13), set here by hand: the public decorator imports torch._dynamo, and `import mahia.ops` would pay
# that in every process (about 6 s on the H100 machine's host, 2026-11-27, in each notebook that never compiles).
_native_cpu_supported._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _why_not_native(device: torch.device, dtype: torch.dtype, k: int, n: int) -> str | None:
    """None if torch._grouped_mm runs sync-free for (M, k) @ (G, k, n) in ``dtype`` on ``device``."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm (added in 2.8)"
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
    if k == 0 or n == 0 or (k * dtype.itemsize) % 16 or (n * dtype.itemsize) % 16:
        return f"K and N must be positive with rows of a multiple of 16 bytes, got K={k} and N={n} in {dtype}"
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
    """The backend ``grouped_mm(a, b, offs)`` runs with ``backend="auto"``: one of ``BACKENDS``, in eager and
    under torch.compile alike."""
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


# The tile table and the padded-bmm backend


def _tile_table(ends: torch.Tensor, n_rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut every group's rows into ``block_m``-row tiles, on the device: (tile_group, tile_row0), int32.

    ``ends`` are the group ends (non-decreasing, <= n_rows); the rows past the last one count as group G.
    Group g holds count_g rows and needs ceil(count_g / block_m) tiles; the G + 1 groups need at most
    ceil(n_rows / block_m) + G tiles, the table's fixed length (a bound that needs no data). Spare tiles
    at the end get group -1.
    """
    G = ends.numel()
    bounds = torch.cat([ends.long(), ends.new_full((1,), n_rows, dtype=torch.long)])  # (G+1,)
    counts = torch.diff(bounds, prepend=bounds.new_zeros(1))  # (G+1,) rows per group
    tiles = (counts + block_m - 1) // block_m  # (G+1,) tiles per group
    tile_end = tiles.cumsum(0)  # (G+1,) one past each group's last tile
    t = torch.arange((n_rows + block_m - 1) // block_m + G, device=ends.device)
    group = torch.searchsorted(tile_end, t, right=True)  # (T,) group of tile t; G+1 for spares
    g = group.clamp(max=G)
    row0 = (bounds - counts).gather(0, g) + (t - (tile_end - tiles).gather(0, g)) * block_m
    return group.masked_fill(group > G, -1).to(torch.int32), row0.to(torch.int32)


def _grouped_mm_padded(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Sync-free grouped matmul in plain PyTorch: zero-padded tiles, one ``bmm``. Differentiable."""
    M, K = a.shape
    G, _, N = b.shape
    if G == 0:  # every row is past the last end: c = 0, still a function of a and b (zero gradients)
        return a.new_zeros(M, N) + (a[:, :0].sum() + b.sum())
    bm = _PAD_BLOCK_M
    group, row0 = _tile_table(ends, M, bm)
    T = group.numel()
    g = group.clamp(0, G - 1).long()  # the tail tiles (group G) and spares hold no real row
    src = row0.long()[:, None] + torch.arange(bm, device=a.device)  # (T, bm) source row of each slot
    valid = ((group >= 0) & (group < G))[:, None] & (src < ends.long().gather(0, g)[:, None])  # a real row
    src = torch.where(valid, src, M).reshape(-1)  # padding slots -> dump row M
    a_ext = torch.cat([a, a.new_zeros(1, K)])  # (M+1, K), row M is zeros
    a_tiles = a_ext.index_select(0, src).view(T, bm, K)  # (T, bm, K)
    c_tiles = torch.bmm(a_tiles, b.index_select(0, g))  # (T, bm, N)
    c_ext = a.new_zeros(M + 1, N).index_add(0, src, c_tiles.reshape(T * bm, N))  # one write per real row
    return c_ext[:M]


# The kernels: one autograd Function in eager mode, one custom op per Triton kernel under torch.compile


@triton.jit
def _grouped_mm_kernel(
    A, B, C, ENDS, TILE_GROUP, TILE_ROW, M, N, K, G,
    stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_M, BLOCK_N) tile of C = A[rows of g] @ B[g]; the tile's group g comes from the table
    (g = G: rows past the last end, stored as zeros; g = -1: a spare tile)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.load(TILE_GROUP + pid_m)
    if g < 0:  # a spare tile of the static upper bound
        return
    row_end = tl.load(ENDS + g, mask=g < G, other=M)
    k_end = tl.where(g < G, K, 0)  # the rows of no group get no product: zeros
    rm = tl.load(TILE_ROW + pid_m) + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < row_end
    mask_n = rn < N
    a_ptrs = A + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + g.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
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
    A, DC, DB, ENDS, K, N,
    stride_am, stride_ak, stride_cm, stride_cn, stride_bg, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_K, BLOCK_N) tile of dB[g] = A[rows of g]^T @ dC[rows of g], looping over g's rows."""
    g = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    start = tl.load(ENDS + g - 1, mask=g > 0, other=0)
    end = tl.load(ENDS + g)
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


@triton.jit
def _zero_tail_kernel(C, ENDS, M, N, G, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Zero the rows of C past the last group end (torch._grouped_mm leaves them unwritten). A block of rows
    wholly before that end returns at once: without such rows (the usual case) this costs one launch."""
    end = tl.load(ENDS + G - 1, mask=G > 0, other=0)
    row0 = tl.program_id(0) * BLOCK_M
    if row0 + BLOCK_M <= end:
        return
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = ((rm >= end) & (rm < M))[:, None] & (rn < N)[None, :]
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=C.dtype.element_ty), mask=mask)


_launch_mm = Launcher(_grouped_mm_kernel)
_launch_wgrad = Launcher(_grouped_mm_wgrad_kernel)
_launch_zero_tail = Launcher(_zero_tail_kernel)


def _blocks(t: torch.Tensor, kernel: str) -> dict:
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


def _aligned(t: torch.Tensor, rows: bool = False) -> torch.Tensor:
    """``t``, or a contiguous copy where torch._grouped_mm rejects its strides: each matrix must be row- or
    column-major with a leading stride of a multiple of 16 bytes (a transposed bfloat16 ``a`` is not, nor
    is a broadcast gradient such as the one of ``c.sum()``). ``rows``: a 2D operand whose groups are cut along
    its rows must be row-major. Column-major, each group would start at ``offs[g-1]`` elements, which CUTLASS's
    TMA accepts only for groups of a multiple of 16 bytes: a device-side assert (``delta % align``) otherwise."""
    (n_rows, cols), (s_row, s_col) = t.shape[-2:], t.stride()[-2:]
    row_major = s_col == 1 and s_row >= max(cols, 1)
    col_major = not rows and s_row == 1 and s_col >= max(n_rows, 1)
    lead = s_row if row_major else s_col if col_major else 0
    # not .contiguous(): an empty or one-row view counts as contiguous whatever its strides
    return t if lead and (lead * t.itemsize) % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


class _GroupedMM(torch.autograd.Function):
    """c = grouped_mm(a, b, ends) on torch._grouped_mm (``native``) or the Triton kernels, with
    da = grouped_mm(dc, b^T, ends) and db = _wgrad(a, dc, ends). ``ends`` follow the rule for offs."""

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, native: bool) -> torch.Tensor:
        if torch.compiler.is_compiling():  # opaque: Inductor may pick a layout CUTLASS rejects (docstring)
            return _mm_op(a, b, ends, native)
        M, N = a.shape[0], b.shape[2]
        if native:
            c = torch._grouped_mm(_aligned(a, rows=True), _aligned(b), offs=ends)  # rows past ends[-1] are not written
            if why_not(c) is not None:
                last = ends[-1:] if ends.numel() else ends.new_zeros(1)
                # not in place: selective activation checkpointing may keep c as torch._grouped_mm returned it
                return c.masked_fill((torch.arange(M, device=a.device) >= last)[:, None], 0)
            if c.numel():
                grid = (cdiv(M, 64), cdiv(N, 256))
                _launch_zero_tail(grid, c, ends, M, N, ends.numel(), *c.stride(), BLOCK_M=64, BLOCK_N=256, num_warps=4)
            return c
        c = a.new_empty(M, N)
        if c.numel():
            cfg = _blocks(a, "mm")
            group, row0 = _tile_table(ends, M, cfg["BLOCK_M"])
            grid = (group.numel(), cdiv(N, cfg["BLOCK_N"]))
            _launch_mm(
                grid, a, b, c, ends, group, row0, M, N, a.shape[1], ends.numel(),
                *a.stride(), *b.stride(), *c.stride(), IEEE=_ieee_dot(a), **cfg,
            )  # fmt: skip
        return c

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, ends, ctx.native = inputs
        ctx.save_for_backward(a, b, ends)

    @staticmethod
    def backward(ctx, dc):
        a, b, ends = ctx.saved_tensors
        da = _GroupedMM.forward(dc, b.transpose(1, 2), ends, ctx.native) if ctx.needs_input_grad[0] else None
        db = _wgrad(a, dc, ends, ctx.native) if ctx.needs_input_grad[1] else None
        return da, db, None, None


def _wgrad(a: torch.Tensor, dc: torch.Tensor, ends: torch.Tensor, native: bool) -> torch.Tensor:
    """db (G, K, N) with db[g] = a[rows of g]^T @ dc[rows of g]. a (M, K), dc (M, N), any strides."""
    if torch.compiler.is_compiling():  # as in forward: Inductor wrote a^T row-major here
        return _wgrad_op(a, dc, ends, native)
    if native:
        return torch._grouped_mm(_aligned(a, rows=True).t(), _aligned(dc, rows=True), offs=ends)
    K, N = a.shape[1], dc.shape[1]
    db = a.new_empty(ends.numel(), K, N)
    if db.numel():
        cfg = _blocks(a, "wgrad")
        grid = (ends.numel(), cdiv(K, cfg["BLOCK_K"]), cdiv(N, cfg["BLOCK_N"]))
        _launch_wgrad(grid, a, dc, db, ends, K, N, *a.stride(), *dc.stride(), *db.stride(), IEEE=_ieee_dot(a), **cfg)
    return db


@torch.library.custom_op("mahia::moe_grouped_mm", mutates_args=())
def _mm_op(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, native: bool) -> torch.Tensor:
    return _GroupedMM.forward(a, b, ends, native)


_mm_op.register_fake(lambda a, b, ends, native: a.new_empty(a.shape[0], b.shape[2]))


@torch.library.custom_op("mahia::moe_grouped_mm_wgrad", mutates_args=())
def _wgrad_op(a: torch.Tensor, dc: torch.Tensor, ends: torch.Tensor, native: bool) -> torch.Tensor:
    return _wgrad(a, dc, ends, native)


_wgrad_op.register_fake(lambda a, dc, ends, native: a.new_empty(ends.shape[0], a.shape[1], dc.shape[1]))
