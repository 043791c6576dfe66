"""Measurement glue for notebooks 08 (MoE routing) and 09 (hybrid components): the cost model's constants
(:func:`mahia.measure.cost.step_time`: ``t = max(n_ops t_launch, t_work) + n_syncs t_sync`` on a GPU, the sum on a
CPU), the host cost per op (a real op costs the host more than a bare one-element add: module calls, checks,
autograd, allocation), and the inputs and forward + backward closures the two notebooks time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mahia.lessons.sync_loops import launch_chain
from mahia.measure.cost import Machine, step_time
from mahia.measure.instruments import OpCount, SyncReport, count_ops, count_syncs
from mahia.measure.timing import Timing, bench, host_time


@dataclass(frozen=True)
class LaunchCosts:
    """t_launch and t_sync in µs, and the two timings of ``n_kernels`` adds they come from."""

    launch_us: float
    sync_us: float
    chain: Timing
    chain_synced: Timing
    n_kernels: int


def launch_costs(device, *, n_kernels: int = 200, bench: Callable[..., Timing] = bench) -> LaunchCosts:
    """t_launch = time(a chain of ``n_kernels`` one-element adds) / n_kernels (launch-bound on a GPU);
    t_sync = (time(the same chain reading the value back after every add) - time(chain)) / n_kernels.
    On a CPU both are host costs: an op's dispatch, and (nearly) nothing for a "sync"."""
    x = torch.zeros(1, device=device)
    chain = bench(lambda: launch_chain(x, n_kernels), memory=False)
    synced = bench(lambda: launch_chain(x, n_kernels, read_every=1), memory=False)
    sync_us = max(synced.median_ms - chain.median_ms, 0.0) * 1e3 / n_kernels
    return LaunchCosts(chain.median_ms * 1e3 / n_kernels, sync_us, chain, synced, n_kernels)


def launch_model_ms(n_ops, n_syncs, launch_us, sync_us, work_ms=0.0, *, overlap=True) -> float:
    """max(n_ops t_launch, work_ms) + n_syncs t_sync, in ms; without ``overlap`` (a CPU) the sum of all three."""
    machine = Machine(launch_us=launch_us, sync_us=sync_us, overlap=overlap)
    return step_time(machine, launches=n_ops, work_ms=work_ms, syncs=n_syncs).ms


def count_ops_and_syncs(fn: Callable[[], object]) -> tuple[OpCount, SyncReport]:
    """Run ``fn()`` once: the ops it dispatched that launch a kernel, and its host syncs."""
    with count_syncs(keep_stack=False) as syncs, count_ops() as ops:
        fn()
    return ops, syncs


@dataclass(frozen=True)
class HostCost:
    """A call's host issue time (:func:`mahia.measure.timing.host_time`), its ops and syncs, the t_sync taken out
    per sync and the ``size`` of the instance measured."""

    timing: Timing
    n_ops: int
    n_syncs: int = 0
    sync_us: float = 0.0
    size: int | None = None

    @property
    def us_per_op(self) -> float:
        """(host time - n_syncs t_sync) / n_ops. Any wait for the device beyond t_sync stays in (an upper bound)."""
        return max(self.timing.median_ms * 1e3 - self.n_syncs * self.sync_us, 0.0) / self.n_ops


def host_cost(make_fn, size: int, *, device, sync_us=0.0, limit=None, counts=None, timer=None) -> HostCost:
    """The host cost per op of the call ``make_fn(size)``. With ``limit`` (a GPU's launch queue,
    :data:`mahia.measure.timing.LAUNCH_QUEUE_KERNELS`) the size is halved until the call queues at most ``limit``
    kernels between two syncs: past it the host waits for the device. ``counts``: the (ops, syncs) of
    ``make_fn(size)`` if already counted; ``timer`` default ``host_time(fn, device=device)``."""
    while True:
        fn = make_fn(size)
        ops, syncs = counts or count_ops_and_syncs(fn)
        counts = None  # a smaller size is counted afresh
        per_run = ops.total / (syncs.count + 1)  # kernels queued between two syncs
        if limit is None or per_run <= limit or size == 1:
            break
        target = size * limit / per_run  # the size that fits if the ops grow in proportion to it
        size //= 2
        while size > 1 and size > target:
            size //= 2
    t = timer(fn) if timer else host_time(fn, device=device)
    return HostCost(t, ops.total, syncs.count, sync_us, size)


