"""Measurement glue for notebooks 08 (MoE routing) and 09 (hybrid components).

None of this is a model component; it is what the two notebooks need around the components:

* ``launch_costs`` and ``launch_model_ms``: the cost model both notebooks predict with
  (:mod:`mahia.measure.cost`). A step of small kernels costs about

      t = max(n_ops * t_launch, t_work) + n_syncs * t_sync        (GPU; on a CPU the sum: overlap=False)

  where ``t_launch`` is what the host needs to issue one kernel, ``t_work`` the device time of the
  arithmetic, and ``t_sync`` what one host-device synchronization adds (drain the queue, copy the value
  back, launch again). On a GPU launches overlap with device work (hence the max); a sync does not.
* ``HostCost``, ``host_cost`` and ``host_row``: the model's ``t_launch`` is the cost of a
  one-element add in a bare chain; a real op costs the host more (module calls, argument checks, autograd
  recording, allocation). ``host_cost`` measures a call's host issue time directly
  (:func:`mahia.measure.timing.host_time`) and divides it by the call's ops, on a smaller instance of the
  call when the full one would overfill the launch queue; ``host_row`` puts a path's two predictions (with
  t_launch, and with that measured per-op cost in its place) next to its time.
* ``count_ops_and_syncs``: the ``n_ops`` (ops that launch a kernel, :func:`mahia.measure.instruments.count_ops`)
  and ``n_syncs`` of one call.
* ``moe_bytes``, ``moe_fwd_bwd``, ``check_moe``, ``train_routing``: the MoE layer's compulsory memory
  traffic, a forward + backward closure returning every gradient, a check of one implementation
  against another, and a short training run that records how evenly the router spreads the tokens.
* ``gla_inputs`` and ``fwd_bwd``: gated-linear-attention inputs as a MetaAttention layer makes them,
  and a forward + backward closure for any function of tensors.
* ``threshold_in_gap``: a gate threshold that no gate value sits near, so that a low-precision path
  and its float64 reference switch the same layers on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mahia.lessons.sync_loops import launch_chain
from mahia.measure.checks import check_close, check_float_dtype, check_int, tolerance
from mahia.measure.cost import Machine, step_time
from mahia.measure.instruments import OpCount, SyncReport, count_ops, count_syncs
from mahia.measure.timing import Timing, host_time
from mahia.measure.timing import bench as _bench

__all__ = [
    "LaunchCosts",
    "launch_costs",
    "launch_model_ms",
    "HostCost",
    "host_cost",
    "host_row",
    "count_ops_and_syncs",
    "moe_bytes",
    "moe_fwd_bwd",
    "check_moe",
    "train_routing",
    "gla_inputs",
    "fwd_bwd",
    "threshold_in_gap",
]

MOE_OUTPUTS = ("y", "aux", "dx", "dw_router", "dw13", "dw2")


# ---------------------------------------------------------------------------------------------------
# The launch-and-sync cost model
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchCosts:
    """What one tiny kernel launch and one host-device sync cost on this device, in microseconds,
    with the two timings they were derived from."""

    launch_us: float
    sync_us: float
    chain: Timing
    chain_synced: Timing
    n_kernels: int


def launch_costs(
    device: torch.device | str, *, n_kernels: int = 200, bench: Callable[..., Timing] | None = None
) -> LaunchCosts:
    """Measure t_launch and t_sync with ``mahia.lessons.sync_loops.launch_chain``.

    t_launch = time(chain of ``n_kernels`` one-element adds) / n_kernels  (launch-bound on a GPU);
    t_sync   = (time(same chain reading the value back after every kernel) - time(chain)) / n_kernels.
    ``bench`` is the timing function (e.g. a notebook's ``ctx.bench``); default ``mahia.measure.timing.bench``.
    On a CPU both are host costs: an op's dispatch overhead, and (nearly) nothing for a "sync".
    """
    check_int("launch_costs", "n_kernels", n_kernels)
    dev = torch.device(device)
    timer = bench if bench is not None else (lambda fn, **kw: _bench(fn, device=dev, **kw))
    x = torch.zeros(1, device=dev)
    chain = timer(lambda: launch_chain(x, n_kernels), memory=False)
    synced = timer(lambda: launch_chain(x, n_kernels, read_every=1), memory=False)
    launch_us = chain.median_ms * 1e3 / n_kernels
    sync_us = max(synced.median_ms - chain.median_ms, 0.0) * 1e3 / n_kernels
    return LaunchCosts(launch_us, sync_us, chain, synced, n_kernels)


def launch_model_ms(
    n_ops: float, n_syncs: float, launch_us: float, sync_us: float, work_ms: float = 0.0, *, overlap: bool = True
) -> float:
    """Predicted time in ms: max(n_ops * t_launch, work_ms) + n_syncs * t_sync
    (:func:`mahia.measure.cost.step_time`).

    On a GPU the host issues ``n_ops`` kernels while the device runs ``work_ms`` of arithmetic, so the
    two overlap and the slower one sets the pace; each sync drains the queue and adds ``t_sync``. On a
    CPU (``overlap=False``) the same cores dispatch and compute: n_ops * t_launch + work_ms + n_syncs * t_sync.
    """
    for name, v in (
        ("n_ops", n_ops),
        ("n_syncs", n_syncs),
        ("launch_us", launch_us),
        ("sync_us", sync_us),
        ("work_ms", work_ms),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"launch_model_ms: {name} must be a number >= 0, got {v!r}")
    machine = Machine(launch_us=launch_us, sync_us=sync_us, overlap=overlap)
    return step_time(machine, launches=n_ops, work_ms=work_ms, syncs=n_syncs).ms


def count_ops_and_syncs(fn: Callable[[], object]) -> tuple[OpCount, SyncReport]:
    """Run ``fn()`` once; return the ops it dispatched that launch a kernel (views, allocations and
    ``.item()`` excluded) and its host syncs."""
    if not callable(fn):
        raise TypeError(f"count_ops_and_syncs: fn must be callable, got {type(fn).__name__}")
    with count_syncs(keep_stack=False) as syncs, count_ops() as ops:
        fn()
    return ops, syncs


@dataclass(frozen=True)
class HostCost:
    """A call's measured host issue time (``timing``, from :func:`mahia.measure.timing.host_time`) with the ops
    (``n_ops``) and syncs (``n_syncs``) it dispatched, ``size`` the instance measured (``None``: not sized)
    and ``sync_us`` the t_sync taken out for each sync."""

    timing: Timing
    n_ops: int
    n_syncs: int = 0
    sync_us: float = 0.0
    size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.timing, Timing):
            raise TypeError(f"HostCost: timing must be a Timing (from host_time), got {type(self.timing).__name__}")
        check_int("HostCost", "n_ops", self.n_ops)
        check_int("HostCost", "n_syncs", self.n_syncs, minimum=0)
        if isinstance(self.sync_us, bool) or not isinstance(self.sync_us, (int, float)) or not self.sync_us >= 0:
            raise ValueError(f"HostCost: sync_us must be a number >= 0, got {self.sync_us!r}")

    @property
    def us_per_op(self) -> float:
        """Host µs per op: (host median - n_syncs * t_sync) / n_ops, at least 0. A call that syncs waits for the
        device at each sync; t_sync is taken out, any wait beyond it stays in (an upper bound on the host's
        own cost per op then)."""
        return max(self.timing.median_ms * 1e3 - self.n_syncs * self.sync_us, 0.0) / self.n_ops


def host_cost(
    make_fn: Callable[[int], Callable[[], object]],
    size: int,
    *,
    device: torch.device | str,
    sync_us: float = 0.0,
    limit: int | None = None,
    counts: tuple[OpCount, SyncReport] | None = None,
    timer: Callable[[Callable[[], object]], Timing] | None = None,
) -> HostCost:
    """Measure the host cost per op of the call ``make_fn(size)`` (a zero-argument function).

    With ``limit`` (the launch queue, :data:`mahia.measure.timing.LAUNCH_QUEUE_KERNELS`, on a GPU) the size
    is halved until the call queues at most ``limit`` kernels between two syncs, ops / (syncs + 1): past it
    the host waits for the device and its time is no longer its own (:func:`mahia.measure.timing.host_time`).
    Each step halves as often as ops growing in proportion to the size say it must, then counts again.
    ``counts``: the (ops, syncs) of ``make_fn(size)`` when already counted (skips one counting run).
    ``timer``: how to time a call (default ``host_time(fn, device=device)``). The result's ``size`` says
    which instance was measured.
    """
    if not callable(make_fn):
        raise TypeError(f"host_cost: make_fn must be callable, got {type(make_fn).__name__}")
    check_int("host_cost", "size", size)
    if limit is not None:
        check_int("host_cost", "limit", limit)
    while True:
        fn = make_fn(size)
        ops, syncs = counts if counts is not None else count_ops_and_syncs(fn)
        counts = None  # a smaller size is counted afresh
        per_run = ops.total / (syncs.count + 1)  # kernels queued between two syncs, on average
        if limit is None or per_run <= limit or size == 1:
            break
        target = size * limit / per_run  # the size that fits if the ops grow in proportion to it
        size //= 2
        while size > 1 and size > target:  # halve straight to it; the count at that size checks the guess
            size //= 2
    if ops.total == 0:
        raise ValueError(f"host_cost: make_fn({size}) dispatched no op that launches a kernel: no cost per op")
    t = timer(fn) if timer is not None else host_time(fn, device=device)
    return HostCost(t, ops.total, syncs.count, sync_us, size)


def host_row(
    path: str,
    host: HostCost,
    *,
    measured: Timing,
    n_ops: int,
    n_syncs: int,
    launch_us: float,
    predicted_ms: float,
    refined_ms: float,
    instance: str = "",
) -> dict:
    """One path's row for a table: its full call's
    ``n_ops`` and ``n_syncs``, the host cost measured (on ``instance``, e.g. "T=32", when smaller than the
    full call: ``host.n_ops`` ops), the measured time (median, 20th and 80th percentiles) and the two
    predictions: with t_launch (``predicted_ms``) and with the measured host cost (``refined_ms``)."""
    if not isinstance(host, HostCost) or not isinstance(measured, Timing):
        raise TypeError("host_row: host must be a HostCost and measured a Timing")
    check_int("host_row", "n_ops", n_ops)
    check_int("host_row", "n_syncs", n_syncs, minimum=0)
    for name, v in (("launch_us", launch_us), ("predicted_ms", predicted_ms), ("refined_ms", refined_ms)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"host_row: {name} must be a number > 0, got {v!r}")
    return {
        "path": path,
        "ops": n_ops,
        "syncs": n_syncs,
        "host instance": instance or "the call itself",
        "host ops": host.n_ops,
        "host ms": host.timing.median_ms,
        "host µs/op": host.us_per_op,
        "t_launch µs": launch_us,
        "measured ms": measured.median_ms,
        "p20 ms": measured.p20_ms,
        "p80 ms": measured.p80_ms,
        "predicted ms": predicted_ms,
        "refined ms": refined_ms,
    }


# ---------------------------------------------------------------------------------------------------
# Mixture of experts
# ---------------------------------------------------------------------------------------------------


def moe_bytes(n_tokens: int, dim: int, hidden: int, n_experts: int, *, element_size: int) -> int:
    """Compulsory device-memory traffic of one MoE forward: read x and write y (N x D each), read every
    expert's weights once (E x 3 x D x H: w13 is D x 2H, w2 is H x D) and the router (D x E).

    The permuted activations the grouped path writes and reads back are not counted: they are the
    implementation's choice, not the function's, so the roofline shows what an ideal kernel must move.
    """
    for name, v in (
        ("n_tokens", n_tokens),
        ("dim", dim),
        ("hidden", hidden),
        ("n_experts", n_experts),
        ("element_size", element_size),
    ):
        check_int("moe_bytes", name, v)
    return (2 * n_tokens * dim + n_experts * 3 * dim * hidden + dim * n_experts) * element_size


def _check_moe_like(fn: str, moe) -> None:
    for attr in ("w_router", "w13", "w2", "routing_stats"):
        if not hasattr(moe, attr):
            raise TypeError(f"{fn}: moe must be a mahia.model.moe.MoE, got {type(moe).__name__}")


def moe_fwd_bwd(moe: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], tuple]:
    """A closure running ``y, aux = moe(x)`` and the gradients of <y, dy> + aux with respect to x and
    the three weights. It returns (y, aux, dx, dw_router, dw13, dw2); ``.grad`` is left untouched."""
    _check_moe_like("moe_fwd_bwd", moe)
    if not isinstance(x, torch.Tensor) or not isinstance(dy, torch.Tensor):
        raise TypeError("moe_fwd_bwd: x and dy must be tensors")
    if dy.shape != x.shape:
        raise ValueError(f"moe_fwd_bwd: dy must have the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    leaves = [x.detach().requires_grad_(), moe.w_router, moe.w13, moe.w2]

    def fn():
        y, aux = moe(leaves[0])
        grads = torch.autograd.grad([y, aux], leaves, [dy, torch.ones_like(aux)])
        return (y, aux, *grads)

    return fn


def check_moe(
    fast: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, *, tol: float | None = None
) -> dict[str, float]:
    """Compare ``fast`` with ``ref`` (two MoE layers with the same weights): output, aux loss and the
    gradients of x, w_router, w13, w2. Returns the norm-wise relative errors by name; raises
    ``CorrectnessError`` at the first one over ``tol`` (default ``tolerance(x.dtype)``)."""
    _check_moe_like("check_moe", fast)
    _check_moe_like("check_moe", ref)
    tol = tolerance(x.dtype) if tol is None else tol
    got = moe_fwd_bwd(fast, x, dy)()
    want = moe_fwd_bwd(ref, x, dy)()
    return {
        name: check_close(f"{name} ({fast.impl} vs {ref.impl})", g, w, tol)
        for name, g, w in zip(MOE_OUTPUTS, got, want)
    }


def train_routing(
    moe: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, steps: int, lr: float = 3e-3
) -> list[dict]:
    """Fit ``moe`` to ``target`` with Adam on  mse(y, target) + aux  for ``steps`` steps (in place) and
    record the routing balance before every step and after the last one.

    Returns ``steps + 1`` rows: step, cv and max_over_mean of the tokens per expert (``routing_stats``),
    task_loss and aux_loss. The aux loss enters scaled by the layer's ``aux_loss_coef``, so running this
    with two coefficients shows what the load-balancing term does to the routing.
    """
    _check_moe_like("train_routing", moe)
    check_int("train_routing", "steps", steps, minimum=0)
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"train_routing: lr must be a positive number, got {lr!r}")
    if not isinstance(target, torch.Tensor) or target.shape != x.shape:
        raise ValueError(
            f"train_routing: target must be a tensor with the shape of x {tuple(x.shape)}, "
            f"got {getattr(target, 'shape', type(target).__name__)}"
        )
    opt = torch.optim.Adam(moe.parameters(), lr=lr)
    rows = []
    for step in range(steps + 1):
        y, aux = moe(x)
        task = F.mse_loss(y.float(), target.float())
        stats = moe.routing_stats(x)
        rows.append(
            {
                "step": step,
                "cv": stats["cv"],
                "max_over_mean": stats["max_over_mean"],
                "task_loss": float(task.detach()),
                "aux_loss": float(aux.detach()),
            }
        )
        if step == steps:
            break
        opt.zero_grad(set_to_none=True)
        (task + aux).backward()
        opt.step()
    return rows


# ---------------------------------------------------------------------------------------------------
# Gated linear attention
# ---------------------------------------------------------------------------------------------------


def gla_inputs(
    B: int,
    H: int,
    T: int,
    K: int,
    V: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    temperature: float = 16.0,
    seed: int = 0,
):
    """q, k, v, g and an output gradient ``do`` as a MetaAttention layer makes them:
    q ~ N(0, 1/K), k, v ~ N(0, 1), g = logsigmoid(N(0, 1)) / temperature (<= 0), do ~ N(0, 1).

    Drawn on the CPU from one seeded generator (the same numbers on every device), in the order of
    ``mahia.bench.meta``, then moved to ``device`` and ``dtype``. Shapes (B, H, T, K) and (B, H, T, V).
    """
    for name, v in (("B", B), ("H", H), ("T", T), ("K", K), ("V", V)):
        check_int("gla_inputs", name, v)
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"gla_inputs: temperature must be a positive number, got {temperature!r}")
    check_float_dtype("gla_inputs", dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=gen) * K**-0.5
    k = torch.randn(B, H, T, K, generator=gen)
    v = torch.randn(B, H, T, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, H, T, K, generator=gen)) / temperature
    do = torch.randn(B, H, T, V, generator=gen)
    return tuple(t.to(device, dtype) for t in (q, k, v, g, do))


def fwd_bwd(
    fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], grad_out: torch.Tensor
) -> Callable[[], tuple]:
    """A closure running ``out = fn(*inputs)`` and the gradients of <out, grad_out> with respect to every
    input. The inputs are detached copies made once (leaves), so repeated calls time the same work.
    It returns (out, *grads)."""
    if not callable(fn):
        raise TypeError(f"fwd_bwd: fn must be callable, got {type(fn).__name__}")
    for i, t in enumerate(inputs):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            raise TypeError(f"fwd_bwd: inputs[{i}] must be a floating-point tensor")
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def run():
        out = fn(*leaves)
        if out.shape != grad_out.shape:
            raise ValueError(f"fwd_bwd: grad_out has shape {tuple(grad_out.shape)} but fn returned {tuple(out.shape)}")
        return (out, *torch.autograd.grad(out, leaves, grad_out))

    return run


# ---------------------------------------------------------------------------------------------------
# Gates
# ---------------------------------------------------------------------------------------------------


def threshold_in_gap(gates: torch.Tensor, lo: float = 0.3, hi: float = 0.7) -> float:
    """The midpoint of the widest gap between the values of ``gates`` that lie in [lo, hi] (lo and hi
    count as values). A threshold there is as far as possible from every gate, so rounding differences
    between two implementations cannot flip an on/off decision. Reads the gates to the host (a sync)."""
    if not (isinstance(gates, torch.Tensor) and gates.is_floating_point() and gates.numel() > 0):
        raise TypeError("threshold_in_gap: gates must be a non-empty floating-point tensor")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi):
        raise ValueError(f"threshold_in_gap: need numbers lo < hi, got lo={lo!r}, hi={hi!r}")
    inside = gates.detach().double().flatten().cpu()
    inside = inside[(inside >= lo) & (inside <= hi)]
    vals = torch.cat([torch.tensor([float(lo), float(hi)], dtype=torch.float64), inside]).sort().values
    i = int((vals[1:] - vals[:-1]).argmax())
    return float(vals[i] + vals[i + 1]) / 2
