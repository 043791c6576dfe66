"""The Triton kernels of gated linear attention, forward and backward, and the two functions that launch them.

The chunked form they compute is in :mod:`mahia.ops.gla_scan` (chunks of BT = 16 rows, b_i the log-decay
from the chunk start through row i, S the state entering the chunk). Every exponent is <= 0, so nothing
can overflow at any sequence length. The tempting factorization A = (q * exp(b)) (k * exp(-b))^T would
let tl.dot do the intra-chunk part too, but exp(-b_j) grows like exp(BT * |g|) and overflows (float16:
above exp(11)) for strong decays; the pairwise decays cost a (BT, BT, K) block of registers instead,
which is why BT is 16 and K is at most 128.

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

Programs: one per (value block of BV columns, b * h, group of GROUP rows). The carries entering the groups
come first, from a light pass (_gla_bounds_kernel: one dot per 64 rows, no pairwise blocks), so the groups
of one sequence run in parallel; a sequence of one group needs none. The forward walks its group's chunks in
order with its (K, BV) float32 state in registers. The backward walks them backwards (dk, dv; H saved at every
chunk end: a (T/16, K, BV) float32 scratch), then forwards (dq, S, dg). dq, dk, dg sum over all V columns: with
several value blocks each program writes float32 partials and a ``sum(0)`` finishes them.
Inputs float32, bfloat16 or float16, accumulated in float32; 16-bit dots on tensor cores, float32 ones "ieee".
Layout: (B, H, T, K) / (B, H, T, V), made contiguous (a copy) if they are not. Any T; K <= 128; any V.
A reset (a gate below RESET, mahia.ops.gla_scan) zeroes every decay across it and the kernels write dg = 0
there (the true dg carries a factor exp(g)). The launchers do not check their inputs: the public function did.
"""

from __future__ import annotations

import functools
import os

import torch

from mahia.ops._launch import Launcher
from mahia.ops._triton import tl, triton
from mahia.ops.gla_scan.reference import RESET

CHUNK = 16  # rows per chunk: tl.dot's minimum, and the (CHUNK, CHUNK, K) pairwise block fits registers
MAX_K = 128


@triton.jit
def _decays(g, pairs, RESET: tl.constexpr):
    """The log-decays of one chunk from its gates g (BT, BK), float32: (decay, b, R, b_last, R_last) with

        b = cumsum(g) from the chunk start, resets (g < RESET) left out: it keeps the small gates' precision
        R = cumsum(-2**100 per reset): R_i - R_j is exactly 0 with no reset between rows j and i, else <= -2**100
        decay_ij = exp((b_i - b_j) + (R_i - R_j)) where pairs[i, j] (j <= i only), else 0      (BT, BT, BK)

    and b_last, R_last (BK,) those of the whole chunk. The callers take exp(b + R) for the decay from the
    chunk start, exp((b_last - b) + (R_last - R)) for the decay to its end: 0 across a reset. A power of two,
    as its multiples are exact: -1e30's were not, the GPU's tree scan summed them in another order, R_i - R_j
    came out +3e23 and exp() gave inf, then NaN (H200, 2026-12-04; the CPU interpreter sums in order)."""
    b, R, b_last, R_last = _log_decays(g, RESET)
    diff = (b[:, None, :] - b[None, :, :]) + (R[:, None, :] - R[None, :, :])
    decay = tl.exp(tl.where(pairs[:, :, None], diff, float("-inf")))
    return decay, b, R, b_last, R_last


