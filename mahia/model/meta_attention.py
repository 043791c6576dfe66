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
3. ``"triton"``: the same chunked form in the Triton kernels of :mod:`mahia.ops.gla_scan` (forward
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

from mahia.measure.checks import check_float_tensor, check_int
from mahia.ops.gla_scan import IMPLS, gated_linear_attention

__all__ = ["IMPLS", "MetaAttention"]


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

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        key_dim: int | None = None,
        value_dim: int | None = None,
        impl: str = "triton",
        gate_temperature: float = 16.0,
        gate_rank: int = 16,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        for name, n in (("dim", dim), ("n_heads", n_heads), ("gate_rank", gate_rank)):
            check_int("MetaAttention", name, n)
        if (key_dim is None or value_dim is None) and dim % n_heads:
            raise ValueError(
                f"MetaAttention: dim ({dim}) must be divisible by n_heads ({n_heads}) "
                "unless key_dim and value_dim are given"
            )
        key_dim = dim // n_heads if key_dim is None else key_dim
        value_dim = dim // n_heads if value_dim is None else value_dim
        for name, n in (("key_dim", key_dim), ("value_dim", value_dim)):
            check_int("MetaAttention", name, n)
        if impl not in IMPLS:
            raise ValueError(f"MetaAttention: impl must be one of {IMPLS}, got {impl!r}")
        if not (
            isinstance(gate_temperature, (int, float)) and math.isfinite(gate_temperature) and gate_temperature > 0
        ):
            raise ValueError(
                f"MetaAttention: gate_temperature must be a positive finite number, got {gate_temperature!r}"
            )
        self.dim, self.n_heads, self.key_dim, self.value_dim = dim, n_heads, key_dim, value_dim
        self.impl, self.gate_temperature = impl, float(gate_temperature)
        fk = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(dim, n_heads * key_dim, bias=False, **fk)
        self.k_proj = nn.Linear(dim, n_heads * key_dim, bias=False, **fk)
        self.v_proj = nn.Linear(dim, n_heads * value_dim, bias=False, **fk)
        self.gate_proj = nn.Sequential(
            nn.Linear(dim, gate_rank, bias=False, **fk), nn.Linear(gate_rank, n_heads * key_dim, bias=True, **fk)
        )
        self.o_proj = nn.Linear(n_heads * value_dim, dim, bias=False, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor("MetaAttention", "x", x)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"MetaAttention: x must be (B, T, dim={self.dim}), got shape {tuple(x.shape)}")
        w = self.q_proj.weight
        if x.device != w.device:
            raise ValueError(f"MetaAttention: x is on {x.device} but the parameters are on {w.device}")
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"MetaAttention: x has dtype {x.dtype} but the parameters are {w.dtype}; "
                "convert one of them (e.g. module.to(x.dtype)) or run under torch.autocast"
            )
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.value_dim

        def heads(t: torch.Tensor, d: int) -> torch.Tensor:  # (B, T, H * d) -> (B, H, T, d)
            return t.view(B, T, H, d).transpose(1, 2)

        q = heads(self.q_proj(x), K) * K**-0.5
        k = heads(self.k_proj(x), K)
        v = heads(self.v_proj(x), V)
        g = heads(F.logsigmoid(self.gate_proj(x)) / self.gate_temperature, K)  # <= 0
        o = gated_linear_attention(q, k, v, g, impl=self.impl)  # (B, H, T, V)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * V))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, n_heads={self.n_heads}, key_dim={self.key_dim}, value_dim={self.value_dim}, "
            f"impl={self.impl!r}, gate_temperature={self.gate_temperature}"
        )
