"""Two training loops that compute the same updates: one full of host-device syncs, one without.

A *sync* is a point where the CPU waits for the GPU to finish everything queued so far (see
:mod:`mahia.measure.instruments`). Without syncs the CPU runs ahead and queues kernels while the GPU works; each sync
drains that queue: the GPU finishes and idles, the result crosses to the host, and the GPU waits again
until the CPU has launched the next kernel. Per sync this costs roughly

    drain + device-to-host copy + launch latency of the next kernel

(launch_chain measures the copy and the launch, the read-back's round trip: its queue holds at most one tiny
kernel at each read, so nothing drains there)

plus, when CPU and GPU work were overlapping, the overlap itself: a step then takes host time + device
time instead of the larger of the two, which costs most when the two are about equal.

The loop (for each batch x (B, F), y (B,) int64):

    l_i  = cross_entropy(model(x)_i, y_i)                          per-sample loss, (B,)
    m_i  = [l_i >= mean(l)]                                         "hard" examples
    loss = sum_i l_i m_i / max(sum_i m_i, 1)                        mean loss over the hard examples
    g    = grad(loss);  n = ||g||_2 over all parameters
    g    = g * (max_norm / (n + eps))  if n > max_norm              gradient-norm clipping
    opt.step();  record loss, running best loss and its step, batch accuracy, clipped-step count

:func:`train_syncing` writes it the way it is usually written: boolean-mask indexing
``l[l >= l.mean()]`` (the output size depends on the data: sync), ``if norm > max_norm:`` and
``if loss < best:`` (Python reads a device value: sync), ``loss.item()`` logging and ``.cpu()`` of a
metric every step (sync). :func:`train_sync_free` computes the same numbers with fixed-size device
arithmetic only: the masked mean above, ``torch.where`` instead of ``if``, and pre-allocated device
buffers for what is recorded; the caller reads them when it wants (one sync), or every ``log_every``
steps. The masked mean keeps *all* examples above the mean, however many; ``topk`` would avoid the
sync too, but selects a fixed number of examples: a different function.

The two paths differ only in the order of the floating-point additions of the masked mean (the
zeros of the non-hard examples take part in the reduction tree), so their parameters agree to float
rounding, not bit for bit.

Also here: :func:`launch_chain`, a loop of tiny kernels with an optional read-back, to measure what one
sync costs on a machine; :func:`host_issue_ms`, how long the host takes to issue a call that never waits,
and from it :func:`host_step_ms`, the host's time per step of a loop; :func:`device_step_ms`, the device's
busy time per step (profiler); :func:`ops_per_step`; :func:`overlap_columns` and :func:`balance_order`, which
set the measured gain of removing the syncs against host time / device time, and
:func:`plot_gain_vs_balance`; :func:`gpu_activity` / :func:`idle_fraction`, which read GPU kernels out of a
``torch.profiler`` Chrome trace; and, re-exported for notebook 01, :func:`mahia.measure.instruments.count_ops`,
the number of ops that launch a kernel.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from mahia.lessons.profiler_summary import profile_calls
from mahia.measure.checks import check_float_dtype, check_int
from mahia.measure.instruments import count_ops
from mahia.measure.timing import issue_ms

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ResidualMLP",
    "make_batches",
    "LoopResult",
    "train_syncing",
    "train_sync_free",
    "launch_chain",
    "host_issue_ms",
    "host_step_ms",
    "device_step_ms",
    "ops_per_step",
    "overlap_columns",
    "BalanceOrder",
    "balance_order",
    "plot_gain_vs_balance",
    "count_ops",  # re-exported from mahia.measure.instruments: notebook 01 imports it from here
    "GPU_CATEGORIES",
    "gpu_activity",
    "idle_fraction",
]

_EPS = 1e-6  # in max_norm / (norm + eps): keeps the scale finite for a zero gradient


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
# The two loops
# ---------------------------------------------------------------------------------------------------


@dataclass
class LoopResult:
    """What a training loop recorded, one entry per step.

    ``losses`` (n_steps,) and ``accuracy`` (n_steps,) float32, ``best_loss`` 0-d, ``best_step`` and
    ``n_clipped`` 0-d int64. :func:`train_syncing` returns them on the CPU; :func:`train_sync_free` on
    the device, unread (reading them is the caller's one sync). ``log`` holds the (step, loss) pairs
    read during the loop.
    """

    losses: torch.Tensor
    accuracy: torch.Tensor
    best_loss: torch.Tensor
    best_step: torch.Tensor
    n_clipped: torch.Tensor
    log: list[tuple[int, float]] = field(default_factory=list)

    def cpu(self) -> LoopResult:
        """A copy with every tensor on the CPU (one sync for a device result)."""
        return LoopResult(
            self.losses.cpu(),
            self.accuracy.cpu(),
            self.best_loss.cpu(),
            self.best_step.cpu(),
            self.n_clipped.cpu(),
            list(self.log),
        )


def _check_loop_args(
    fn: str,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    max_norm: float,
) -> list[nn.Parameter]:
    """The trainable parameters, after checking every argument (shapes, dtypes, devices: no syncs)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{fn}: model has no trainable parameters")
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"{fn}: opt must be a torch.optim.Optimizer, got {type(opt).__name__}")
    owned = {id(p) for p in params}
    if not any(id(p) in owned for g in opt.param_groups for p in g["params"]):
        raise ValueError(f"{fn}: opt does not optimize any parameter of model")
    if not isinstance(batches, (list, tuple)) or len(batches) == 0:
        what = "an empty sequence" if isinstance(batches, (list, tuple)) else type(batches).__name__
        raise ValueError(f"{fn}: batches must be a non-empty list of (x, y) pairs, got {what}")
    dev, dt = params[0].device, params[0].dtype
    for i, pair in enumerate(batches):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"{fn}: batches[{i}] must be an (x, y) pair")
        x, y = pair
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 2):
            raise ValueError(
                f"{fn}: batches[{i}] x must be a 2-d floating tensor (batch, features), got "
                f"{type(x).__name__ if not isinstance(x, torch.Tensor) else (x.dtype, tuple(x.shape))}"
            )
        if not (isinstance(y, torch.Tensor) and y.dtype == torch.int64 and y.dim() == 1):
            raise ValueError(
                f"{fn}: batches[{i}] y must be a 1-d int64 tensor of class indices, got "
                f"{type(y).__name__ if not isinstance(y, torch.Tensor) else (y.dtype, tuple(y.shape))}"
            )
        if y.shape[0] != x.shape[0] or x.shape[0] == 0:
            raise ValueError(
                f"{fn}: batches[{i}] x {tuple(x.shape)} and y {tuple(y.shape)} must hold the "
                "same, non-zero number of examples"
            )
        if x.device != dev or y.device != dev:
            raise ValueError(
                f"{fn}: batches[{i}] must be on the model's device {dev}, got x on {x.device}, y on {y.device}"
            )
        if x.dtype != dt:
            raise TypeError(f"{fn}: batches[{i}] x must have the model's dtype {dt}, got {x.dtype}")
    if (
        isinstance(max_norm, bool)
        or not isinstance(max_norm, (int, float))
        or not (math.isfinite(max_norm) and max_norm > 0)
    ):
        raise ValueError(f"{fn}: max_norm must be a positive finite number, got {max_norm!r}")
    return params


