"""Input checks shared by the model's components."""

from __future__ import annotations

import torch


def check_btd(x: torch.Tensor, name: str = "x") -> None:
    """``x`` must be a non-empty floating-point (B, T, D) tensor; else a clear error naming it."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"{name} must be a (B, T, D) tensor, got {getattr(x, 'shape', type(x))}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one sample and one token, got shape {tuple(x.shape)}")
