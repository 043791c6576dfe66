"""What notebooks 04 (torch.compile), 05 (CUDA graphs) and 10 share that is not their lesson: a kernel/byte
model of a step, reading Inductor's output, and the capture helpers whose failure handling is not the point.
The notebooks define the compile loop and the capture idiom themselves.

**What a step costs.** :func:`trace_ops` (from :mod:`mahia.measure.instruments`) records every op a call
dispatches; :func:`predict_step` prices such a trace with :mod:`mahia.measure.cost`, ``t_launch`` being the
host cost of one op and ``t_floor`` the shortest kernel::

    GPU time   = sum over kernels of max(t_floor, FLOPs / peak, bytes / bandwidth)
    CPU time   = kernels x t_launch          (one launch when the step replays a CUDA graph)
    step       = max(CPU, GPU)    on a GPU (the host queues work ahead: the slower side sets the pace)
               = CPU + GPU        on a CPU (the same cores dispatch and compute)

**CUDA graphs.** :class:`GraphedTrainStep` captures a whole training step (forward, backward, optimizer
update); :func:`try_capture` captures like :func:`mahia.measure.timing.capture_graph` but reports a failed
capture instead of raising, and leaves CUDA ready for the next one; :func:`cuda_memory` reads what the
allocator holds.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mahia.measure.checks import check_int
from mahia.measure.cost import Machine, step_time, work_ms
from mahia.measure.instruments import OpTrace, trace_ops
from mahia.measure.timing import capture_graph

__all__ = [
    "trace_ops",  # re-exported from mahia.measure.instruments: notebooks 04, 05 and 10 import it from here
    "StepPrediction",
    "predict_step",
    "timed_call",
    "generated_kernels",
    "library_calls",
    "break_even_steps",
    "GraphedTrainStep",
    "CaptureAttempt",
    "try_capture",
    "cuda_memory",
    "Noise",
    "collect_noise",
]

# ---------------------------------------------------------------------------------------------------
# Predicting a step
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPrediction:
    """A step predicted by :func:`predict_step` (times in ms)."""

    cpu_ms: float  # host time to launch the kernels
    gpu_ms: float  # device time of the kernels
    ms: float  # the step: max (GPU, overlapping) or sum (CPU)
    kernels: int
    bytes: int

    @property
    def launch_bound(self) -> bool:
        return self.cpu_ms > self.gpu_ms


def predict_step(
    trace: OpTrace,
    *,
    launch_us: float,
    bandwidth_gbps: float,
    matmul_tflops: float,
    floor_us: float = 0.0,
    fused: bool = False,
    graphed: bool = False,
    overlap: bool = True,
) -> StepPrediction:
    """Predicted time of one step (module docstring): eager, ``fused`` (an ideal compiler) and/or
    ``graphed`` (one launch per step). ``overlap=False`` for a CPU, where dispatch and compute add up."""
    for name, v in (("launch_us", launch_us), ("floor_us", floor_us)):
        if not (isinstance(v, (int, float)) and v >= 0):
            raise ValueError(f"predict_step: {name} must be a number >= 0, got {v!r}")
    for name, v in (("bandwidth_gbps", bandwidth_gbps), ("matmul_tflops", matmul_tflops)):
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"predict_step: {name} must be a positive number, got {v!r}")
    if not isinstance(trace, OpTrace):
        raise TypeError(f"predict_step: trace must be an OpTrace (from trace_ops), got {type(trace).__name__}")
    machine = Machine(
        launch_us=launch_us,
        bandwidth_gbps=bandwidth_gbps,
        matmul_tflops=matmul_tflops,
        floor_us=floor_us,
        overlap=overlap,
    )
    kernels_fb = [(o.flops, o.bytes) for o in trace.ops if o.kind in ("matmul", "opaque")]
    if fused:
        est = trace.fused()
        kernels_fb += [(0, b) for b in est.region_bytes]
        kernels, nbytes = est.kernels, est.bytes
    else:
        kernels_fb += [(0, o.bytes) for o in trace.of_kind("pointwise")]
        kernels, nbytes = trace.kernels, trace.bytes
    t = step_time(machine, launches=1 if graphed else kernels, work_ms=work_ms(kernels_fb, machine))
    return StepPrediction(t.launch_ms, t.work_ms, t.ms, kernels, nbytes)


# ---------------------------------------------------------------------------------------------------
# torch.compile bookkeeping
# ---------------------------------------------------------------------------------------------------


def timed_call(fn: Callable[[], Any], device: torch.device | str) -> tuple[Any, float]:
    """``(fn(), milliseconds)`` of one synchronized call: for a compiled function's first call, whose
    time is the compilation (the median of later calls comes from ``mahia.measure.timing.bench``)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - t0) * 1e3