def moe_bytes(n_tokens: int, dim: int, hidden: int, n_experts: int, *, element_size: int) -> int:
    """Compulsory traffic of one MoE forward: x and y (N x D each), every expert's weights (w13 D x 2H, w2 H x D)
    and the router (D x E). Not the permuted activations: an ideal kernel need not write them."""
    return (2 * n_tokens * dim + n_experts * 3 * dim * hidden + dim * n_experts) * element_size


def moe_fwd_bwd(moe: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], tuple]:
    """A closure running ``y, aux = moe(x)`` and the gradients of <y, dy> + aux with respect to x and the three
    weights: (y, aux, dx, dw_router, dw13, dw2); ``.grad`` is left untouched."""
    leaves = [x.detach().requires_grad_(), moe.w_router, moe.w13, moe.w2]

    def fn():
        y, aux = moe(leaves[0])
        return (y, aux, *torch.autograd.grad([y, aux], leaves, [dy, torch.ones_like(aux)]))

    return fn


def train_routing(moe, x: torch.Tensor, target: torch.Tensor, *, steps: int, lr: float = 3e-3) -> list[dict]:
    """Fit ``moe`` to ``target`` with Adam on mse(y, target) + aux (scaled by the layer's ``aux_loss_coef``) and
    record the routing balance (``routing_stats``) and the task loss before every step and after the last."""
    opt = torch.optim.Adam(moe.parameters(), lr=lr)
    rows = []
    for step in range(steps + 1):
        y, aux = moe(x)
        task = F.mse_loss(y.float(), target.float())
        stats = moe.routing_stats(x)
        rows.append({"step": step, **{k: stats[k] for k in ("cv", "max_over_mean")}, "task_loss": task.item()})
        if step < steps:
            opt.zero_grad(set_to_none=True)
            (task + aux).backward()
            opt.step()
    return rows


def gla_inputs(B, H, T, K, V, *, device="cpu", dtype=torch.float32, temperature=16.0, seed=0):
    """q, k, v, g and an output gradient ``do`` as a MetaAttention layer makes them, (B, H, T, K or V):
    q ~ N(0, 1/K), k, v ~ N(0, 1), g = logsigmoid(N(0, 1)) / temperature (<= 0), do ~ N(0, 1); drawn on the CPU
    from one seeded generator (the same numbers on every device) in the order of ``mahia.bench.meta``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=gen) * K**-0.5
    k = torch.randn(B, H, T, K, generator=gen)
    v = torch.randn(B, H, T, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, H, T, K, generator=gen)) / temperature
    do = torch.randn(B, H, T, V, generator=gen)
    return tuple(t.to(device, dtype) for t in (q, k, v, g, do))


def fwd_bwd(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], grad_out: torch.Tensor):
    """A closure returning ``out = fn(*inputs)`` and the gradients of <out, grad_out> with respect to every input.
    The inputs are copied once into leaves, so repeated calls time the same work."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def run():
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, grad_out))

    return run


def threshold_in_gap(gates: torch.Tensor, lo: float = 0.3, hi: float = 0.7) -> float:
    """The midpoint of the widest gap between the gate values in [lo, hi] (lo and hi included): a threshold as far
    as can be from every gate, so that rounding cannot flip an on/off decision. Reads the gates (a sync)."""
    vals = gates.detach().double().flatten().cpu()
    vals = torch.cat([torch.tensor([lo, hi], dtype=torch.float64), vals[(vals >= lo) & (vals <= hi)]]).sort().values
    i = int((vals[1:] - vals[:-1]).argmax())
    return float(vals[i] + vals[i + 1]) / 2
