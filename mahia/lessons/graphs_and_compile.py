"""Helpers of notebooks 04 (torch.compile) and 05 (CUDA graphs): a kernel/byte model of a step, compile
bookkeeping, a hand-written CUDA-graph wrapper and shape bucketing.

**What a step costs (the model both notebooks predict with).** :func:`trace_ops` (from
:mod:`mahia.measure.instruments`, where its kinds of ops and the fusion estimate are explained) runs a
function once and records every op it dispatches, forward and backward alike: matmuls with their FLOPs,
opaque kernels, fusable pointwise ops and free ops, with the bytes each reads and writes;
:meth:`~mahia.measure.instruments.OpTrace.fused` estimates what an ideal fusing compiler would launch and
move. :func:`predict_step` prices such a trace with the cost model of :mod:`mahia.measure.cost`, with
``t_launch`` the host cost of one launch and ``t_floor`` the shortest kernel::

    GPU time   = sum over kernels of max(t_floor, FLOPs / peak, bytes / bandwidth)
    CPU time   = kernels x t_launch          (one launch when the step replays a CUDA graph)
    step       = max(CPU, GPU)    on a GPU (the host queues work ahead: the slower side sets the pace)
               = CPU + GPU        on a CPU (the same cores dispatch and compute)

Launch-bound steps (CPU > GPU) gain from fewer launches (fusion, graphs); bandwidth-bound ones from fewer
bytes (fusion); matmul-bound ones from neither.

**CUDA graphs.** :class:`GraphedStep` captures an inference step once (static input buffers, then
:func:`mahia.measure.timing.capture_graph`: warm-up on a side stream, capture) and replays it after copying
new inputs into the static buffers: one launch instead of one per kernel. :class:`BucketedGraphs` serves
variable sizes with one graph per bucket, padding each input up to the next bucket and slicing the outputs
back. :class:`GraphedTrainStep` captures a whole training step (forward, backward, optimizer update);
:func:`try_capture` captures like :class:`GraphedStep` but reports a failed capture instead of raising, and leaves
CUDA ready for the next one; :func:`cuda_memory` reads what the allocator holds, to show the memory a graph
keeps in its pool.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from mahia.measure.checks import check_int
from mahia.measure.cost import Machine, step_time, work_ms
from mahia.measure.instruments import OpTrace, trace_ops
from mahia.measure.timing import capture_graph

__all__ = [
    "trace_ops",  # re-exported from mahia.measure.instruments: notebooks 04, 05 and 10 import it from here
    "StepPrediction",
    "predict_step",
    "CompileCounter",
    "timed_call",
    "CUDAGRAPH_MODES",
    "CompileAttempt",
    "try_compile",
    "generated_kernels",
    "library_calls",
    "break_even_steps",
    "break_even_range",
    "clip_by_norm_logged",
    "clip_by_norm",
    "GraphedStep",
    "next_bucket",
    "pad_to",
    "BucketedGraphs",
    "GraphedTrainStep",
    "CaptureAttempt",
    "try_capture",
    "cuda_memory",
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


class CompileCounter:
    """A ``torch.compile`` backend that counts the graphs Dynamo hands it and runs them as captured.

        counter = CompileCounter()
        f = torch.compile(fn, backend=counter)   # Dynamo only: no code generation, compiles in ms
        f(x); counter.graphs                      # graphs compiled so far (recompilations included)

    Graph breaks and recompilations are Dynamo's doing, so they show here exactly as they would with
    Inductor, without paying for code generation.
    """

    def __init__(self):
        self.graphs = 0
        self.ops: list[int] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs += 1
        self.ops.append(sum(n.op == "call_function" or n.op == "call_method" for n in gm.graph.nodes))
        return gm.forward


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


# torch.compile modes whose compiled code replays CUDA graphs (its outputs are overwritten by the next call).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class CompileAttempt:
    """One ``torch.compile`` attempt: ``run()`` calls the compiled version (None if compiling failed),
    ``output`` is its first output (cloned), ``first_call_ms`` the time of that call (the compilation),
    ``error`` the reason it failed, ``code`` the source Inductor generated (when asked for)."""

    mode: str | None
    run: Callable[[], Any] | None
    output: Any = None
    first_call_ms: float | None = None
    error: str | None = None
    code: list[str] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.run is not None


def _clone(tree: Any) -> Any:
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def try_compile(
    target: Callable[..., Any],
    call: Callable[[Callable[..., Any]], Any],
    *,
    mode: str | None = None,
    backend: str | Callable = "inductor",
    dynamic: bool | None = None,
    device: torch.device | str = "cpu",
    reset: bool = True,
    capture_code: bool = False,
) -> CompileAttempt:
    """``torch.compile(target, mode=mode, ...)`` and its first call ``call(compiled)``, timed.

    Compilation happens in that first call, so its time is the compile time. Failures (no compiler, an
    unsupported op, a backend error) are caught and returned as ``error``, so a notebook can say what
    failed and go on with eager. ``reset`` forgets earlier compilations first (``torch._dynamo.reset()``),
    so one mode does not reuse another mode's graphs. In the CUDA-graph modes ``run()`` marks the start
    of a new step before each call (``torch.compiler.cudagraph_mark_step_begin``), as a loop must.
    ``capture_code`` keeps the Python/Triton/C++ source Inductor wrote
    (``torch._inductor.utils.run_and_get_code``).
    """
    if not callable(target) or not callable(call):
        raise TypeError("try_compile: target and call must be callable")
    if reset:
        torch._dynamo.reset()
    kw: dict[str, Any] = {"backend": backend, "dynamic": dynamic}
    if mode is not None:
        kw["mode"] = mode
    mark = (
        mode in CUDAGRAPH_MODES
        and torch.device(device).type == "cuda"
        and hasattr(torch.compiler, "cudagraph_mark_step_begin")
    )
    try:
        compiled = torch.compile(target, **kw)

        def run() -> Any:
            if mark:
                torch.compiler.cudagraph_mark_step_begin()
            return call(compiled)

        code: list[str] = []
        if capture_code:
            from torch._inductor.utils import run_and_get_code

            (out, code), ms = timed_call(lambda: run_and_get_code(run), device)
        else:
            out, ms = timed_call(run, device)
        return CompileAttempt(mode, run, _clone(out), ms, None, list(code))
    except Exception as exc:  # noqa: BLE001 - any compile failure: report it, keep eager
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        return CompileAttempt(mode, None, error=f"{type(exc).__name__}: {first[:300]}")


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


def break_even_range(compile_ms: float, eager, compiled) -> tuple[float, float]:
    """(fewest, most) calls to pay back ``compile_ms`` over the 20–80% spreads of two timings (``p20_ms``,
    ``p80_ms``): the fewest with the largest saving, eager p80 - compiled p20; the most with the smallest,
    eager p20 - compiled p80 (``inf`` when that is not a saving)."""
    for name, t in (("eager", eager), ("compiled", compiled)):
        if not (hasattr(t, "p20_ms") and hasattr(t, "p80_ms")):
            raise TypeError(f"break_even_range: {name} must be a timing with p20_ms and p80_ms, got {type(t).__name__}")
    return (
        break_even_steps(compile_ms, eager.p80_ms, compiled.p20_ms),
        break_even_steps(compile_ms, eager.p20_ms, compiled.p80_ms),
    )


def clip_by_norm_logged(x: torch.Tensor, max_norm: float = 1.0) -> torch.Tensor:
    """Before: ``x`` scaled down to norm ``max_norm`` if it is longer, written the usual way.

    Two graph breaks under ``torch.compile``: ``.item()`` (a device value becomes a Python float, here
    for a log line) and an ``if`` on a tensor (which branch runs depends on the data). Each break ends
    one graph and starts another, and on a GPU each one is also a host-device sync.
    """
    norm = x.norm()
    print("clip_by_norm_logged: norm", norm.item())
    if norm > max_norm:
        x = x * (max_norm / norm)
    return x


def clip_by_norm(x: torch.Tensor, max_norm: float = 1.0) -> torch.Tensor:
    """After: the same result with device arithmetic only, one graph.

    x * min(1, max_norm / ||x||): the factor is max_norm / ||x|| when ||x|| > max_norm and exactly 1
    otherwise (also for x = 0, where max_norm / 0 = inf is clamped to 1).
    """
    return x * torch.clamp(max_norm / x.norm(), max=1.0)


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


class GraphedStep:
    """``fn(*inputs)`` captured once in a CUDA graph and replayed (inference: captured under no_grad).

    Capture: copy the example inputs into static buffers the graph owns, run ``fn`` ``warmup`` times on a
    side stream (lazy initialisation, cuBLAS workspaces, autotuning and allocator growth happen there,
    outside the capture), then record one call into the graph (:func:`mahia.measure.timing.capture_graph`;
    ``pool`` is its memory pool). Each later call::

        static_inputs[i].copy_(inputs[i])      # the graph reads these addresses
        graph.replay()                         # every kernel of fn, one launch
        return static_outputs                  # the graph writes these addresses: the next call overwrites them

    What cannot be captured: anything that needs the host mid-step (``.item()``, ``print(tensor)``,
    ``nonzero``, data-dependent Python branches) and new shapes (capture one graph per shape, or bucket).
    Python numbers in ``fn`` are frozen at capture: pass what changes as a tensor.
    """

    def __init__(self, fn: Callable[..., Any], *example_inputs: torch.Tensor, warmup: int = 3, pool=None):
        if not callable(fn):
            raise TypeError(f"GraphedStep: fn must be callable, got {type(fn).__name__}")
        _check_tensors("GraphedStep", example_inputs)
        if not all(t.is_cuda for t in example_inputs):
            devices = sorted({str(t.device) for t in example_inputs})
            raise ValueError(f"GraphedStep: CUDA graphs need CUDA tensors, got inputs on {devices}")
        check_int("GraphedStep", "warmup", warmup)
        self.fn = fn
        self.static_inputs = tuple(t.detach().clone() for t in example_inputs)
        with torch.no_grad():  # warm-up on a side stream, then one call recorded (mahia.measure.timing)
            self.graph, self.static_outputs = capture_graph(lambda: fn(*self.static_inputs), warmup=warmup, pool=pool)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        _same_layout(
            "GraphedStep",
            self.static_inputs,
            inputs,
            hint="a graph replays fixed shapes (capture one per shape, or pad to buckets)",
        )
        for s, x in zip(self.static_inputs, inputs):
            if x is not s:
                s.copy_(x)
        self.graph.replay()
        return self.static_outputs


def next_bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= n."""
    check_int("next_bucket", "n", n)
    fits = [b for b in buckets if b >= n]
    if not fits:
        raise ValueError(f"next_bucket: size {n} exceeds the largest bucket {max(buckets)}")
    return min(fits)


