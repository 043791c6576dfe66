"""Momentum update of a neural memory (Titans-style "surprise" with decay), in place.

For every memory weight w_i with gradient g_i (of the memory's associative loss) and momentum m_i:

    m_i <- eta_i * m_i - theta_i * g_i          momentum of the surprise; eta = decay, theta = step size
    w_i <- (1 - alpha_i) * w_i + m_i            forgetting gate alpha in [0, 1], then the update

eta, theta and alpha may each be a Python float (same for all layers), a 0-dim tensor (same for all
layers, e.g. data-dependent and computed on the device) or a (L,) tensor (one value per layer).
The update runs under ``torch.no_grad()`` (it is an optimizer-like step on the memory, not part of
the autograd graph); weights and momenta are updated in place, gradients are only read.

* ``momentum_update_loop`` (before): a Python loop over layers that, as code often does (for logging,
  or to feed a Python-side step-size schedule), reads tensor-valued eta/theta/alpha with ``.item()``:
  up to 3 host syncs per layer, plus 4 kernels per layer.
* ``momentum_update_foreach`` (after): ``torch._foreach_*`` ops over all layers at once (a few fused
  multi-tensor kernels on CUDA), tensor-valued hyper-parameters stay on the device: no sync.
  With a 0-dim tensor theta it writes one temporary the size of the gradients (theta * g), since the
  ``alpha=`` argument of ``_foreach_add_`` only takes Python numbers. Per-layer (L,) tensors are split
  into L 0-dim tensors; CUDA then takes the foreach slow path for that op (one kernel per layer),
  still without syncs.

Tensor values are not range-checked (that would itself be a sync); Python floats are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

__all__ = ["momentum_update_loop", "momentum_update_foreach", "MomentumMemory", "IMPLS"]

IMPLS = ("loop", "foreach")

Hyper = float | torch.Tensor

# Allowed ranges for Python-float hyper-parameters.
_RANGES = {"eta": (0.0, 1.0), "theta": (0.0, float("inf")), "alpha": (0.0, 1.0)}


def _check_lists(weights, moms, grads) -> int:
    for name, seq in (("weights", weights), ("moms", moms), ("grads", grads)):
        if isinstance(seq, torch.Tensor) or not isinstance(seq, (list, tuple)):
            raise TypeError(f"{name} must be a list or tuple of tensors, got {type(seq).__name__}")
    n = len(weights)
    if n == 0:
        raise ValueError("weights is empty; expected at least one memory weight")
    if len(moms) != n or len(grads) != n:
        raise ValueError(f"weights, moms and grads must have the same length, got {n}, {len(moms)}, {len(grads)}")
    for i, (w, m, g) in enumerate(zip(weights, moms, grads)):
        for name, t in (("weights", w), ("moms", m), ("grads", g)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}] must be a tensor, got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"{name}[{i}] must be floating point, got {t.dtype}")
        if m.shape != w.shape or g.shape != w.shape:
            raise ValueError(
                f"layer {i}: weights {tuple(w.shape)}, moms {tuple(m.shape)} and grads "
                f"{tuple(g.shape)} must have the same shape"
            )
        if m.device != w.device or g.device != w.device or w.device != weights[0].device:
            raise ValueError(
                f"layer {i}: all tensors must be on {weights[0].device}, got weights "
                f"{w.device}, moms {m.device}, grads {g.device}"
            )
        if m.dtype != w.dtype or g.dtype != w.dtype:
            raise TypeError(
                f"layer {i}: weights, moms and grads must share a dtype, got {w.dtype}, {m.dtype}, {g.dtype}"
            )
    return n


def _check_hyper(name: str, value: Hyper, n_layers: int) -> None:
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
        if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != n_layers):
            raise ValueError(
                f"{name} must be a 0-dim tensor or a ({n_layers},) tensor (one per layer), "
                f"got shape {tuple(value.shape)}"
            )
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
    lo, hi = _RANGES[name]
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def momentum_update_loop(
    weights: Sequence[torch.Tensor],
    moms: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    eta: Hyper,
    theta: Hyper,
    alpha: Hyper,
) -> None:
    """Reference: one layer at a time; tensor hyper-parameters are read with ``.item()`` (a sync each)."""
    n = _check_lists(weights, moms, grads)
    for name, v in (("eta", eta), ("theta", theta), ("alpha", alpha)):
        _check_hyper(name, v, n)

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
    """A float stays a float; a tensor moves to ``like``'s device (a host-to-device copy at most, never
    a sync) and to at least ``like``'s precision, as ``.item()`` (a Python double) gives the loop path."""
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
    n = _check_lists(weights, moms, grads)
    for name, v in (("eta", eta), ("theta", theta), ("alpha", alpha)):
        _check_hyper(name, v, n)
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


_UPDATES = {"loop": momentum_update_loop, "foreach": momentum_update_foreach}


class MomentumMemory(nn.Module):
    """A list of memory weights (parameters) and their momentum buffers, updated by :meth:`step`.

    ``shapes`` gives one shape per memory layer (e.g. ``[(D, D)] * L`` for an L-layer linear memory).
    Weights start like ``nn.Linear`` weights (uniform in +-1/sqrt(fan_in)); momenta start at zero.
    The module only holds and updates the memory; how it is read (and which loss makes ``grads``) is
    up to the caller.
    """

    def __init__(
        self,
        shapes: Sequence[Sequence[int]],
        *,
        eta: Hyper = 0.9,
        theta: Hyper = 1e-2,
        alpha: Hyper = 1e-3,
        impl: str = "foreach",
    ):
        super().__init__()
        shapes = [tuple(s) for s in shapes]
        if not shapes:
            raise ValueError("shapes is empty; expected at least one memory layer")
        for i, s in enumerate(shapes):
            if not s or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in s):
                raise ValueError(f"shapes[{i}] must be a tuple of positive ints, got {s}")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        for name, v in (("eta", eta), ("theta", theta), ("alpha", alpha)):
            _check_hyper(name, v, len(shapes))
        self.eta, self.theta, self.alpha, self.impl = eta, theta, alpha, impl
        self.weights = nn.ParameterList()
        for i, s in enumerate(shapes):
            bound = 1.0 / s[-1] ** 0.5
            self.weights.append(nn.Parameter(torch.empty(s).uniform_(-bound, bound)))
            self.register_buffer(f"mom_{i}", torch.zeros(s))

    @property
    def moms(self) -> list[torch.Tensor]:
        return [getattr(self, f"mom_{i}") for i in range(len(self.weights))]

    def reset_momentum(self) -> None:
        for m in self.moms:
            m.zero_()

    def step(
        self,
        grads: Sequence[torch.Tensor] | None = None,
        *,
        impl: str | None = None,
        eta: Hyper | None = None,
        theta: Hyper | None = None,
        alpha: Hyper | None = None,
    ) -> None:
        """One in-place update. ``grads`` default to the weights' ``.grad``; ``impl`` and the
        hyper-parameters default to the constructor's (pass tensors here for data-dependent values)."""
        impl = self.impl if impl is None else impl
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        weights = list(self.weights)
        if grads is None:
            missing = [i for i, w in enumerate(weights) if w.grad is None]
            if missing:
                raise ValueError(f"grads not given and weights {missing} have no .grad; run backward first")
            grads = [w.grad for w in weights]
        _UPDATES[impl](
            weights,
            self.moms,
            list(grads),
            self.eta if eta is None else eta,
            self.theta if theta is None else theta,
            self.alpha if alpha is None else alpha,
        )

    def extra_repr(self) -> str:
        return f"layers={len(self.weights)}, impl={self.impl!r}"
