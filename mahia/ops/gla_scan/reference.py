"""The PyTorch paths of gated linear attention: the recurrence (the float64 reference), the chunked log-space
form, and the counts of FLOPs and bytes. The math is in :mod:`mahia.ops.gla_scan`; the public function there
checks and dispatches.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from mahia.measure.checks import check_float_tensor, check_int, check_same_device

LOGSPACE_CHUNK = 16
# A log-decay below RESET is a full reset of its key channel: exp(-60) = 9e-27, too small to leave a trace in
# any float32 sum it joins. The chunked paths leave such gates out of their cumulative sums (a -1e30 would
# absorb every small gate added after it; a -inf would give -inf - -inf = NaN) and zero every decay across them.
RESET = -60.0


def check_gla_inputs(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> None:
    """q, k, g (B, H, T, K) and v (B, H, T, V); floating point; q, k, v of one dtype; one device."""
    named = {"q": q, "k": k, "v": v, "g": g}
    for name, t in named.items():
        check_float_tensor(fn, name, t)
        if t.dim() != 4:
            last = "V" if name == "v" else "K"
            raise ValueError(f"{fn}: {name} must be 4-D (B, H, T, {last}), got shape {tuple(t.shape)}")
    for name in ("k", "g"):
        if named[name].shape != q.shape:
            raise ValueError(f"{fn}: {name} must have the shape of q {tuple(q.shape)}, got {tuple(named[name].shape)}")
    if v.shape[:3] != q.shape[:3]:
        B, H, T, _ = q.shape
        raise ValueError(
            f"{fn}: v must be (B, H, T, V) = ({B}, {H}, {T}, V) to match q {tuple(q.shape)}, got {tuple(v.shape)}"
        )
    for name in ("k", "v"):
        if named[name].dtype != q.dtype:
            raise TypeError(f"{fn}: {name} must have the dtype of q ({q.dtype}), got {named[name].dtype}")
    check_same_device(fn, **named)


def _empty_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The (B, H, 0, V) output of T = 0, attached to the autograd graph through every input (zero
    gradients), so that autograd.grad over q, k, v, g reports no unused input."""
    return v * 0 + (q.sum() + k.sum() + g.sum()).to(v.dtype) * 0


# Path 1: the recurrence, one step at a time
def gla_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T;  o_t = S_t^T q_t.  Returns (B, H, T, V) in v's dtype."""
    check_gla_inputs("gla_loop", q, k, v, g)
    return _gla_loop(q, k, v, g)


def _outside_autocast(fn):
    """Run a PyTorch path with autocast off on its device: these paths compute in float32 (float64 for
    float64), and under autocast their matmuls would run in the autocast dtype instead. (The Triton path launches
    kernels, which autocast does not see.)"""

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
    out_dtype, dt = v.dtype, torch.promote_types(q.dtype, torch.float32)  # float64 stays: the loop is the reference
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


# Path 2: vectorized in log space
def gla_logspace(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *, chunk_size: int = LOGSPACE_CHUNK
) -> torch.Tensor:
    """Chunked log-space form (:mod:`mahia.ops.gla_scan`): pairwise decays inside a chunk, the state between.

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
    out_dtype, dt = v.dtype, torch.promote_types(q.dtype, torch.float32)
    if T == 0:
        return _empty_output(q, k, v, g)
    C = chunk_size
    N = -(-T // C)  # chunks
    pad = N * C - T

    def chunks(t: torch.Tensor) -> torch.Tensor:  # (B, H, T, D) -> (B, H, N, C, D), zero-padded
        t = F.pad(t.to(dt), (0, 0, 0, pad))  # g = 0 and k = v = 0 on padding rows: no effect
        return t.view(B, H, N, C, t.shape[-1])

    q, k, v, g = (chunks(t) for t in (q, k, v, g))
    reset = g < RESET  # (B, H, N, C, K)
    r = reset.cumsum(dim=3)  # resets from the chunk start through row i
    b = torch.where(reset, 0.0, g).cumsum(dim=3)  # log-decay from the chunk start through row i, resets left out
    b_last, r_last = b[:, :, :, -1:, :], r[:, :, :, -1:, :]  # (B, H, N, 1, K)

    # Intra-chunk: A_ij = sum_c q_ic k_jc exp(b_ic - b_jc) for j <= i with no reset in between (else 0).
    # The terms above the diagonal are selected away (where), not multiplied by 0: a NaN or Inf in k_j
    # or v_j must not reach the rows i < j, in the forward or (through autograd) the backward.
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril().unsqueeze(-1)  # (C, C, 1)
    diff = b.unsqueeze(4) - b.unsqueeze(3)  # (B, H, N, C_i, C_j, K) = b_i - b_j
    decay = diff.masked_fill(~causal | (r.unsqueeze(4) != r.unsqueeze(3)), float("-inf")).exp()
    k_dec = torch.where(causal, k.unsqueeze(3) * decay, 0.0)  # k_j decayed to row i, for j <= i
    A = torch.where(causal[..., 0], (q.unsqueeze(4) * k_dec).sum(-1), 0.0)  # (B, H, N, C, C)
    # A v, where v's non-finite entries must reach only the rows at and after them (0 * NaN in the
    # matmul would reach every row of the chunk): rows before a column's first non-finite entry take
    # the product with those entries zeroed, the others the plain product (its NaN, and its gradient).
    finite = torch.isfinite(v)
    after_bad = (~finite).cumsum(dim=3) > 0  # (B, H, N, C, V)
    o = torch.where(after_bad, A @ v, A @ torch.where(finite, v, 0.0))

    # Inter-chunk: carry S (B, H, K, V) across the N chunks; all factors in [0, 1], 0 across a reset.
    q_in = q * torch.where(r == 0, b.exp(), 0.0)  # decay from the chunk start to row i
    k_out = k * torch.where(r == r_last, (b_last - b).exp(), 0.0)  # decay from row j to the chunk end
    chunk_decay = torch.where(r_last == 0, b_last.exp(), 0.0).transpose(-1, -2)  # (B, H, N, K, 1)
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
