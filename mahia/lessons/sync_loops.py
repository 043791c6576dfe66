"""What notebook 01 measures its two loops with: a small model and its data, a chain of tiny kernels that prices
one launch and one sync (also 04, 05, hybrid_parts), the host's time per step, the ops a step dispatches."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mahia.measure.instruments import count_ops
from mahia.measure.timing import issue_ms

__all__ = ["ResidualMLP", "make_batches", "launch_chain", "host_step_ms", "ops_per_step"]


class ResidualMLP(nn.Module):
    """A classifier made of pre-norm residual MLP blocks, small enough that one step is a few hundred
    short kernels:

        h = x W_in;   h = h + gelu(LayerNorm(h) W_k)  for k = 1..depth;   logits = LayerNorm(h) W_out
    """

    def __init__(self, in_features: int, width: int, depth: int, n_classes: int, *, device=None, dtype=None):
        super().__init__()
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
    n_steps: int, batch: int, in_features: int, n_classes: int, *, device=None, dtype=torch.float32, seed=0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_steps`` batches (x (batch, in_features), y (batch,) int64) of a learnable task: y is the
    arg-max of a fixed random linear map of x. Made on the CPU from ``seed`` (so every device gets the
    same data), then moved to ``device`` once, outside any timed region."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(in_features, n_classes, generator=gen)
    x = torch.randn(n_steps, batch, in_features, generator=gen)
    y = (x @ teacher).argmax(-1)  # (n_steps, batch)
    return [(x[i].to(device=device, dtype=dtype), y[i].to(device)) for i in range(n_steps)]


def launch_chain(x: torch.Tensor, n_kernels: int, *, read_every: int = 0) -> torch.Tensor:
    """Add 1 to ``x`` ``n_kernels`` times (one tiny kernel each), reading ``x[0]`` back (a sync) after every
    ``read_every``-th kernel if > 0. On a GPU, (time(read_every=1) - time(0)) / n_kernels is one sync's round
    trip (copy, the host's wake-up, the next launch): the chain is launch-bound, so no queue of work drains."""
    flat = x.view(-1)
    for i in range(n_kernels):
        x.add_(1)
        if read_every and (i + 1) % read_every == 0:
            flat[0].item()  # sync
    return x


def host_step_ms(
    run: Callable[[int], object],
    device: torch.device | str,
    *,
    steps: int = 4,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The host's time to issue one step of a loop that never syncs, in ms:

        t_host = (T(steps) - T(1)) / (steps - 1),    T(n) = median host time of run(n) on an idle device

    ``run(n)`` runs the loop over its first ``n`` batches; ``mahia.measure.timing.issue_ms`` syncs before and
    after each call, outside the timed span. The difference cancels what a call pays once (argument checks,
    allocation, the first launches after an idle device). ``steps`` stays small so the device's launch queue
    never fills (T would then time the device). On a CPU it is the whole time of a step. ``clock``: for tests.
    """

    def t(n: int) -> float:
        return statistics.median(issue_ms(lambda: run(n), device, clock=clock) for _ in range(repeats))

    t_n, t_1 = t(steps), t(1)
    if not t_n > t_1:
        raise RuntimeError(
            f"host_step_ms: a call of {steps} steps took {t_n:.3g} ms of host time, one step {t_1:.3g} ms: "
            "the host time did not grow with the steps"
        )
    return (t_n - t_1) / (steps - 1)


def ops_per_step(run: Callable[[int], object], *, steps: int = 3) -> float:
    """Ops that launch a kernel (:func:`count_ops`) per step of a loop: (ops of run(steps) - ops of run(1)) /
    (steps - 1), after one uncounted run(1) (a first optimizer step allocates its state)."""
    run(1)
    with count_ops() as many:
        run(steps)
    with count_ops() as one:
        run(1)
    return (many.total - one.total) / (steps - 1)