def pad_to(x: torch.Tensor, size: int, dim: int = 0, value: float = 0) -> torch.Tensor:
    """``x`` padded with ``value`` at the end of ``dim`` to ``size`` (``x`` itself when it has that size)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"pad_to: x must be a torch.Tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"pad_to: dim {dim} is out of range for a {x.dim()}-d tensor")
    n = x.shape[dim]
    if size < n:
        raise ValueError(f"pad_to: size {size} is smaller than dim {dim} of x ({n})")
    if size == n:
        return x
    shape = list(x.shape)
    shape[dim] = size - n
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


class BucketedGraphs:
    """Variable sizes along ``dim`` through one captured graph per bucket.

    A call pads every input along ``dim`` from n to b = ``next_bucket(n, buckets)`` with ``pad_value``,
    replays (capturing on first use) the :class:`GraphedStep` of bucket b, and returns the outputs
    narrowed back to n along ``dim`` (outputs without size b there are returned whole). Exact when ``fn``
    treats positions along ``dim`` independently (the rows of a batch) or causally (padding at the end of
    a sequence does not change the earlier positions). The cost: the padded rows are computed too, and
    every bucket holds its own graph and memory. Outputs are views of a graph's static buffers, valid
    until the next call of the same bucket. ``capture=False`` runs the padded ``fn`` eagerly (a CPU, or
    to measure what the padding alone costs).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        buckets: Iterable[int],
        *,
        dim: int = 0,
        pad_value: float = 0,
        warmup: int = 3,
        capture: bool = True,
    ):
        if not callable(fn):
            raise TypeError(f"BucketedGraphs: fn must be callable, got {type(fn).__name__}")
        buckets = sorted(set(buckets))
        if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
            raise ValueError(f"BucketedGraphs: buckets must be positive ints, got {buckets!r}")
        if not isinstance(capture, bool):
            raise TypeError(f"BucketedGraphs: capture must be a bool, got {capture!r}")
        self.fn, self.buckets, self.dim, self.pad_value = fn, buckets, dim, pad_value
        self.warmup, self.capture = warmup, capture
        self.graphs: dict[int, GraphedStep] = {}

    def __call__(self, *inputs: torch.Tensor) -> Any:
        _check_tensors("BucketedGraphs", inputs)
        sizes = {x.shape[self.dim] for x in inputs}
        if len(sizes) != 1:
            raise ValueError(
                f"BucketedGraphs: all inputs must have the same size along dim {self.dim}, got {sorted(sizes)}"
            )
        n = sizes.pop()
        b = next_bucket(n, self.buckets)
        padded = [pad_to(x, b, self.dim, self.pad_value) for x in inputs]
        if self.capture:
            if b not in self.graphs:
                self.graphs[b] = GraphedStep(self.fn, *padded, warmup=self.warmup)
            out = self.graphs[b](*padded)
        else:
            with torch.no_grad():
                out = self.fn(*padded)

        def narrow(t):
            if isinstance(t, torch.Tensor) and t.dim() > self.dim and t.shape[self.dim] == b:
                return t.narrow(self.dim, 0, n)
            return t

        return tree_map(narrow, out)


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
    """What :func:`try_capture` got. ``step`` is the :class:`GraphedStep` when the capture worked. Otherwise
    ``error`` is the first error the step raised during capture, and ``end_error`` what ending that failed
    capture raised on top of it, if anything (a CUDA error invalidates the capture, and
    ``cudaStreamEndCapture`` then fails too: "operation failed due to a previous error during capture").
    ``warnings`` are the first sentences of the warnings raised meanwhile (an interrupted capture may end
    with an empty graph)."""

    step: GraphedStep | None
    error: str | None = None
    end_error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.step is not None

    def __str__(self) -> str:
        s = "captured" if self.ok else str(self.error)
        if self.end_error:
            s += f" (ending the failed capture then raised {self.end_error})"
        if self.warnings:
            s += " [torch warned: " + "; ".join(self.warnings) + "]"
        return s


