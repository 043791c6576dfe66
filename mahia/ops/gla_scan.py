"""Gated linear attention (GLA) as a chunked scan in Triton, forward and backward.

Math, per batch b and head h (K key channels, V value channels, state S_t in R^{K x V}, S_0 = 0):

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,        o_t = S_t^T q_t,        g_t <= 0 (log-decays)

The reference paths (a Python loop, a PyTorch log-space form) are in :mod:`mahia.model.meta_attention`.

Chunked form (chunk of BT = 16 rows; b_i = g_1 + ... + g_i summed from the chunk start, so b <= 0 and
b_last = b_BT is the decay of the whole chunk; S is the state entering the chunk):

    o_i   = (q_i * exp(b_i)) S                                   inter-chunk: a tl.dot, exp(b_i) <= 1
          + sum_{j<=i} A_ij v_j,                                 intra-chunk: a masked tl.dot
      A_ij = sum_c q_ic k_jc exp(b_ic - b_jc)                    pairwise decays, exp(...) <= 1
    S'    = exp(b_last) * S + sum_j (k_j * exp(b_last - b_j)) v_j^T

Every exponent is <= 0, so nothing can overflow at any sequence length. The tempting factorization
A = (q * exp(b)) (k * exp(-b))^T would let tl.dot do the intra-chunk part too, but exp(-b_j) grows like
exp(BT * |g|) and overflows (float16: above exp(11)) for strong decays; the pairwise decays cost a
(BT, BT, K) block of registers instead, which is why BT is 16 and K is at most 128.

Backward (do = dL/do): dA_ij = do_i . v_j, and the adjoint state H_next = sum over the rows s after the
chunk of exp(G_s - G_end) q_s do_s^T, carried backwards over the chunks like S is carried forwards:

    dq_i = exp(b_i) * (S do_i)              + sum_{j<=i} dA_ij k_j * exp(b_i - b_j)
    dk_j = exp(b_last - b_j) * (H_next v_j) + sum_{i>=j} dA_ij q_i * exp(b_i - b_j)
    dv_j = (k_j * exp(b_last - b_j)) H_next + sum_{i>=j} A_ij do_i
    H    = exp(b_last) * H_next + sum_i (q_i * exp(b_i)) do_i^T

and for the gate the standard GLA identity: G = cumsum(g) enters only through exp(G_t - G_s), so
dL/dG_t = q_t * dq_t - k_t * dk_t (t as the later index, minus t as the earlier one) and dg is its
reverse cumulative sum, dg_t = sum_{s>=t} (q_s * dq_s - k_s * dk_s). Summed over a long sequence that
cancels badly (|dg| is ~300x smaller than sum |dG| at T=2048: a float32 kernel doing it lost a decimal
digit, a bfloat16 one failed its tolerance). The kernel sums dG only inside the chunk and adds the tail
directly: sum_{s > chunk end} dG_s is the derivative for the pairs straddling the chunk end, which is

    dg_after = sum_v S_end * H_end            (per key channel; S_end, H_end: state and adjoint there)

Likewise the pairs j = i (decay exp(0) = 1) would add the same q_i k_i (do_i . v_i) to q * dq and to
k * dk; they go into dq and dk apart, never into dG.

Programs: one per (value block of BV columns, b * h). The forward walks the chunks in order with its
(K, BV) float32 state in registers. The backward walks them backwards (dk, dv; H saved at every chunk
end: a (T/16, K, BV) float32 scratch), then forwards (dq, S, dg). dq, dk and dg sum over all V columns,
so with several value blocks each program writes float32 partials and a ``sum(0)`` finishes them.
Inputs are float32, bfloat16 or float16 with float32 accumulation; bfloat16/float16 dots run on
tensor cores with the operands rounded to the input dtype; float32 dots run in full ("ieee") precision.
Layout: (B, H, T, K) / (B, H, T, V), made contiguous (a copy) if they are not. Any T; K <= 128; any V.
g <= 0 is assumed, not checked (a check would read the data: a host sync).

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

Behaviour at the edges (the public ``gated_linear_attention``): T = 0 returns an empty (B, H, 0, V)
output that keeps q, k, v and g in the autograd graph (zero gradients); a key dim K > 128 with
``impl="triton"`` runs the log-space path with the one-time fallback warning; float64 in any input
(e.g. a float64 g next to float32 q, k, v) takes the log-space path silently; ``meta`` tensors get
their shapes from the PyTorch paths, never the interpreter. Inputs are validated once, by the public
function, whose name the errors carry.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from mahia.measure.checks import check_float_tensor, check_int, check_same_device
from mahia.ops._launch import Launcher
from mahia.ops._triton import tl, triton
from mahia.ops.dispatch import use_triton

__all__ = [
    "IMPLS",
    "gated_linear_attention",
    "gla_loop",
    "gla_logspace",
    "naive_cumprod_form",
    "check_gla_inputs",
    "gla_flops",
    "gla_bytes",
    "gla_fwd",
    "gla_bwd",
    "gla_fwd_launch",
    "gla_bwd_launch",
    "gated_linear_attention_triton",
    "check_gla_kernel_inputs",
    "CHUNK",
    "MAX_K",
    "DTYPES",
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CHUNK = 16  # rows per chunk: tl.dot's minimum, and the (CHUNK, CHUNK, K) pairwise block fits registers
MAX_K = 128
IMPLS = ("loop", "logspace", "triton")
LOGSPACE_CHUNK = 16


# --------------------------------------------------------------------------------------------------
# Input checks and the two PyTorch paths: the recurrence (the float64 reference) and the chunked log-space form
# --------------------------------------------------------------------------------------------------


def check_gla_inputs(
    fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, do: torch.Tensor | None = None
) -> None:
    """q, k, g (B, H, T, K) and v, do (B, H, T, V); floating point; q, k, v of one dtype; one device."""
    named = {"q": q, "k": k, "v": v, "g": g}
    if do is not None:
        named["do"] = do
    for name, t in named.items():
        check_float_tensor(fn, name, t)
        if t.dim() != 4:
            last = "V" if name in ("v", "do") else "K"
            raise ValueError(f"{fn}: {name} must be 4-D (B, H, T, {last}), got shape {tuple(t.shape)}")
    for name in ("k", "g"):
        if named[name].shape != q.shape:
            raise ValueError(f"{fn}: {name} must have the shape of q {tuple(q.shape)}, got {tuple(named[name].shape)}")
    if v.shape[:3] != q.shape[:3]:
        B, H, T, _ = q.shape
        raise ValueError(
            f"{fn}: v must be (B, H, T, V) = ({B}, {H}, {T}, V) to match q {tuple(q.shape)}, got {tuple(v.shape)}"
        )
    if do is not None and do.shape != v.shape:
        raise ValueError(f"{fn}: do must have the shape of v {tuple(v.shape)}, got {tuple(do.shape)}")
    for name in ("k", "v"):
        if named[name].dtype != q.dtype:
            raise TypeError(f"{fn}: {name} must have the dtype of q ({q.dtype}), got {named[name].dtype}")
    check_same_device(fn, **named)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float32 math for half types; float64 stays float64 so the loop doubles as the reference.
    return torch.promote_types(dtype, torch.float32)


def _empty_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The (B, H, 0, V) output of T = 0, attached to the autograd graph through every input (zero
    gradients), so that autograd.grad over q, k, v, g reports no unused input."""
    return v * 0 + (q.sum() + k.sum() + g.sum()).to(v.dtype) * 0


