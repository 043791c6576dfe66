"""What notebooks 04 (torch.compile), 05 (CUDA graphs) and 10 share that is not their lesson. :func:`predict_step`
prices an op trace with :mod:`mahia.measure.cost` (``t_launch``: the host cost of one op; ``t_floor``: the
shortest kernel)::

    GPU time = sum over kernels of max(t_floor, FLOPs / peak, bytes / bandwidth)
    CPU time = kernels x t_launch          (one launch when the step replays a CUDA graph)
    step     = max(CPU, GPU) on a GPU (the host queues work ahead), CPU + GPU on a CPU (the same cores do both)
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mahia.measure.cost import Machine, step_time, work_ms
from mahia.measure.instruments import OpTrace, trace_ops  # noqa: F401 (notebooks 04, 05 and 10 import trace_ops here)
from mahia.measure.timing import capture_graph


@dataclass(frozen=True)
class StepPrediction:
    cpu_ms: float  # host time to launch the kernels
    gpu_ms: float  # device time of the kernels
    ms: float  # the step: max (GPU, overlapping) or sum (CPU)
    kernels: int
    bytes: int


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


def timed_call(fn: Callable[[], Any], device: torch.device | str) -> tuple[Any, float]:
    """``(fn(), milliseconds)`` of one synchronized call: a compiled function's first call, its compilation."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - t0) * 1e3


_KERNEL_RE = re.compile(r"^(\w+) = async_compile\.\w+\([^\n]*?r?'''\n?(.*?)'''", re.M | re.S)


def generated_kernels(code: str) -> dict[str, str]:
    """{kernel name: source} of the ``name = async_compile.<kind>(..., '''<source>''')`` definitions of one
    Inductor output file (Triton on a GPU, C++ on a CPU)."""
    return {m.group(1): m.group(2) for m in _KERNEL_RE.finditer(code)}


def library_calls(code: str) -> dict[str, int]:
    """How often one Inductor output file calls each kernel it did not generate: matmuls
    (``extern_kernels.mm``), ATen fallbacks (``torch.ops.aten.<op>``), custom ops (``torch.ops.mahia...``)."""
    calls = re.findall(r"^\s*(?:\w+ = )?(extern_kernels\.\w+|torch\.ops\.\w+\.\w+)(?:\.\w+)?\(", code, re.M)
    return dict(Counter(calls))


def break_even_steps(compile_ms: float, eager_ms: float, compiled_ms: float) -> float:
    """Calls after which compiling has paid for itself: compile_ms / (eager_ms - compiled_ms), else ``inf``."""
    saved = eager_ms - compiled_ms
    return compile_ms / saved if saved > 0 else math.inf


class GraphedTrainStep:
    """A whole training step (forward, backward, the optimizer's update; ``capturable=True`` keeps its step count
    on the device) in one CUDA graph: ``step = GraphedTrainStep(model, opt, batch)``, then ``loss = step(batch2)``
    copies the batch into the graph's inputs (made in its strides: a compiled model guards on them) and replays
    it. The ``warmup`` steps *train the model*: give an eager twin the same. ``loss_fn(model, *batch)`` gives the
    loss (default ``model(*batch)[1]``); the next replay overwrites the returned loss."""

    def __init__(self, model, optimizer, example_batch: Sequence[torch.Tensor], *, warmup=3, loss_fn=None, pool=None):
        if not all(group.get("capturable", False) for group in optimizer.param_groups):
            raise ValueError("GraphedTrainStep: the optimizer must be built with capturable=True")
        loss_of = loss_fn or (lambda m, *batch: m(*batch)[1])
        self.static_batch = tuple(t.new_empty_strided(t.shape, t.stride()).copy_(t.detach()) for t in example_batch)

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)  # at capture: the backward allocates the grads in the pool
            loss = loss_of(model, *self.static_batch)
            loss.backward()
            optimizer.step()
            return loss.detach()

        model.train()
        self.graph, self.static_loss = capture_graph(step, warmup=warmup, pool=pool)

    def __call__(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        for s, x in zip(self.static_batch, batch, strict=True):
            s.copy_(x)
        self.graph.replay()
        return self.static_loss


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


@dataclass
class CaptureAttempt:
    """What :func:`try_capture` got: the ``graph`` and its ``outputs`` (overwritten by each replay), or the
    ``error`` the step itself raised."""

    graph: torch.cuda.CUDAGraph | None
    outputs: Any = None
    error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.graph is not None

    def __str__(self) -> str:
        s = "captured" if self.ok else str(self.error)
        return s + (" [torch warned: " + "; ".join(self.warnings) + "]" if self.warnings else "")


def try_capture(fn: Callable[..., Any], *example_inputs: torch.Tensor, warmup: int = 1) -> CaptureAttempt:
    """``fn(*example_inputs)`` captured (the inputs themselves as the static inputs), or why it cannot be.

    When the step raises, ``torch.cuda.graph``'s ``__exit__`` ends the capture and that can raise too ("a previous
    error during capture"): Python shows only the consequence. Here the step's own error (the first of the chain)
    is reported, the caller's stream restored and the device synchronized.
    """
    caller = torch.cuda.current_stream()
    torch.cuda.synchronize()
    graph, outputs, error = None, None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                graph, outputs = capture_graph(lambda: fn(*example_inputs), warmup=warmup)
        except Exception as exc:  # noqa: BLE001 - reporting why the capture failed is the point
            while exc.__cause__ or exc.__context__:
                exc = exc.__cause__ or exc.__context__
            error = _first_line(exc)
        finally:
            torch.cuda.set_stream(caller)
    torch.cuda.synchronize()
    notes = tuple(dict.fromkeys(str(w.message).strip().split(". ")[0] for w in caught))
    return CaptureAttempt(graph, outputs, error, notes)


def cuda_memory(device: torch.device | str) -> dict[str, int]:
    """Bytes the CUDA allocator holds after a sync: ``allocated`` (live tensors) and ``reserved`` (those plus
    the cached free blocks, the private pools of live CUDA graphs included)."""
    torch.cuda.synchronize(device)
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device)}


@dataclass
class Noise:
    warnings: list = field(default_factory=list)
    records: list = field(default_factory=list)  # torch's log records
    stderr: list = field(default_factory=list)

    def summary(self, what: str) -> str:
        """One line: how many of each were filtered, ``what`` naming why they came."""
        return (
            f"{what}: {len(self.warnings)} warnings, {len(self.records)} torch log records and "
            f"{len(self.stderr)} stderr lines filtered"
        )


@contextlib.contextmanager
def collect_noise():
    """Keep, instead of showing, what a block triggers on purpose: warnings, the records torch's loggers would
    print (Dynamo's graph breaks and recompiles, Inductor's autotuning) and ``sys.stderr``. Yields the
    :class:`Noise`, filled when the block ends."""
    noise = Noise()

    def keep(record: logging.LogRecord) -> bool:
        noise.records.append(record)
        return False

    loggers = [lg for name, lg in logging.root.manager.loggerDict.items() if name.startswith("torch")]
    handlers = {h for lg in loggers + [logging.getLogger("torch")] for h in getattr(lg, "handlers", [])}
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