def try_capture(fn: Callable[..., Any], *example_inputs: torch.Tensor, warmup: int = 1) -> CaptureAttempt:
    """``GraphedStep(fn, *example_inputs)``, or why it cannot be captured, for showing what breaks capture.

    Each call captures into a new ``torch.cuda.CUDAGraph`` after a warm-up on a new side stream
    (:class:`GraphedStep`). A failure is caught, and CUDA is left ready for the next capture:

    * the error reported is the first one, the step's own. ``torch.cuda.graph`` ends the capture in its
      ``__exit__`` even when the step raised; when that ``capture_end`` raises as well, Python raises the
      second error with the first as its ``__context__``, so the message the caller would see names only
      the consequence ("a previous error during capture");
    * a ``capture_end`` that raised never restored the caller's stream (the capture stream stays current):
      it is restored here, and the device synchronized.

    A CUDA error that is *sticky* (an illegal address, a device-side assert) cannot be cleared by any of
    this: the synchronization then raises a RuntimeError, and the process needs a restart. Argument errors
    (a CPU tensor, a non-callable) are raised as by :class:`GraphedStep`, not reported.
    """
    if not callable(fn):
        raise TypeError(f"try_capture: fn must be callable, got {type(fn).__name__}")
    _check_tensors("try_capture", example_inputs)
    if not all(t.is_cuda for t in example_inputs):
        raise ValueError("try_capture: CUDA graphs need CUDA tensors, got an input on the CPU")
    caller = torch.cuda.current_stream()
    torch.cuda.synchronize()
    step, error, end_error = None, None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            step = GraphedStep(fn, *example_inputs, warmup=warmup)
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
    return CaptureAttempt(step, error, end_error, notes)


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
