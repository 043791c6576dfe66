"""Correctness before speed: compare a fast path with a higher-precision reference.

The error measure is norm-wise relative error, ``||out - ref|| / ||ref||``, computed in float64. It is
one number per tensor, insensitive to a handful of near-zero reference entries (where element-wise
relative error explodes) and comparable across shapes. Typical values (METHOD.md):

    float64            ~1e-15
    float32            far under 1e-5 for pointwise/norm ops, ~1e-6..1e-5 for long reductions
    tf32 / triton fp32 dot   ~3e-4
    bfloat16 operands  1e-3 .. 1e-2  (8 bits of mantissa: one rounding is ~4e-3)
    float16            ~5e-4 .. 2e-3

``TOLERANCE`` holds the bound a fast path must meet for its *compute* dtype; the reference is always
run in float64, so the bound covers only the fast path's own rounding. NaN or Inf never passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

# Norm-wise relative error a fast path may have, by the dtype it computes in.
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}


class CorrectnessError(AssertionError):
    """A fast path disagrees with its reference; timing must not go on."""


def check_int(fn: str, name: str, value, *, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else a ValueError naming ``fn`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{fn}: {name} must be {what}, got {value!r}")
    return value


def check_float_dtype(fn: str, dtype) -> torch.dtype:
    """``dtype`` if it is a floating-point torch.dtype; else a TypeError naming ``fn``."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{fn}: dtype must be a floating torch.dtype, got {dtype!r}")
    return dtype


def check_float_tensor(fn: str, name: str, t: object, *, min_dim: int = 1) -> torch.Tensor:
    """Raise TypeError/ValueError unless ``t`` is a floating-point tensor with at least ``min_dim`` dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(
            f"{fn}: {name} must be a floating-point tensor (float32, float16 or bfloat16), got dtype {t.dtype}"
        )
    if t.dim() < min_dim:
        raise ValueError(f"{fn}: {name} must have at least {min_dim} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_same_device(fn: str, **tensors: torch.Tensor) -> None:
    """Raise ValueError naming the tensors if they are not all on one device."""
    values = iter(tensors.values())
    first = next(values).device
    if any(t.device != first for t in values):
        listing = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"{fn}: all inputs must be on the same device, got {listing}")


def tolerance(dtype: torch.dtype, *, tf32: bool = False) -> float:
    """Allowed norm-wise relative error for results computed in ``dtype``; ``tf32=True`` widens float32's to what
    TF32 matrix units (and Triton's default float32 ``tl.dot``) give: about 1e-3 for a 10-bit mantissa."""
    if dtype not in TOLERANCE:
        raise ValueError(f"no tolerance defined for dtype {dtype}; known: {sorted(map(str, TOLERANCE))}")
    if tf32 and dtype == torch.float32:
        return 2e-3
    return TOLERANCE[dtype]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref||_2 / ||ref||_2`` in float64 (inf if out has NaN/Inf, 0 for two zero tensors)."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    o = out.detach().double()  # on out's device: no host copy of a large tensor
    r = ref.detach().to(device=out.device, dtype=torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    denom = r.norm().item()
    diff = (o - r).norm().item()
    if denom == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / denom


def check_close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    """Raise ``CorrectnessError`` naming ``name`` unless ``rel_error(out, ref) <= tol``; return the error."""
    err = rel_error(out, ref)
    if not err <= tol:  # also catches NaN
        raise CorrectnessError(
            f"{name}: relative error {err:.3e} exceeds tolerance {tol:.1e} "
            f"(shape {tuple(out.shape)}, dtype {out.dtype})"
        )
    return err


@dataclass
class Comparison:
    """Errors of a fast function against its reference, per output and per input gradient."""

    errors: dict[str, float]
    tol: float

    @property
    def max_error(self) -> float:
        return max(self.errors.values()) if self.errors else 0.0

    def __str__(self) -> str:
        items = ", ".join(f"{k}={v:.2e}" for k, v in self.errors.items())
        return f"max rel. error {self.max_error:.2e} (tol {self.tol:.0e}): {items}"


def _as_tuple(x) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare_fn(
    fast: Callable[..., torch.Tensor | Sequence[torch.Tensor]],
    ref: Callable[..., torch.Tensor | Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    *,
    grads: bool = True,
    tol: float | None = None,
    ref_dtype: torch.dtype = torch.float64,
    name: str = "fast path",
    grad_inputs: Iterable[int] | None = None,
) -> Comparison:
    """Run ``fast(*inputs)`` and ``ref(*upcast inputs)``; compare outputs and gradients.

    The reference runs on copies of the inputs upcast to ``ref_dtype`` on the same device (no host round trip).
    Floating inputs (those in ``grad_inputs``) get gradients from one backward pass of ``sum(out_i * g_i)`` with
    the same seeded ``g_i`` for both paths. Raises ``CorrectnessError`` on the first value over ``tol`` (default:
    :func:`tolerance` of the first floating input's dtype).
    """
    float_inputs = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not float_inputs:
        raise ValueError(f"{name}: compare_fn needs at least one floating-point tensor input")
    tol = tolerance(float_inputs[0].dtype) if tol is None else tol

    idx = set(range(len(inputs))) if grad_inputs is None else set(grad_inputs)

    def prep(cast: torch.dtype | None) -> list:
        return [
            (x.detach().to(cast) if cast else x.detach().clone()).requires_grad_(grads and i in idx)
            if isinstance(x, torch.Tensor) and x.is_floating_point()
            else x
            for i, x in enumerate(inputs)
        ]

    fast_in, ref_in = prep(None), prep(ref_dtype)
    fast_out = _as_tuple(fast(*fast_in))
    ref_out = _as_tuple(ref(*ref_in))
    if len(fast_out) != len(ref_out):
        raise CorrectnessError(f"{name}: returned {len(fast_out)} outputs, reference {len(ref_out)}")

    errors = {
        f"out{i}": check_close(f"{name} output {i}", o, r, tol) for i, (o, r) in enumerate(zip(fast_out, ref_out))
    }

    if grads and any(t.requires_grad for t in fast_in if isinstance(t, torch.Tensor)):
        # Seeded cotangents drawn where the outputs are: no host-sized tensor crosses to the device.
        dev = fast_out[0].device
        gen = torch.Generator(device=dev).manual_seed(1234)
        pairs = [
            (o, r, torch.randn(o.shape, generator=gen, dtype=torch.float64, device=dev))
            for o, r in zip(fast_out, ref_out)
            if o.requires_grad and o.is_floating_point()
        ]
        if pairs:
            sum(((o * g.to(o.device, o.dtype)).sum() for o, _, g in pairs)).backward()
            sum(((r * g.to(r.device, r.dtype)).sum() for _, r, g in pairs)).backward()
            for i, (a, b) in enumerate(zip(fast_in, ref_in)):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    if a.grad is None or b.grad is None:
                        raise CorrectnessError(
                            f"{name}: input {i} got no gradient (fast: {a.grad is not None}, ref: {b.grad is not None})"
                        )
                    errors[f"grad{i}"] = check_close(f"{name} gradient of input {i}", a.grad, b.grad, tol)
    return Comparison(errors, tol)
