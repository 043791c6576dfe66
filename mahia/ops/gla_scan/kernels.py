"""The Triton kernels of gated linear attention, forward and backward, and the two functions that launch them.

The chunked form they compute is in :mod:`mahia.ops.gla_scan` (chunks of BT = 16 rows, b_i the log-decay from the
chunk start through row i, S the state entering the chunk). Every exponent is <= 0: nothing overflows at any length.
Inside a chunk, A = (q * exp(b - m)) (k * exp(m - b))^T (m the middle of each channel's log-decays) lets tl.dot do
the pairs in float32 where both factors stay in range: the chunk's decays span at most SPAN. A chunk with stronger
decays (exp(-b_j) grows like exp(BT |g|)), a reset or a non-finite q or k goes one column j at a time (BT^2 K exps).

Backward (do = dL/do): dA_ij = do_i . v_j, and the adjoint state H_next = sum over the rows s after the
chunk of exp(G_s - G_end) q_s do_s^T, carried backwards over the chunks like S is carried forwards:

    dq_i = exp(b_i) * (S do_i)              + sum_{j<=i} dA_ij k_j * exp(b_i - b_j)
    dk_j = exp(b_last - b_j) * (H_next v_j) + sum_{i>=j} dA_ij q_i * exp(b_i - b_j)
    dv_j = (k_j * exp(b_last - b_j)) H_next + sum_{i>=j} A_ij do_i
    H    = exp(b_last) * H_next + sum_i (q_i * exp(b_i)) do_i^T

and for the gate the standard GLA identity: G = cumsum(g) enters only through exp(G_t - G_s), so
dL/dG_t = q_t * dq_t - k_t * dk_t (t as the later index, minus t as the earlier one) and dg is its reverse cumulative
sum, dg_t = sum_{s>=t} (q_s * dq_s - k_s * dk_s). Summed over a long sequence that cancels badly (|dg| is ~300x
smaller than sum |dG| at T=2048: a float32 kernel doing it lost a decimal digit, a bfloat16 one failed its
tolerance). The kernel sums dG only inside the chunk and adds the tail directly: sum_{s > chunk end} dG_s is the
derivative for the pairs straddling the chunk end, which is

    dg_after = sum_v S_end * H_end            (per key channel; S_end, H_end: state and adjoint there)

Likewise the pairs j = i (decay exp(0) = 1) would add the same q_i k_i (do_i . v_i) to q * dq and to
k * dk; they go into dq and dk apart, never into dG.

Programs of two kinds (one walking the chunks with the pairwise blocks too was latency-bound, ~11,000 cycles a chunk;
split, the forward is 1.15x faster at the model's shapes, forward + backward even; bf16, H200, 2026-12-04):
- _gla_intra_kernel, one per (chunk, b * h), many and small: everything pairwise in a chunk. A, and in the backward
  (dA = do v^T from _gla_dA_kernel) the pairs' dq, dk and dG (reverse-summed in the chunk), the diagonal terms. It
  also writes what the walks would otherwise compute on their serial path: q exp(b), k exp(b_last - b), exp(b_last)
  and for the backward exp(b), exp(b_last - b) in float32. In the walks, these were 70% of the forward loop's
  instructions and half the backward's (SASS, sm_90, 2026-12-05); the forward walk took 132 us, now 64 (H100).
- _gla_fwd_kernel / _gla_bwd_kernel, one per (value block of BV columns, b * h, group of GROUP rows): the state
  across chunks, three small dots a chunk, A and the factors read back. The carries entering the groups come first,
  from a light pass (_gla_bounds_kernel: one dot a chunk), so the groups of one sequence run in parallel. The
  backward walks its group's chunks backwards (dk, dv; H saved at every chunk end: a (T/16, K, BV) float32
  scratch), then forwards (dq, S, dg). dq, dk, dg sum over all V columns: float32 partials per value block (block
  0's with the intra-chunk terms), summed after (two blocks: one add); with one value block the program writes them.
Inputs float32, bfloat16 or float16, accumulated in float32; 16-bit dots on tensor cores, float32 ones "ieee".
q is read times ``scale``, dq written times it. With GATE, G holds the gate's logits z: the intra kernel writes
g = logsigmoid(z) * inv_t to a float32 scratch for its column loop (recomputed there, it spilled registers) and for
the backward dg/dz = inv_t sigmoid(-z), which the walk multiplies dg by (computed there, a third of its loop).
Layout: q, k, g (B, H, T, K), v (B, H, T, V), any strides but a unit one along K or V (the (b, h, t) strides are
arguments: transposed views of a projection's output are read in place). o and each gradient take their input's
head order (output_like); the scratch is contiguous. Any T; K <= 128; any V. A reset (a gate below RESET) zeroes
every decay across it; dg = 0 there. The launchers do not check their inputs: the public function did.
"""

from __future__ import annotations

import os

import torch

from mahia.ops._launch import Launcher, cdiv, next_pow2, sm_count
from mahia.ops._triton import tl, triton
from mahia.ops.gla_scan.reference import RESET

CHUNK = 16  # rows per chunk: tl.dot's minimum; the pairwise exponentials grow with it (CHUNK^2 * K a chunk)
MAX_K = 128
SPAN = 40.0  # the largest log-decay span of a chunk that _gla_intra_kernel's dots take (factors e^+-20); 0: no dots.
# The dots against the column loop alone (SPAN = 0), forward + backward, bf16: 1.31 against 1.54 ms at B16 H8 T1024 K64,
# 8.20 / 12.10 at B4 H16 T4096 K128 (H100, 2026-12-05). The column loop is a runtime loop: unrolled, ptxas (sm_90)
# spilled the backward (1,816 B of stack); rolled, the same device time (H100, 2026-12-05) and a 3-5x faster compile.


