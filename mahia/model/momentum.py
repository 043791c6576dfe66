"""Momentum update of a neural memory (Titans-style "surprise" with decay), in place.

For every memory weight w_i with gradient g_i (of the memory's associative loss) and momentum m_i:

    m_i <- eta_i * m_i - theta_i * g_i          momentum of the surprise; eta = decay, theta = step size
    w_i <- (1 - alpha_i) * w_i + m_i            forgetting gate alpha in [0, 1], then the update

eta, theta and alpha are each a Python float, a 0-dim tensor (e.g. data-dependent, on the device) or a
(L,) tensor (one per layer). Runs under ``torch.no_grad()``; gradients are only read. Tensor values are
not range-checked (that would itself be a sync); Python floats are.

* ``momentum_update_loop`` (before): a Python loop over layers that reads tensor hyper-parameters with
  ``.item()`` (for logging, or a Python-side schedule): up to 3 host syncs and 4 kernels per layer.
* ``momentum_update_foreach`` (after): ``torch._foreach_*`` ops over all layers at once, hyper-parameters
  stay on the device: no sync. A tensor theta costs one temporary theta * g (``_foreach_add_``'s
  ``alpha=`` takes Python numbers only); (L,) tensors are split into L 0-dim tensors, which CUDA runs on
  the foreach slow path (one kernel per layer), still without syncs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["momentum_update_loop", "momentum_update_foreach"]

Hyper = float | torch.Tensor

# Allowed ranges for Python-float hyper-parameters.
_RANGES = {"eta": (0.0, 1.0), "theta": (0.0, float("inf")), "alpha": (0.0, 1.0)}


def _check(fn: str, weights, moms, grads, hyper: dict[str, Hyper]) -> None:
    if not (isinstance(weights, (list, tuple)) and len(weights) == len(moms) == len(grads) > 0):
        raise ValueError(f"{fn}: weights, moms and grads must be lists of tensors of one nonzero length")
    for i, (w, m, g) in enumerate(zip(weights, moms, grads)):
        if not (m.shape == g.shape == w.shape and m.dtype == g.dtype == w.dtype and w.is_floating_point()):
            raise ValueError(
                f"{fn}: layer {i}: weights, moms and grads must share a shape and a floating dtype, got "
                f"{tuple(w.shape)} {w.dtype}, {tuple(m.shape)} {m.dtype}, {tuple(g.shape)} {g.dtype}"
            )
    for name, v in hyper.items():
        if isinstance(v, torch.Tensor):
            if not v.is_floating_point() or v.dim() > 1 or (v.dim() == 1 and len(v) != len(weights)):
                raise ValueError(f"{fn}: {name} must be a floating 0-dim or ({len(weights)},) tensor, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not _RANGES[name][0] <= v <= _RANGES[name][1]:
            raise ValueError(f"{fn}: {name} must be a float in {list(_RANGES[name])} or a tensor, got {v!r}")


def momentum_update_loop(
    weights: Sequence[torch.Tensor],
    moms: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    eta: Hyper,
    theta: Hyper,
    alpha: Hyper,
) -> None:
    """Reference: one layer at a time; tensor hyper-parameters are read with ``.item()`` (a sync each)."""
    _check("momentum_update_loop", weights, moms, grads, dict(eta=eta, theta=theta, alpha=alpha))

    def at(v: Hyper, i: int) -> float:
        if isinstance(v, torch.Tensor):
            return (v[i] if v.dim() == 1 else v).item()  # host sync
        return float(v)

    with torch.no_grad():
        for i, (w, m, g) in enumerate(zip(weights, moms, grads)):
            eta_i, theta_i, alpha_i = at(eta, i), at(theta, i), at(alpha, i)
            m.mul_(eta_i).add_(g, alpha=-theta_i)
            w.mul_(1.0 - alpha_i).add_(m)


def _on_device(v: Hyper, like: torch.Tensor) -> Hyper:
    """A float stays a float; a tensor moves to ``like``'s device (a copy, never a sync) and to at least
    ``like``'s precision, as ``.item()`` (a Python double) gives the loop path."""
    if not isinstance(v, torch.Tensor):
        return float(v)
    return v.to(device=like.device, dtype=torch.promote_types(v.dtype, like.dtype))


def _per_layer(v: Hyper) -> float | torch.Tensor | list[torch.Tensor]:
    """The forms ``torch._foreach_mul_`` takes: a float, a 0-dim tensor, or one 0-dim tensor per layer."""
    return list(v.unbind(0)) if isinstance(v, torch.Tensor) and v.dim() == 1 else v


def momentum_update_foreach(
    weights: Sequence[torch.Tensor],
    moms: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    eta: Hyper,
    theta: Hyper,
    alpha: Hyper,
) -> None:
    """Fast path: multi-tensor ``torch._foreach_*`` ops over all layers, no ``.item()``, in place."""
    _check("momentum_update_foreach", weights, moms, grads, dict(eta=eta, theta=theta, alpha=alpha))
    weights, moms, grads = list(weights), list(moms), list(grads)
    with torch.no_grad():
        eta_d, theta_d, alpha_d = (_on_device(v, weights[0]) for v in (eta, theta, alpha))
        keep = 1.0 - alpha_d  # before splitting per layer: one tiny op, not L
        eta_d, theta_d, keep = _per_layer(eta_d), _per_layer(theta_d), _per_layer(keep)

        torch._foreach_mul_(moms, eta_d)  # m <- eta m
        if isinstance(theta_d, float):
            torch._foreach_add_(moms, grads, alpha=-theta_d)  # m <- m - theta g, fused
        else:
            torch._foreach_sub_(moms, torch._foreach_mul(grads, theta_d))  # temporary theta * g
        torch._foreach_mul_(weights, keep)  # w <- (1 - alpha) w
        torch._foreach_add_(weights, moms)  # w <- w + m