_KERNEL_RE = None


def generated_kernels(code: str) -> dict[str, str]:
    """{kernel name: source} of the kernels in one Inductor output file (Triton on a GPU, C++ on a CPU):
    the ``name = async_compile.<kind>(..., '''<source>''')`` definitions."""
    import re

    global _KERNEL_RE
    if _KERNEL_RE is None:
        q = "'" * 3
        _KERNEL_RE = re.compile(r"^(\w+) = async_compile\.\w+\([^\n]*?r?" + q + r"\n?(.*?)" + q, re.M | re.S)
    if not isinstance(code, str):
        raise TypeError(f"generated_kernels: code must be a str, got {type(code).__name__}")
    return {m.group(1): m.group(2) for m in _KERNEL_RE.finditer(code)}


def library_calls(code: str) -> dict[str, int]:
    """How often one Inductor output file calls each library kernel it did not generate: matmuls
    (``extern_kernels.mm``), fallbacks to ATen (``torch.ops.aten.<op>``), custom ops (``torch.ops.mahia...``)."""
    import re
    from collections import Counter

    if not isinstance(code, str):
        raise TypeError(f"library_calls: code must be a str, got {type(code).__name__}")
    calls = re.findall(r"^\s*(?:\w+ = )?(extern_kernels\.\w+|torch\.ops\.\w+\.\w+)(?:\.\w+)?\(", code, re.M)
    return dict(Counter(calls))


def break_even_steps(compile_ms: float, eager_ms: float, compiled_ms: float) -> float:
    """Calls after which compiling has paid for itself: compile_ms / (eager_ms - compiled_ms);
    ``inf`` when the compiled call is not faster (it never pays back)."""
    for name, v in (("compile_ms", compile_ms), ("eager_ms", eager_ms), ("compiled_ms", compiled_ms)):
        if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
            raise ValueError(f"break_even_steps: {name} must be a finite number >= 0, got {v!r}")
    saved = eager_ms - compiled_ms
    return compile_ms / saved if saved > 0 else math.inf


# ---------------------------------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------------------------------


def _check_tensors(fn: str, inputs: Sequence[Any]) -> None:
    if not inputs:
        raise ValueError(f"{fn}: needs at least one example input tensor")
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{fn}: input {i} must be a torch.Tensor, got {type(t).__name__} "
                "(capture Python values as tensors, or close over constants)"
            )