# --------------------------------------------------------------------------------------------------
# Path 1: the recurrence, one step at a time
# --------------------------------------------------------------------------------------------------


def gla_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T;  o_t = S_t^T q_t.  Returns (B, H, T, V) in v's dtype."""
    check_gla_inputs("gla_loop", q, k, v, g)
    return _gla_loop(q, k, v, g)


def _outside_autocast(fn):
    """Run a PyTorch path with autocast off on its device: these paths compute in float32 (float64 for
    float64), and under autocast their matmuls would run in the autocast dtype instead. (The Triton path is
    a custom op, which autocast does not enter.)"""

    @functools.wraps(fn)
    def wrapper(q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if q.device.type not in ("cuda", "cpu"):  # meta tensors: no autocast to turn off
            return fn(q, *args, **kwargs)
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)

    return wrapper


@_outside_autocast
def _gla_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    B, H, T, K = q.shape
    V = v.shape[-1]
    out_dtype, dt = v.dtype, _compute_dtype(q.dtype)
    if T == 0:
        return _empty_output(q, k, v, g)
    S = q.new_zeros(B, H, K, V, dtype=dt)
    outs = []
    # unbind: T views at once (indexing q[:, :, t] in the loop would give every step's backward a
    # zero-filled full-size gradient to add up: O(T^2) memory traffic)
    for q_t, k_t, v_t, g_t in zip(*(t.to(dt).unbind(dim=2) for t in (q, k, v, g))):  # (B, H, K) / (B, H, V)
        S = g_t.exp().unsqueeze(-1) * S + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)  # (B, H, K, V)
        outs.append((q_t.unsqueeze(-2) @ S).squeeze(-2))  # o_t = S_t^T q_t: (B, H, V)
    return torch.stack(outs, dim=2).to(out_dtype)


# --------------------------------------------------------------------------------------------------
# Path 2: vectorized in log space
# --------------------------------------------------------------------------------------------------


