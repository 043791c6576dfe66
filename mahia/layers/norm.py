"""RMSNorm, with and without a fused residual add: the eager reference and the module.

    rms_norm(x, w)[..., j] = x[..., j] / sqrt(mean_j(x^2) + eps) * w[j]

computed in float32 (float64 for float64 inputs) and cast back to the dtype of ``x``. The Triton
kernels in :mod:`mahia.kernels.rmsnorm` compute the same function; ``RMSNorm(impl=...)`` picks one.
"""
from __future__ import annotations

import torch
from torch import nn

from mahia.checks import check_int
from mahia import kernels
from mahia.kernels._registry import check_rms_norm_inputs

__all__ = ["rms_norm_eager", "add_rms_norm_eager", "RMSNorm"]

IMPLS = ("eager", "triton")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float32 math for half types; float64 stays float64 so the eager path doubles as the reference.
    return torch.promote_types(dtype, torch.float32)


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, in float32, returned in ``x.dtype``.  x: (..., N)."""
    check_rms_norm_inputs("rms_norm_eager", x, weight, eps=eps)
    xf = x.to(_compute_dtype(x.dtype))
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return (xf * rstd * weight.to(xf.dtype)).to(x.dtype)


def add_rms_norm_eager(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual (in ``x.dtype``); y = rms_norm(h).  Returns (y, h), the pre-norm block's pair."""
    check_rms_norm_inputs("add_rms_norm_eager", x, weight, residual, eps)
    h = x + residual
    return rms_norm_eager(h, weight, eps), h


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a learned scale (initialised to ones).

    ``forward(x)`` returns ``y``; ``forward(x, residual)`` adds first and returns ``(y, h)`` with
    ``h = x + residual``, so a pre-norm block reads its residual stream once instead of twice.
    ``impl="triton"`` runs :func:`mahia.kernels.rms_norm` / :func:`mahia.kernels.add_rms_norm`
    (which fall back to the eager reference, with a warning, where Triton cannot run).
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, impl: str = "eager",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl must be one of {IMPLS}, got {impl!r}")
        check_int("RMSNorm", "dim", dim)
        self.dim, self.eps, self.impl = dim, eps, impl
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            norm = kernels.rms_norm if self.impl == "triton" else rms_norm_eager
            return norm(x, self.weight, self.eps)
        add_norm = kernels.add_rms_norm if self.impl == "triton" else add_rms_norm_eager
        return add_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, impl={self.impl!r}"
