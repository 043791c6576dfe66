"""RMSNorm, with and without a fused residual add: the module.

    rms_norm(x, w)[..., j] = x[..., j] / sqrt(mean_j(x^2) + eps) * w[j]

computed in float32 (float64 for float64 inputs) and cast back to the dtype of ``x``. The eager
reference and the Triton kernels live in :mod:`mahia.ops.rmsnorm`; ``RMSNorm(impl=...)`` picks one.
"""

from __future__ import annotations

import torch
from torch import nn

from mahia.measure.checks import check_int
from mahia.ops.rmsnorm import add_rms_norm, add_rms_norm_eager, rms_norm, rms_norm_eager

__all__ = ["RMSNorm"]

IMPLS = ("eager", "triton")


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a learned scale (ones at init). ``forward(x, residual)`` adds first and
    returns ``(y, h)`` with ``h = x + residual``: a pre-norm block reads its residual stream once, not twice.
    ``impl="triton"``: :func:`mahia.ops.rms_norm` / :func:`mahia.ops.add_rms_norm` (eager fallback, with a
    warning, where Triton cannot run). ``autocast_out=True``, for a norm whose output only feeds matmuls: under
    autocast y comes out in the autocast dtype, written so by the norm itself (the bits the matmul's cast would
    give, without that cast's kernel and bytes, and in the backward the gradient's cast back)."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        *,
        impl: str = "eager",
        autocast_out: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl must be one of {IMPLS}, got {impl!r}")
        check_int("RMSNorm", "dim", dim)
        self.dim, self.eps, self.impl, self.autocast_out = dim, eps, impl, autocast_out
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        out = None  # meta tensors (FLOP counts) have no autocast state to ask
        if self.autocast_out and not x.is_meta and torch.is_autocast_enabled(x.device.type):
            out = torch.get_autocast_dtype(x.device.type)
        if residual is None:
            norm = rms_norm if self.impl == "triton" else rms_norm_eager
            return norm(x, self.weight, self.eps, out_dtype=out)
        add_norm = add_rms_norm if self.impl == "triton" else add_rms_norm_eager
        return add_norm(x, residual, self.weight, self.eps, out_dtype=out)
