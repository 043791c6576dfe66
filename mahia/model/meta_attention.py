"""MetaAttention: gated linear attention (GLA), a linear recurrence with a per-channel forget gate.

Per batch b and head h, with key dim K and value dim V, a state S_t in R^{K x V} with S_0 = 0 and

    S_t = diag(a_t) S_{t-1} + k_t v_t^T,        o_t = S_t^T q_t        (o_t in R^V)

where a_t = exp(g_t) in (0, 1]^K decays each key channel of the state. The log-decays g_t = log a_t <= 0
come from the input: g = logsigmoid(x W_g) / temperature, as in Gated Linear Attention (Yang et al.,
2023; the temperature, 16 there, keeps most decays close to 1 so the state remembers). Unrolled, with
G_t = g_1 + ... + g_t (a cumulative sum, per channel):

    o_t = sum_{s <= t} ((q_t * exp(G_t - G_s)) . k_s) v_s

Three paths compute this same function (``impl=``):

1. ``"loop"``: the recurrence itself, a Python loop over t carrying S. Readable, and the float64
   reference; a few small kernel launches per step, so slow.
2. ``"logspace"``: vectorized PyTorch, chunked in log space. The tempting vectorization,
   :func:`naive_cumprod_form`, writes exp(G_t - G_s) = exp(G_t) exp(-G_s) and turns the sum into one
   masked (T x T) matmul; but exp(-G_s) grows like exp(s |g|) and overflows float32 (exp(88.7)) once
   |G| passes ~88: about 1800 steps at the typical |g| ~ 0.05 of temperature 16. The stable form
   splits T into chunks of C rows, with b_i = G_i - G_{chunk start - 1} (the decay since the chunk
   start, <= 0):

       o_i = (q_i * exp(b_i)) S_prev                              state from earlier chunks
           + sum_{j <= i in chunk} (sum_c q_ic k_jc exp(b_ic - b_jc)) v_j       pairwise, per chunk
       S_next = exp(b_last) * S_prev + sum_j (k_j * exp(b_last - b_j)) v_j^T

   Every exponent is <= 0, so every factor is in [0, 1]: exact at any length. The pairwise decays
   cost a (C, C, K) tensor per chunk (hence C = 16); the state passes between chunks in a short loop
   of T / C steps of batched matmuls.
3. ``"triton"``: the same chunked form in the Triton kernels of :mod:`mahia.kernels.scan` (forward
   and backward, fused, the state in registers). Where Triton cannot run on the input (a CPU tensor
   without ``TRITON_INTERPRET=1``, ``MAHIA_DISABLE_TRITON=1``, no triton) it falls back to
   ``"logspace"`` with one warning.

All paths compute in float32 (float64 for float64 inputs) and return v's dtype.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mahia.checks import check_int
from mahia.kernels._registry import (
    check_float_tensor,
    check_gla_inputs,
    triton_available_for,
    triton_import_error,
    warn_fallback_once,
)

if triton_import_error() is None:
    from mahia.kernels import scan as _scan

__all__ = [
    "IMPLS",
    "MetaAttention",
    "gated_linear_attention",
    "gla_loop",
    "gla_logspace",
    "naive_cumprod_form",
    "check_gla_inputs",
    "gla_flops",
    "gla_bytes",
]

IMPLS = ("loop", "logspace", "triton")
LOGSPACE_CHUNK = 16


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float32 math for half types; float64 stays float64 so the loop doubles as the reference.
    return torch.promote_types(dtype, torch.float32)


# --------------------------------------------------------------------------------------------------
# Path 1: the recurrence, one step at a time
# --------------------------------------------------------------------------------------------------


def gla_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T;  o_t = S_t^T q_t.  Returns (B, H, T, V) in v's dtype."""
    check_gla_inputs("gla_loop", q, k, v, g)
    B, H, T, K = q.shape
    V = v.shape[-1]
    out_dtype, dt = v.dtype, _compute_dtype(q.dtype)
    if T == 0:
        return v * 0  # (B, H, 0, V), still attached to the autograd graph
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


def gla_logspace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *,
                 chunk_size: int = LOGSPACE_CHUNK) -> torch.Tensor:
    """Chunked log-space form (module docstring): pairwise decays inside a chunk, the state between.

    Every exponent is a difference b_i - b_j with j <= i (or b_last - b_j, or b_i), so <= 0: no
    overflow at any length. Memory: a (B, H, T, C, K) tensor of pairwise decays.
    """
    check_gla_inputs("gla_logspace", q, k, v, g)
    check_int("gla_logspace", "chunk_size", chunk_size)
    B, H, T, K = q.shape
    V = v.shape[-1]
    out_dtype, dt = v.dtype, _compute_dtype(q.dtype)
    if T == 0:
        return v * 0
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
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = b.unsqueeze(4) - b.unsqueeze(3)  # (B, H, N, C_i, C_j, K) = b_i - b_j
    decay = diff.masked_fill(~causal.unsqueeze(-1), float("-inf")).exp()
    A = (q.unsqueeze(4) * k.unsqueeze(3) * decay).sum(-1)  # (B, H, N, C, C)
    o = A @ v  # (B, H, N, C, V)

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