@triton.jit
def _log_decays(g, RESET: tl.constexpr):
    """The log-decays of the rows of g (rows, BK), float32: (b, R, b_last, R_last) with

        b = cumsum(g) from the first row, resets (g < RESET) left out: it keeps the small gates' precision
        R = cumsum(-2**100 per reset): R_i - R_j is exactly 0 with no reset between rows j and i, else <= -2**100

    and b_last, R_last (BK,) those of all the rows. The decay from row j to row i (j <= i) is
    exp((b_i - b_j) + (R_i - R_j)): 0 across a reset. A power of two, as its multiples are exact: -1e30's
    were not, the GPU's tree scan summed them in another order, R_i - R_j came out +3e23 and exp() gave
    inf, then NaN (H200, 2026-12-04; the CPU interpreter sums in order)."""
    reset = g < RESET
    r = tl.where(reset, -(2.0**100), 0.0)  # (rows, BK)
    R, R_last = tl.cumsum(r, axis=0), tl.sum(r, axis=0)  # (rows, BK), (BK,)
    g = tl.where(reset, 0.0, g)
    b = tl.cumsum(g, axis=0)  # (rows, BK) log-decay from the first row through row i
    return b, R, tl.sum(g, axis=0), R_last  # b_last (BK,): the log-decay of all the rows


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with float32 accumulation. UPCAST: Triton's CPU interpreter multiplies bfloat16 operands as
    their raw 16-bit patterns, so there the (already rounded) operands go in as float32: same products."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _seq(X, pid_bh, n_heads, stride_b, stride_h):
    """X's first element of the sequence pid_bh = b * n_heads + h (int64: it can pass 2**31)."""
    return X + (pid_bh // n_heads) * stride_b + (pid_bh % n_heads) * stride_h


@triton.jit
def _chunk_rows(c, seq_len, offs_t, k_ok, v_ok, BT: tl.constexpr):
    """Chunk c's rows c * BT ... c * BT + BT - 1 and their masks (BT, BK), (BT, BV), padding rows and columns masked:
    an operand with row stride st is at rows[:, None] * st + columns."""
    rows = c * BT + offs_t
    return rows, (rows < seq_len)[:, None] & k_ok[None, :], (rows < seq_len)[:, None] & v_ok[None, :]


@triton.jit
def _gla_intra_kernel(
    Q, K, G, GS, DA, A, QI, KO, DEC, EI, EO, DQI, DKI, DGI, DZ, seq_len, k_dim, n_heads, scale, inv_t,
    sqb, sqh, sqt, skb, skh, skt, sgb, sgh, sgt,  # (b, h, t) strides of Q K G
    BT: tl.constexpr, BK: tl.constexpr, BKB: tl.constexpr, BACKWARD: tl.constexpr, PRECISION: tl.constexpr,
    RESET: tl.constexpr, GATE: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    # A: float32 (B*H, n_chunks * BT, BT); row i of chunk c holds A_ij for the chunk's rows j (0 for j > i).
    # For the walks (B*H, T, K): QI = q exp(b), KO = k exp(b_last - b) in v's dtype; DEC (B*H, n_chunks, BK) exp(b_last)
    # BACKWARD: the float32 factors EI = exp(b), EO = exp(b_last - b) (resets included, as _log_decays gives them),
    # and from DA = do v^T (_gla_dA_kernel's, laid out as A) float32 (B*H, T, K)
    #   DQI = sum_{j<i} dA_ij k_j e_ij + dA_ii k_i,     DKI = sum_{i>j} dA_ij q_i e_ij + dA_ii q_i,
    #   DGI = reverse cumsum within the chunk of q * dq - k * dk over the pairs j < i, 0 at a reset:
    # the pairs j = i add the same q_i k_i dA_ii to q * dq and to k * dk, so they go into dq and dk apart.
    # All but A are per key channel, so the channels go BKB at a time, A summed over the blocks: fewer registers.
    n_chunks = tl.cdiv(seq_len, BT)  # one flat grid axis: B * H may pass a second axis' limit, 65535
    c, pid_bh = tl.program_id(0) % n_chunks, (tl.program_id(0) // n_chunks).to(tl.int64)
    qk0 = pid_bh * seq_len * k_dim  # this (b, h)'s first element in the (B*H, T, K) outputs
    Q, K, G = _seq(Q, pid_bh, n_heads, sqb, sqh), _seq(K, pid_bh, n_heads, skb, skh), _seq(G, pid_bh, n_heads, sgb, sgh)
    A += pid_bh * n_chunks * BT * BT
    offs_t = tl.arange(0, BT)
    rows = c * BT + offs_t
    if GATE:  # the column loop reads rows of the log-decays this program writes (GS, float32)
        GR, sgr = GS + qk0, k_dim
    else:
        GR, sgr = G, sgt
    dA = tl.zeros((BT, BT), dtype=tl.float32)
    if BACKWARD:
        dA = tl.load(DA + (pid_bh * n_chunks + c) * BT * BT + offs_t[:, None] * BT + offs_t[None, :])
    # dA's entries finite and below 2**40, or the pairs go by the column loop (no product overflows; NaN, Inf selected)
    n_big = tl.sum(((tl.abs(dA) >= 2.0**40) & (tl.abs(dA) < float("inf"))).to(tl.int32))
    dA_low = tl.where(offs_t[:, None] > offs_t[None, :], dA, 0.0)  # (BT, BT): dA_ij for rows i > j
    diag = tl.sum(tl.where(offs_t[:, None] == offs_t[None, :], dA, 0.0), axis=1)  # (BT,): do_i . v_i
    a = tl.zeros((BT, BT), dtype=tl.float32)
    # Each block's q, k, g are loaded one block ahead, so their loads are in flight while the block before is computed.
    offs_k = tl.arange(0, BKB)
    mask = (rows < seq_len)[:, None] & (offs_k < k_dim)[None, :]
    q_next = tl.load(Q + rows[:, None] * sqt + offs_k[None, :], mask=mask, other=0.0)  # (BT, BKB)
    k_next = tl.load(K + rows[:, None] * skt + offs_k[None, :], mask=mask, other=0.0)  # padding 0
    g_next = tl.load(G + rows[:, None] * sgt + offs_k[None, :], mask=mask, other=0.0)
    for k0 in range(0, BK, BKB):
        offs_k = k0 + tl.arange(0, BKB)
        off = rows[:, None] * k_dim + offs_k[None, :]
        mask = (rows < seq_len)[:, None] & (offs_k < k_dim)[None, :]
        q, k, g = q_next.to(tl.float32) * scale, k_next.to(tl.float32), g_next.to(tl.float32)
        n_mask = (rows < seq_len)[:, None] & (offs_k + BKB < k_dim)[None, :]  # none after the last block
        q_next = tl.load(Q + rows[:, None] * sqt + (offs_k + BKB)[None, :], mask=n_mask, other=0.0)
        k_next = tl.load(K + rows[:, None] * skt + (offs_k + BKB)[None, :], mask=n_mask, other=0.0)
        g_next = tl.load(G + rows[:, None] * sgt + (offs_k + BKB)[None, :], mask=n_mask, other=0.0)
        if GATE:  # G holds the logits z: g = logsigmoid(z) * inv_t = (min(z, 0) - log1p(exp(-|z|))) * inv_t, written
            x = tl.exp(-tl.abs(g))  # once (GS: float32 (B*H, T, K)) for the row reads below and the kernels after this
            u = 1.0 + x  # log1p(x) = log(u) x / (u - 1) (Kahan: log(u) alone is 0 for x < 6e-8)
            log1p = tl.where(u == 1.0, x, tl.log(u) * x / tl.where(u == 1.0, 1.0, u - 1.0))
            dz = tl.where(g >= 0.0, x, 1.0) / u * inv_t  # dg/dz = inv_t sigmoid(-z), for the backward's dg
            g = tl.where(mask, (tl.minimum(g, 0.0) - log1p) * inv_t, 0.0)
            tl.store(GS + qk0 + off, g, mask=mask)
            if BACKWARD:  # DZ (B*H, T, K) float32; NaN marks a reset, whose dg is 0 whatever dL/dg is
                tl.store(DZ + qk0 + off, tl.where(g < RESET, float("nan"), dz), mask=mask)
            tl.debug_barrier()
        b, R, b_last, R_last = _log_decays(g, RESET)
        e_in, e_out = tl.exp(b + R), tl.exp((b_last[None, :] - b) + (R_last[None, :] - R))  # (BT, BKB)
        tl.store(QI + qk0 + off, (q * e_in).to(QI.dtype.element_ty), mask=mask)
        tl.store(KO + qk0 + off, (k * e_out).to(KO.dtype.element_ty), mask=mask)
        tl.store(DEC + (pid_bh * n_chunks + c) * BK + offs_k, tl.exp(b_last + R_last))
        if BACKWARD:
            tl.store(EI + qk0 + off, e_in, mask=mask)
            tl.store(EO + qk0 + off, e_out, mask=mask)
        a_k = tl.zeros((BT, BT), dtype=tl.float32)  # this block's channels' share of A
        dq, dk = tl.zeros((BT, BKB), dtype=tl.float32), tl.zeros((BT, BKB), dtype=tl.float32)
        # Where the block allows it, exp(b_i - b_j) = exp(b_i - m) exp(m - b_j) (m: each channel's middle log-decay) and
        # the pairs are float32 dots: decays spanning <= SPAN (factors in e^(+-SPAN/2)), no reset, q and k finite (a
        # dot's 0 * NaN would reach earlier rows) and dA below 2**40.
        ok = (tl.abs(q) < 2.0**40) & (tl.abs(k) < 2.0**40) & (R == 0.0) & (tl.abs(b) < float("inf"))
        lo, hi = tl.min(b, axis=0), tl.max(b, axis=0)  # (BKB,)
        dots = False
        if SPAN > 0:  # compile-time: SPAN = 0 builds the column loop alone (untaken, the dots cost registers)
            dots = (tl.sum(ok.to(tl.int32)) == BT * BKB) & (n_big == 0) & (tl.max(hi - lo) <= SPAN)
        if dots:
            m = (lo + hi)[None, :] * 0.5  # (1, BKB): the middle of each channel's log-decays
            e_q, e_k = tl.exp(b - m), tl.exp(m - b)  # (BT, BKB)
            q_m, k_m = q * e_q, k * e_k  # q_i exp(b_i - m), k_j exp(m - b_j)
            a_k = _dot(q_m, tl.trans(k_m), PRECISION, False)  # tf32 for 16-bit inputs: A goes to their dtype
            if BACKWARD:
                dq = _dot(dA_low, k_m, "ieee", False) * e_q
                dk = _dot(tl.trans(dA_low), q_m, "ieee", False) * e_k
        else:
            b_j, R_j = tl.zeros((BKB,), dtype=tl.float32), tl.zeros((BKB,), dtype=tl.float32)
            for j in range(BT):  # one column j at a time: a (BT, BKB) block, not (BT, BT, BKB)
                row_j = offs_t[:, None] == j  # selected, not multiplied by 0: a NaN of another row stays there
                # row j read again (L1), b_j and R_j summed on the way: from the tile it was 3-4x slower (H200)
                j_mask = offs_k < k_dim * (c * BT + j < seq_len).to(tl.int32)  # padding rows load 0
                k_j = tl.load(K + (c * BT + j) * skt + offs_k, mask=j_mask, other=0.0).to(tl.float32)
                g_j = tl.load(GR + (c * BT + j) * sgr + offs_k, mask=j_mask, other=0.0).to(tl.float32)
                b_j, R_j = b_j + tl.where(g_j < RESET, 0.0, g_j), R_j + tl.where(g_j < RESET, -(2.0**100), 0.0)
                seen = (offs_t >= j)[:, None]  # rows i >= j: exponent <= 0; the others' is masked, not left to overflow
                e = tl.exp(tl.where(seen, (b - b_j[None, :]) + (R - R_j[None, :]), float("-inf")))  # (BT, BKB)
                a_k = tl.where(offs_t[None, :] == j, tl.sum(q * k_j[None, :] * e, axis=1)[:, None], a_k)
                if BACKWARD:
                    dA_j = tl.sum(tl.where(offs_t[None, :] == j, dA, 0.0), axis=1)  # (BT,) over the rows i
                    later = (offs_t > j)[:, None]  # rows i > j (selected: dA_j or k_j may be NaN)
                    dq += tl.where(later, dA_j[:, None] * k_j[None, :] * e, 0.0)
                    dk = tl.where(row_j, tl.sum(tl.where(later, dA_j[:, None] * q * e, 0.0), axis=0)[None, :], dk)
        a += a_k
        if BACKWARD:
            dg = tl.cumsum(q * dq - k * dk, axis=0, reverse=True)
            tl.store(DGI + qk0 + off, tl.where(g < RESET, 0.0, dg), mask=mask)
            tl.store(DQI + qk0 + off, dq + diag[:, None] * k, mask=mask)
            tl.store(DKI + qk0 + off, dk + diag[:, None] * q, mask=mask)
    tl.store(A + rows[:, None] * BT + offs_t[None, :], tl.where(offs_t[:, None] >= offs_t[None, :], a, 0.0))


@triton.jit
def _gla_dA_kernel(
    V, DO, DA, seq_len, v_dim, n_heads, svb, svh, svt, sdb, sdh, sdt,
    BT: tl.constexpr, NC: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    # dA = do v^T of NC chunks at once, one (NC * BT)^2 dot, of which the NC diagonal (BT, BT) blocks are stored:
    # DA float32 (B*H, n_chunks * BT, BT), row i of chunk c holding dA_ij for the chunk's rows j.
    n_chunks = tl.cdiv(seq_len, BT)
    n_prog = tl.cdiv(n_chunks, NC)
    p, pid_bh = tl.program_id(0) % n_prog, (tl.program_id(0) // n_prog).to(tl.int64)
    V, DO = _seq(V, pid_bh, n_heads, svb, svh), _seq(DO, pid_bh, n_heads, sdb, sdh)
    r = tl.arange(0, NC * BT)
    rows = p * NC * BT + r
    acc = tl.zeros((NC * BT, NC * BT), dtype=tl.float32)
    for v0 in range(0, v_dim, BV):
        cols = v0 + tl.arange(0, BV)
        m = (rows < seq_len)[:, None] & (cols < v_dim)[None, :]
        v = tl.load(V + rows[:, None] * svt + cols[None, :], mask=m, other=0.0)
        do = tl.load(DO + rows[:, None] * sdt + cols[None, :], mask=m, other=0.0)
        acc += _dot(do, tl.trans(v), PRECISION, UPCAST)
    same = (r[:, None] // BT) == (r[None, :] // BT)
    out = DA + pid_bh * n_chunks * BT * BT + rows[:, None] * BT + (r[None, :] % BT)
    tl.store(out, acc, mask=same & (rows < n_chunks * BT)[:, None])


@triton.jit
def _gla_fwd_kernel(
    QI, KO, V, DEC, A, O, SB, seq_len, k_dim, v_dim, n_bh, n_groups, n_heads,
    svb, svh, svt, sob, soh, sot,  # (b, h, t) strides of V O
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, RESET: tl.constexpr,
):  # fmt: skip
    # BT rows per chunk, GROUP rows per program (a multiple of BT); all BK >= k_dim key channels, BV value columns;
    # PRECISION: tl.dot's for float32 operands; UPCAST: see _dot; SB: the state entering each group (float32
    # (n_vblocks, B*H, n_groups, BK, BV), _gla_bounds_kernel's); A, QI, KO, DEC: _gla_intra_kernel's (resets in them).
    # One flat grid axis (a second holds 65535 programs; B*H can pass that); value blocks neighbour, sharing L2.
    n_vblocks = tl.cdiv(v_dim, BV)
    pid_v = tl.program_id(0) % n_vblocks
    grp = (tl.program_id(0) // n_vblocks) % n_groups
    pid_bh = (tl.program_id(0) // n_vblocks // n_groups).to(tl.int64)  # pid_bh * seq_len * k_dim can pass 2**31
    SB += ((pid_v * n_bh + pid_bh) * n_groups + grp) * BK * BV
    n_chunks = tl.cdiv(seq_len, BT)
    qk0 = pid_bh * seq_len * k_dim  # this (b, h)'s first element in QI, KO
    QI, KO, DEC = QI + qk0, KO + qk0, DEC + pid_bh * n_chunks * BK
    V, O = _seq(V, pid_bh, n_heads, svb, svh), _seq(O, pid_bh, n_heads, sob, soh)
    A += pid_bh * n_chunks * BT * BT

    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    k_ok = offs_k < k_dim
    v_ok = offs_v < v_dim

    state = tl.zeros((BK, BV), dtype=tl.float32)  # S entering the chunk
    if n_groups > 1:
        state = tl.load(SB + offs_k[:, None] * BV + tl.arange(0, BV)[None, :])
    tril = (offs_t[:, None] >= offs_t[None, :]).to(V.dtype.element_ty)  # (BT, BT) 0/1: row i sums rows <= i
    for c in range(grp * (GROUP // BT), tl.minimum((grp + 1) * (GROUP // BT), n_chunks)):
        rows, qk_mask, v_mask = _chunk_rows(c, seq_len, offs_t, k_ok, v_ok, BT)
        # Padding rows and columns load 0: q_in = k_out = v = 0 add nothing to o or to the state.
        q_in = tl.load(QI + rows[:, None] * k_dim + offs_k[None, :], mask=qk_mask, other=0.0)  # (BT, BK)
        k_out = tl.load(KO + rows[:, None] * k_dim + offs_k[None, :], mask=qk_mask, other=0.0)
        v = tl.load(V + rows[:, None] * svt + offs_v[None, :], mask=v_mask, other=0.0)  # (BT, BV), dot operand dtype
        a = tl.load(A + (c * BT + offs_t)[:, None] * BT + offs_t[None, :])  # (BT, BT), _gla_intra_kernel's
        # A v takes v with its non-finite entries zeroed (0 * NaN in the dot would reach the whole chunk);
        # each value column is NaN from its first non-finite entry on, as in the recurrence: a dot of the 0/1 lower
        # triangle counts the non-finite rows at or above each row (integers <= BT: exact; no cross-lane minimum).
        finite = tl.abs(v.to(tl.float32)) < float("inf")  # (BT, BV), False for NaN and +-Inf
        after_bad = _dot(tril, tl.where(finite, 0.0, 1.0).to(v.dtype), PRECISION, UPCAST) > 0.0
        o = _dot(a.to(v.dtype), tl.where(finite, v, 0.0).to(v.dtype), PRECISION, UPCAST)  # (BT, BV)
        o += _dot(q_in, state.to(v.dtype), PRECISION, UPCAST)
        o = tl.where(after_bad, float("nan"), o)
        tl.store(O + rows[:, None] * sot + offs_v[None, :], o.to(O.dtype.element_ty), mask=v_mask)
        dec = tl.load(DEC + c * BK + offs_k)  # (BK,) the decay of the whole chunk
        state = state * dec[:, None] + _dot(tl.trans(k_out), v, PRECISION, UPCAST)


@triton.jit
def _gla_bounds_kernel(
    QI, KO, V, DO, DEC, SB, HB, seq_len, k_dim, v_dim, n_bh, n_groups, n_heads,
    svb, svh, svt, sdb, sdh, sdt,  # (b, h, t) strides of V DO
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, RESET: tl.constexpr, KS: tl.constexpr,
):  # fmt: skip
    """The carries at the group boundaries, so that the groups of a sequence run in parallel: programs
    [0, P) walk forwards and write the state S entering each group to SB, programs [P, 2P) (launched by the
    backward) walk backwards and write the adjoint H leaving each group to HB; P = value blocks x B*H x BK/KS (the
    decay is diagonal in the key channels: each of the carry's rows evolves alone, KS of them a program). Only the
    carry is updated, from _gla_intra_kernel's factors QI, KO, DEC and as the walks update it, so a group starts from
    the very bits the walk of one group would have there:

        S' = exp(b_last) S + sum_j (k_j exp(b_last - b_j)) v_j^T,    H = exp(b_last) H' + sum_i (q_i exp(b_i)) do_i^T
    """
    n_vblocks, splits = tl.cdiv(v_dim, BV), BK // KS  # splits: the programs of one carry, KS rows each
    P = n_vblocks * n_bh * splits
    forward, adjoint = tl.program_id(0) < P, tl.program_id(0) >= P
    pid = tl.program_id(0) % P
    pid_v = pid // splits % n_vblocks
    pid_bh = (pid // splits // n_vblocks).to(tl.int64)
    offs_t, offs_v = tl.arange(0, BT), pid_v * BV + tl.arange(0, BV)
    offs_k = pid % splits * KS + tl.arange(0, KS)  # this program's rows of the carry
    box = (pid_v * n_bh + pid_bh) * n_groups * BK * BV + offs_k[:, None] * BV + tl.arange(0, BV)[None, :]
    n_chunks = tl.cdiv(seq_len, BT)
    qk0 = pid_bh * seq_len * k_dim  # this (b, h)'s first element in QI, KO
    QI, KO, DEC = QI + qk0, KO + qk0, DEC + pid_bh * n_chunks * BK
    V, DO = _seq(V, pid_bh, n_heads, svb, svh), _seq(DO, pid_bh, n_heads, sdb, sdh)
    carry = tl.zeros((KS, BV), dtype=tl.float32)
    for i in range(0, n_chunks):
        c = tl.where(adjoint, n_chunks - 1 - i, i)
        grp = c // (GROUP // BT)
        if forward & (c % (GROUP // BT) == 0):
            tl.store(SB + box + grp * BK * BV, carry)  # the state entering group grp
        if adjoint & ((c % (GROUP // BT) == GROUP // BT - 1) | (c == n_chunks - 1)):
            tl.store(HB + box + grp * BK * BV, carry)  # the adjoint leaving group grp
        rows, qk_mask, v_mask = _chunk_rows(c, seq_len, offs_t, offs_k < k_dim, offs_v < v_dim, BT)
        if adjoint:
            x = tl.load(QI + rows[:, None] * k_dim + offs_k[None, :], mask=qk_mask, other=0.0)
            y = tl.load(DO + rows[:, None] * sdt + offs_v[None, :], mask=v_mask, other=0.0)
        else:
            x = tl.load(KO + rows[:, None] * k_dim + offs_k[None, :], mask=qk_mask, other=0.0)
            y = tl.load(V + rows[:, None] * svt + offs_v[None, :], mask=v_mask, other=0.0)
        carry = carry * tl.load(DEC + c * BK + offs_k)[:, None] + _dot(tl.trans(x), y, PRECISION, UPCAST)


@triton.jit
def _gla_bwd_load(
    X, sxt, V, DO, svt, sdt, c, seq_len, k_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT: tl.constexpr,
):  # fmt: skip
    """Chunk c's rows and masks (_chunk_rows), its offsets in the contiguous scratch, x (float32; q or k, read with its
    row stride sxt), v and do (the dot operand dtype)."""
    rows, qk_mask, v_mask = _chunk_rows(c, seq_len, offs_t, k_ok, v_ok, BT)
    qk_off = rows[:, None] * k_dim + offs_k[None, :]  # in the contiguous scratch
    x = tl.load(X + rows[:, None] * sxt + offs_k[None, :], mask=qk_mask, other=0.0).to(tl.float32)
    v = tl.load(V + rows[:, None] * svt + offs_v[None, :], mask=v_mask, other=0.0)
    do = tl.load(DO + rows[:, None] * sdt + offs_v[None, :], mask=v_mask, other=0.0)
    return rows, qk_off, qk_mask, v_mask, x, v, do


@triton.jit
def _gla_bwd_kernel(
    Q, K, V, G, DO, A, QI, KO, DEC, EI, EO, DQI, DKI, DGI, DZ, DQ, DK, DV, DG, DGO, HS, SB, HB, seq_len, k_dim, v_dim,
    n_bh, n_groups, n_heads, scale, inv_t,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sgb, sgh, sgt, sdb, sdh, sdt,  # (b, h, t) strides of Q K V G DO
    s1b, s1h, s1t, s2b, s2h, s2t, s3b, s3h, s3t, s4b, s4h, s4t,  # (b, h, t) strides of DQ DK DV DGO
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, RESET: tl.constexpr, GATE: tl.constexpr,
):  # fmt: skip
    # DQ, DK, DG: float32 partials (n_vblocks, B*H, T, K), DG also the scratch of pass 1; DGO: where the final dg goes
    # (DG itself; with one value block, DQ, DK, DGO are the outputs, in the inputs' dtypes and layouts: no partials
    # to sum, so no conversion or copy after); HS: float32 scratch (n_vblocks, B*H, n_chunks, BK, BV),
    # the adjoint state at every chunk end; SB, HB: the state entering each group and the adjoint leaving it;
    # A, QI, KO, DEC, EI, EO, DZ: _gla_intra_kernel's; DQI, DKI, DGI: its too, added to value block 0's partials.
    n_vblocks = tl.cdiv(v_dim, BV)  # a flat grid, as in the forward kernel
    pid_v = tl.program_id(0) % n_vblocks
    grp = (tl.program_id(0) // n_vblocks) % n_groups
    pid_bh = (tl.program_id(0) // n_vblocks // n_groups).to(tl.int64)
    n_chunks = tl.cdiv(seq_len, BT)
    c_begin = grp * (GROUP // BT)
    c_end = tl.minimum(c_begin + GROUP // BT, n_chunks)
    Q, K, G = _seq(Q, pid_bh, n_heads, sqb, sqh), _seq(K, pid_bh, n_heads, skb, skh), _seq(G, pid_bh, n_heads, sgb, sgh)
    V, DO = _seq(V, pid_bh, n_heads, svb, svh), _seq(DO, pid_bh, n_heads, sdb, sdh)
    qk0 = pid_bh * seq_len * k_dim  # this (b, h)'s first element in the (B*H, T, K) scratch
    QI, KO, EI, EO = QI + qk0, KO + qk0, EI + qk0, EO + qk0
    DQI, DKI, DGI, DZ = DQI + qk0, DKI + qk0, DGI + qk0, DZ + qk0
    DEC += pid_bh * n_chunks * BK
    A += pid_bh * n_chunks * BT * BT
    part = pid_v * n_bh + pid_bh  # this program's slice of the partials and of the scratch
    DG += part * seq_len * k_dim
    vblock = (pid_v * n_bh).to(tl.int64) * seq_len * k_dim  # the value block's partials (0 with one block)
    DQ, DK = _seq(DQ, pid_bh, n_heads, s1b, s1h) + vblock, _seq(DK, pid_bh, n_heads, s2b, s2h) + vblock
    DV, DGO = _seq(DV, pid_bh, n_heads, s3b, s3h), _seq(DGO, pid_bh, n_heads, s4b, s4h) + vblock
    HS += part * n_chunks * BK * BV
    first = pid_v == 0

    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    k_ok = offs_k < k_dim
    v_ok = offs_v < v_dim
    hs_off = offs_k[:, None] * BV + tl.arange(0, BV)[None, :]  # (BK, BV), padding included

    # Pass 1, backward over the group's chunks: dk and dv need the adjoint state H of the rows after the chunk.
    dstate = tl.zeros((BK, BV), dtype=tl.float32)
    if n_groups > 1:
        dstate = tl.load(HB + (part * n_groups + grp) * BK * BV + hs_off)
    for i in range(c_begin, c_end):
        c = c_end - 1 - (i - c_begin)
        rows, qk_off, qk_mask, v_mask, k, v, do = _gla_bwd_load(
            K, skt, V, DO, svt, sdt, c, seq_len, k_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT
        )
        a = tl.load(A + (c * BT + offs_t)[:, None] * BT + offs_t[None, :])  # (BT, BT)
        d_out = tl.load(EO + qk_off, mask=qk_mask, other=0.0)  # (BT, BK) decay from row j to the chunk end
        tl.store(HS + c * BK * BV + hs_off, dstate)  # H at this chunk's end, for dg in pass 2
        dstate_op = dstate.to(v.dtype)
        dk = _dot(v, tl.trans(dstate_op), PRECISION, UPCAST) * d_out
        dv = _dot(tl.trans(a.to(v.dtype)), do, PRECISION, UPCAST)  # (BT, BV)
        dv += _dot(tl.load(KO + qk_off, mask=qk_mask, other=0.0), dstate_op, PRECISION, UPCAST)  # k_out H
        tl.store(DG + qk_off, k * dk, mask=qk_mask)  # the k side of dG, for pass 2
        if first:
            dk += tl.load(DKI + qk_off, mask=qk_mask, other=0.0)
        tl.store(DK + rows[:, None] * s2t + offs_k[None, :], dk, mask=qk_mask)
        tl.store(DV + rows[:, None] * s3t + offs_v[None, :], dv.to(DV.dtype.element_ty), mask=v_mask)
        q_in = tl.load(QI + qk_off, mask=qk_mask, other=0.0)
        dstate = dstate * tl.load(DEC + c * BK + offs_k)[:, None] + _dot(tl.trans(q_in), do, PRECISION, UPCAST)

    tl.debug_barrier()  # pass 2 reads what other threads of this program wrote to DG and HS

    # Pass 2, forward over the group's chunks: dq needs the state S entering each chunk; then dg.
    state = tl.zeros((BK, BV), dtype=tl.float32)
    if n_groups > 1:
        state = tl.load(SB + (part * n_groups + grp) * BK * BV + hs_off)
    for c in range(c_begin, c_end):
        rows, qk_off, qk_mask, v_mask, q, v, do = _gla_bwd_load(
            Q, sqt, V, DO, svt, sdt, c, seq_len, k_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT
        )
        q = q * scale
        dq = _dot(do, tl.trans(state.to(v.dtype)), PRECISION, UPCAST) * tl.load(EI + qk_off, mask=qk_mask, other=0.0)
        k_out = tl.load(KO + qk_off, mask=qk_mask, other=0.0)
        state = state * tl.load(DEC + c * BK + offs_k)[:, None] + _dot(tl.trans(k_out), v, PRECISION, UPCAST)
        # dg_t = sum_{s >= t in the chunk} dG_s + sum_v S_end * H_end: the pairs straddling the chunk
        # end, summed directly instead of as a long, cancelling sum of dG over the rest of the sequence.
        dg_after = tl.sum(state * tl.load(HS + c * BK * BV + hs_off), axis=1)  # (BK,)
        dG = q * dq - tl.load(DG + qk_off, mask=qk_mask, other=0.0)  # (BT, BK), 0 on padding rows
        dg = tl.cumsum(dG, axis=0, reverse=True) + dg_after[None, :]
        if first:
            dq += tl.load(DQI + qk_off, mask=qk_mask, other=0.0)
            dg += tl.load(DGI + qk_off, mask=qk_mask, other=0.0)
        tl.store(DQ + rows[:, None] * s1t + offs_k[None, :], dq * scale, mask=qk_mask)  # dq was q * scale's
        if GATE:  # dL/dz = dL/dg dg/dz, the factor _gla_intra_kernel wrote (NaN: a reset, dg 0)
            dz = tl.load(DZ + qk_off, mask=qk_mask, other=0.0)
            dg = tl.where(dz != dz, 0.0, dg * dz)
        else:
            g = tl.load(G + rows[:, None] * sgt + offs_k[None, :], mask=qk_mask, other=0.0).to(tl.float32)
            dg = tl.where(g < RESET, 0.0, dg)  # 0 at a reset: its dg carries exp(g)
        tl.store(DGO + rows[:, None] * s4t + offs_k[None, :], dg, mask=qk_mask)


_launch_intra, _launch_fwd, _launch_dA, _launch_bwd, _launch_bounds = (
    Launcher(k) for k in (_gla_intra_kernel, _gla_fwd_kernel, _gla_dA_kernel, _gla_bwd_kernel, _gla_bounds_kernel)
)


def _plan(q: torch.Tensor, v_dim: int, backward: bool = False) -> tuple[int, int, dict]:
    """(value blocks, groups per sequence, the kernels' meta) for inputs like q (B, H, T, K) and the forward or backward.

    BK, BV, num_warps of the walks: BV = 64 for 16-bit inputs; float32 operands take twice the registers, so float32
    uses BV = 32 for K <= 32, else 16 (ptxas, sm_90). 4 warps for 16-bit inputs with K <= 64: forward + backward 5%
    faster than 8 at the model's shapes, 19% slower at K = 128, which keeps 8 (H100, 2026-12-05); BV 32, 16 were slower.
    GROUP, rows per program: the forward takes about one program per SM; the backward 4x the groups, its programs
    being longer (bf16, H100, 2026-12-06: at 8x against 1x the backward took 0.86 against 1.02 ms at B16 H8 T1024 K64,
    1.69 / 2.03 at B8 H16 T2048, 2.95 / 3.02 at B2 H8 T8192 K128, 5.31 / 5.28 at B4 H16 T4096; 4x against 8x, fwd +
    bwd, 0.838 / 0.843 and 1.637 / 1.642 at the first two; the forward at 2x 15% slower at K = 64).
    Under the CPU interpreter 32 rows, so the tests' sequences cross groups.
    """
    B, H, T, k_dim = q.shape
    bk = max(16, next_pow2(k_dim))  # tl.dot needs every dim >= 16
    cap = 64 if q.dtype != torch.float32 else (32 if bk <= 32 else 16)
    bv = min(cap, max(16, next_pow2(v_dim)))
    n_vblocks = cdiv(v_dim, bv)
    want = max(1, sm_count(q.device) * (4 if backward else 1) // (n_vblocks * B * H))
    group = 64 * max(1, cdiv(T, 64 * want)) if q.is_cuda else 2 * CHUNK
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32: for float32 operands, e.g. the intra kernel's A
    upcast = q.dtype == torch.bfloat16 and not q.is_cuda and os.environ.get("TRITON_INTERPRET", "") == "1"
    warps = 4 if bk == 16 or (bk <= 64 and q.dtype != torch.float32) else 8
    meta = dict(BK=bk, BV=bv, GROUP=group, PRECISION=precision, UPCAST=upcast, RESET=RESET, num_warps=warps)
    return n_vblocks, max(1, cdiv(T, group)), meta


def _unit(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dim has a unit stride (any other strides: the kernels take them), else a copy."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The (b, h, t) strides of each (B, H, T, d) operand, in order: the kernels' stride arguments."""
    return tuple(s for t in tensors for s in t.stride()[:3])


def output_like(v: torch.Tensor) -> torch.Tensor:
    """An empty tensor like v (B, H, T, d): (B, T, H, d) memory when v's heads are interleaved along T (a transposed
    view of a projection), so that a projection's matmul reads it without a copy (o, the gradients); else contiguous."""
    if v.stride(1) < v.stride(2):
        B, H, T, V = v.shape
        return v.new_empty((B, T, H, V)).transpose(1, 2)
    return v.new_empty(v.shape)


def gla_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float = 1.0, inv_t: float = 0.0
) -> torch.Tensor:
    """o (B, H, T, V) of gated linear attention with q * scale and log-decays g (B, H, T, K), or with inv_t > 0
    logsigmoid(g) * inv_t; in v's dtype (layout: output_like)."""
    (B, H, T, k_dim), v_dim = q.shape, v.shape[-1]
    o = output_like(v)
    q, k, v, g = (_unit(t) for t in (q, k, v, g))
    if o.numel() == 0 or q.numel() == 0:
        return o.zero_()
    n_vblocks, n_groups, meta = _plan(q, v_dim)
    (a, qi, ko, dec), _ = _intra(q, k, v, g, None, float(scale), float(inv_t), meta)
    sb = _bounds(qi, ko, dec, v, None, n_vblocks, n_groups, meta)
    args = (qi, ko, v, dec, a, o, sb, T, k_dim, v_dim, B * H, n_groups, H, *_strides(v, o))
    _launch_fwd((n_vblocks * B * H * n_groups,), *args, BT=CHUNK, **meta)
    return o


def _intra(q, k, v, g, do, scale, inv_t, meta):
    """([A, QI, KO, DEC], and given do EI, EO, DQI, DKI, DGI, DZ after them: _gla_intra_kernel's outputs, one program per
    chunk and (b, h); the log-decays the kernels after it read: g, or with inv_t > 0 (g the logits) the float32 ones
    it wrote). Key channels 16 at a time, dA by its own kernel (four chunks a dot), A's dot in tf32 for 16-bit inputs,
    2 warps forward, 4 backward: 128 and 112 registers a thread (ptxas sm_90, triton 3.9; all K at once, dA in the
    kernel, 4 warps: 96 and 212). GLA fwd + bwd, bf16, H100, 2026-12-06, ms at B16 H8 T1024 K64 and B8 H16 T2048: all
    K at once 1.092, 2.144; 16 channels 0.938, 1.851; dA apart 0.886, 1.726; A in tf32 0.856, 1.668 (o's error 2.82e-3
    -> 2.87e-3, dg's 3.09e-3 as it was); 2 warps forward 0.843, 1.642 (8 warps: 1.018 at the second step; 32 channels
    0.921 at the third)."""
    (B, H, T, k_dim), bw = q.shape, do is not None
    n_chunks, f32 = cdiv(T, CHUNK), dict(dtype=torch.float32, device=q.device)
    a, dec = torch.empty((B * H, n_chunks * CHUNK, CHUNK), **f32), torch.empty((B * H, n_chunks, meta["BK"]), **f32)
    qi, ko = (torch.empty(q.shape, dtype=v.dtype, device=q.device) for _ in range(2))  # as the walks' dots take them
    rest = [torch.empty(q.shape, **f32) for _ in range(5)] if bw else [a] * 5  # EI, EO, DQI, DKI, DGI (a: unwritten)
    out = [a, qi, ko, dec, *rest, torch.empty(q.shape, **f32) if bw and inv_t > 0 else a]  # DZ
    gs, da = torch.empty(q.shape, **f32) if inv_t > 0 else g, torch.empty_like(a) if bw else a
    if bw:
        bv = min(64, max(16, next_pow2(v.shape[-1])))
        _launch_dA((cdiv(n_chunks, 4) * B * H,), v, do, da, T, v.shape[-1], H, *_strides(v, do), BT=CHUNK, NC=4,
                   BV=bv, PRECISION=meta["PRECISION"], UPCAST=meta["UPCAST"], num_warps=4)  # fmt: skip
    args = (q, k, g, gs, da, *out, T, k_dim, H, scale, inv_t, *_strides(q, k, g))
    _launch_intra((n_chunks * B * H,), *args, BT=CHUNK, BK=meta["BK"], BKB=min(meta["BK"], 16), BACKWARD=bw,
                  PRECISION=meta["PRECISION"], RESET=RESET, GATE=inv_t > 0, SPAN=SPAN, num_warps=4 if bw else 2)  # fmt: skip
    return (out if bw else out[:4]), gs


def _bounds(qi, ko, dec, v, do, n_vblocks, n_groups, meta):
    """SB, or (SB, HB) given do: the carries entering the groups; a stand-in, unread, for one group a sequence."""
    (B, H, T, k_dim), n, bk = qi.shape, 1 if do is None else 2, meta["BK"]
    shape = (n, n_vblocks, B * H, n_groups, bk, meta["BV"]) if n_groups > 1 else (2, 1)
    carries = torch.empty(shape, dtype=torch.float32, device=qi.device)
    if n_groups > 1:
        d, ks, p = v if do is None else do, bk, n * n_vblocks * B * H  # ks rows of the carry a program:
        while ks >= 64 and p * bk // ks < sm_count(qi.device):  # halved while the SMs outnumber the programs
            ks //= 2
        args = (qi, ko, v, d, dec, carries[0], carries[-1], T, k_dim, v.shape[-1], B * H, n_groups, H)
        _launch_bounds((p * bk // ks,), *args, *_strides(v, d), BT=CHUNK, KS=ks, **meta)
    return carries[0] if do is None else (carries[0], carries[-1])


def gla_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, do: torch.Tensor, scale: float = 1.0,
    inv_t: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv, dg) of :func:`gla_fwd` given the output's gradient do, each in its input's dtype and layout
    (output_like: the layout a transposed view's gradient goes on in, e.g. to the projection's matmul)."""
    (B, H, T, k_dim), v_dim = q.shape, v.shape[-1]
    outs = [output_like(t) for t in (q, k, v, g)]
    q, k, v, g = (_unit(t) for t in (q, k, v, g))
    do = _unit(do.to(v.dtype))  # autograd hands do in o's dtype (v's); a direct caller might not
    if q.numel() == 0 or v.numel() == 0:
        return tuple(t.zero_() for t in outs)
    n_vblocks, n_groups, meta = _plan(q, v_dim, backward=True)  # after the check: no programs, no plan
    scale, inv_t = float(scale), float(inv_t)
    # float32 partials, one slice per value block: dq, dk and dg sum over all V columns. With one value block (V <= 64
    # for 16-bit inputs) nothing is summed: the kernel writes dq, dk and the final dg into the outputs.
    one = n_vblocks == 1
    dg = q.new_empty((n_vblocks, B, H, T, k_dim), dtype=torch.float32)  # pass 1's scratch (and the partials)
    dq, dk = outs[:2] if one else (torch.empty_like(dg) for _ in range(2))
    dg_out = outs[3] if one else dg  # else in place
    h_ends = q.new_empty((n_vblocks, B * H, cdiv(T, CHUNK), meta["BK"], meta["BV"]), dtype=torch.float32)
    intra, g = _intra(q, k, v, g, do, scale, inv_t, meta)  # A, QI, KO, DEC, EI, EO, DQI, DKI, DGI, DZ; g: log-decays
    sb, hb = _bounds(*intra[1:4], v, do, n_vblocks, n_groups, meta)
    args = (q, k, v, g, do, *intra, dq, dk, outs[2], dg, dg_out, h_ends, sb, hb, T, k_dim, v_dim, B * H, n_groups, H)
    ends = _strides(*(t if one else t[0] for t in (dq, dk)), outs[2], dg_out if one else dg[0])
    args += (scale, inv_t, *_strides(q, k, v, g, do), *ends)
    _launch_bwd((n_vblocks * B * H * n_groups,), *args, BT=CHUNK, GATE=inv_t > 0, **meta)
    if not one:
        for out, partials in zip((outs[0], outs[1], outs[3]), (dq, dk, dg)):  # 2 blocks (16-bit V = 128): one kernel
            torch.add(*partials, out=out) if n_vblocks == 2 else out.copy_(partials.sum(0))
    return tuple(outs)
