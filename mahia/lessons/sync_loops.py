"""What notebook 01 measures its loops with: a small model and its data, and the costs of a step.

The two training loops (one with host-device syncs, one without) are the lesson, so they live in notebook 01's
own cells. Here: :class:`ResidualMLP` and :func:`make_batches`; :func:`launch_chain`, a loop of tiny kernels with
an optional read-back, to measure what one launch and one sync cost on a machine (notebooks 04, 05 and
:mod:`mahia.lessons.hybrid_parts` use it too); :func:`host_issue_ms` and :func:`host_step_ms`, how long the host
takes to issue a call (a step) that never waits; :func:`ops_per_step`, the ops a step dispatches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mahia.measure.checks import check_float_dtype, check_int
from mahia.measure.instruments import count_ops
from mahia.measure.timing import issue_ms

__all__ = ["ResidualMLP", "make_batches", "launch_chain", "host_issue_ms", "host_step_ms", "ops_per_step"]


# ---------------------------------------------------------------------------------------------------
# A small model and synthetic data
# ---------------------------------------------------------------------------------------------------


class ResidualMLP(nn.Module):
    """A classifier made of pre-norm residual MLP blocks, small enough that one step is a few hundred
    short kernels:

        h = x W_in;   h = h + gelu(LayerNorm(h) W_k)  for k = 1..depth;   logits = LayerNorm(h) W_out
    """

    def __init__(
        self,
        in_features: int,
        width: int,
        depth: int,
        n_classes: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        for name, val in (("in_features", in_features), ("width", width), ("n_classes", n_classes)):
            check_int("ResidualMLP", name, val)
        check_int("ResidualMLP", "depth", depth, minimum=0)
        kw = dict(device=device, dtype=dtype)
        self.inp = nn.Linear(in_features, width, **kw)
        self.norms = nn.ModuleList(nn.LayerNorm(width, **kw) for _ in range(depth))
        self.fcs = nn.ModuleList(nn.Linear(width, width, **kw) for _ in range(depth))
        self.norm_out = nn.LayerNorm(width, **kw)
        self.out = nn.Linear(width, n_classes, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)  # (B, width)
        for norm, fc in zip(self.norms, self.fcs):
            h = h + F.gelu(fc(norm(h)))
        return self.out(self.norm_out(h))  # (B, n_classes)


def make_batches(
    n_steps: int,
    batch: int,
    in_features: int,
    n_classes: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_steps`` batches (x (batch, in_features), y (batch,) int64) of a learnable task: y is the
    arg-max of a fixed random linear map of x. Made on the CPU from ``seed`` (so every device gets the
    same data), then moved to ``device`` once, outside any timed region."""
    for name, val in (("n_steps", n_steps), ("batch", batch), ("in_features", in_features), ("n_classes", n_classes)):
        check_int("make_batches", name, val)
    check_float_dtype("make_batches", dtype)
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(in_features, n_classes, generator=gen)
    x = torch.randn(n_steps, batch, in_features, generator=gen)
    y = (x @ teacher).argmax(-1)  # (n_steps, batch)
    return [(x[i].to(device=device, dtype=dtype), y[i].to(device)) for i in range(n_steps)]


# ---------------------------------------------------------------------------------------------------
# Measuring what a sync costs
# ---------------------------------------------------------------------------------------------------


def launch_chain(x: torch.Tensor, n_kernels: int, *, read_every: int = 0) -> torch.Tensor:
    """Add 1 to ``x`` ``n_kernels`` times (one tiny kernel each); with ``read_every=k > 0`` read
    ``x[0]`` back to the host after every k-th kernel (one sync each).

    On a GPU, time(read_every=1) - time(read_every=0), divided by ``n_kernels``, is what one sync adds
    to a stream of short kernels. The chain is launch-bound, so at each read at most one tiny kernel is
    queued: this is the read-back's round trip (copy to host, the host's wake-up, launch latency of the
    next kernel), not the wait for a queue of longer work to drain, which a device-bound loop also pays.
    """
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        raise ValueError("launch_chain: x must be a non-empty tensor")
    for name, val, low in (("n_kernels", n_kernels, 1), ("read_every", read_every, 0)):
        check_int("launch_chain", name, val, minimum=low)
    flat = x.view(-1)
    for i in range(n_kernels):
        x.add_(1)
        if read_every and (i + 1) % read_every == 0:
            flat[0].item()  # sync
    return x


def host_issue_ms(
    fn, device: torch.device | str, *, repeats: int = 5, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Median host time, in ms, of ``fn()`` started on an idle device and not waited for.

    The device is synchronized before each call and after it, outside the timed span: for a call that
    never syncs this is the time the host needs to *issue* its kernels (Python, dispatch, launches) while
    the device queue is empty. On a CPU, where the work runs inside the call, it is the call's whole time.
    ``clock`` (seconds) is there for tests.
    """
    if not callable(fn):
        raise TypeError(f"host_issue_ms: fn must be callable, got {type(fn).__name__}")
    check_int("host_issue_ms", "repeats", repeats, minimum=1)
    return statistics.median(issue_ms(fn, device, clock=clock) for _ in range(repeats))


def _check_steps(fn: str, run, steps: int) -> None:
    if not callable(run):
        raise TypeError(f"{fn}: run must be callable as run(n_steps), got {type(run).__name__}")
    check_int(fn, "steps", steps, minimum=2)


def host_step_ms(
    run: Callable[[int], object],
    device: torch.device | str,
    *,
    steps: int = 4,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The host's time to issue one step of a loop that never syncs, in ms:

        t_host = (T(steps) - T(1)) / (steps - 1),    T(n) = host_issue_ms(lambda: run(n))

    ``run(n)`` runs the loop over its first ``n`` batches. The difference cancels what a call pays once
    (argument checks, buffer allocation, the first launches after an idle device), which a one-step call
    would charge to its step. ``steps`` stays small (a few hundred launches) so that the device's launch
    queue never fills: a full queue would make the host wait for the device, and T would time the device.
    On a CPU it is the whole time of a step. Raises if T did not grow with the steps (nothing measured).
    """
    _check_steps("host_step_ms", run, steps)
    t_n = host_issue_ms(lambda: run(steps), device, repeats=repeats, clock=clock)
    t_1 = host_issue_ms(lambda: run(1), device, repeats=repeats, clock=clock)
    if not t_n > t_1:
        raise RuntimeError(
            f"host_step_ms: a call of {steps} steps took {t_n:.3g} ms of host time, one step {t_1:.3g} ms: "
            "the host time did not grow with the steps"
        )
    return (t_n - t_1) / (steps - 1)


def ops_per_step(run: Callable[[int], object], *, steps: int = 3) -> float:
    """Ops that launch a kernel (:func:`count_ops`) per step of a loop:
    (ops of run(steps) - ops of run(1)) / (steps - 1), which leaves out what a call does once (buffer
    allocation, stacking the results), after one uncounted run(1) (a first optimizer step allocates its
    state). An average: a branch taken on some steps only counts in part."""
    _check_steps("ops_per_step", run, steps)
    run(1)
    with count_ops() as many:
        run(steps)
    with count_ops() as one:
        run(1)
    return (many.total - one.total) / (steps - 1)
