"""Dynamic neuro-fabric: a gate network decides, per sample, which layers of a residual stack run.

Math, for a batch x in R^{B x T x D} and L layers f_1..f_L (each maps (b, T, D) -> (b, T, D) and
treats samples independently, e.g. a Linear, an MLP or a transformer block without batch statistics):

    g = sigmoid(s(x) Wg^T + bg)               (B, L): per-sample gates, computed once from the input
    for l = 1..L:
        x_b <- x_b + g_{b,l} f_l(x)_b    if g_{b,l} > threshold
        x_b <- x_b                        otherwise (layer l skipped for sample b)

The summary s(x) of each sample is picked by ``gate_source`` (one switch, a real decision):

* ``"mean"`` (default, the standalone component): s(x) = mean over the T tokens of x. Every output
  position then depends on every input position through its gates: fine for a classifier or an
  encoder, a leak of the future in a language model (position t would see later tokens).
* ``"first"``: s(x) = x[:, 0], the first token. Every position sees token 0, so the fabric is causal
  (a decoder decides the gates at its first token and keeps them: ``gates=`` below).

``forward(x, layers, gates=g)`` takes the (B, L) gates from the caller instead (e.g. computed once
per sequence and reused while decoding); nothing else changes.

Gates are per sample (each sample chooses its own layers), computed once from the stack's input, not
re-evaluated between layers, in float32 (float64 for float64 input) so that the on/off decision does not
hinge on a bfloat16 rounding; they scale f_l in the activation dtype. Gradients: g receives gradient
through the product g_{b,l} f_l where a gate is active; the hard threshold itself has zero gradient (a
step function), so inactive gates get no gradient. That is the same in every implementation below.

Implementations (``impl=``):

* ``"branch"`` (before): ``if g[b, l] > threshold:`` in Python, running f_l on the one-sample slice.
  Each comparison reads a tensor value on the host: B * L device syncs per forward, and f_l runs on
  batches of one.
* ``"masked"`` (after): always computes f_l on the whole batch and adds ``g * (g > threshold)`` times it,
  a tensor mask, so nothing waits on the device. It spends the FLOPs of skipped (sample, layer)
  pairs; caveat: 0 * inf = NaN, so a non-finite f_l(x) of a skipped sample leaks into the masked path.

``plan(x)`` returns a :class:`FabricPlan`: which layers are active for at least one sample, read to
the host with ONE sync. ``forward(x, layers, plan=plan)`` then skips the layers that are off for the
whole batch and runs the others as in ``impl``. It pays when whole layers are off for every sample
(small batches, strongly input-dependent routing) and a skipped layer costs more than one sync
(~10-50 us plus the lost CPU/GPU overlap); with per-sample gates and large batches some sample
usually wants every layer and the plan skips nothing. A plan is only valid for the input it was
computed from; forward does not re-check it (that would cost the sync the plan avoids).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mahia.measure.checks import check_int
from mahia.model._inputs import check_btd

__all__ = ["DynamicNeuroFabric", "FabricPlan", "fabric_gates", "fabric_forward", "fabric_plan", "IMPLS", "GATE_SOURCES"]

IMPLS = ("branch", "masked")
GATE_SOURCES = ("mean", "first")


@dataclass(frozen=True)
class FabricPlan:
    """Which layers run: ``active[l]`` is False when layer l is off for every sample of the batch."""

    active: tuple[bool, ...]

    @property
    def n_skipped(self) -> int:
        return sum(not a for a in self.active)


def _check_threshold(threshold: float) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be a float in [0, 1] (gates are sigmoids), got {threshold!r}")


def _check_gate_source(gate_source: str) -> None:
    if gate_source not in GATE_SOURCES:
        raise ValueError(f"gate_source must be one of {GATE_SOURCES}, got {gate_source!r}")


def fabric_gates(
    x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor, *, source: str = "mean"
) -> torch.Tensor:
    """g = sigmoid(s(x) Wg^T + bg): (B, T, D) -> (B, L), in float32 (or float64).

    s(x) is the mean over the tokens (``source="mean"``) or the first token (``source="first"``, causal).
    """
    _check_gate_source(source)
    check_btd(x)
    if gate_weight.dim() != 2 or gate_weight.shape[1] != x.shape[-1]:
        raise ValueError(f"gate_weight must be (L, D={x.shape[-1]}), got {tuple(gate_weight.shape)}")
    if gate_bias.shape != gate_weight.shape[:1]:
        raise ValueError(f"gate_bias must be (L,) = ({gate_weight.shape[0]},), got {tuple(gate_bias.shape)}")
    for name, p in (("gate_weight", gate_weight), ("gate_bias", gate_bias)):
        if p.dtype != x.dtype or p.device != x.device:
            raise TypeError(f"{name} is {p.dtype} on {p.device} but x is {x.dtype} on {x.device}")
    # In at least float32: the gate network is tiny (B x L) and the on/off decision should not hinge
    # on the bfloat16 rounding of a logit, so it also runs outside autocast (which would make F.linear
    # bf16). mean(dtype=) accumulates in float32 without copying x.
    dt = torch.promote_types(x.dtype, torch.float32)
    summary = x.mean(dim=1, dtype=dt) if source == "mean" else x[:, 0].to(dt)  # (B, D)
    with torch.autocast(x.device.type, enabled=False):
        return torch.sigmoid(F.linear(summary, gate_weight.to(dt), gate_bias.to(dt)))  # (B, L)


def _check_gates(gates: torch.Tensor, x: torch.Tensor, n_layers: int) -> None:
    if not isinstance(gates, torch.Tensor):
        raise TypeError(f"gates must be None or a (B, L) tensor, got {type(gates).__name__}")
    if tuple(gates.shape) != (x.shape[0], n_layers):
        raise ValueError(f"gates must be (B, L) = ({x.shape[0]}, {n_layers}), got {tuple(gates.shape)}")
    if not gates.is_floating_point() or gates.device != x.device:
        raise TypeError(f"gates must be a floating-point tensor on {x.device}, got {gates.dtype} on {gates.device}")


def _branch(x, g, layers, threshold, skip):
    """Reference: one Python decision per (sample, layer); each ``if`` is a host sync."""
    gx = g.to(x.dtype)  # the weights in the activation dtype; decisions use the float32 gates
    out = []
    for b in range(x.shape[0]):
        xb = x[b : b + 1]  # (1, T, D)
        for l, f in enumerate(layers):
            if l in skip:
                continue
            if g[b, l] > threshold:  # reads the gate value on the host
                xb = xb + gx[b, l] * f(xb)
        out.append(xb)
    return torch.cat(out, dim=0)  # (B, T, D)


def _masked(x, g, layers, threshold, skip):
    """Every layer on the whole batch, weighted by g * (g > threshold): no host sync."""
    coef = g.to(x.dtype) * (g > threshold)  # (B, L); zero where the layer is off
    for l, f in enumerate(layers):
        if l in skip:
            continue
        x = x + coef[:, l, None, None] * f(x)  # (B, 1, 1) * (B, T, D)
    return x


def fabric_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor,
    layers: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    *,
    threshold: float = 0.5,
    impl: str = "masked",
    plan: FabricPlan | None = None,
    gate_source: str = "mean",
    gates: torch.Tensor | None = None,
) -> torch.Tensor:
    """Functional form of :class:`DynamicNeuroFabric` (module docstring has the math). Returns (B, T, D).

    ``gates`` (B, L): use these gate values instead of computing them from x (``gate_source`` is then
    unused); decisions compare them with ``threshold``, the layers are scaled by them.
    """
    _check_threshold(threshold)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if gates is None:
        g = fabric_gates(x, gate_weight, gate_bias, source=gate_source)  # (B, L); checks x and the gate params
    else:
        _check_gate_source(gate_source)
        check_btd(x)
        _check_gates(gates, x, gate_weight.shape[0])
        g = gates
    n_layers = g.shape[1]
    # nn.ModuleList and nn.Sequential are not collections.abc.Sequence; accept any iterable of callables.
    if isinstance(layers, (torch.Tensor, str)) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers must be a sequence of callables, got {type(layers).__name__}")
    layers = list(layers)
    if len(layers) != n_layers:
        raise ValueError(f"layers has {len(layers)} entries but the gate network has {n_layers} outputs")
    for l, f in enumerate(layers):
        if not callable(f):
            raise TypeError(f"layers[{l}] must be callable, got {type(f).__name__}")
    skip: frozenset[int] = frozenset()
    if plan is not None:
        if not isinstance(plan, FabricPlan):
            raise TypeError(f"plan must be a FabricPlan from .plan(x), got {type(plan).__name__}")
        if len(plan.active) != n_layers:
            raise ValueError(f"plan covers {len(plan.active)} layers, expected {n_layers}")
        skip = frozenset(l for l, a in enumerate(plan.active) if not a)
    run = _branch if impl == "branch" else _masked
    return run(x, g, layers, threshold, skip)


def fabric_plan(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor,
    *,
    threshold: float = 0.5,
    gate_source: str = "mean",
) -> FabricPlan:
    """Layers active for at least one sample; one device-to-host copy of L booleans (one sync)."""
    _check_threshold(threshold)
    with torch.no_grad():
        active = (fabric_gates(x, gate_weight, gate_bias, source=gate_source) > threshold).any(dim=0)  # (L,)
    return FabricPlan(tuple(bool(a) for a in active.tolist()))


class DynamicNeuroFabric(nn.Module):
    """Per-sample gates over L residual layers; ``forward(x, layers, plan=None, gates=None) -> x``.

    The module owns only the gate network (a Linear D -> L); the layers are passed to ``forward`` so
    that any stack of sample-independent (b, T, D) -> (b, T, D) callables can be gated. See the module
    docstring for the math, the gradient rule, ``gate_source`` ("mean": bidirectional, "first":
    causal) and when ``plan`` pays.
    """

    def __init__(
        self, dim: int, n_layers: int, *, threshold: float = 0.5, impl: str = "masked", gate_source: str = "mean"
    ):
        super().__init__()
        check_int("DynamicNeuroFabric", "dim", dim)
        check_int("DynamicNeuroFabric", "n_layers", n_layers)
        _check_threshold(threshold)
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        _check_gate_source(gate_source)
        self.dim, self.n_layers, self.threshold, self.impl = dim, n_layers, float(threshold), impl
        self.gate_source = gate_source
        self.gate = nn.Linear(dim, n_layers)
        # Bias +2 (g ~ 0.88): every layer starts on, so an untrained fabric is a plain residual stack
        # and training decides what to switch off; a zero bias would put every gate on the threshold.
        nn.init.constant_(self.gate.bias, 2.0)

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, L) gate values in (0, 1), from the summary ``gate_source`` picks."""
        return fabric_gates(x, self.gate.weight, self.gate.bias, source=self.gate_source)

    def plan(self, x: torch.Tensor) -> FabricPlan:
        """Static skip plan for this ``x`` (one host sync); pass it to ``forward(x, layers, plan=...)``."""
        return fabric_plan(x, self.gate.weight, self.gate.bias, threshold=self.threshold, gate_source=self.gate_source)

    def forward(
        self,
        x: torch.Tensor,
        layers: Sequence[Callable[[torch.Tensor], torch.Tensor]],
        *,
        plan: FabricPlan | None = None,
        gates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``gates`` (B, L): use these instead of ``self.gates(x)`` (e.g. kept from a sequence's first call)."""
        return fabric_forward(
            x,
            self.gate.weight,
            self.gate.bias,
            layers,
            threshold=self.threshold,
            impl=self.impl,
            plan=plan,
            gate_source=self.gate_source,
            gates=gates,
        )

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, n_layers={self.n_layers}, threshold={self.threshold}, impl={self.impl!r}, "
            f"gate_source={self.gate_source!r}"
        )
