"""MetaAttention: gated linear attention (GLA), a linear recurrence with a per-channel forget gate.

Per batch and head, with key dim K and value dim V, a state S_t (K, V), S_0 = 0:

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,        o_t = S_t^T q_t

with log-decays g = logsigmoid(x W_g) / temperature <= 0 from the input (Gated Linear Attention, Yang
et al., 2023; the temperature, 16 there, keeps most decays near 1 so the state remembers). The three
paths of :func:`mahia.ops.gla_scan.gated_linear_attention` (``impl=``) compute this same function: "loop"
(the recurrence, the float64 reference), "logspace" (chunked in log space, every exponent <= 0: exact
at any length) and "triton" (the same chunked form fused; falls back to "logspace" with one warning
where Triton cannot run). All compute in float32 (float64 for float64 inputs) and return v's dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mahia.measure.checks import check_float_tensor, check_int
from mahia.ops.gla_scan import IMPLS, gated_linear_attention

__all__ = ["IMPLS", "MetaAttention"]


class MetaAttention(nn.Module):
    """Multi-head gated linear attention over x (B, T, dim) -> (B, T, dim).

    Per head: q = x W_q / sqrt(K), k = x W_k, v = x W_v, g = logsigmoid(x W_g1 W_g2 + b_g) / temperature
    (a low-rank gate of rank ``gate_rank``, as in GLA), o = gated_linear_attention(q, k, v, g), and
    the heads concatenated go through W_o back to dim. W_q, W_k, W_v and W_g1 are one matrix, ``in_proj``
    (one matmul); W_g2, b_g are ``gate_up``. ``key_dim`` and ``value_dim`` are per head
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
        if not (isinstance(gate_temperature, (int, float)) and 0 < gate_temperature < math.inf):
            raise ValueError(
                f"MetaAttention: gate_temperature must be a positive finite number, got {gate_temperature!r}"
            )
        self.dim, self.n_heads, self.key_dim, self.value_dim = dim, n_heads, key_dim, value_dim
        self.impl, self.gate_temperature = impl, float(gate_temperature)
        fk = {"device": device, "dtype": dtype}
        self.gate_rank = gate_rank
        # q, k, v and the gate's low-rank code in one matmul. nn.Linear's default init depends only on
        # fan_in = dim, so the fused weight draws from the same distribution as four separate ones.
        self.in_proj = nn.Linear(dim, n_heads * (2 * key_dim + value_dim) + gate_rank, bias=False, **fk)
        self.gate_up = nn.Linear(gate_rank, n_heads * key_dim, bias=True, **fk)
        self.o_proj = nn.Linear(n_heads * value_dim, dim, bias=False, **fk)

    def _project(self, x: torch.Tensor):
        """q (unscaled), k, v and the gate's logits z from x (B, T, dim): (B, T, H*K) x 2, (B, T, H*V), (B, T, H*K).
        The scan scales q by 1/sqrt(K) and takes the log-decays logsigmoid(z) / temperature <= 0 itself."""
        HK, HV = self.n_heads * self.key_dim, self.n_heads * self.value_dim
        q, k, v, r = self.in_proj(x).split([HK, HK, HV, self.gate_rank], dim=-1)  # views; r: (B, T, gate_rank)
        # r as the 2-D view it is: the bias goes into the matmul (addmm), not into a kernel of its own
        return q, k, v, self.gate_up(r.flatten(0, 1)).unflatten(0, x.shape[:2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor("MetaAttention", "x", x)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"MetaAttention: x must be (B, T, dim={self.dim}), got shape {tuple(x.shape)}")
        w = self.in_proj.weight
        if x.device != w.device or (x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type)):
            raise TypeError(
                f"MetaAttention: x has dtype {x.dtype} but the parameters are {w.dtype} (x on {x.device}, they on "
                f"{w.device}); convert one of them (module.to(x)) or run under torch.autocast"
            )
        B, T, _ = x.shape
        H, V = self.n_heads, self.value_dim
        # (B, T, H * d) -> (B, H, T, d) views: the Triton scan reads them in place (k, v inside the projection's
        # output) and writes o as (B, T, H, V) memory, so no copy on either side of it
        q, k, v, z = (t.view(B, T, H, -1).transpose(1, 2) for t in self._project(x))
        kw = dict(scale=self.key_dim**-0.5, gate_temperature=self.gate_temperature)
        o = gated_linear_attention(q, k, v, z, impl=self.impl, **kw)  # (B, H, T, V)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * V))

    def decode(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``self(x)`` for T new tokens x (B, T, dim) continuing from ``state`` (B, H, K, V) float32 (zeros
        before the first token), by the recurrence; ``state`` is updated in place. With T = 1 the shapes
        are static, so a decode step can be captured in a CUDA graph."""
        B, T, _ = x.shape
        H, V = self.n_heads, self.value_dim
        dt = state.dtype
        q, k, v, z = (t.view(B, T, H, -1).to(dt) for t in self._project(x))
        q, g = q * self.key_dim**-0.5, F.logsigmoid(z) / self.gate_temperature
        S, outs = state, []
        for t in range(T):
            S = g[:, t].exp().unsqueeze(-1) * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)  # (B, H, K, V)
            outs.append((q[:, t].unsqueeze(-2) @ S).squeeze(-2))  # (B, H, V)
        state.copy_(S)
        o = torch.stack(outs, dim=1).to(x.dtype)  # (B, T, H, V)
        return self.o_proj(o.reshape(B, T, H * V))
