"""SwiGLU feed-forward: the module (the activation's eager reference and kernels are in :mod:`mahia.ops.swiglu`).

    swiglu(a, b) = silu(a) * b = a * sigmoid(a) * b
    SwiGLU(x)    = w3( swiglu(x @ [W1 | W2]^T) ),  W1 and W2 stored as one (2*hidden, dim) matrix ``w12``

The activation is computed in float32 (float64 for float64 inputs) and returned in the input dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from mahia.measure.checks import check_int
from mahia.ops.swiglu import swiglu, swiglu_eager

__all__ = ["SwiGLU"]

IMPLS = ("eager", "triton")


class SwiGLU(nn.Module):
    """The Llama feed-forward block: one fused up projection ``w12`` (gate and up halves), SwiGLU, ``w3``.
    ``impl="triton"`` runs the activation through :func:`mahia.ops.swiglu` on the packed halves (read in
    place, one gradient tensor written); the matrix products are cuBLAS either way."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        impl: str = "eager",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"SwiGLU: impl must be one of {IMPLS}, got {impl!r}")
        for name, v in (("dim", dim), ("hidden", hidden)):
            check_int("SwiGLU", name, v)
        self.dim, self.hidden, self.impl = dim, hidden, impl
        self.w12 = nn.Linear(dim, 2 * hidden, bias=False, device=device, dtype=dtype)
        self.w3 = nn.Linear(hidden, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = swiglu if self.impl == "triton" else swiglu_eager
        return self.w3(act(self.w12(x)))  # w12(x): (..., 2 hidden) = [gate | up]; act: (..., hidden)
