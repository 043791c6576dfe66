"""Rotary position embedding (RoPE), rotate-half convention (Llama / Hugging Face).

For a head vector x of size D, split into halves x1 = x[:D/2], x2 = x[D/2:], at position t:

    theta_i = base^(-2i/D),   cos = cos(t * theta), sin = sin(t * theta)      (i = 0 .. D/2-1)
    rope(x) = cat(x1 * cos - x2 * sin,  x2 * cos + x1 * sin)

The backward pass is the inverse rotation (the same formula with sin negated). One fp32 cos/sin
cache, :class:`RotaryCache`, serves every layer of a model.
"""

from __future__ import annotations

import torch
from torch import nn

from mahia.measure.checks import check_int
from mahia.ops.rope import apply_rope_eager, rope

__all__ = ["RotaryCache", "apply_rope"]

IMPLS = ("eager", "triton")


class RotaryCache(nn.Module):
    """cos/sin tables (max_seq_len, head_dim // 2) in float32, one per model for all layers (``get(T, offset)``).
    The angles are computed in float64 before rounding, which keeps cos/sin accurate at large positions."""

    def __init__(
        self, head_dim: int, max_seq_len: int, base: float = 10000.0, device: torch.device | str | None = None
    ):
        super().__init__()
        if not (isinstance(head_dim, int) and head_dim > 0 and head_dim % 2 == 0):
            raise ValueError(f"RotaryCache: head_dim must be a positive even int, got {head_dim!r}")
        check_int("RotaryCache", "max_seq_len", max_seq_len)
        if not base > 0:
            raise ValueError(f"RotaryCache: base must be > 0, got {base!r}")
        self.head_dim, self.max_seq_len, self.base = head_dim, max_seq_len, float(base)
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64, device=device), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)  # (max_seq_len, D/2)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def get(self, seq_len: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for positions offset .. offset+seq_len-1, each (seq_len, head_dim // 2)."""
        if seq_len < 0 or offset < 0:
            raise ValueError(f"RotaryCache.get: seq_len and offset must be >= 0, got {seq_len}, {offset}")
        if offset + seq_len > self.max_seq_len:
            raise ValueError(
                f"RotaryCache.get: positions up to offset + seq_len = {offset + seq_len} "
                f"exceed max_seq_len = {self.max_seq_len}; build the cache longer"
            )
        return self.cos[offset : offset + seq_len], self.sin[offset : offset + seq_len]


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: str = "eager"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope_eager` (``impl="eager"``) or :func:`mahia.ops.rope` (``impl="triton"``)."""
    if impl == "eager":
        return apply_rope_eager(q, k, cos, sin)
    if impl == "triton":
        return rope(q, k, cos, sin)
    raise ValueError(f"apply_rope: impl must be one of {IMPLS}, got {impl!r}")
