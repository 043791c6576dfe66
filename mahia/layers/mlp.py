"""SwiGLU feed-forward: the eager activation reference and the module.

    swiglu(a, b) = silu(a) * b = a * sigmoid(a) * b
    SwiGLU(x)    = w3( swiglu(x @ W1^T, x @ W2^T) ),  with W1 and W2 stored as one (2*hidden, dim) matrix

The activation is computed in float32 (float64 for float64 inputs) and returned in the input dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mahia.checks import check_int
from mahia import kernels
from mahia.kernels._registry import check_swiglu_inputs

__all__ = ["swiglu_eager", "SwiGLU"]

IMPLS = ("eager", "triton")


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = silu(a) * b, computed in float32 and returned in ``a.dtype``.  a, b: (..., H)."""
    check_swiglu_inputs("swiglu_eager", a, b)
    dt = torch.promote_types(a.dtype, torch.float32)
    return (F.silu(a.to(dt)) * b.to(dt)).to(a.dtype)


class SwiGLU(nn.Module):
    """The Llama feed-forward block: one fused up projection ``w12`` (gate and up halves), SwiGLU, ``w3``.

    ``impl="triton"`` runs the activation through :func:`mahia.kernels.swiglu`; the two matrix
    products are cuBLAS either way. The gate/up halves are strided views of the ``w12`` output (last dim
    contiguous), which the kernel reads in place, without a copy.
    """

    def __init__(self, dim: int, hidden: int, *, impl: str = "eager", bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"SwiGLU: impl must be one of {IMPLS}, got {impl!r}")
        for name, v in (("dim", dim), ("hidden", hidden)):
            check_int("SwiGLU", name, v)
        self.dim, self.hidden, self.impl = dim, hidden, impl
        self.w12 = nn.Linear(dim, 2 * hidden, bias=bias, device=device, dtype=dtype)
        self.w3 = nn.Linear(hidden, dim, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)  # (..., hidden) each
        act = kernels.swiglu if self.impl == "triton" else swiglu_eager
        return self.w3(act(gate, up))  # (..., dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, impl={self.impl!r}"
