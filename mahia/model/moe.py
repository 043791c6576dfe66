"""Mixture-of-experts feed-forward layer: a per-expert loop ("before") and a sync-free grouped path ("after").

Math, for N tokens x (N, D), E experts, top-k routing:

    router     logits = x W_r                        W_r: (D, E), computed in x.dtype, also under autocast
               p      = softmax(logits)              in float32 (float64 for float64 inputs)
               (v, i) = topk(p, k)                   per token: the k largest probabilities and their experts
               g      = v / sum(v)                   gate weights, renormalized to sum to 1 over the k experts
    expert e   y_e(x) = (silu(x W1_e) * (x W3_e)) W2_e     SwiGLU; W1_e, W3_e: (D, H) stored fused as
                                                           w13[e] = [W1_e | W3_e]: (D, 2H); W2_e = w2[e]: (H, D)
    output     y_n    = sum_{j<k} g_nj * y_{i_nj}(x_n)
    aux loss   aux    = coef * E * sum_e f_e * P_e   (Switch Transformer / GShard load balancing)
                        f_e = (number of the N*k assignments routed to e) / (N*k)   (no gradient)
                        P_e = mean over tokens of p_ne                              (carries the gradient)

aux is 1 * coef when routing is uniform (f_e = P_e = 1/E) and grows as the load concentrates.

Over a weighted set of tokens (``forward(x, token_weight=w)``, e.g. w = 0 for the samples that a gated
model skips) both averages are weighted: f_e = sum_n w_n [e in top-k(n)] / (k sum_n w_n) and
P_e = sum_n w_n p_ne / sum_n w_n (aux = 0 when sum_n w_n = 0). Their numerators and sum_n w_n are a
:class:`RouterStats` (``return_stats=True``): statistics of disjoint token sets add up, so the loss of
a batch processed in pieces (one sample at a time) equals that of the whole batch (``RouterStats.pool``,
``MoE.aux_loss_from``).

Under autocast the experts' matmuls run in the autocast dtype; the gated sum over the k experts of
each token is accumulated in x's dtype by the loop and in float32 by the grouped path's fused combine
(rounded once to x's dtype), so y keeps x's dtype.

Two paths compute this same function from the same parameters (``impl=``):

* ``"loop"``: for each expert, find its tokens with ``nonzero``, run its two small matmuls (x w13,
  then w2), ``index_add_`` the gated result back. Readable, and what most first MoE implementations
  look like, but each ``nonzero`` returns a data-dependent number of rows, so the CPU waits for the
  GPU E times per forward (a host-device sync), and 2E small matmuls leave much of the GPU idle.
* ``"grouped"``: no host sync. The N*k (token, expert) assignments are sorted once by expert
  (a stable ``argsort``), the tokens gathered in that order, and the rows of each expert made one
  contiguous group. Per-expert counts come from ``scatter_add_`` (``bincount`` would sync) and
  ``offs = cumsum(counts)`` (int32) marks where each group ends. Then

      h   = grouped_mm(x_sorted, w13, offs)            (N*k, 2H)   row r of group e times w13[e]
      a   = silu(h[:, :H]) * h[:, H:]                  (N*k, H)    mahia.kernels.swiglu (Triton on CUDA)
      out = grouped_mm(a, w2, offs)                    (N*k, D)
      y   = sum_k g * out[inverse permutation]         (N, D)      mahia.kernels.moe_combine: one fused
                                                                   kernel (gather, gate, k-sum in one
                                                                   pass over out; Triton on CUDA)

  The group sizes stay on the device: every shape above is known from N, k, D, H alone.

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
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mahia import kernels
from mahia.kernels._registry import check_moe_combine_inputs, triton_import_error, why_not

__all__ = [
    "MoE",
    "RouterStats",
    "IMPLS",
    "BACKENDS",
    "moe_flops",
    "grouped_mm",
    "grouped_mm_backend",
    "moe_combine_eager",
]

IMPLS = ("grouped", "loop")
BACKENDS = ("torch._grouped_mm", "triton", "padded-bmm")

# Rows per tile of the padded-bmm fallback (a multiple of 16 keeps bmm on aligned shapes).
_PAD_BLOCK_M = 32


def moe_flops(n_tokens: int, dim: int, hidden: int, top_k: int, n_experts: int) -> int:
    """Forward FLOPs of one MoE layer: expert matmuls 2*N*k*D*2H + 2*N*k*H*D, plus the router 2*N*D*E.

    Counts multiply-adds as 2 FLOPs; the SwiGLU, softmax, top-k and the permutation are not counted
    (they move bytes, not FLOPs). A forward plus backward is 3x this (each matmul has two gradient
    matmuls of the same size).
    """
    for name, v in (("n_tokens", n_tokens), ("dim", dim), ("hidden", hidden), ("top_k", top_k),
                    ("n_experts", n_experts)):
        if not (isinstance(v, int) and v >= 0):
            raise ValueError(f"moe_flops: {name} must be a non-negative int, got {v!r}")
    assignments = n_tokens * top_k
    return 2 * assignments * dim * 2 * hidden + 2 * assignments * hidden * dim + 2 * n_tokens * dim * n_experts


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
        raise ValueError(f"{fn}: offs must be a 1-D int32 tensor of G = {b.shape[0]} group ends, "
                         f"got dtype {offs.dtype}, shape {tuple(offs.shape)}")
    if not (a.device == b.device == offs.device):
        raise ValueError(f"{fn}: a, b and offs must be on one device, got {a.device}, {b.device}, {offs.device}")


# dtype -> whether this torch build has a CPU torch._grouped_mm (with autograd) for it; probed once.
_cpu_grouped_mm_probe: dict[torch.dtype, bool] = {}


@torch.compiler.assume_constant_result  # torch.compile calls the probe instead of tracing it
def _native_cpu_supported(dtype: torch.dtype) -> bool:
    """Whether this torch build has a CPU kernel (and autograd) for torch._grouped_mm in ``dtype``."""
    if dtype not in _cpu_grouped_mm_probe:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                # The first call may come from inside no_grad / inference_mode; the probe needs autograd.
                with torch.inference_mode(False), torch.enable_grad():
                    a = torch.zeros(4, 8, dtype=dtype, requires_grad=True)
                    b = torch.zeros(2, 8, 8, dtype=dtype, requires_grad=True)
                    c = torch._grouped_mm(a, b, offs=torch.tensor([2, 4], dtype=torch.int32))
                    c.backward(torch.ones_like(c))
            except (RuntimeError, NotImplementedError, TypeError):
                ok = False
        _cpu_grouped_mm_probe[dtype] = ok
    return _cpu_grouped_mm_probe[dtype]


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
    """None if the Triton kernels can run on ``a`` (see mahia.kernels.status()), else the reason."""
    reason = why_not(a)
    if reason is None and a.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        reason = f"the Triton kernel takes float32, float16 or bfloat16, got {a.dtype}"
    return reason


def _choose_backend(a: torch.Tensor, gemms: list[tuple[int, int]]) -> str:
    """One backend for every (K, N) GEMM of ``gemms`` with left operands like ``a``: native if it
    suits all of them, else Triton, else the padded bmm."""
    if all(_why_not_native(a.device, a.dtype, k, n) is None for k, n in gemms):
        return "torch._grouped_mm"
    if _why_not_triton(a) is None:
        return "triton"
    if a.is_cuda:
        warnings.warn("grouped_mm: neither torch._grouped_mm nor Triton can run here; using the padded-bmm "
                      "fallback (sync-free and exact, but it copies one expert weight per tile: slow)",
                      RuntimeWarning, stacklevel=3)
    return "padded-bmm"


def grouped_mm_backend(a: torch.Tensor, b: torch.Tensor) -> str:
    """The backend ``grouped_mm(a, b, offs)`` runs with ``backend="auto"``: one of ``BACKENDS``.

    Asked in eager, it answers for eager; inside torch.compile torch._grouped_mm is used for bfloat16
    only (its meta kernel rejects other dtypes), so there the answer can differ.
    """
    return _choose_backend(a, [(b.shape[1], b.shape[2])])


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
    counts = torch.diff(ends, prepend=ends.new_zeros(1))          # (G,)
    tiles = (counts + block_m - 1) // block_m                      # (G,) tiles per group
    tile_end = tiles.cumsum(0)                                     # (G,) one past each group's last tile
    t = torch.arange((n_rows + block_m - 1) // block_m + G, device=offs.device)
    group = torch.searchsorted(tile_end, t, right=True)           # (T,) group of tile t; G for spares
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
    src = row0.long()[:, None] + torch.arange(bm, device=a.device)           # (T, bm) source row of each slot
    valid = valid_tile[:, None] & (src < offs.long().gather(0, g)[:, None])   # slot holds a real row
    src = torch.where(valid, src, M).reshape(-1)                              # padding slots -> dump row M
    a_ext = torch.cat([a, a.new_zeros(1, K)])                                 # (M+1, K), row M is zeros
    a_tiles = a_ext.index_select(0, src).view(T, bm, K)                       # (T, bm, K)
    c_tiles = torch.bmm(a_tiles, b.index_select(0, g))                        # (T, bm, N)
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

if triton_import_error() is None:
    import triton
    import triton.language as tl

    @triton.jit
    def _grouped_mm_kernel(
        A, B, C, offs_ptr, tile_group_ptr, tile_row_ptr,
        N, K,
        stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
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
        mask_m = rm < row_end
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
        A, DC, DB, offs_ptr,
        K, N,
        stride_am, stride_ak, stride_cm, stride_cn, stride_bg, stride_bk, stride_bn,
        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
    ):
        """One (BLOCK_K, BLOCK_N) tile of dB[g] = A[rows of g]^T @ dC[rows of g], looping over g's rows."""
        g = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_n = tl.program_id(2)
        start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
        end = tl.load(offs_ptr + g)
        rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_k = rk < K
        mask_n = rn < N
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
        for m0 in range(start, end, BLOCK_M):  # an empty group leaves acc = 0
            rows = m0 + tl.arange(0, BLOCK_M)
            mask_m = rows < end
            rows = rows.to(tl.int64)
            a_t = tl.load(A + rows[None, :] * stride_am + rk[:, None] * stride_ak,
                          mask=mask_k[:, None] & mask_m[None, :], other=0.0)      # (BLOCK_K, BLOCK_M)
            dc = tl.load(DC + rows[:, None] * stride_cm + rn[None, :] * stride_cn,
                         mask=mask_m[:, None] & mask_n[None, :], other=0.0)       # (BLOCK_M, BLOCK_N)
            if IEEE:
                acc = tl.dot(a_t.to(tl.float32), dc.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a_t, dc, acc)
        db_ptrs = DB + g.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        tl.store(db_ptrs, acc.to(DB.dtype.element_ty), mask=mask_k[:, None] & mask_n[None, :])

    def _triton_blocks(t: torch.Tensor, kernel: str) -> dict:
        """Tile sizes for ``kernel`` ("mm" or "wgrad"): small under the CPU interpreter (test speed),
        GEMM-sized on a GPU. Rules of thumb, not autotuned (the tile table depends on BLOCK_M)."""
        if not t.is_cuda:
            return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=1)
        wide = t.dtype != torch.float32  # 16-bit operands: twice the tile for the same shared memory
        if kernel == "mm":    # output tile BLOCK_M x BLOCK_N, reduction over BLOCK_K
            return dict(BLOCK_M=128 if wide else 64, BLOCK_N=128 if wide else 64, BLOCK_K=64 if wide else 32,
                        num_warps=8 if wide else 4, num_stages=3)
        # wgrad: output tile BLOCK_K x BLOCK_N, reduction over the group's rows in steps of BLOCK_M
        return dict(BLOCK_M=64 if wide else 32, BLOCK_N=128 if wide else 64, BLOCK_K=64,
                    num_warps=8 if wide else 4, num_stages=3)

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
        _grouped_mm_kernel[grid](
            a, b, c, offs, group, row0, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1),
            IEEE=_ieee_dot(a), **cfg,
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
        _grouped_mm_wgrad_kernel[grid](
            a, dc, db, offs, K, N,
            a.stride(0), a.stride(1), dc.stride(0), dc.stride(1), db.stride(0), db.stride(1), db.stride(2),
            IEEE=_ieee_dot(a), **cfg,
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
        db = _grouped_mm_wgrad_op(a, dc, offs) if ctx.needs_input_grad[1] else None            # A^T dC
        return da, db, None

    _grouped_mm_op.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


def _grouped_mm_triton(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _grouped_mm_op(a, b, offs)


# ---------------------------------------------------------------------------------------------------
# Combine: back to token order, gated sum over the k experts
# ---------------------------------------------------------------------------------------------------

def moe_combine_eager(out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor,
                      dtype: torch.dtype | None = None) -> torch.Tensor:
    """y[n] = sum_j gates[n, j] * out[inverse[n*k + j]] in plain PyTorch: three kernels (gather, gate
    multiply, k-sum) and two (N, k, D) intermediates. ``mahia.kernels.moe_combine`` fuses them.

    out (N*k, D) in expert order, inverse (N*k,) int64, gates (N, k); y (N, D) in ``dtype`` (None:
    out.dtype). Like the loop: gate in the experts' dtype, accumulate the k terms in ``dtype``.
    """
    check_moe_combine_inputs("moe_combine", out, inverse, gates, dtype)
    N, k = gates.shape
    dtype = out.dtype if dtype is None else dtype
    out = out.index_select(0, inverse).view(N, k, out.shape[1])              # (N, k, D) back in token order
    return (out * gates.to(out.dtype).unsqueeze(-1)).to(dtype).sum(dim=1)  # (N, D)


# ---------------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------------

class RouterStats(NamedTuple):
    """What the load-balancing loss needs from a (weighted) set of tokens; sets pool by adding.

    counts (E,): sum over the tokens of w_n * [expert e in the token's top-k] (no gradient);
    prob_sum (E,): sum over the tokens of w_n * p_ne (carries the router's gradient);
    n_tokens (): sum of the weights w_n. Float32 (float64 for float64 inputs).
    """

    counts: torch.Tensor
    prob_sum: torch.Tensor
    n_tokens: torch.Tensor

    @staticmethod
    def pool(stats: Sequence["RouterStats"]) -> "RouterStats":
        """The statistics of the union of disjoint token sets: the element-wise sum."""
        stats = list(stats)
        if not stats:
            raise ValueError("RouterStats.pool: needs at least one RouterStats")
        return RouterStats(*(sum(parts[1:], parts[0]) for parts in zip(*stats)))


class MoE(nn.Module):
    """Top-k routed mixture of SwiGLU experts (see the module docstring for the math).

    ``forward(x) -> (y, aux_loss)`` for x of shape (..., dim); y has x's shape and dtype, aux_loss is
    a scalar in float32 (float64 for float64 x), already multiplied by ``aux_loss_coef``.
    ``forward(x, token_weight=w)`` computes aux_loss over tokens weighted by w (shape x.shape[:-1]);
    ``return_stats=True`` returns ``(y, aux_loss, RouterStats)`` (pool the stats of several calls and
    turn them into the loss with ``aux_loss_from``). ``impl`` picks the loop or grouped path;
    ``backend`` picks the grouped matmul of the grouped path ("auto" or one of ``BACKENDS``);
    ``backend_for(x)`` says which one runs.

    Parameters: ``w_router`` (dim, n_experts), ``w13`` (n_experts, dim, 2*hidden) = [W1 | W3],
    ``w2`` (n_experts, hidden, dim).
    """

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int = 2, *, impl: str = "grouped",
                 aux_loss_coef: float = 0.01, backend: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        for name, v in (("dim", dim), ("hidden", hidden), ("n_experts", n_experts), ("top_k", top_k)):
            if not (isinstance(v, int) and not isinstance(v, bool)):
                raise TypeError(f"MoE: {name} must be an int, got {type(v).__name__}")
        for name, v in (("dim", dim), ("hidden", hidden), ("n_experts", n_experts)):
            if v < 1:
                raise ValueError(f"MoE: {name} must be >= 1, got {v}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"MoE: top_k must be between 1 and n_experts = {n_experts}, got {top_k}")
        if impl not in IMPLS:
            raise ValueError(f"MoE: impl must be one of {IMPLS}, got {impl!r}")
        if backend != "auto" and backend not in BACKENDS:
            raise ValueError(f"MoE: backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
        if not (isinstance(aux_loss_coef, (int, float)) and aux_loss_coef >= 0):
            raise ValueError(f"MoE: aux_loss_coef must be a number >= 0, got {aux_loss_coef!r}")
        self.dim, self.hidden, self.n_experts, self.top_k = dim, hidden, n_experts, top_k
        self.impl, self.backend, self.aux_loss_coef = impl, backend, float(aux_loss_coef)
        kw = dict(device=device, dtype=dtype)
        self.w_router = nn.Parameter(torch.empty(dim, n_experts, **kw))
        self.w13 = nn.Parameter(torch.empty(n_experts, dim, 2 * hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, dim, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Unit-variance inputs give unit-variance logits and hidden activations.
        nn.init.normal_(self.w_router, std=self.dim ** -0.5)
        nn.init.normal_(self.w13, std=self.dim ** -0.5)
        nn.init.normal_(self.w2, std=self.hidden ** -0.5)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, hidden={self.hidden}, n_experts={self.n_experts}, top_k={self.top_k}, "
                f"impl={self.impl!r}, backend={self.backend!r}, aux_loss_coef={self.aux_loss_coef}")

    # -- shared pieces ---------------------------------------------------------------------------
    def _flatten_input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MoE: x must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"MoE: x must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"MoE: x must have shape (..., dim={self.dim}), got {tuple(x.shape)}")
        if x.dtype != self.w13.dtype:
            raise TypeError(f"MoE: x has dtype {x.dtype} but the parameters are {self.w13.dtype}; "
                            "convert one of them (e.g. moe.to(x.dtype))")
        if x.device != self.w13.device:
            raise ValueError(f"MoE: x is on {x.device} but the parameters are on {self.w13.device}")
        if x.numel() == 0:
            raise ValueError(f"MoE: x has no tokens, shape {tuple(x.shape)}")
        return x.reshape(-1, self.dim)  # (N, D)

    def _route(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probs (N, E), experts (N, k) int64, gates (N, k)); probs and gates in float32 or float64."""
        # The decision must not hinge on the rounding of a logit: under autocast the router matmul would run
        # in bf16, so it runs outside it, in x's dtype (float32 in mixed precision; Switch Transformer's
        # "selective precision"). It is small: N x D x E.
        with torch.autocast(x2.device.type, enabled=False):
            logits = x2 @ self.w_router                                       # (N, E) in x.dtype
        probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        top_p, experts = probs.topk(self.top_k, dim=-1)                       # (N, k)
        if self.top_k == 1:
            # v / v = 1 with a zero gradient; computing it would only add rounding noise to the router's
            # gradient (which then comes from the aux loss alone).
            gates = torch.ones_like(top_p)
        else:
            gates = top_p / top_p.sum(dim=-1, keepdim=True)
        return probs, experts, gates

    def _stats(self, probs: torch.Tensor, experts: torch.Tensor,
               weight: torch.Tensor | None) -> RouterStats:
        """RouterStats of the N routed tokens; weight (N,) or None (every token counts once)."""
        N = probs.shape[0]
        w = probs.new_ones(N) if weight is None else weight.to(probs.dtype)            # (N,)
        counts = probs.new_zeros(self.n_experts).scatter_add_(                          # sync-free bincount
            0, experts.reshape(-1), w.detach().repeat_interleave(self.top_k))           # (E,)
        prob_sum = (probs if weight is None else probs * w[:, None]).sum(dim=0)        # (E,)
        return RouterStats(counts, prob_sum, w.sum())

    def aux_loss_from(self, stats: RouterStats) -> torch.Tensor:
        """coef * E * sum_e f_e P_e with f_e = counts_e / (k n), P_e = prob_sum_e / n; 0 when n = 0."""
        if not isinstance(stats, RouterStats):
            raise TypeError(f"MoE.aux_loss_from: stats must be a RouterStats, got {type(stats).__name__}")
        n = stats.n_tokens.clamp(min=1e-12)  # n = 0 means no token: counts and prob_sum are 0 too
        return self.aux_loss_coef * self.n_experts * (stats.counts * stats.prob_sum).sum() / (self.top_k * n * n)

    def _check_weight(self, token_weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
        if token_weight is None:
            return None
        if not isinstance(token_weight, torch.Tensor):
            raise TypeError(f"MoE: token_weight must be None or a tensor, got {type(token_weight).__name__}")
        if tuple(token_weight.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"MoE: token_weight must have x's leading shape {tuple(x.shape[:-1])}, "
                             f"got {tuple(token_weight.shape)}")
        if token_weight.device != x.device:
            raise ValueError(f"MoE: token_weight is on {token_weight.device} but x is on {x.device}")
        return token_weight.reshape(-1)  # (N,)

    def backend_for(self, x: torch.Tensor) -> str:
        """What runs the experts for input ``x``: "loop", or the grouped matmul backend of the grouped path."""
        if self.impl == "loop":
            return "loop"
        if self.backend != "auto":
            return self.backend
        return _choose_backend(x, [(self.dim, 2 * self.hidden), (self.hidden, self.dim)])

    # -- forward ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, *, token_weight: torch.Tensor | None = None,
                return_stats: bool = False):
        """``(y, aux_loss)``, or ``(y, aux_loss, RouterStats)`` with ``return_stats`` (class docstring)."""
        x2 = self._flatten_input(x)
        weight = self._check_weight(token_weight, x)
        if self.impl == "loop":
            y, probs, experts = self._forward_loop(x2)
        else:
            y, probs, experts = self._forward_grouped(x2)
        stats = self._stats(probs, experts, weight)
        aux = self.aux_loss_from(stats)
        return (y.view(x.shape), aux, stats) if return_stats else (y.view(x.shape), aux)

    def _forward_loop(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Before: one expert at a time. Each nonzero() is a host sync; two small matmuls per expert.
        Returns (y (N, D), probs, experts) for the aux loss."""
        probs, experts, gates = self._route(x2)
        y = torch.zeros_like(x2)                                       # (N, D), the accumulator: x's dtype
        for e in range(self.n_experts):
            mask = experts == e                                        # (N, k)
            token, slot = mask.nonzero(as_tuple=True)                  # (n_e,) each: the CPU waits here
            if token.numel() == 0:
                continue
            h = x2[token] @ self.w13[e]                                # (n_e, 2H), autocast dtype if any
            a, b = h.chunk(2, dim=-1)
            out = (F.silu(a) * b) @ self.w2[e]                         # (n_e, D)
            gated = out * gates[token, slot].unsqueeze(-1).to(out.dtype)
            y.index_add_(0, token, gated.to(y.dtype))                  # under autocast out is 16-bit
        return y, probs, experts

    def _forward_grouped(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """After: sort assignments by expert once, two grouped matmuls, then one fused combine kernel that
        un-permutes, gates and sums each token's k results. No host sync.
        Returns (y (N, D), probs, experts) for the aux loss."""
        N, D = x2.shape
        E, k = self.n_experts, self.top_k
        backend = self.backend_for(x2)
        probs, experts, gates = self._route(x2)
        flat = experts.reshape(-1)                                     # (N*k,) expert of assignment n*k + j
        order = torch.argsort(flat, stable=True)                       # (N*k,) assignments grouped by expert
        counts = torch.zeros(E, dtype=torch.int32, device=x2.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))         # (E,) sync-free bincount
        offs = counts.cumsum(0, dtype=torch.int32)                     # (E,) end row of each expert's group
        xs = x2.index_select(0, order // k)                            # (N*k, D) tokens in expert order
        w13, w2 = self.w13, self.w2
        dev_type = x2.device.type
        if torch.is_autocast_enabled(dev_type):
            # Autocast does not know grouped_mm: cast as it would for a matmul, like the loop's F.linear.
            amp = torch.get_autocast_dtype(dev_type)
            xs, w13, w2 = xs.to(amp), w13.to(amp), w2.to(amp)
            backend = self.backend_for(xs)
        h = grouped_mm(xs, w13, offs, backend=backend)                 # (N*k, 2H)
        a = kernels.swiglu(*h.chunk(2, dim=-1))                        # (N*k, H)
        out = grouped_mm(a, w2, offs, backend=backend)                 # (N*k, D)
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(N * k, device=x2.device))  # (N*k,)
        # y[n] = sum_j g[n, j] * out[inverse[n*k + j]]: gather, gate and k-sum in one pass (float32 math),
        # y in x's dtype like the loop. Eager version: moe_combine_eager.
        y = kernels.moe_combine(out, inverse, gates, x2.dtype)         # (N, D)
        return y, probs, experts

    # -- statistics (outside forward) ------------------------------------------------------------
    @torch.no_grad()
    def routing_stats(self, x: torch.Tensor) -> dict:
        """How the router spreads the tokens of ``x`` over the experts (for plots; syncs, by design).

        Returns tokens_per_expert (E,) int64 on the CPU, cv (std / mean of those counts: 0 is perfect
        balance), max_over_mean (load of the busiest expert relative to the mean), empty_experts,
        n_assignments (N*k) and aux_loss (the loss forward returns for this x).
        """
        x2 = self._flatten_input(x)
        probs, experts, _ = self._route(x2)
        aux = self.aux_loss_from(self._stats(probs, experts, None))
        counts = torch.bincount(experts.reshape(-1), minlength=self.n_experts).cpu()
        c = counts.double()
        mean = c.mean()
        return {
            "tokens_per_expert": counts,
            "cv": float(c.std(correction=0) / mean),
            "max_over_mean": float(c.max() / mean),
            "empty_experts": int((counts == 0).sum()),
            "n_assignments": int(counts.sum()),
            "aux_loss": float(aux),
        }
