"""One cost model: the time of a step from its launches, syncs, FLOPs and bytes, and the peak memory of a
training step from its byte counts. Plain numbers in, plain numbers out: the counts come from the instruments,
a model's own tables or a formula; the rates from :mod:`mahia.measure.hardware` and a chain of tiny launches.

**Time.** A kernel (or work taken as one, the roofline of its totals) takes on the device

    t_kernel(F, B) = max(t_floor, F / matmul rate, B / bandwidth)               (:func:`kernel_ms`)

and a step of kernels k, issued with ``n_launches`` launches and ``n_syncs`` host-device syncs, takes

    t_work = sum over kernels of t_kernel(F_k, B_k)                             (:func:`work_ms`)
    t_step = max(n_launches t_launch, t_work) + n_syncs t_sync    a GPU: the host queues work ahead, so
                                                                  the slower side sets the pace
    t_step = n_launches t_launch + t_work + n_syncs t_sync        a CPU: the same cores dispatch and compute

A sync drains the queue: nothing overlaps it. A CUDA-graph replay is one launch. A launch-bound step
(n_launches t_launch > t_work) gains from fewer launches (fusion, graphs, no Python loops), a bandwidth-bound
one from fewer bytes (fusion), a matmul-bound one from neither.

**Memory.** Per block b, ``full_b`` is what autograd keeps without checkpointing and ``selective_b`` what it keeps
under selective checkpointing (the block's input and the outputs of its matmuls and attention); ``input`` is a
block's input, ``attn`` the attention kernel's output and log-sum-exp, ``head`` what the rest keeps::

    checkpoint        kept                              recompute (alive again while one block reruns)
    None              sum_b full_b + head               0
    "full"            n_blocks input + head             max_b full_b
    "selective"       sum_b selective_b + head          max_b (full_b - selective_b)
    "keep_attention"  n_blocks (input + attn) + head    max_b full_b - attn

The peak of a training step, on top of weights and optimizer state, falls early in the backward pass, when the
gradients start to exist and little has been freed: ``peak = kept + recompute + gradients``. Allocator slack,
workspaces and backward temporaries are not modelled: measure for the real peak.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def _number(fn: str, name: str, v, *, positive: bool = False, finite: bool = True) -> float:
    """``v`` as a float if it is a real number (not a bool) >= 0 (> 0 with ``positive``; inf allowed unless
    ``finite``), else a ValueError naming ``fn`` and ``name``."""
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and (v > 0 if positive else v >= 0)
    if not ok or (finite and v == math.inf):
        what = ("a finite " if finite else "a ") + ("positive number" if positive else "number >= 0")
        raise ValueError(f"{fn}: {name} must be {what}, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Machine:
    """The rates of one machine: ``launch_us`` (host time to issue a kernel), ``sync_us`` (what a sync adds),
    ``bandwidth_gbps`` (1e9 bytes/s), ``matmul_tflops`` (1e12 FLOP/s), ``floor_us`` (the shortest kernel) and
    ``overlap`` (the host runs ahead of the device: a GPU). A rate of ``inf`` makes that resource free."""

    launch_us: float = 0.0
    sync_us: float = 0.0
    bandwidth_gbps: float = math.inf
    matmul_tflops: float = math.inf
    floor_us: float = 0.0
    overlap: bool = True

    def __post_init__(self) -> None:
        for name in ("launch_us", "sync_us", "floor_us"):
            _number("Machine", name, getattr(self, name))
        for name in ("bandwidth_gbps", "matmul_tflops"):
            _number("Machine", name, getattr(self, name), positive=True, finite=False)
        if not isinstance(self.overlap, bool):
            raise TypeError(f"Machine: overlap must be a bool (True: a GPU, False: a CPU), got {self.overlap!r}")


def _machine(fn: str, machine) -> Machine:
    if not isinstance(machine, Machine):
        raise TypeError(f"{fn}: machine must be a Machine, got {type(machine).__name__}")
    return machine


def kernel_ms(flops: float, nbytes: float, machine: Machine) -> float:
    """Device time of one kernel in ms: ``max(t_floor, flops / matmul rate, bytes / bandwidth)``; of the totals of
    several kernels with ``floor_us=0``, the roofline time of that work."""
    m = _machine("kernel_ms", machine)
    flops, nbytes = _number("kernel_ms", "flops", flops), _number("kernel_ms", "nbytes", nbytes)
    return max(m.floor_us * 1e-3, flops / (m.matmul_tflops * 1e9), nbytes / (m.bandwidth_gbps * 1e6))


def work_ms(kernels: Iterable[tuple[float, float]], machine: Machine) -> float:
    """Device time of a sequence of ``(flops, bytes)`` kernels in ms: the sum of :func:`kernel_ms`."""
    total = 0.0
    for i, k in enumerate(kernels):
        if not (isinstance(k, (tuple, list)) and len(k) == 2):
            raise TypeError(f"work_ms: kernel {i} must be a (flops, bytes) pair, got {k!r}")
        total += kernel_ms(k[0], k[1], machine)
    return total


@dataclass(frozen=True)
class StepTime:
    """One predicted step in ms: its three terms and the step ``ms`` (module docstring)."""

    launch_ms: float  # n_launches * t_launch: the host issuing the kernels
    work_ms: float  # the device running them
    sync_ms: float  # n_syncs * t_sync
    ms: float


def step_time(machine: Machine, *, launches: float, work_ms: float = 0.0, syncs: float = 0) -> StepTime:
    """A step of ``launches`` kernel launches (1 for a CUDA-graph replay), ``work_ms`` of device work and ``syncs``
    host-device syncs: ``max(launches t_launch, work_ms)`` (overlapping, a GPU) or their sum (a CPU), plus
    ``syncs t_sync``."""
    m = _machine("step_time", machine)
    launch = _number("step_time", "launches", launches) * m.launch_us * 1e-3
    work = _number("step_time", "work_ms", work_ms)
    sync = _number("step_time", "syncs", syncs) * m.sync_us * 1e-3
    return StepTime(launch, work, sync, (max(launch, work) if m.overlap else launch + work) + sync)


CHECKPOINT_POLICIES = (None, "full", "selective", "keep_attention")


def activation_bytes(
    blocks: Sequence[tuple[float, float]],
    *,
    block_input: float,
    head: float = 0.0,
    attention: float = 0.0,
    checkpoint: str | None = None,
) -> tuple[float, float]:
    """``(kept, recompute)`` activation bytes for ``checkpoint`` (the module docstring's table; any unit): what
    autograd keeps at the end of the forward pass, and what is alive again while one block is recomputed.
    ``blocks``: ``(full_b, selective_b)`` per block."""
    if checkpoint not in CHECKPOINT_POLICIES:
        raise ValueError(f"activation_bytes: checkpoint must be one of {CHECKPOINT_POLICIES}, got {checkpoint!r}")
    n = len(blocks)
    if checkpoint is None:
        return sum(f for f, _ in blocks) + head, 0.0
    if checkpoint == "full":
        return n * block_input + head, max((f for f, _ in blocks), default=0.0)
    if checkpoint == "keep_attention":
        return n * (block_input + attention) + head, max((max(f - attention, 0.0) for f, _ in blocks), default=0.0)
    return sum(s for _, s in blocks) + head, max((f - s for f, s in blocks), default=0.0)


def training_peak_bytes(*, activations: float, recompute: float, gradients: float) -> int:
    """Peak bytes of a training step on top of the weights and the optimizer state (module docstring)."""
    return int(activations + recompute + gradients)
