"""One cost model: the time of a step from its launches, syncs, FLOPs and bytes, and the peak memory of a
training step from its byte counts.

Plain numbers in, plain numbers out. The counts come from the instruments (:mod:`mahia.measure.instruments`:
ops, syncs, an op trace with bytes and FLOPs), from a model's own tables (its FLOPs and activation bytes per
token) or from a formula; the rates from :mod:`mahia.measure.hardware` (bandwidth, matmul rate) and a chain
of tiny launches (launch and sync cost). Nothing here imports a model.

**Time.** One kernel, or an amount of work taken as one (the roofline of its totals), takes on the device

    t_kernel(F, B) = max(t_floor, F / matmul rate, B / bandwidth)          (:func:`kernel_ms`)

and a step of kernels k, issued by the host with ``n_launches`` launches and ``n_syncs`` host-device
synchronizations, takes

    t_work = sum over kernels of t_kernel(F_k, B_k)                        (:func:`work_ms`)
    t_step = max(n_launches t_launch, t_work) + n_syncs t_sync   overlap: a GPU; the host queues work
                                                                 ahead, so the slower side sets the pace
    t_step = n_launches t_launch + t_work + n_syncs t_sync       no overlap: a CPU; the same cores
                                                                 dispatch and compute
                                                                            (:func:`step_time`)

A sync drains the queue: nothing overlaps it. A step replayed from a CUDA graph is one launch. A step is
launch-bound when n_launches t_launch > t_work: fewer launches (fusion, CUDA graphs, no Python loops) help;
when it is bandwidth-bound fewer bytes help (fusion); when matmul-bound, neither. The rates of a machine
are one :class:`Machine`.

**Memory.** Autograd keeps some activations of every block from the forward pass for the backward pass.
With, per block b, ``full_b`` the bytes it keeps without checkpointing and ``selective_b`` those it keeps
under selective checkpointing (its input and the outputs of its matrix products and attention), ``input``
what full checkpointing keeps of a block (its input), ``attn`` what the fused attention kernel outputs per
block (its output and log-sum-exp) and ``head`` what the part outside the blocks keeps (never
checkpointed)::

    checkpoint    kept                          recompute (alive again while one block is recomputed)
    None          sum_b full_b + head           0
    "full"        n_blocks input + head         max_b full_b                   the whole block is rerun
    "selective"   sum_b selective_b + head      max_b (full_b - selective_b)   only what was not kept
    "keep_attention"  n_blocks (input + attn) + head   max_b full_b - attn   all but the attention output

(:func:`activation_bytes`; any unit: per token, per step). The peak of a training step, on top of the
weights and the optimizer state, falls early in the backward pass, when the gradients start to exist and
little has been freed::

    peak = kept activations + recompute + gradients                        (:func:`training_peak_bytes`)

Allocator slack, workspaces and the temporaries of the backward pass are not modelled: measure for the
real peak.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Machine",
    "kernel_ms",
    "work_ms",
    "StepTime",
    "step_time",
    "CHECKPOINT_POLICIES",
    "activation_bytes",
    "training_peak_bytes",
]


def _number(fn: str, name: str, v, *, positive: bool = False, finite: bool = True) -> float:
    """``v`` as a float if it is a real number (not a bool) >= 0 (> 0 with ``positive``; inf allowed unless
    ``finite``), else a ValueError naming ``fn`` and ``name``."""
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and (v > 0 if positive else v >= 0)
    if ok and finite and v == math.inf:
        ok = False
    if not ok:
        what = ("a finite " if finite else "a ") + ("positive number" if positive else "number >= 0")
        raise ValueError(f"{fn}: {name} must be {what}, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Machine:
    """The rates of one machine for the cost model (module docstring).

    ``launch_us``: host time to issue one kernel; ``sync_us``: what one host-device sync adds;
    ``bandwidth_gbps``: device memory bandwidth (GB/s, 1e9 bytes); ``matmul_tflops``: the matmul rate
    (TFLOP/s, 1e12); ``floor_us``: the shortest a kernel takes; ``overlap``: whether the host runs ahead of
    the device (True on a GPU, False on a CPU). A rate of ``inf`` (the default) makes that resource free:
    leave out what a prediction does not use.
    """

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


def kernel_ms(flops: float, nbytes: float, machine: Machine) -> float:
    """Device time of one kernel in ms: ``max(t_floor, flops / matmul rate, bytes / bandwidth)``. Applied to
    the totals of several kernels, the roofline time of that work (no floor per kernel then: pass a
    ``machine`` with ``floor_us=0``)."""
    if not isinstance(machine, Machine):
        raise TypeError(f"kernel_ms: machine must be a Machine, got {type(machine).__name__}")
    flops = _number("kernel_ms", "flops", flops)
    nbytes = _number("kernel_ms", "nbytes", nbytes)
    return max(machine.floor_us * 1e-3, flops / (machine.matmul_tflops * 1e9), nbytes / (machine.bandwidth_gbps * 1e6))


def work_ms(kernels: Iterable[tuple[float, float]], machine: Machine) -> float:
    """Device time of a sequence of kernels in ms: the sum of :func:`kernel_ms` over ``(flops, bytes)`` pairs."""
    total = 0.0
    for i, k in enumerate(kernels):
        if not (isinstance(k, (tuple, list)) and len(k) == 2):
            raise TypeError(f"work_ms: kernel {i} must be a (flops, bytes) pair, got {k!r}")
        total += kernel_ms(k[0], k[1], machine)
    return total


@dataclass(frozen=True)
class StepTime:
    """One predicted step, in ms: its three terms and their combination ``ms`` (module docstring)."""

    launch_ms: float  # n_launches * t_launch: the host issuing the kernels
    work_ms: float  # the device running them
    sync_ms: float  # n_syncs * t_sync
    ms: float  # the step
    overlap: bool

    @property
    def launch_bound(self) -> bool:
        """The host's launches take longer than the device's work."""
        return self.launch_ms > self.work_ms

    @property
    def bound_by(self) -> str:
        """The largest term: ``"launches"``, ``"device work"`` or ``"syncs"``."""
        terms = {"launches": self.launch_ms, "device work": self.work_ms, "syncs": self.sync_ms}
        return max(terms, key=terms.get)


def step_time(machine: Machine, *, launches: float, work_ms: float = 0.0, syncs: float = 0) -> StepTime:
    """A step of ``launches`` kernel launches (1 for a CUDA-graph replay), ``work_ms`` of device work (from
    :func:`work_ms`, :func:`kernel_ms` or a measurement) and ``syncs`` host-device syncs on ``machine``:

        ms = max(launches t_launch, work_ms) + syncs t_sync     machine.overlap (a GPU)
        ms = launches t_launch + work_ms + syncs t_sync         otherwise (a CPU)
    """
    if not isinstance(machine, Machine):
        raise TypeError(f"step_time: machine must be a Machine, got {type(machine).__name__}")
    launches = _number("step_time", "launches", launches)
    work = _number("step_time", "work_ms", work_ms)
    syncs = _number("step_time", "syncs", syncs)
    launch = launches * machine.launch_us * 1e-3
    sync = syncs * machine.sync_us * 1e-3
    busy = max(launch, work) if machine.overlap else launch + work
    return StepTime(launch, work, sync, busy + sync, machine.overlap)


# ---------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------

CHECKPOINT_POLICIES = (None, "full", "selective", "keep_attention")


def activation_bytes(
    blocks: Sequence[tuple[float, float]],
    *,
    block_input: float,
    head: float = 0.0,
    attention: float = 0.0,
    checkpoint: str | None = None,
) -> tuple[float, float]:
    """``(kept, recompute)``: the activation bytes autograd keeps at the end of the forward pass, and those
    alive again while one checkpointed block is recomputed during backward (module docstring).

    ``blocks``: ``(full_b, selective_b)`` per block, the bytes block b keeps without checkpointing and with
    selective checkpointing; ``block_input``: what full checkpointing keeps of each block; ``head``: what
    the rest of the model keeps (not checkpointed); ``attention``: what the attention kernel outputs per
    block (kept by ``"keep_attention"``); ``checkpoint``: one of ``CHECKPOINT_POLICIES``.
    """
    if checkpoint not in CHECKPOINT_POLICIES:
        raise ValueError(f"activation_bytes: checkpoint must be one of {CHECKPOINT_POLICIES}, got {checkpoint!r}")
    block_input = _number("activation_bytes", "block_input", block_input)
    head = _number("activation_bytes", "head", head)
    attention = _number("activation_bytes", "attention", attention)
    pairs = []
    for i, b in enumerate(blocks):
        if not (isinstance(b, (tuple, list)) and len(b) == 2):
            raise TypeError(f"activation_bytes: block {i} must be a (full, selective) pair, got {b!r}")
        full = _number("activation_bytes", f"block {i} full", b[0])
        sel = _number("activation_bytes", f"block {i} selective", b[1])
        if sel > full:
            raise ValueError(
                f"activation_bytes: block {i} keeps more with selective checkpointing ({sel}) than without ({full})"
            )
        pairs.append((full, sel))
    if checkpoint is None:
        return sum(f for f, _ in pairs) + head, 0.0
    if checkpoint == "full":
        return len(pairs) * block_input + head, max((f for f, _ in pairs), default=0.0)
    if checkpoint == "keep_attention":
        rerun = max((max(f - attention, 0.0) for f, _ in pairs), default=0.0)
        return len(pairs) * (block_input + attention) + head, rerun
    return sum(s for _, s in pairs) + head, max((f - s for f, s in pairs), default=0.0)


def training_peak_bytes(*, activations: float, recompute: float, gradients: float) -> int:
    """Peak bytes of a training step on top of the weights and the optimizer state:
    ``activations + recompute + gradients`` (module docstring), rounded down to whole bytes."""
    return int(
        sum(
            _number("training_peak_bytes", name, v)
            for name, v in (("activations", activations), ("recompute", recompute), ("gradients", gradients))
        )
    )
