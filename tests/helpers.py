"""Helpers shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

from __future__ import annotations

import torch

from mahia.measure.checks import CorrectnessError, rel_error, tolerance


def grouped_mm_runs(backend: str, dtype: torch.dtype = torch.float32, device="cpu") -> bool:
    """Whether this grouped matmul backend can run here on ``dtype`` tensors on ``device``."""
    from mahia.ops.grouped_mm import grouped_mm

    a, b = torch.zeros(2, 16, dtype=dtype, device=device), torch.zeros(1, 16, 16, dtype=dtype, device=device)
    try:
        grouped_mm(a, b, torch.tensor([2], dtype=torch.int32, device=device), backend=backend)
    except ValueError:
        return False
    return True


def graph_ops(fn, *args):
    """Names of the ops Dynamo puts in the graph of ``fn`` (fullgraph: a graph break raises)."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    return seen


# (rtol, atol) per compute dtype: every element must satisfy |out - ref| <= atol * scale + rtol * |ref|,
# with scale = max |ref| (an element left near 0 by a cancellation carries an error of the size of
# the terms it came from, not of itself). The reference is float64, so these bound the fast path's
# own error: its final rounding plus its float32 arithmetic.
#   float16: one rounding is at most half an ulp, 2^-11 relative; 2e-3 allows four.
#   bfloat16: triton 3.9's interpreter converts float32 -> bfloat16 by truncation, not rounding, so an
#   element can be one whole ulp off (up to 2^-7 = 7.8e-3 relative) where rounding gives half of one;
#   1.6e-2 allows two ulps.
ELEMENTWISE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(
    name: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype | None = None,
    *,
    tol: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    scale: float | None = None,
    norm: bool = True,
) -> float:
    """Norm-wise (``rel_error <= tol``, skipped for a zero reference or ``norm=False``) and element-wise
    (``ELEMENTWISE``; ``scale`` replaces max |ref| as the unit of atol) comparison; ``dtype`` (default:
    out's) picks the bounds. Non-finite ``out`` fails unless ``ref`` has the same value there. Raises
    CorrectnessError naming ``name``; returns the norm-wise error."""
    dtype = out.dtype if dtype is None else dtype
    tol = tolerance(dtype) if tol is None else tol
    d_rtol, d_atol = ELEMENTWISE[dtype]
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    if out.shape != ref.shape:
        raise CorrectnessError(f"{name}: shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    o = out.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    if o.numel() == 0:
        return 0.0
    same_nonfinite = ~torch.isfinite(r) & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    if not torch.equal(torch.isfinite(o) | same_nonfinite, torch.ones_like(same_nonfinite)):
        bad = (~(torch.isfinite(o) | same_nonfinite)).nonzero()[0].tolist()
        raise CorrectnessError(
            f"{name}: non-finite value {o[tuple(bad)].item()} at {bad} where the reference "
            f"has {r[tuple(bad)].item()} (shape {tuple(out.shape)}, {dtype})"
        )
    o, r = torch.where(same_nonfinite, 0.0, o), torch.where(same_nonfinite, 0.0, r)
    err = 0.0
    if norm and r.norm().item() > 0:
        err = rel_error(o, r)
        if not err <= tol:
            raise CorrectnessError(
                f"{name}: norm-wise relative error {err:.3e} exceeds {tol:.1e} (shape {tuple(out.shape)}, {dtype})"
            )
    unit = r.abs().max().item() if scale is None else scale
    excess = (o - r).abs() - (atol * unit + rtol * r.abs())
    if excess.max().item() > 0:
        i = tuple(int(j) for j in torch.unravel_index(excess.argmax(), r.shape))
        raise CorrectnessError(
            f"{name}: element {list(i)} is {o[i].item():.6g}, the reference {r[i].item():.6g}: |diff| "
            f"{abs(o[i] - r[i]).item():.3e} > atol {atol:.1e} * scale {unit:.3e} + rtol {rtol:.1e} * |ref| "
            f"(shape {tuple(out.shape)}, {dtype})"
        )
    return err


def compare(
    fast,
    ref,
    inputs,
    *,
    dtype: torch.dtype | None = None,
    tol: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    grads: bool = True,
    grad_inputs=None,
    name: str = "fast path",
    seed: int = 1234,
) -> dict[str, float]:
    """Like ``mahia.measure.checks.compare_fn`` (fast on the inputs, ref on float64 copies, outputs and
    the gradients of one backward pass of sum(out_i * g_i)), with :func:`assert_close` (norm-wise and
    element-wise) on every output and gradient. ``dtype`` (default: the first floating input's) picks
    the default bounds. Returns the norm-wise errors by name ("out0", "grad1", ...)."""
    floats = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    dtype = floats[0].dtype if dtype is None else dtype
    idx = set(range(len(inputs))) if grad_inputs is None else set(grad_inputs)

    def prep(cast):
        out = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                y = x.detach().to(cast) if cast is not None else x.detach().clone()
                out.append(y.requires_grad_(grads and i in idx))
            else:
                out.append(x)
        return out

    fast_in, ref_in = prep(None), prep(torch.float64)
    fast_out, ref_out = fast(*fast_in), ref(*ref_in)
    fast_out, ref_out = [o if isinstance(o, (tuple, list)) else (o,) for o in (fast_out, ref_out)]
    if len(fast_out) != len(ref_out):
        raise CorrectnessError(f"{name}: returned {len(fast_out)} outputs, the reference {len(ref_out)}")
    kw = dict(tol=tol, rtol=rtol, atol=atol)
    errors = {
        f"out{i}": assert_close(f"{name} output {i}", o, r, dtype, **kw)
        for i, (o, r) in enumerate(zip(fast_out, ref_out))
    }
    if grads and any(isinstance(t, torch.Tensor) and t.requires_grad for t in fast_in):
        gen = torch.Generator().manual_seed(seed)
        pairs = [
            (o, r, torch.randn(o.shape, generator=gen, dtype=torch.float64))
            for o, r in zip(fast_out, ref_out)
            if o.requires_grad
        ]
        sum((o * g.to(o.device, o.dtype)).sum() for o, _, g in pairs).backward()
        sum((r * g.to(r.device, r.dtype)).sum() for _, r, g in pairs).backward()
        for i, (a, b) in enumerate(zip(fast_in, ref_in)):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                if a.grad is None or b.grad is None:
                    raise CorrectnessError(f"{name}: input {i} got no gradient")
                errors[f"grad{i}"] = assert_close(f"{name} gradient of input {i}", a.grad, b.grad, dtype, **kw)
    return errors