@_outside_autocast
def naive_cumprod_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The tempting vectorization, kept to show why it fails: exp(G_t - G_s) = exp(G_t) * exp(-G_s).

        o = tril((q * exp(G)) (k * exp(-G))^T) v,      G = cumsum(g) over the whole sequence

    Exact in exact arithmetic, but exp(-G_s) grows like exp(s |g|): past |G| ~ 88 it is inf in
    float32 while exp(G_t) underflows to 0, and 0 * inf = NaN. Fine for short sequences only.
    """
    check_gla_inputs("naive_cumprod_form", q, k, v, g)
    T = q.shape[2]
    out_dtype, dt = v.dtype, _compute_dtype(q.dtype)
    q, k, v, g = (t.to(dt) for t in (q, k, v, g))
    G = g.cumsum(dim=2)  # (B, H, T, K)
    scores = (q * G.exp()) @ (k * (-G).exp()).transpose(-1, -2)  # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return (scores.masked_fill(~causal, 0.0) @ v).to(out_dtype)


def gla_logspace(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *, chunk_size: int = LOGSPACE_CHUNK
) -> torch.Tensor:
    """Chunked log-space form (module docstring): pairwise decays inside a chunk, the state between.

    Every exponent is a difference b_i - b_j with j <= i (or b_last - b_j, or b_i), so <= 0: no
    overflow at any length. Memory: a (B, H, T, C, K) tensor of pairwise decays.
    """
    check_gla_inputs("gla_logspace", q, k, v, g)
    check_int("gla_logspace", "chunk_size", chunk_size)
    return _gla_logspace(q, k, v, g, chunk_size)


@_outside_autocast
def _gla_logspace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int) -> torch.Tensor:
    B, H, T, K = q.shape
    V = v.shape[-1]
    out_dtype, dt = v.dtype, _compute_dtype(q.dtype)
    if T == 0:
        return _empty_output(q, k, v, g)
    C = chunk_size
    N = -(-T // C)  # chunks
    pad = N * C - T

    def chunks(t: torch.Tensor) -> torch.Tensor:  # (B, H, T, D) -> (B, H, N, C, D), zero-padded
        t = F.pad(t.to(dt), (0, 0, 0, pad))  # g = 0 and k = v = 0 on padding rows: no effect
        return t.view(B, H, N, C, t.shape[-1])

    q, k, v, g = (chunks(t) for t in (q, k, v, g))
    b = g.cumsum(dim=3)  # (B, H, N, C, K): log-decay from the chunk start through row i, <= 0
    b_last = b[:, :, :, -1:, :]  # (B, H, N, 1, K)

    # Intra-chunk: A_ij = sum_c q_ic k_jc exp(b_ic - b_jc) for j <= i (masked to exp(-inf) = 0 above).
    # The terms above the diagonal are selected away (where), not multiplied by 0: a NaN or Inf in k_j
    # or v_j must not reach the rows i < j, in the forward or (through autograd) the backward.
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril().unsqueeze(-1)  # (C, C, 1)
    diff = b.unsqueeze(4) - b.unsqueeze(3)  # (B, H, N, C_i, C_j, K) = b_i - b_j
    decay = diff.masked_fill(~causal, float("-inf")).exp()
    k_dec = torch.where(causal, k.unsqueeze(3) * decay, 0.0)  # k_j decayed to row i, for j <= i
    A = torch.where(causal[..., 0], (q.unsqueeze(4) * k_dec).sum(-1), 0.0)  # (B, H, N, C, C)
    # A v, where v's non-finite entries must reach only the rows at and after them (0 * NaN in the
    # matmul would reach every row of the chunk): rows before a column's first non-finite entry take
    # the product with those entries zeroed, the others the plain product (its NaN, and its gradient).
    finite = torch.isfinite(v)
    after_bad = (~finite).cumsum(dim=3) > 0  # (B, H, N, C, V)
    o = torch.where(after_bad, A @ v, A @ torch.where(finite, v, 0.0))

    # Inter-chunk: carry S (B, H, K, V) across the N chunks; all factors in [0, 1].
    q_in = q * b.exp()  # decay from the chunk start to row i
    k_out = k * (b_last - b).exp()  # decay from row j to the chunk end
    chunk_decay = b_last.exp().transpose(-1, -2)  # (B, H, N, K, 1)
    S = q.new_zeros(B, H, K, V)
    inter = []
    for n in range(N):
        inter.append(q_in[:, :, n] @ S)  # (B, H, C, V)
        S = chunk_decay[:, :, n] * S + k_out[:, :, n].transpose(-1, -2) @ v[:, :, n]
    o = o + torch.stack(inter, dim=2)
    return o.reshape(B, H, N * C, V)[:, :, :T].to(out_dtype)


def gla_flops(B: int, H: int, T: int, K: int, V: int, chunk: int = 16, *, backward: bool = True) -> int:
    """FLOPs the chunked algorithm executes: forward, plus the backward when ``backward``.

    Per chunk of C rows (padding included) and per (b, h), the matrix products and the pairwise score
    sums (a multiply-add counts 2); elementwise work (exp, decay scaling) is not counted:

        forward:  3 C^2 K (scores q_i k_j exp(.))  + 2 C^2 V (A v)  + 4 C K V (q S, state update)
        backward: 9 C^2 K (dq, dk, recomputed scores) + 6 C^2 V (dA twice, A^T do)
                  + 10 C K V (dq, dk, dv inter-chunk; state and adjoint-state updates)
    """
    for name, n in (("B", B), ("H", H), ("T", T), ("K", K), ("V", V), ("chunk", chunk)):
        if not (isinstance(n, int) and n >= (1 if name == "chunk" else 0)):
            raise ValueError(f"gla_flops: {name} must be a non-negative int (chunk >= 1), got {n!r}")
    C = chunk
    per_chunk = 3 * C * C * K + 2 * C * C * V + 4 * C * K * V
    if backward:
        per_chunk += 9 * C * C * K + 6 * C * C * V + 10 * C * K * V
    return B * H * (-(-T // C)) * per_chunk


def gla_bytes(B: int, H: int, T: int, K: int, V: int, *, element_size: int = 4, backward: bool = True) -> int:
    """Compulsory device-memory traffic: every input read once and every output written once.

    forward: read q, k, g (T K each) and v (T V), write o (T V); backward: read q, k, g, v, do and
    write dq, dk, dg, dv. Per (b, h): (3K + 2V) T forward, (6K + 3V) T more for the backward.
    """
    for name, n in (("B", B), ("H", H), ("T", T), ("K", K), ("V", V), ("element_size", element_size)):
        if not (isinstance(n, int) and n >= 0):
            raise ValueError(f"gla_bytes: {name} must be a non-negative int, got {n!r}")
    per_row = 3 * K + 2 * V + ((6 * K + 3 * V) if backward else 0)
    return B * H * T * per_row * element_size


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------


@triton.jit
def _pairwise_decay(b, pairs):
    """exp(b_i - b_j) where pairs[i, j] (j <= i only), else 0: a (BT, BT, BK) block of values in [0, 1]."""
    diff = b[:, None, :] - b[None, :, :]
    return tl.exp(tl.where(pairs[:, :, None], diff, float("-inf")))


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with float32 accumulation. UPCAST: Triton's CPU interpreter multiplies bfloat16 operands as
    their raw 16-bit patterns, so there the (already rounded) operands go in as float32: same products."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _chunk_offsets(c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT: tl.constexpr):
    """Offsets and masks of chunk c (rows c * BT ... c * BT + BT - 1) in a (T, K) and a (T, V) operand of
    one (batch, head): (qk_off, qk_mask, v_off, v_mask), each (BT, BK) or (BT, BV); padding rows and
    columns are masked."""
    rows = c * BT + offs_t
    t_ok = rows < seq_len
    qk_off = rows[:, None] * k_dim + offs_k[None, :]
    qk_mask = t_ok[:, None] & k_ok[None, :]
    v_off = rows[:, None] * v_dim + offs_v[None, :]
    v_mask = t_ok[:, None] & v_ok[None, :]
    return qk_off, qk_mask, v_off, v_mask


@triton.jit
def _gla_fwd_kernel(
    Q,
    K,
    V,
    G,
    O,
    seq_len,
    k_dim,
    v_dim,
    BT: tl.constexpr,  # rows per chunk
    BK: tl.constexpr,  # next power of two >= k_dim (the whole key dim lives in one program)
    BV: tl.constexpr,  # value columns per program
    PRECISION: tl.constexpr,  # tl.dot input precision for float32 operands
    UPCAST: tl.constexpr,  # see _dot
):
    # One flat grid axis (a second axis holds at most 65535 programs, and B*H can pass that); the value
    # blocks of one (batch, head) stay neighbours, so they run together and share its q, k, g in L2.
    n_vblocks = tl.cdiv(v_dim, BV)
    pid_v = tl.program_id(0) % n_vblocks
    pid_bh = (tl.program_id(0) // n_vblocks).to(tl.int64)  # pid_bh * seq_len * k_dim can pass 2**31
    Q += pid_bh * seq_len * k_dim
    K += pid_bh * seq_len * k_dim
    G += pid_bh * seq_len * k_dim
    V += pid_bh * seq_len * v_dim
    O += pid_bh * seq_len * v_dim

    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    k_ok = offs_k < k_dim
    v_ok = offs_v < v_dim
    causal = offs_t[:, None] >= offs_t[None, :]  # (BT, BT): row i sees rows j <= i

    state = tl.zeros((BK, BV), dtype=tl.float32)  # S entering the chunk
    for c in range(0, tl.cdiv(seq_len, BT)):
        qk_off, qk_mask, v_off, v_mask = _chunk_offsets(
            c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT
        )
        # Padding rows and columns load 0: g = 0 keeps b constant, k = v = 0 adds nothing to the state.
        q = tl.load(Q + qk_off, mask=qk_mask, other=0.0).to(tl.float32)  # (BT, BK)
        k = tl.load(K + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
        g = tl.load(G + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
        v = tl.load(V + v_off, mask=v_mask, other=0.0)  # (BT, BV), the dot operand dtype

        b = tl.cumsum(g, axis=0)  # (BT, BK) log-decay from the chunk start through row i
        b_last = tl.sum(g, axis=0)  # (BK,) log-decay of the whole chunk
        decay = _pairwise_decay(b, causal)  # (BT, BT, BK)
        # (BT, BT), zero above the diagonal: selected, not multiplied by 0, so a NaN of k_j stays in rows >= j
        A = tl.sum(tl.where(causal[:, :, None], q[:, None, :] * k[None, :, :] * decay, 0.0), axis=2)

        # A v takes v with its non-finite entries zeroed (0 * NaN in the dot would reach the whole chunk);
        # each value column is NaN from its first non-finite entry on, as in the recurrence.
        finite = tl.abs(v.to(tl.float32)) < float("inf")  # (BT, BV), False for NaN and +-Inf
        first_bad = tl.min(tl.where(finite, BT, offs_t[:, None]), axis=0)  # (BV,): BT if none
        after_bad = offs_t[:, None] >= first_bad[None, :]
        o = _dot(A.to(v.dtype), tl.where(finite, v, 0.0).to(v.dtype), PRECISION, UPCAST)  # (BT, BV)
        q_in = (q * tl.exp(b)).to(v.dtype)
        o += _dot(q_in, state.to(v.dtype), PRECISION, UPCAST)
        o = tl.where(after_bad, float("nan"), o)
        tl.store(O + v_off, o.to(O.dtype.element_ty), mask=v_mask)

        k_out = (k * tl.exp(b_last[None, :] - b)).to(v.dtype)  # decay from row j to the chunk end
        state = state * tl.exp(b_last)[:, None] + _dot(tl.trans(k_out), v, PRECISION, UPCAST)


@triton.jit
def _gla_bwd_chunk(
    Q, K, G, V, DO, c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, strict, BT: tl.constexpr
):
    """Load chunk c (rows c * BT ... c * BT + BT - 1) and the decays both backward passes need:

        b_i = g_1 + ... + g_i,   b_last = b_BT,   decay_ij = exp(b_i - b_j) for j < i, else 0

    Returns (qk_off, qk_mask, v_off, v_mask, q, k, v, do, b, b_last, decay): q, k, b, b_last, decay in
    float32, v and do in the dot operand dtype; padding rows and columns load 0. dA = do v^T stays in the
    passes: computed here, it moves ahead of pass 1's A and changes the compiled schedule (and spills)."""
    qk_off, qk_mask, v_off, v_mask = _chunk_offsets(c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT)
    q = tl.load(Q + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
    k = tl.load(K + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
    g = tl.load(G + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
    v = tl.load(V + v_off, mask=v_mask, other=0.0)
    do = tl.load(DO + v_off, mask=v_mask, other=0.0)

    b = tl.cumsum(g, axis=0)
    b_last = tl.sum(g, axis=0)
    decay = _pairwise_decay(b, strict)  # (BT, BT, BK), zero on and above the diagonal
    return qk_off, qk_mask, v_off, v_mask, q, k, v, do, b, b_last, decay


@triton.jit
def _gla_bwd_kernel(
    Q,
    K,
    V,
    G,
    DO,
    DQ,
    DK,
    DV,
    DG,  # DQ, DK, DG: float32 partials (n_vblocks, B*H, T, K)
    HS,  # float32 scratch (n_vblocks, B*H, n_chunks, BK, BV): the adjoint state at every chunk end
    seq_len,
    k_dim,
    v_dim,
    n_bh,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    n_vblocks = tl.cdiv(v_dim, BV)  # a flat grid, as in the forward kernel
    pid_v = tl.program_id(0) % n_vblocks
    pid_bh = (tl.program_id(0) // n_vblocks).to(tl.int64)
    n_chunks = tl.cdiv(seq_len, BT)
    Q += pid_bh * seq_len * k_dim
    K += pid_bh * seq_len * k_dim
    G += pid_bh * seq_len * k_dim
    V += pid_bh * seq_len * v_dim
    DO += pid_bh * seq_len * v_dim
    DV += pid_bh * seq_len * v_dim
    part = pid_v * n_bh + pid_bh  # this program's slice of the partials and of the scratch
    DQ += part * seq_len * k_dim
    DK += part * seq_len * k_dim
    DG += part * seq_len * k_dim
    HS += part * n_chunks * BK * BV

    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    k_ok = offs_k < k_dim
    v_ok = offs_v < v_dim
    hs_off = offs_k[:, None] * BV + tl.arange(0, BV)[None, :]  # (BK, BV), padding included
    # Pairs j = i (decay exp(0) = 1) add the same q_i k_i (do_i . v_i) to q * dq and to k * dk; they are
    # added to dq and dk apart (diag_dA) so that dG = q * dq - k * dk never sees them.
    strict = offs_t[:, None] > offs_t[None, :]
    eye = offs_t[:, None] == offs_t[None, :]

    # Pass 1, backward over the chunks: dk and dv need the adjoint state H of the rows after the chunk.
    dstate = tl.zeros((BK, BV), dtype=tl.float32)
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i
        qk_off, qk_mask, v_off, v_mask, q, k, v, do, b, b_last, decay = _gla_bwd_chunk(
            Q, K, G, V, DO, c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, strict, BT
        )
        # recomputed: pairs j < i (selected, not multiplied by 0: see the forward) ...
        A = tl.sum(tl.where(strict[:, :, None], q[:, None, :] * k[None, :, :] * decay, 0.0), axis=2)
        A += tl.where(eye, tl.sum(q * k, axis=1)[:, None], 0.0)  # ... and j = i
        dA = _dot(do, tl.trans(v), PRECISION, UPCAST)  # (BT, BT): do_i . v_j
        diag_dA = tl.sum(tl.where(eye, dA, 0.0), axis=1)  # (BT,): do_i . v_i
        k_w = tl.exp(b_last[None, :] - b)  # (BT, BK) decay from row j to the chunk end
        tl.store(HS + c * BK * BV + hs_off, dstate)  # H at this chunk's end, for dg in pass 2
        dstate_op = dstate.to(v.dtype)

        dk = tl.sum(tl.where(strict[:, :, None], dA[:, :, None] * q[:, None, :] * decay, 0.0), axis=0)  # i > j
        dk += _dot(v, tl.trans(dstate_op), PRECISION, UPCAST) * k_w
        dv = _dot(tl.trans(A.to(v.dtype)), do, PRECISION, UPCAST)  # (BT, BV)
        dv += _dot((k * k_w).to(v.dtype), dstate_op, PRECISION, UPCAST)
        tl.store(DG + qk_off, k * dk, mask=qk_mask)  # the k side of dG, for pass 2
        tl.store(DK + qk_off, dk + diag_dA[:, None] * q, mask=qk_mask)
        tl.store(DV + v_off, dv.to(DV.dtype.element_ty), mask=v_mask)

        q_in = (q * tl.exp(b)).to(v.dtype)
        dstate = dstate * tl.exp(b_last)[:, None] + _dot(tl.trans(q_in), do, PRECISION, UPCAST)

    tl.debug_barrier()  # pass 2 reads what other threads of this program wrote to DG and HS

    # Pass 2, forward over the chunks: dq needs the state S entering each chunk; then dg.
    state = tl.zeros((BK, BV), dtype=tl.float32)
    for c in range(0, n_chunks):
        qk_off, qk_mask, v_off, v_mask, q, k, v, do, b, b_last, decay = _gla_bwd_chunk(
            Q, K, G, V, DO, c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, strict, BT
        )
        dA = _dot(do, tl.trans(v), PRECISION, UPCAST)
        diag_dA = tl.sum(tl.where(eye, dA, 0.0), axis=1)
        dq = tl.sum(tl.where(strict[:, :, None], dA[:, :, None] * k[None, :, :] * decay, 0.0), axis=1)  # j < i
        dq += _dot(do, tl.trans(state.to(v.dtype)), PRECISION, UPCAST) * tl.exp(b)
        tl.store(DQ + qk_off, dq + diag_dA[:, None] * k, mask=qk_mask)

        k_out = (k * tl.exp(b_last[None, :] - b)).to(v.dtype)
        state = state * tl.exp(b_last)[:, None] + _dot(tl.trans(k_out), v, PRECISION, UPCAST)
        # dg_t = sum_{s >= t in the chunk} dG_s + sum_v S_end * H_end: the pairs straddling the chunk
        # end, summed directly instead of as a long, cancelling sum of dG over the rest of the sequence.
        dg_after = tl.sum(state * tl.load(HS + c * BK * BV + hs_off), axis=1)  # (BK,)
        dG = q * dq - tl.load(DG + qk_off, mask=qk_mask, other=0.0)  # (BT, BK), 0 on padding rows
        dg = tl.cumsum(dG, axis=0, reverse=True) + dg_after[None, :]
        tl.store(DG + qk_off, dg, mask=qk_mask)


_launch_fwd = Launcher(_gla_fwd_kernel)
_launch_bwd = Launcher(_gla_bwd_kernel)


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "") == "1"


def check_gla_kernel_inputs(
    fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, do: torch.Tensor | None = None
) -> None:
    """q, k, g (B, H, T, K) and v, do (B, H, T, V); float32/bfloat16/float16; q, k, v one dtype; one device."""
    check_gla_inputs(fn, q, k, v, g, do)
    for name, t in {"q": q, "g": g, "do": do}.items():  # k and v have q's dtype (checked above)
        if t is not None and t.dtype not in DTYPES:
            raise TypeError(f"{fn}: {name} must be float32, bfloat16 or float16 for the Triton kernel, got {t.dtype}")
    Kd = q.shape[-1]
    if Kd > MAX_K:
        raise ValueError(
            f"{fn}: key dim K={Kd} exceeds the kernel's limit of {MAX_K} (each program keeps a "
            f"({CHUNK}, {CHUNK}, K) block of pairwise decays in registers); use more heads or the "
            "log-space PyTorch path"
        )


def _check_runnable(fn: str, q: torch.Tensor) -> None:
    if not (q.is_cuda or _interpreting()):
        raise ValueError(
            f"{fn}: inputs are on {q.device}; the Triton kernel needs a CUDA device "
            "(or TRITON_INTERPRET=1 for the CPU interpreter)"
        )


def _config(q: torch.Tensor, v_dim: int, block_v: int | None) -> tuple[int, int, int, str]:
    """(BK, BV, num_warps, dot precision) for inputs like q (B, H, T, K).

    Picked from the register use ptxas reports for sm_90 (compiled ahead of time, not timed): the
    (16, 16, BK) pairwise blocks and the (BK, BV) state and adjoint fill the 255 registers a thread may
    have. With 16-bit inputs BV = 64 spills nothing (at most a few bytes) up to K = 64; float32 dot
    operands take twice the registers, so float32 uses narrower value blocks (BV = 32 for K <= 32,
    16 above; about 200 bytes of spill at K = 64). K = 128 spills in every configuration.
    """
    k_dim = q.shape[-1]
    bk = max(16, triton.next_power_of_2(k_dim))  # tl.dot needs every dim >= 16
    if block_v is None:
        cap = 64 if q.dtype != torch.float32 else (32 if bk <= 32 else 16)
        block_v = min(cap, max(16, triton.next_power_of_2(v_dim)))
    elif not (isinstance(block_v, int) and block_v >= 16 and block_v & (block_v - 1) == 0):
        raise ValueError(f"gla: block_v must be a power of two >= 16, got {block_v!r}")
    num_warps = 4 if bk == 16 else 8
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # the latter is ignored for 16-bit operands
    return bk, block_v, num_warps, precision


def _upcast_dots(q: torch.Tensor) -> bool:
    return q.dtype == torch.bfloat16 and not q.is_cuda and _interpreting()


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def gla_fwd_launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    block_v: int | None = None,
    check: bool = True,
) -> torch.Tensor:
    """Run the forward kernel: o (B, H, T, V) in v's dtype (``check=False``: the caller validated)."""
    if check:
        fn = "gla_fwd"
        check_gla_kernel_inputs(fn, q, k, v, g)
        _check_runnable(fn, q)
    B, H, T, k_dim = q.shape
    v_dim = v.shape[-1]
    bk, bv, num_warps, precision = _config(q, v_dim, block_v)
    q, k, v, g = map(_contig, (q, k, v, g))
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if o.numel() == 0 or q.numel() == 0:
        return o.zero_()
    _launch_fwd(
        (triton.cdiv(v_dim, bv) * B * H,),
        q,
        k,
        v,
        g,
        o,
        T,
        k_dim,
        v_dim,
        BT=CHUNK,
        BK=bk,
        BV=bv,
        PRECISION=precision,
        UPCAST=_upcast_dots(q),
        num_warps=num_warps,
    )
    return o


def gla_bwd_launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    *,
    block_v: int | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernel: (dq, dk, dv, dg), each in the dtype and shape of its input."""
    if check:
        fn = "gla_bwd"
        check_gla_kernel_inputs(fn, q, k, v, g, do)
        _check_runnable(fn, q)
    B, H, T, k_dim = q.shape
    v_dim = v.shape[-1]
    bk, bv, num_warps, precision = _config(q, v_dim, block_v)
    q, k, v, g = map(_contig, (q, k, v, g))
    do = _contig(do.to(v.dtype))  # autograd hands do in o's dtype (v's); a direct caller might not
    n_vblocks = triton.cdiv(v_dim, bv)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0 or v.numel() == 0:
        return q.new_zeros(q.shape), k.new_zeros(k.shape), dv.zero_(), g.new_zeros(g.shape)
    # float32 partials, one slice per value block: dq, dk and dg sum over all V columns.
    dq, dk, dg = (torch.empty((n_vblocks, B, H, T, k_dim), dtype=torch.float32, device=q.device) for _ in range(3))
    h_ends = torch.empty((n_vblocks, B * H, triton.cdiv(T, CHUNK), bk, bv), dtype=torch.float32, device=q.device)
    _launch_bwd(
        (n_vblocks * B * H,),
        q,
        k,
        v,
        g,
        do,
        dq,
        dk,
        dv,
        dg,
        h_ends,
        T,
        k_dim,
        v_dim,
        B * H,
        BT=CHUNK,
        BK=bk,
        BV=bv,
        PRECISION=precision,
        UPCAST=_upcast_dots(q),
        num_warps=num_warps,
    )
    dq, dk, dg = (t.sum(0) if n_vblocks > 1 else t[0] for t in (dq, dk, dg))  # (B, H, T, K) float32
    return dq.to(q.dtype), dk.to(k.dtype), dv, dg.to(g.dtype)


# --------------------------------------------------------------------------------------------------
# torch.library custom ops: opaque to torch.compile (no graph break), with fake and autograd rules
# --------------------------------------------------------------------------------------------------


@torch.library.custom_op("mahia::gla_fwd", mutates_args=())
def gla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """o (B, H, T, V) of gated linear attention with log-decays g (B, H, T, K)."""
    return gla_fwd_launch(q, k, v, g)


@gla_fwd.register_fake
def _(q, k, v, g):
    check_gla_kernel_inputs("gla_fwd", q, k, v, g)
    return v.new_empty(v.shape)


@torch.library.custom_op("mahia::gla_bwd", mutates_args=())
def gla_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, do: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg) of gated linear attention, given the inputs and the output's gradient do."""
    return gla_bwd_launch(q, k, v, g, do)


@gla_bwd.register_fake
def _(q, k, v, g, do):
    check_gla_kernel_inputs("gla_bwd", q, k, v, g, do)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape)


def _gla_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # q, k, v, g: the backward recomputes states instead of storing them


def _gla_backward(ctx, do):
    q, k, v, g = ctx.saved_tensors
    return gla_bwd(q, k, v, g, do)


gla_fwd.register_autograd(_gla_backward, setup_context=_gla_setup)


class _GLAFunction(torch.autograd.Function):
    """Eager-mode autograd over the same launchers, without the custom-op dispatch and without checking
    again what the caller validated (less host time; see mahia.ops.rmsnorm). torch.compile uses the
    custom ops."""

    @staticmethod
    def forward(ctx, q, k, v, g):
        ctx.save_for_backward(q, k, v, g)
        return gla_fwd_launch(q, k, v, g, check=False)

    @staticmethod
    def backward(ctx, do):
        q, k, v, g = ctx.saved_tensors
        return gla_bwd_launch(q, k, v, g, do, check=False)


def _gla_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return gla_fwd(q, k, v, g)
    return _GLAFunction.apply(q, k, v, g)


def gated_linear_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """o_t = S_t^T q_t with S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, on the Triton kernels (differentiable).

    q, k, g: (B, H, T, K); v: (B, H, T, V); returns (B, H, T, V) in v's dtype. No fallback: inputs the
    kernels cannot take (float64, K > 128, no CUDA and no interpreter) raise.
    """
    check_gla_kernel_inputs("gated_linear_attention_triton", q, k, v, g)
    _check_runnable("gated_linear_attention_triton", q)
    return _gla_triton(q, k, v, g)


# --------------------------------------------------------------------------------------------------
# The functional entry point
# --------------------------------------------------------------------------------------------------


def _kernel_limit(q: torch.Tensor) -> str | None:
    if q.shape[-1] > MAX_K:
        return (
            f"key dim K={q.shape[-1]} exceeds the kernel's limit of {MAX_K} (a ({CHUNK}, {CHUNK}, K) "
            "block of pairwise decays lives in registers)"
        )
    return None


def gated_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *, impl: str
) -> torch.Tensor:
    """o_t = S_t^T q_t with S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T  (module docstring).

    q, k: (B, H, T, K); v: (B, H, T, V); g: (B, H, T, K) log-decays, <= 0 (not checked: a check
    reads the data, a host sync). Returns (B, H, T, V) in v's dtype. ``impl``: "loop", "logspace"
    or "triton" (falls back to "logspace", with one warning, where Triton cannot run on the input,
    K > 128 included; float64 in any input takes "logspace" silently, since the kernels compute in
    float32; so do ``meta`` tensors). T = 0 gives an empty output with zero gradients for all four
    inputs. A NaN at step t reaches no output before t. Inputs are checked once, here.
    """
    if impl not in IMPLS:
        raise ValueError(f"gated_linear_attention: impl must be one of {IMPLS}, got {impl!r}")
    check_gla_inputs("gated_linear_attention", q, k, v, g)
    if impl == "loop":
        return _gla_loop(q, k, v, g)
    if impl == "triton" and use_triton("gla", q, k, v, g, unsupported=_kernel_limit(q)):
        return _gla_triton(q, k, v, g)
    return _gla_logspace(q, k, v, g, LOGSPACE_CHUNK)