# --------------------------------------------------------------------------------------------------
# The functional entry point
# --------------------------------------------------------------------------------------------------

def gated_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *,
                           impl: str) -> torch.Tensor:
    """o_t = S_t^T q_t with S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T  (module docstring).

    q, k: (B, H, T, K); v: (B, H, T, V); g: (B, H, T, K) log-decays, <= 0 (not checked: a check
    reads the data, a host sync). Returns (B, H, T, V) in v's dtype. ``impl``: "loop", "logspace"
    or "triton" (falls back to "logspace", with one warning, where Triton cannot run on the input;
    float64 inputs take "logspace" silently, since the kernels compute in float32).
    """
    if impl not in IMPLS:
        raise ValueError(f"gated_linear_attention: impl must be one of {IMPLS}, got {impl!r}")
    check_gla_inputs("gated_linear_attention", q, k, v, g)
    if impl == "loop":
        return gla_loop(q, k, v, g)
    if impl == "triton" and q.dtype != torch.float64:
        if triton_available_for(q):
            return _scan.gated_linear_attention_triton(q, k, v, g)
        warn_fallback_once("gla", q)
    return gla_logspace(q, k, v, g)


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
# The module
# --------------------------------------------------------------------------------------------------

class MetaAttention(nn.Module):
    """Multi-head gated linear attention over x (B, T, dim) -> (B, T, dim).

    Per head: q = x W_q / sqrt(K), k = x W_k, v = x W_v, g = logsigmoid(x W_g1 W_g2 + b_g) / temperature
    (a low-rank gate of rank ``gate_rank``, as in GLA), o = gated_linear_attention(q, k, v, g), and
    the heads concatenated go through W_o back to dim. ``key_dim`` and ``value_dim`` are per head
    (default dim // n_heads). ``impl`` picks the path ("triton", "logspace" or "loop"); all compute the
    same function.
    """

    def __init__(self, dim: int, n_heads: int, *, key_dim: int | None = None, value_dim: int | None = None,
                 impl: str = "triton", gate_temperature: float = 16.0, gate_rank: int = 16,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        for name, n in (("dim", dim), ("n_heads", n_heads), ("gate_rank", gate_rank)):
            check_int("MetaAttention", name, n)
        if (key_dim is None or value_dim is None) and dim % n_heads:
            raise ValueError(f"MetaAttention: dim ({dim}) must be divisible by n_heads ({n_heads}) "
                             "unless key_dim and value_dim are given")
        key_dim = dim // n_heads if key_dim is None else key_dim
        value_dim = dim // n_heads if value_dim is None else value_dim
        for name, n in (("key_dim", key_dim), ("value_dim", value_dim)):
            check_int("MetaAttention", name, n)
        if impl not in IMPLS:
            raise ValueError(f"MetaAttention: impl must be one of {IMPLS}, got {impl!r}")
        if not (isinstance(gate_temperature, (int, float)) and math.isfinite(gate_temperature)
                and gate_temperature > 0):
            raise ValueError(f"MetaAttention: gate_temperature must be a positive finite number, "
                             f"got {gate_temperature!r}")
        self.dim, self.n_heads, self.key_dim, self.value_dim = dim, n_heads, key_dim, value_dim
        self.impl, self.gate_temperature = impl, float(gate_temperature)
        fk = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(dim, n_heads * key_dim, bias=False, **fk)
        self.k_proj = nn.Linear(dim, n_heads * key_dim, bias=False, **fk)
        self.v_proj = nn.Linear(dim, n_heads * value_dim, bias=False, **fk)
        self.gate_proj = nn.Sequential(nn.Linear(dim, gate_rank, bias=False, **fk),
                                       nn.Linear(gate_rank, n_heads * key_dim, bias=True, **fk))
        self.o_proj = nn.Linear(n_heads * value_dim, dim, bias=False, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor("MetaAttention", "x", x)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"MetaAttention: x must be (B, T, dim={self.dim}), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.value_dim

        def heads(t: torch.Tensor, d: int) -> torch.Tensor:  # (B, T, H * d) -> (B, H, T, d)
            return t.view(B, T, H, d).transpose(1, 2)

        q = heads(self.q_proj(x), K) * K ** -0.5
        k = heads(self.k_proj(x), K)
        v = heads(self.v_proj(x), V)
        g = heads(F.logsigmoid(self.gate_proj(x)) / self.gate_temperature, K)  # <= 0
        o = gated_linear_attention(q, k, v, g, impl=self.impl)  # (B, H, T, V)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * V))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, n_heads={self.n_heads}, key_dim={self.key_dim}, value_dim={self.value_dim}, "
                f"impl={self.impl!r}, gate_temperature={self.gate_temperature}")
