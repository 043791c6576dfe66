"""Dynamic neuro-fabric: a gate network decides, per sample, which layers of a residual stack run.

For x (B, T, D) and L layers f_l (each (b, T, D) -> (b, T, D), samples independent):

    g = sigmoid(s(x) Wg^T + bg)                (B, L): per-sample gates, computed once from the input
    x_b <- x_b + g_{b,l} f_l(x)_b   if g_{b,l} > threshold, else x_b unchanged      (l = 1..L)

s(x) is the mean over tokens (``gate_source="mean"``, the standalone component: every position sees
every token through its gates) or the first token (``"first"``: causal, what a language model needs).
Gates run in float32 (float64 for float64 input), outside autocast, so the on/off decision does not
hinge on a bfloat16 rounding. The hard threshold has zero gradient: only active gates get gradient.

``impl="branch"`` (before): ``if g[b, l] > threshold`` in Python on one-sample slices: B * L host syncs.
``impl="masked"`` (after): every layer on the whole batch, scaled by ``g * (g > threshold)``: no sync,
but the FLOPs of skipped pairs are spent (and 0 * inf = NaN leaks a skipped sample's non-finite f_l).
``plan(x)`` reads which layers are on for at least one sample (ONE sync); ``forward(..., plan=)`` skips
the others. It pays when whole layers are off for the batch and a skipped layer costs more than a sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mahia.measure.checks import check_int
from mahia.model._inputs import check_btd

__all__ = ["DynamicNeuroFabric", "FabricPlan", "fabric_gates", "fabric_forward", "IMPLS", "GATE_SOURCES"]

IMPLS = ("branch", "masked")
GATE_SOURCES = ("mean", "first")


@dataclass(frozen=True)
class FabricPlan:
    """Which layers run: ``active[l]`` is False when layer l is off for every sample of the batch."""

    active: tuple[bool, ...]

    @property
    def n_skipped(self) -> int:
        return sum(not a for a in self.active)


def _check(fn: str, threshold: float, impl: str, gate_source: str) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"{fn}: threshold must be a float in [0, 1] (gates are sigmoids), got {threshold!r}")
    if impl not in IMPLS:
        raise ValueError(f"{fn}: impl must be one of {IMPLS}, got {impl!r}")
    if gate_source not in GATE_SOURCES:
        raise ValueError(f"{fn}: gate_source must be one of {GATE_SOURCES}, got {gate_source!r}")


def fabric_gates(
    x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor, *, source: str = "mean"
) -> torch.Tensor:
    """g = sigmoid(s(x) Wg^T + bg): (B, T, D) -> (B, L), in float32 (or float64)."""
    if source not in GATE_SOURCES:
        raise ValueError(f"fabric_gates: source must be one of {GATE_SOURCES}, got {source!r}")
    check_btd(x)
    if gate_weight.shape != (gate_bias.shape[0], x.shape[-1]) or gate_bias.dim() != 1:
        raise ValueError(
            f"fabric_gates: gate_weight must be (L, D={x.shape[-1]}) and gate_bias (L,), "
            f"got {tuple(gate_weight.shape)} and {tuple(gate_bias.shape)}"
        )
    dt = torch.promote_types(x.dtype, torch.float32)
    summary = x.mean(dim=1, dtype=dt) if source == "mean" else x[:, 0].to(dt)  # (B, D), no copy of x
    with torch.autocast(x.device.type, enabled=False):
        return torch.sigmoid(F.linear(summary, gate_weight.to(dt), gate_bias.to(dt)))  # (B, L)


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
    """Functional :class:`DynamicNeuroFabric`: (B, T, D) -> (B, T, D). ``gates`` (B, L): use these instead
    of computing them from x (e.g. kept from a sequence's first call while decoding)."""
    fn = "fabric_forward"
    _check(fn, threshold, impl, gate_source)
    if gates is None:
        gates = fabric_gates(x, gate_weight, gate_bias, source=gate_source)  # (B, L)
    elif gates.shape != (x.shape[0], gate_weight.shape[0]) or not gates.is_floating_point():
        raise ValueError(f"{fn}: gates must be a floating (B, L) = ({x.shape[0]}, {gate_weight.shape[0]}) tensor")
    layers = list(layers)
    if len(layers) != gates.shape[1] or not all(callable(f) for f in layers):
        raise ValueError(f"{fn}: layers must be {gates.shape[1]} callables (one per gate), got {len(layers)}")
    skip = frozenset()
    if plan is not None:
        if not isinstance(plan, FabricPlan) or len(plan.active) != len(layers):
            raise ValueError(f"{fn}: plan must be the FabricPlan of .plan(x) for these {len(layers)} layers")
        skip = frozenset(l for l, a in enumerate(plan.active) if not a)
    run = _branch if impl == "branch" else _masked
    return run(x, gates, layers, threshold, skip)


class DynamicNeuroFabric(nn.Module):
    """Per-sample gates over L residual layers; ``forward(x, layers, plan=None, gates=None) -> x``.

    The module owns only the gate network (a Linear D -> L); the layers are passed to ``forward``, so
    any stack of sample-independent (b, T, D) -> (b, T, D) callables can be gated.
    """

    def __init__(
        self, dim: int, n_layers: int, *, threshold: float = 0.5, impl: str = "masked", gate_source: str = "mean"
    ):
        super().__init__()
        check_int("DynamicNeuroFabric", "dim", dim)
        check_int("DynamicNeuroFabric", "n_layers", n_layers)
        _check("DynamicNeuroFabric", threshold, impl, gate_source)
        self.dim, self.n_layers, self.threshold, self.impl = dim, n_layers, float(threshold), impl
        self.gate_source = gate_source
        self.gate = nn.Linear(dim, n_layers)
        # Bias +2 (g ~ 0.88): every layer starts on, an untrained fabric is a plain residual stack, and
        # training decides what to switch off; a zero bias would put every gate on the threshold.
        nn.init.constant_(self.gate.bias, 2.0)

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, L) gate values in (0, 1)."""
        return fabric_gates(x, self.gate.weight, self.gate.bias, source=self.gate_source)

    @torch.no_grad()
    def plan(self, x: torch.Tensor) -> FabricPlan:
        """Layers active for at least one sample of this ``x``: one device-to-host copy (one sync)."""
        return FabricPlan(tuple((self.gates(x) > self.threshold).any(dim=0).tolist()))

    def forward(
        self,
        x: torch.Tensor,
        layers: Sequence[Callable[[torch.Tensor], torch.Tensor]],
        *,
        plan: FabricPlan | None = None,
        gates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        kw = dict(threshold=self.threshold, impl=self.impl, gate_source=self.gate_source)
        return fabric_forward(x, self.gate.weight, self.gate.bias, layers, plan=plan, gates=gates, **kw)