def _same_layout(fn: str, static: Sequence[torch.Tensor], inputs: Sequence[Any], *, hint: str = "") -> None:
    """Raise unless ``inputs`` are tensors of the captured ``static`` ones' shapes, dtypes and devices;
    ``hint`` ends the message."""
    if len(inputs) != len(static):
        raise ValueError(f"{fn}: expected {len(static)} inputs, got {len(inputs)}")
    for i, (s, x) in enumerate(zip(static, inputs)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{fn}: input {i} must be a torch.Tensor, got {type(x).__name__}")
        if x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
            raise ValueError(
                f"{fn}: input {i} is {x.dtype} {tuple(x.shape)} on {x.device}, but the graph was captured for "
                f"{s.dtype} {tuple(s.shape)} on {s.device}" + (f": {hint}" if hint else "")
            )


class GraphedTrainStep:
    """A whole training step (forward, backward and the optimizer's update) captured in one CUDA graph and
    replayed: PyTorch's "whole-network capture".

        step = GraphedTrainStep(model, opt, (idx, targets))    # warm-up steps, then one captured step
        loss = step((idx2, targets2))                           # copy into the static batch, one replay

    What capture asks of a training step, and how this class meets it:

    * **static inputs**: every call copies the batch into buffers the graph owns (``static_batch``);
    * **a device-only optimizer step**: ``capturable=True`` keeps the optimizer's step count and its
      arithmetic on the device (checked here; without it ``step()`` refuses to be captured);
    * **gradients in the graph's memory**: ``zero_grad(set_to_none=True)`` before the captured backward,
      so the backward allocates the gradients from the graph's pool; every replay rewrites them in place;
    * **warm-up outside capture**: ``warmup`` real steps on a side stream (the optimizer creates its
      state, kernels are chosen, the allocator grows). They *train the model* on the example batch: give
      an eager twin the same steps before comparing the two.

    ``loss_fn(model, *batch)`` gives the loss (default ``model(*batch)[1]``, a HybridModel's loss). The
    loss returned by a call is the graph's static output: the next replay overwrites it. ``pool`` is the
    graph's memory pool (:func:`mahia.measure.timing.capture_graph`). Nothing in the step may need the
    host (``.item()``, ``nonzero``, a Python branch on a tensor): count its syncs first
    (:func:`mahia.measure.instruments.count_syncs`), a failed capture can leave CUDA unusable.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        example_batch: Sequence[torch.Tensor],
        *,
        warmup: int = 3,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        pool=None,
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"GraphedTrainStep: model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"GraphedTrainStep: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        if not all(group.get("capturable", False) for group in optimizer.param_groups):
            raise ValueError(
                "GraphedTrainStep: the optimizer must be built with capturable=True (its step count and update "
                "then stay on the device); e.g. torch.optim.AdamW(params, lr=..., capturable=True)"
            )
        _check_tensors("GraphedTrainStep", tuple(example_batch))
        if not all(t.is_cuda for t in example_batch):
            raise ValueError("GraphedTrainStep: CUDA graphs need CUDA tensors, got a batch on the CPU")
        check_int("GraphedTrainStep", "warmup", warmup)
        loss_of = loss_fn or (lambda m, *batch: m(*batch)[1])
        self.model, self.optimizer = model, optimizer
        self.static_batch = tuple(t.detach().clone() for t in example_batch)

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)  # at capture: the backward allocates the grads in the pool
            loss = loss_of(model, *self.static_batch)
            loss.backward()
            optimizer.step()
            return loss.detach()

        model.train()
        self.graph, self.static_loss = capture_graph(step, warmup=warmup, pool=pool)

    def __call__(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        _same_layout("GraphedTrainStep", self.static_batch, tuple(batch))
        for s, x in zip(self.static_batch, batch):
            if x is not s:
                s.copy_(x)
        self.graph.replay()
        return self.static_loss


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _first_and_last_error(exc: BaseException) -> tuple[str, str | None]:
    """``(first, last)`` of the chain of errors that ``exc`` ends (``__cause__``/``__context__``): the error
    raised first, and ``exc`` itself when it is another one (an ``__exit__`` that raised while the block's
    error was in flight, say), else None."""
    chain = [exc]
    while len(chain) < 8 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    return _first_line(chain[-1]), (_first_line(exc) if len(chain) > 1 else None)


@dataclass
class CaptureAttempt:
    """What :func:`try_capture` got. When the capture worked, ``graph`` replays it and ``outputs`` is what the
    captured call returned (overwritten by each replay). Otherwise ``error`` is the first error the step raised
    during capture, and ``end_error`` what ending that failed capture raised on top of it, if anything (a CUDA
    error invalidates the capture, and ``cudaStreamEndCapture`` then fails too: "operation failed due to a
    previous error during capture"). ``warnings``: the first sentences of the warnings raised meanwhile."""

    graph: torch.cuda.CUDAGraph | None
    outputs: Any = None
    error: str | None = None
    end_error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.graph is not None

    def __str__(self) -> str:
        s = "captured" if self.ok else str(self.error)
        if self.end_error:
            s += f" (ending the failed capture then raised {self.end_error})"
        if self.warnings:
            s += " [torch warned: " + "; ".join(self.warnings) + "]"
        return s


def try_capture(fn: Callable[..., Any], *example_inputs: torch.Tensor, warmup: int = 1) -> CaptureAttempt:
    """``fn(*example_inputs)`` captured (:func:`mahia.measure.timing.capture_graph`, the inputs themselves
    as the static inputs), or why it cannot be, for showing what breaks capture. A failure is caught, and CUDA
    is left ready for the next capture:

    * the error reported is the first one, the step's own. ``torch.cuda.graph`` ends the capture in its
      ``__exit__`` even when the step raised; when that ``capture_end`` raises as well, Python raises the
      second error with the first as its ``__context__``, so the message the caller would see names only
      the consequence ("a previous error during capture");
    * a ``capture_end`` that raised never restored the caller's stream: it is restored here, and the device
      synchronized.

    A *sticky* CUDA error (an illegal address, a device-side assert) cannot be cleared: the synchronization
    then raises a RuntimeError, and the process needs a restart.
    """
    if not callable(fn):
        raise TypeError(f"try_capture: fn must be callable, got {type(fn).__name__}")
    _check_tensors("try_capture", example_inputs)
    if not all(t.is_cuda for t in example_inputs):
        raise ValueError("try_capture: CUDA graphs need CUDA tensors, got an input on the CPU")
    caller = torch.cuda.current_stream()
    torch.cuda.synchronize()
    graph, outputs, error, end_error = None, None, None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                graph, outputs = capture_graph(lambda: fn(*example_inputs), warmup=warmup)
        except Exception as exc:  # noqa: BLE001 - reporting why the capture failed is the point
            error, end_error = _first_and_last_error(exc)  # strings: the failed graph is freed with exc
        finally:
            torch.cuda.set_stream(caller)
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a sticky error: nothing more can run on this device
        raise RuntimeError(
            f"try_capture: the device reports an error after the failed capture ({_first_line(exc)}); "
            "a sticky CUDA error cannot be cleared in this process"
        ) from exc
    notes = tuple(dict.fromkeys(str(w.message).strip().split(". ")[0] for w in caught))
    return CaptureAttempt(graph, outputs, error, end_error, notes)


def cuda_memory(device: torch.device | str) -> dict[str, int]:
    """What the CUDA caching allocator holds on ``device`` after a sync, in bytes: ``allocated`` (live
    tensors), ``reserved`` (allocated plus the free blocks it keeps cached, including the private pools
    of live CUDA graphs) and ``segments`` (memory obtained from the driver, ``cudaMalloc`` calls kept)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"cuda_memory: needs a CUDA device, got {device}")
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
        "segments": int(stats.get("segment.all.current", 0)),
    }


@dataclass
class Noise:
    """What :func:`collect_noise` kept: warnings, torch's log records and the lines written to stderr."""

    warnings: list[warnings.WarningMessage] = field(default_factory=list)
    records: list[logging.LogRecord] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    def summary(self, what: str) -> str:
        """One line: how many of each were filtered, ``what`` naming why they came."""
        return (
            f"{what}: {len(self.warnings)} warnings, {len(self.records)} torch log records and "
            f"{len(self.stderr)} stderr lines filtered"
        )


class _Keep(logging.Filter):
    def __init__(self, into: list):
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        self.into.append(record)
        return False


@contextlib.contextmanager
def collect_noise():
    """Keep, instead of showing, what a block triggers on purpose: warnings, the records that torch's loggers
    would print (Dynamo's graph-break and recompile logs, Inductor's autotuning) and what is written to
    ``sys.stderr``. Yields the :class:`Noise`, filled when the block ends."""
    noise = Noise()
    keep = _Keep(noise.records)
    handlers = {
        h
        for name, lg in logging.root.manager.loggerDict.items()
        if name.startswith("torch") and isinstance(lg, logging.Logger)
        for h in lg.handlers
    }
    handlers |= set(logging.getLogger("torch").handlers)
    err = io.StringIO()
    for h in handlers:
        h.addFilter(keep)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(err):
            noise.warnings = caught  # filled in place as warnings come
            warnings.simplefilter("always")
            yield noise
    finally:
        for h in handlers:
            h.removeFilter(keep)
        noise.stderr.extend(line for line in err.getvalue().splitlines() if line.strip())