def _grads(params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """||g||_2 over all gradients, a 0-d device tensor (what clip_grad_norm_ computes)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


def train_syncing(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    max_norm: float = 1.0,
) -> LoopResult:
    """The loop of the module docstring, written with the usual habits; 6-7 syncs per step on a GPU.

    Syncs: ``x[mask]`` (nonzero, once in forward and again in its backward), ``if norm > max_norm``,
    ``loss.item()``, ``if loss < best`` (and its ``.item()`` when it improved), ``.cpu()`` of the
    accuracy.
    """
    params = _check_loop_args("train_syncing", model, opt, batches, max_norm)
    losses, accs, log = [], [], []
    best_loss, best_step, n_clipped = float("inf"), -1, 0
    for step, (x, y) in enumerate(batches):
        logits = model(x)  # (B, C)
        per_sample = F.cross_entropy(logits, y, reduction="none")  # (B,)
        hard = per_sample[per_sample >= per_sample.mean()]  # sync: the size of `hard` depends on the data
        loss = hard.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = _grads(params)
        norm = _grad_norm(grads)
        if norm > max_norm:  # sync: Python needs the value to choose a branch
            n_clipped += 1
            torch._foreach_mul_(grads, max_norm / (norm + _EPS))
        opt.step()
        losses.append(loss.item())  # sync
        log.append((step, losses[-1]))
        if loss < best_loss:  # sync
            best_loss, best_step = loss.item(), step  # sync
        accs.append((logits.argmax(-1) == y).float().mean().cpu())  # sync: copy to the host
    return LoopResult(
        torch.tensor(losses, dtype=torch.float32),
        torch.stack(accs),
        torch.tensor(best_loss, dtype=torch.float32),
        torch.tensor(best_step),
        torch.tensor(n_clipped),
        log,
    )


def train_sync_free(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    max_norm: float = 1.0,
    log_every: int = 0,
) -> LoopResult:
    """The same updates as :func:`train_syncing` with no sync inside the loop.

    Masked mean instead of boolean indexing, ``torch.where`` instead of ``if``, results written into
    pre-allocated device buffers. ``log_every=N > 0`` reads the buffered losses once every N steps
    (and the rest at the end) into ``result.log``: N times fewer syncs than reading every step;
    ``log_every=0`` reads nothing.
    """
    params = _check_loop_args("train_sync_free", model, opt, batches, max_norm)
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 0:
        raise ValueError(f"train_sync_free: log_every must be an int >= 0 (0: never read), got {log_every!r}")
    dev, n = batches[0][0].device, len(batches)
    # Allocated with fill kernels, not torch.tensor(...): a host-to-device copy would sync.
    losses = torch.zeros(n, device=dev)
    accs = torch.zeros(n, device=dev)
    best_loss = torch.full((), float("inf"), device=dev)
    best_step = torch.full((), -1, dtype=torch.int64, device=dev)
    n_clipped = torch.zeros((), dtype=torch.int64, device=dev)
    log: list[tuple[int, float]] = []
    read_from = 0
    for step, (x, y) in enumerate(batches):
        logits = model(x)  # (B, C)
        per_sample = F.cross_entropy(logits, y, reduction="none")  # (B,)
        hard = (per_sample >= per_sample.mean()).to(per_sample.dtype)  # (B,) 0/1: fixed size
        loss = (per_sample * hard).sum() / hard.sum().clamp(min=1)  # mean over the hard examples
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = _grads(params)
        norm = _grad_norm(grads)
        clip = norm > max_norm  # a device bool, never read by Python
        n_clipped += clip
        torch._foreach_mul_(grads, torch.where(clip, max_norm / (norm + _EPS), 1.0))  # x1.0 is exact
        opt.step()
        loss = loss.detach()
        losses[step] = loss
        improved = loss < best_loss
        best_loss.copy_(torch.where(improved, loss, best_loss))
        best_step.copy_(torch.where(improved, step, best_step))
        accs[step] = (logits.argmax(-1) == y).float().mean()
        if log_every and ((step + 1) % log_every == 0 or step + 1 == n):
            log.extend(zip(range(read_from, step + 1), losses[read_from : step + 1].tolist()))  # one sync
            read_from = step + 1
    return LoopResult(losses, accs, best_loss, best_step, n_clipped, log)


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


def device_step_ms(run: Callable[[int], object], device: torch.device | str, *, steps: int = 4) -> float:
    """The device's busy time per step, in ms: the time of the kernels, copies and fills of ``run(steps)``
    under ``torch.profiler`` (:func:`mahia.lessons.profiler_summary.profile_calls`), divided by ``steps``.
    Kernel durations do not include the gaps between them, so this is what the step costs the device
    whatever the host does (the profiler slows the host, not the kernels). It includes the call's few
    buffer fills (microseconds). NaN on a CPU: no device runs beside the host there."""
    _check_steps("device_step_ms", run, steps)
    if torch.device(device).type != "cuda":
        return float("nan")
    return profile_calls(lambda: run(steps), device, calls=1, warmup=0).busy_ms / steps


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


# ---------------------------------------------------------------------------------------------------
# The gain of removing the syncs against host time / device time
# ---------------------------------------------------------------------------------------------------


def overlap_columns(host_ms: Sequence[float], device_ms: Sequence[float], step_ms: Sequence[float]) -> pd.DataFrame:
    """Per size of a sweep, from the host's time to issue a sync-free step, the device's busy time of it and
    the measured sync-free step (all ms):

        host/device            > 1: host-bound (the device waits for launches), < 1: device-bound
        bound                  "host" or "device", the larger of the two
        step / max             the measured step over max(host, device): 1 when the two overlap fully
        overlap bound          (host + device) / max(host, device): the gain if the syncs serialized all of
                               a step's host and device work; 1 when one side is zero, 2 when they are equal

    NaN (bound missing) where the device time is NaN (a CPU run).
    """
    import numpy as np
    import pandas as pd

    h, d, s = (np.asarray(v, dtype=float) for v in (host_ms, device_ms, step_ms))
    if not (h.shape == d.shape == s.shape) or h.ndim != 1:
        raise ValueError("overlap_columns: host_ms, device_ms and step_ms need the same length")
    if (h <= 0).any() or (d <= 0).any() or (s <= 0).any():
        raise ValueError("overlap_columns: times must be positive (NaN where not measured)")
    big = np.fmax(h, d)
    measured = ~(np.isnan(h) | np.isnan(d))
    return pd.DataFrame(
        {
            "host/device": h / d,
            "bound": [("host" if hh >= dd else "device") if ok else None for hh, dd, ok in zip(h, d, measured)],
            "step / max": np.where(measured, s / big, np.nan),
            "overlap bound": np.where(measured, (h + d) / big, np.nan),
        }
    )


@dataclass
class BalanceOrder:
    """How the gains of a sweep order against the distance from balance, ``|log(host/device)|``.

    Each pair of sizes whose distances differ is one of: ``agree`` (the size nearer balance gained more),
    ``against`` (it gained less) or a tie in gain. ``*_apart``: of those pairs, how many have 20-80%
    spreads of their gains that do not overlap (the ordering is outside the timing noise). ``top`` is the
    index of the largest gain, ``nearest`` that of the size nearest balance.
    """

    ratio: list[float]
    gain: list[float]
    agree: int
    against: int
    agree_apart: int
    against_apart: int
    top: int
    nearest: int

    @property
    def pairs(self) -> int:
        return self.agree + self.against


def balance_order(
    ratio: Sequence[float], gain: Sequence[float], lo: Sequence[float], hi: Sequence[float]
) -> BalanceOrder:
    """Count the pairs of sweep sizes whose gains (with 20-80% spreads ``lo``-``hi``) order as
    "the nearer host time is to device time (the smaller |log(host/device)|), the larger the gain"."""
    ratio, gain, lo, hi = ([float(x) for x in v] for v in (ratio, gain, lo, hi))  # positions, not labels
    n = len(ratio)
    if not (n == len(gain) == len(lo) == len(hi)) or n == 0:
        raise ValueError("balance_order: ratio, gain, lo and hi need the same, non-zero length")
    if any(not (r > 0 and math.isfinite(r)) for r in ratio):
        raise ValueError(f"balance_order: every host/device ratio must be positive and finite, got {list(ratio)}")
    if any(not (a <= g <= b) for a, g, b in zip(lo, gain, hi)):
        raise ValueError("balance_order: every gain must lie inside its spread lo <= gain <= hi")
    dist = [abs(math.log(r)) for r in ratio]
    agree = against = agree_apart = against_apart = 0
    for i in range(n):
        for j in range(i + 1, n):
            if dist[i] == dist[j] or gain[i] == gain[j]:
                continue
            near, far = (i, j) if dist[i] < dist[j] else (j, i)
            apart = max(lo[i], lo[j]) > min(hi[i], hi[j])
            if gain[near] > gain[far]:
                agree, agree_apart = agree + 1, agree_apart + apart
            else:
                against, against_apart = against + 1, against_apart + apart
    top = max(range(n), key=lambda i: gain[i])
    nearest = min(range(n), key=lambda i: dist[i])
    return BalanceOrder(ratio, gain, agree, against, agree_apart, against_apart, top, nearest)


def plot_gain_vs_balance(df: pd.DataFrame, ax=None, *, title: str = "", device_note: str | None = None):
    """The measured gain of each sweep size (with its 20-80% spread) and its overlap bound against
    host time / device time (log scale); the dotted lines mark balance (host = device) and no gain.
    ``df`` needs columns host/device, measured, lo, hi and overlap bound (:func:`overlap_columns`)."""
    import matplotlib.pyplot as plt

    from mahia.measure.plotting import palette_for

    need = {"host/device", "measured", "lo", "hi", "overlap bound"}
    if not need <= set(df.columns):
        raise ValueError(f"plot_gain_vs_balance: df needs columns {sorted(need)}, got {sorted(df.columns)}")
    d = df.dropna(subset=["host/device"]).sort_values("host/device")
    if d.empty:
        raise ValueError("plot_gain_vs_balance: no size with a measured host/device ratio")
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    x, g = d["host/device"], d["measured"]
    colour = palette_for(["measured", "predicted"])["measured"]  # as in the notebook's gain-against-step plot
    ax.errorbar(
        x, g, yerr=[g - d["lo"], d["hi"] - g], fmt="o-", capsize=3, color=colour, label="measured (20-80% spread)"
    )
    ax.plot(x, d["overlap bound"], "s--", color="grey", label="overlap bound (host + device) / max")
    ax.axvline(1.0, color="black", lw=1, ls=":")
    ax.axhline(1.0, color="black", lw=1, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("host / device time of a sync-free step (log scale; > 1: host-bound)")
    ax.set_ylabel("before / after")
    ax.legend(fontsize=8)
    ax.set_title(f"{title}\n{device_note}" if device_note else title)
    return ax


# ---------------------------------------------------------------------------------------------------
# Reading a torch.profiler trace
# ---------------------------------------------------------------------------------------------------

# Trace categories of work running on the GPU.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _events(trace: dict | str | Path) -> list[dict]:
    if isinstance(trace, (str, Path)):
        trace = json.loads(Path(trace).read_text())
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(
            "gpu_activity: trace must be a Chrome trace (a dict with a 'traceEvents' list) "
            "or the path of one, as written by torch.profiler's export_chrome_trace"
        )
    return [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]


def gpu_activity(trace: dict | str | Path, ranges: Iterable[str]) -> pd.DataFrame:
    """GPU work (kernels, copies, memsets) of a ``torch.profiler`` Chrome trace, by host range.

    ``ranges`` are names of ``torch.profiler.record_function`` blocks on the host. Each GPU event is
    assigned to the range during which its launch call (the runtime event with the same
    ``correlation`` id) ran; events without a matching launch are assigned by their own start time.
    Returns a DataFrame with columns range, name, cat, start_us, end_us (times relative to the first
    GPU event of that range), sorted by range and start.
    """
    import pandas as pd

    names = list(ranges)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError("gpu_activity: ranges must be a non-empty list of record_function names")
    events = _events(trace)
    spans = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name") in names:
            t0 = float(e["ts"])
            spans.setdefault(e["name"], []).append((t0, t0 + float(e.get("dur", 0))))
    missing = [n for n in names if n not in spans]
    if missing:
        raise ValueError(
            f"gpu_activity: no record_function range named {missing} in the trace (found: {sorted(spans)})"
        )
    launch_ts = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None and e.get("cat") not in GPU_CATEGORIES:
            launch_ts[corr] = float(e["ts"])

    def owner(t: float) -> str | None:
        for name, intervals in spans.items():
            if any(a <= t <= b for a, b in intervals):
                return name
        return None

    rows = []
    for e in events:
        if e.get("cat") not in GPU_CATEGORIES:
            continue
        start = float(e["ts"])
        corr = (e.get("args") or {}).get("correlation")
        rng = owner(launch_ts[corr]) if corr in launch_ts else owner(start)
        if rng is not None:
            rows.append(
                {
                    "range": rng,
                    "name": e.get("name", ""),
                    "cat": e["cat"],
                    "start_us": start,
                    "end_us": start + float(e.get("dur", 0)),
                }
            )
    df = pd.DataFrame(rows, columns=["range", "name", "cat", "start_us", "end_us"])
    if df.empty:
        return df
    first = df.groupby("range")["start_us"].transform("min")
    df["start_us"] -= first
    df["end_us"] -= first
    return df.sort_values(["range", "start_us"]).reset_index(drop=True)


def idle_fraction(intervals: Iterable[tuple[float, float]]) -> float:
    """1 - |union of the (start, end) intervals| / (last end - first start): the share of the span
    from the first GPU event to the last during which the GPU ran nothing."""
    iv = sorted((float(a), float(b)) for a, b in intervals)
    if not iv:
        raise ValueError("idle_fraction: no intervals")
    if any(b < a for a, b in iv):
        raise ValueError("idle_fraction: every interval needs end >= start")
    span = max(b for _, b in iv) - iv[0][0]
    if span <= 0:
        return 0.0
    busy, cur_a, cur_b = 0.0, iv[0][0], iv[0][1]
    for a, b in iv[1:]:
        if a > cur_b:
            busy += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    busy += cur_b - cur_a
    return 1.0 - busy / span