@triton.jit
def _log_decays(g, RESET: tl.constexpr):
    """(b, R, b_last, R_last) of _decays, for the rows of g (rows, BK) float32."""
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
    Q, K, V, G, O, SB, seq_len, k_dim, v_dim, n_bh, n_groups,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, RESET: tl.constexpr,
):  # fmt: skip
    # BT rows per chunk, GROUP rows per program (a multiple of BT); the whole key dim in one program (BK: the
    # next power of two >= k_dim), BV value columns; PRECISION: tl.dot's for float32 operands; UPCAST: see _dot;
    # log-decays below RESET are full resets (reference.RESET). SB: the state entering each group (float32
    # (n_vblocks, B*H, n_groups, BK, BV), from _gla_bounds_kernel).
    # One flat grid axis (a second holds 65535 programs; B*H can pass that); value blocks neighbour, sharing L2.
    n_vblocks = tl.cdiv(v_dim, BV)
    pid_v = tl.program_id(0) % n_vblocks
    grp = (tl.program_id(0) // n_vblocks) % n_groups
    pid_bh = (tl.program_id(0) // n_vblocks // n_groups).to(tl.int64)  # pid_bh * seq_len * k_dim can pass 2**31
    SB += ((pid_v * n_bh + pid_bh) * n_groups + grp) * BK * BV
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
    if n_groups > 1:
        state = tl.load(SB + offs_k[:, None] * BV + tl.arange(0, BV)[None, :])
    for c in range(grp * (GROUP // BT), tl.minimum((grp + 1) * (GROUP // BT), tl.cdiv(seq_len, BT))):
        qk_off, qk_mask, v_off, v_mask = _chunk_offsets(
            c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT
        )
        # Padding rows and columns load 0: g = 0 keeps b constant, k = v = 0 adds nothing to the state.
        q = tl.load(Q + qk_off, mask=qk_mask, other=0.0).to(tl.float32)  # (BT, BK)
        k = tl.load(K + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
        g = tl.load(G + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
        v = tl.load(V + v_off, mask=v_mask, other=0.0)  # (BT, BV), the dot operand dtype

        decay, b, R, b_last, R_last = _decays(g, causal, RESET)
        # (BT, BT), zero above the diagonal: selected, not multiplied by 0, so a NaN of k_j stays in rows >= j
        A = tl.sum(tl.where(causal[:, :, None], q[:, None, :] * k[None, :, :] * decay, 0.0), axis=2)

        # A v takes v with its non-finite entries zeroed (0 * NaN in the dot would reach the whole chunk);
        # each value column is NaN from its first non-finite entry on, as in the recurrence.
        finite = tl.abs(v.to(tl.float32)) < float("inf")  # (BT, BV), False for NaN and +-Inf
        first_bad = tl.min(tl.where(finite, BT, offs_t[:, None]), axis=0)  # (BV,): BT if none
        after_bad = offs_t[:, None] >= first_bad[None, :]
        o = _dot(A.to(v.dtype), tl.where(finite, v, 0.0).to(v.dtype), PRECISION, UPCAST)  # (BT, BV)
        q_in = (q * tl.exp(b + R)).to(v.dtype)
        o += _dot(q_in, state.to(v.dtype), PRECISION, UPCAST)
        o = tl.where(after_bad, float("nan"), o)
        tl.store(O + v_off, o.to(O.dtype.element_ty), mask=v_mask)

        # decay from row j to the chunk end
        k_out = (k * tl.exp((b_last[None, :] - b) + (R_last[None, :] - R))).to(v.dtype)
        state = state * tl.exp(b_last + R_last)[:, None] + _dot(tl.trans(k_out), v, PRECISION, UPCAST)


@triton.jit
def _gla_bounds_kernel(
    Q, K, V, G, DO, SB, HB, seq_len, k_dim, v_dim, n_bh, n_groups,
    STEP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, RESET: tl.constexpr,
):  # fmt: skip
    """The carries at the group boundaries, so that the groups of a sequence run in parallel: programs
    [0, P) walk forwards and write the state S entering each group to SB, programs [P, 2P) (launched by the
    backward) walk backwards and write the adjoint H leaving each group to HB; P = value blocks x B*H.
    Only the carry is updated, STEP rows at a time (exp(b_last - b_j) <= 1 at any STEP):

        S' = exp(b_last) S + sum_j (k_j exp(b_last - b_j)) v_j^T,    H = exp(b_last) H' + sum_i (q_i exp(b_i)) do_i^T
    """
    n_vblocks = tl.cdiv(v_dim, BV)
    P = n_vblocks * n_bh
    forward = tl.program_id(0) < P
    adjoint = tl.program_id(0) >= P
    pid = tl.program_id(0) % P
    pid_v = pid % n_vblocks
    pid_bh = (pid // n_vblocks).to(tl.int64)
    offs_t = tl.arange(0, STEP)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    k_ok = offs_k < k_dim
    v_ok = offs_v < v_dim
    box = (pid_v * n_bh + pid_bh) * n_groups * BK * BV + offs_k[:, None] * BV + tl.arange(0, BV)[None, :]
    n_steps = tl.cdiv(seq_len, STEP)
    carry = tl.zeros((BK, BV), dtype=tl.float32)
    for i in range(0, n_steps):
        s = tl.where(adjoint, n_steps - 1 - i, i)
        first = (s * STEP) // GROUP
        if forward & ((s * STEP) % GROUP == 0):
            tl.store(SB + box + first * BK * BV, carry)  # the state entering group `first`
        if adjoint & ((((s + 1) * STEP) % GROUP == 0) | (s == n_steps - 1)):
            tl.store(HB + box + first * BK * BV, carry)  # the adjoint leaving group `first`
        qk_off, qk_mask, v_off, v_mask = _chunk_offsets(
            s, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, STEP
        )
        qk_off += pid_bh * seq_len * k_dim
        v_off += pid_bh * seq_len * v_dim
        b, R, b_last, R_last = _log_decays(tl.load(G + qk_off, mask=qk_mask, other=0.0).to(tl.float32), RESET)
        carry = carry * tl.exp(b_last + R_last)[:, None]
        if adjoint:
            q = tl.load(Q + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
            do = tl.load(DO + v_off, mask=v_mask, other=0.0)
            carry += _dot(tl.trans((q * tl.exp(b + R)).to(do.dtype)), do, PRECISION, UPCAST)
        else:
            k = tl.load(K + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
            v = tl.load(V + v_off, mask=v_mask, other=0.0)
            k_out = k * tl.exp((b_last[None, :] - b) + (R_last[None, :] - R))
            carry += _dot(tl.trans(k_out.to(v.dtype)), v, PRECISION, UPCAST)


@triton.jit
def _gla_bwd_chunk(
    Q, K, G, V, DO, c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, strict,
    BT: tl.constexpr, RESET: tl.constexpr,
):  # fmt: skip
    """Load chunk c (rows c * BT ... c * BT + BT - 1) and the decays both backward passes need (_decays, with
    decay_ij = 0 on and above the diagonal).

    Returns (qk_off, qk_mask, v_off, v_mask, q, k, v, do, decay, b, R, b_last, R_last): q, k and the
    decays in float32, v and do in the dot operand dtype; padding rows and columns load 0. dA = do v^T stays in the
    passes: computed here, it moves ahead of pass 1's A and changes the compiled schedule (and spills)."""
    qk_off, qk_mask, v_off, v_mask = _chunk_offsets(c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, BT)
    q = tl.load(Q + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
    k = tl.load(K + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
    g = tl.load(G + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
    v = tl.load(V + v_off, mask=v_mask, other=0.0)
    do = tl.load(DO + v_off, mask=v_mask, other=0.0)

    decay, b, R, b_last, R_last = _decays(g, strict, RESET)
    return qk_off, qk_mask, v_off, v_mask, q, k, v, do, decay, b, R, b_last, R_last


@triton.jit
def _gla_bwd_kernel(
    Q, K, V, G, DO, DQ, DK, DV, DG, HS, SB, HB, seq_len, k_dim, v_dim, n_bh, n_groups,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, RESET: tl.constexpr,
):  # fmt: skip
    # DQ, DK, DG: float32 partials (n_vblocks, B*H, T, K); HS: float32 scratch (n_vblocks, B*H, n_chunks, BK, BV),
    # the adjoint state at every chunk end; SB, HB: the state entering each group and the adjoint leaving it.
    n_vblocks = tl.cdiv(v_dim, BV)  # a flat grid, as in the forward kernel
    pid_v = tl.program_id(0) % n_vblocks
    grp = (tl.program_id(0) // n_vblocks) % n_groups
    pid_bh = (tl.program_id(0) // n_vblocks // n_groups).to(tl.int64)
    n_chunks = tl.cdiv(seq_len, BT)
    c_begin = grp * (GROUP // BT)
    c_end = tl.minimum(c_begin + GROUP // BT, n_chunks)
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

    # Pass 1, backward over the group's chunks: dk and dv need the adjoint state H of the rows after the chunk.
    dstate = tl.zeros((BK, BV), dtype=tl.float32)
    if n_groups > 1:
        dstate = tl.load(HB + (part * n_groups + grp) * BK * BV + hs_off)
    for i in range(c_begin, c_end):
        c = c_end - 1 - (i - c_begin)
        qk_off, qk_mask, v_off, v_mask, q, k, v, do, decay, b, R, b_last, R_last = _gla_bwd_chunk(
            Q, K, G, V, DO, c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, strict, BT, RESET
        )
        # recomputed: pairs j < i (selected, not multiplied by 0: see the forward) ...
        A = tl.sum(tl.where(strict[:, :, None], q[:, None, :] * k[None, :, :] * decay, 0.0), axis=2)
        A += tl.where(eye, tl.sum(q * k, axis=1)[:, None], 0.0)  # ... and j = i
        dA = _dot(do, tl.trans(v), PRECISION, UPCAST)  # (BT, BT): do_i . v_j
        diag_dA = tl.sum(tl.where(eye, dA, 0.0), axis=1)  # (BT,): do_i . v_i
        d_out = tl.exp((b_last[None, :] - b) + (R_last[None, :] - R))  # (BT, BK) decay from row j to the chunk end
        tl.store(HS + c * BK * BV + hs_off, dstate)  # H at this chunk's end, for dg in pass 2
        dstate_op = dstate.to(v.dtype)

        dk = tl.sum(tl.where(strict[:, :, None], dA[:, :, None] * q[:, None, :] * decay, 0.0), axis=0)  # i > j
        dk += _dot(v, tl.trans(dstate_op), PRECISION, UPCAST) * d_out
        dv = _dot(tl.trans(A.to(v.dtype)), do, PRECISION, UPCAST)  # (BT, BV)
        dv += _dot((k * d_out).to(v.dtype), dstate_op, PRECISION, UPCAST)
        tl.store(DG + qk_off, k * dk, mask=qk_mask)  # the k side of dG, for pass 2
        tl.store(DK + qk_off, dk + diag_dA[:, None] * q, mask=qk_mask)
        tl.store(DV + v_off, dv.to(DV.dtype.element_ty), mask=v_mask)

        q_in = (q * tl.exp(b + R)).to(v.dtype)
        dstate = dstate * tl.exp(b_last + R_last)[:, None] + _dot(tl.trans(q_in), do, PRECISION, UPCAST)

    tl.debug_barrier()  # pass 2 reads what other threads of this program wrote to DG and HS

    # Pass 2, forward over the group's chunks: dq needs the state S entering each chunk; then dg.
    state = tl.zeros((BK, BV), dtype=tl.float32)
    if n_groups > 1:
        state = tl.load(SB + (part * n_groups + grp) * BK * BV + hs_off)
    for c in range(c_begin, c_end):
        qk_off, qk_mask, v_off, v_mask, q, k, v, do, decay, b, R, b_last, R_last = _gla_bwd_chunk(
            Q, K, G, V, DO, c, seq_len, k_dim, v_dim, offs_t, offs_k, offs_v, k_ok, v_ok, strict, BT, RESET
        )
        dA = _dot(do, tl.trans(v), PRECISION, UPCAST)
        diag_dA = tl.sum(tl.where(eye, dA, 0.0), axis=1)
        dq = tl.sum(tl.where(strict[:, :, None], dA[:, :, None] * k[None, :, :] * decay, 0.0), axis=1)  # j < i
        dq += _dot(do, tl.trans(state.to(v.dtype)), PRECISION, UPCAST) * tl.exp(b + R)
        tl.store(DQ + qk_off, dq + diag_dA[:, None] * k, mask=qk_mask)

        k_out = (k * tl.exp((b_last[None, :] - b) + (R_last[None, :] - R))).to(v.dtype)
        state = state * tl.exp(b_last + R_last)[:, None] + _dot(tl.trans(k_out), v, PRECISION, UPCAST)
        # dg_t = sum_{s >= t in the chunk} dG_s + sum_v S_end * H_end: the pairs straddling the chunk
        # end, summed directly instead of as a long, cancelling sum of dG over the rest of the sequence.
        dg_after = tl.sum(state * tl.load(HS + c * BK * BV + hs_off), axis=1)  # (BK,)
        dG = q * dq - tl.load(DG + qk_off, mask=qk_mask, other=0.0)  # (BT, BK), 0 on padding rows
        dg = tl.cumsum(dG, axis=0, reverse=True) + dg_after[None, :]
        dg = tl.where(tl.load(G + qk_off, mask=qk_mask, other=0.0).to(tl.float32) < RESET, 0.0, dg)
        # 0 at a reset, whose dg carries a factor exp(g); g is loaded again, not kept live in registers
        tl.store(DG + qk_off, dg, mask=qk_mask)


_launch_fwd = Launcher(_gla_fwd_kernel)
_launch_bwd = Launcher(_gla_bwd_kernel)
_launch_bounds = Launcher(_gla_bounds_kernel)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _plan(q: torch.Tensor, v_dim: int) -> tuple[int, int, int, dict]:
    """(value blocks, groups per sequence, the carry pass's STEP, the kernels' meta) for inputs like q (B, H, T, K).

    BK, BV, num_warps: picked from the register use ptxas reports for sm_90 (compiled ahead of time, not
    timed): the (16, 16, BK) pairwise blocks and the (BK, BV) state and adjoint fill the 255 registers a
    thread may have. With 16-bit inputs BV = 64 spills nothing (at most a few bytes) up to K = 64; float32
    dot operands take twice the registers, so float32 uses narrower value blocks (BV = 32 for K <= 32, 16
    above; about 200 bytes of spill at K = 64). K = 128 spills in every configuration.

    GROUP, rows per program: a program fills an SM's registers (K = 64: 8 warps x 198-255), so groups pay only
    while the programs are fewer than the SMs. At the model's shapes (128 programs, 132 SMs) 4-5 groups made
    forward + backward 1.2-1.3x slower (1.97 against 1.66 ms at B16 H8 T1024, H200, 2026-12-04): the carry
    pass adds work, no SM. Under the CPU interpreter 32 rows, so the tests' sequences cross groups.
    """
    B, H, T, k_dim = q.shape
    bk = max(16, triton.next_power_of_2(k_dim))  # tl.dot needs every dim >= 16
    cap = 64 if q.dtype != torch.float32 else (32 if bk <= 32 else 16)
    bv = min(cap, max(16, triton.next_power_of_2(v_dim)))
    n_vblocks = triton.cdiv(v_dim, bv)
    want = max(1, _sm_count(q.device) // (n_vblocks * B * H)) if q.is_cuda else 1  # groups per sequence
    group = 64 * max(1, -(-T // (64 * want))) if q.is_cuda else 2 * CHUNK
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # the latter is ignored for 16-bit operands
    upcast = q.dtype == torch.bfloat16 and not q.is_cuda and os.environ.get("TRITON_INTERPRET", "") == "1"
    meta = dict(
        BK=bk, BV=bv, GROUP=group, PRECISION=precision, UPCAST=upcast, RESET=RESET, num_warps=4 if bk == 16 else 8
    )
    return n_vblocks, max(1, -(-T // group)), min(group, 64), meta


def gla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """o (B, H, T, V) of gated linear attention with log-decays g (B, H, T, K), in v's dtype."""
    B, H, T, k_dim = q.shape
    v_dim = v.shape[-1]
    q, k, v, g = (t.contiguous() for t in (q, k, v, g))
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if o.numel() == 0 or q.numel() == 0:
        return o.zero_()
    n_vblocks, n_groups, step, meta = _plan(q, v_dim)
    sb = _bounds(q, k, v, g, None, n_vblocks, n_groups, step, meta)
    _launch_fwd((n_vblocks * B * H * n_groups,), q, k, v, g, o, sb, T, k_dim, v_dim, B * H, n_groups, BT=CHUNK, **meta)
    return o


def _bounds(q, k, v, g, do, n_vblocks, n_groups, step, meta):
    """SB, or (SB, HB) given do: the carries entering the groups; a stand-in, unread, for one group a sequence."""
    B, H, T, k_dim = q.shape
    n = 1 if do is None else 2
    shape = (n, n_vblocks, B * H, n_groups, meta["BK"], meta["BV"]) if n_groups > 1 else (2, 1)
    carries = torch.empty(shape, dtype=torch.float32, device=q.device)
    if n_groups > 1:
        args = (q, k, v, g, v if do is None else do, carries[0], carries[-1], T, k_dim, v.shape[-1], B * H, n_groups)
        _launch_bounds((n * n_vblocks * B * H,), *args, STEP=step, **meta)
    return carries[0] if do is None else (carries[0], carries[-1])


def gla_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, do: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg) of gated linear attention given the output's gradient do, each in its input's dtype."""
    B, H, T, k_dim = q.shape
    v_dim = v.shape[-1]
    q, k, v, g = (t.contiguous() for t in (q, k, v, g))
    do = do.to(v.dtype).contiguous()  # autograd hands do in o's dtype (v's); a direct caller might not
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0 or v.numel() == 0:
        return q.new_zeros(q.shape), k.new_zeros(k.shape), dv.zero_(), g.new_zeros(g.shape)
    n_vblocks, n_groups, step, meta = _plan(q, v_dim)  # after the check: no programs, no plan
    # float32 partials, one slice per value block: dq, dk and dg sum over all V columns.
    dq, dk, dg = (torch.empty((n_vblocks, B, H, T, k_dim), dtype=torch.float32, device=q.device) for _ in range(3))
    h_ends = q.new_empty((n_vblocks, B * H, triton.cdiv(T, CHUNK), meta["BK"], meta["BV"]), dtype=torch.float32)
    sb, hb = _bounds(q, k, v, g, do, n_vblocks, n_groups, step, meta)
    args = (q, k, v, g, do, dq, dk, dv, dg, h_ends, sb, hb, T, k_dim, v_dim, B * H, n_groups)
    _launch_bwd((n_vblocks * B * H * n_groups,), *args, BT=CHUNK, **meta)
    dq, dk, dg = (t.sum(0) if n_vblocks > 1 else t[0] for t in (dq, dk, dg))  # (B, H, T, K) float32
    return dq.to(q.dtype), dk.to(k.dtype), dv, dg.to(g.dtype)
