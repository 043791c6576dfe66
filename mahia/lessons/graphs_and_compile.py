"""Helpers of notebooks 04 (torch.compile) and 05 (CUDA graphs): a kernel/byte model of a step, compile
bookkeeping, a hand-written CUDA-graph wrapper and shape bucketing.

**What a step costs (the model both notebooks predict with).** :func:`trace_ops` runs a function once
and records every ATen op it dispatches, forward and backward alike:

* ``matmul`` ops (``mm``, ``bmm``, ``addmm``, SDPA kernels, ``_grouped_mm``): ``2 m k n`` FLOPs each
  (attention ``2 B H T S (D + Dv)``, halved when causal); library kernels that no compiler fuses into;
* ``opaque`` ops (custom ``torch.library`` kernels, sorts, ``topk``, ``nonzero``): one kernel each,
  not fusable either;
* ``pointwise`` ops (everything else that launches a kernel: elementwise math, reductions, casts,
  copies, gathers): memory-bound, and what a compiler fuses;
* ``free`` ops (views, ``empty``, ``detach``, ``.item()``): no kernel.

Eager PyTorch launches one kernel per non-free op and each pointwise op reads its inputs from memory
and writes its output back. An ideal fusing compiler merges pointwise ops connected by a data edge
into one kernel (a *region*) unless a matmul or opaque op lies between them on some path (their
*level*, the number of non-fusable ops on the longest path from the inputs, differs). A region reads
each outside tensor once and writes only what leaves it (used by a non-member, returned, or written
in place). :meth:`OpTrace.fused` counts those bytes and kernels: an estimate of what a good fusing
compiler reaches (it may do better where the level rule is cautious, worse where it declines to fuse).

A step then takes, with ``t_launch`` the host cost of one launch and ``t_floor`` the shortest kernel::

    GPU time   = sum over kernels of max(t_floor, FLOPs / peak, bytes / bandwidth)
    CPU time   = kernels x t_launch          (one launch when the step replays a CUDA graph)
    step       = max(CPU, GPU)    on a GPU (the host queues work ahead: the slower side sets the pace)
               = CPU + GPU        on a CPU (the same cores dispatch and compute)

(:func:`predict_step`). Launch-bound steps (CPU > GPU) gain from fewer launches (fusion, graphs);
bandwidth-bound ones from fewer bytes (fusion); matmul-bound ones from neither.

**CUDA graphs.** :class:`GraphedStep` captures an inference step once (static input buffers, warm-up on
a side stream, capture) and replays it after copying new inputs into the static buffers: one launch
instead of one per kernel. :class:`BucketedGraphs` serves variable sizes with one graph per bucket,
padding each input up to the next bucket and slicing the outputs back.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from mahia.measure.checks import check_int

__all__ = [
    "MATMUL_OPS", "OPAQUE_ATEN_OPS", "FREE_OPS",
    "OpRecord", "FusedEstimate", "OpTrace", "trace_ops", "StepPrediction", "predict_step",
    "CompileCounter", "timed_call", "CUDAGRAPH_MODES", "CompileAttempt", "try_compile", "generated_kernels",
    "library_calls",
    "break_even_steps", "clip_by_norm_logged", "clip_by_norm",
    "GraphedStep", "next_bucket", "pad_to", "BucketedGraphs",
]

# ---------------------------------------------------------------------------------------------------
# Tracing the ops of a step
# ---------------------------------------------------------------------------------------------------

# Library kernels a compiler calls but does not fuse into (ATen names without the overload).
MATMUL_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward", "_efficient_attention_forward",
})
# ATen ops that launch a kernel a compiler keeps as is (data-dependent sizes, sorting).
OPAQUE_ATEN_OPS = frozenset({
    "sort", "argsort", "topk", "nonzero", "unique", "_unique", "_unique2", "unique_consecutive",
    "masked_select", "multinomial", "randperm", "bincount",
})
# ATen ops that launch nothing: views are in the schema (``is_view``); these are not, but alias or allocate.
FREE_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
    "lift_fresh", "lift_fresh_copy", "_unsafe_view", "set_", "resize_", "_local_scalar_dense",
    "is_nonzero", "equal", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "record_stream",
})


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor (view) covers: broadcast (stride-0) dims count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0


def _matmul_flops(name: str, args: dict[str, Any]) -> int:
    """FLOPs of one matmul-like op from its arguments (by schema name); 0 where unknown."""
    def shape(key):
        t = args.get(key)
        return tuple(t.shape) if isinstance(t, torch.Tensor) else None

    if name in ("mm", "addmm"):
        a, b = shape("mat1" if name == "addmm" else "self"), shape("mat2")
        return 2 * a[0] * a[1] * b[1] if a and b else 0
    if name in ("bmm", "baddbmm"):
        a, b = shape("batch1" if name == "baddbmm" else "self"), shape("batch2" if name == "baddbmm" else "mat2")
        return 2 * a[0] * a[1] * a[2] * b[2] if a and b else 0
    if name == "_grouped_mm":
        a, b = shape("self"), shape("mat2")
        if a and b and len(a) == 2 and len(b) == 3:  # (M, K) x (G, K, N) by groups of rows
            return 2 * a[0] * a[1] * b[2]
        return 0
    if "attention" in name:
        q, k, v = shape("query"), shape("key"), shape("value")
        if not (q and k and v):
            return 0
        # SDPA takes (B, H, T, D); the _flash/_efficient_attention_forward ops take (B, T, H, D).
        if name.startswith("_scaled_dot_product"):
            (B, H, T, D), S, Dv = q, k[-2], v[-1]
        else:
            (B, T, H, D), S, Dv = q, k[1], v[-1]
        flops = 2 * B * H * T * S * (D + Dv)
        return flops // 2 if args.get("is_causal") and T == S else flops
    return 0


@dataclass(frozen=True)
class OpRecord:
    """One dispatched op. ``reads``: (tensor id, bytes, view) per distinct input, where ``view`` =
    (storage offset, shape, strides) tells two views of one tensor apart; ``writes``: (tensor id, bytes).
    Views share the id of the tensor they alias."""

    name: str
    kind: str  # "matmul" | "opaque" | "pointwise" | "free"
    reads: tuple[tuple[int, int, tuple], ...]
    writes: tuple[tuple[int, int], ...]
    flops: int
    level: int
    mutates: bool

    @property
    def read_bytes(self) -> int:
        return sum(r[1] for r in self.reads)

    @property
    def write_bytes(self) -> int:
        return sum(b for _, b in self.writes)

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class FusedEstimate:
    """What an ideal fusing compiler would launch and move (see the module docstring)."""

    regions: int            # fused pointwise kernels
    kernels: int            # regions + matmul + opaque kernels
    pointwise_bytes: int    # bytes the fused regions move
    bytes: int              # all bytes: regions + matmul + opaque ops
    region_bytes: tuple[int, ...] = field(repr=False, default=())


@dataclass
class OpTrace:
    """The ops of one call of a function (:func:`trace_ops`)."""

    ops: list[OpRecord]
    outputs: frozenset[int]  # ids of the tensors the function returned
    sizes: dict[int, int] = field(default_factory=dict, repr=False)  # tensor id -> bytes of the whole tensor

    def of_kind(self, kind: str) -> list[OpRecord]:
        return [o for o in self.ops if o.kind == kind]

    @property
    def kernels(self) -> int:
        """Kernels eager PyTorch launches: one per op that is not free."""
        return sum(o.kind != "free" for o in self.ops)

    @property
    def flops(self) -> int:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> int:
        """Bytes all kernels read and write in eager mode."""
        return sum(o.bytes for o in self.ops if o.kind != "free")

    @property
    def pointwise_bytes(self) -> int:
        return sum(o.bytes for o in self.of_kind("pointwise"))

    def by_kind(self) -> dict[str, dict[str, int]]:
        """{kind: {"ops", "bytes", "flops"}} for a table."""
        out: dict[str, dict[str, int]] = {}
        for o in self.ops:
            d = out.setdefault(o.kind, {"ops": 0, "bytes": 0, "flops": 0})
            d["ops"] += 1
            d["bytes"] += o.bytes if o.kind != "free" else 0
            d["flops"] += o.flops
        return out

    def fused(self) -> FusedEstimate:
        """Merge connected pointwise ops of equal level into regions; count their kernels and bytes."""
        pw = [i for i, o in enumerate(self.ops) if o.kind == "pointwise"]
        parent = {i: i for i in pw}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        producer: dict[int, int] = {}  # tensor id -> index of the pointwise op that wrote it last
        for i in pw:
            o = self.ops[i]
            for tid, *_ in o.reads:
                j = producer.get(tid)
                if j is not None and self.ops[j].level == o.level:
                    parent[find(i)] = find(j)
            for tid, _ in o.writes:  # every write is a fresh id, so a producer is never overwritten
                producer[tid] = i

        region_of = {i: find(i) for i in pw}
        # Which regions (or -1: a non-pointwise op, or the caller) read each tensor id.
        readers: dict[int, set[int]] = {}
        for i, o in enumerate(self.ops):
            if o.kind == "free":
                continue
            r = region_of.get(i, -1)
            for tid, *_ in o.reads:
                readers.setdefault(tid, set()).add(r)
        for tid in self.outputs:
            readers.setdefault(tid, set()).add(-1)

        reads: dict[int, dict[int, dict]] = {}  # region -> tensor id -> view -> bytes
        writes: dict[int, dict[int, int]] = {}  # region -> tensor id -> bytes written
        written_in: dict[int, dict[int, int]] = {}
        for i in pw:
            o, r = self.ops[i], region_of[i]
            inside = written_in.setdefault(r, {})
            for tid, b, view in o.reads:
                if tid not in inside:  # produced outside the region: each distinct view read once
                    reads.setdefault(r, {}).setdefault(tid, {})[view] = b
            for tid, b in o.writes:
                inside[tid] = b
                if o.mutates or any(x != r for x in readers.get(tid, ())):
                    writes.setdefault(r, {})[tid] = b
        roots = sorted(set(region_of.values()))

        def read_bytes(r: int) -> int:  # distinct views of a tensor, at most the whole tensor
            return sum(min(sum(views.values()), self.sizes.get(tid, math.inf))
                       for tid, views in reads.get(r, {}).items())

        region_bytes = tuple(int(read_bytes(r)) + sum(writes.get(r, {}).values()) for r in roots)
        other = [o for o in self.ops if o.kind in ("matmul", "opaque")]
        pointwise_bytes = sum(region_bytes)
        return FusedEstimate(regions=len(roots), kernels=len(roots) + len(other),
                             pointwise_bytes=pointwise_bytes, bytes=pointwise_bytes + sum(o.bytes for o in other),
                             region_bytes=region_bytes)


class _Tracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[OpRecord] = []
        self._tid: dict[int, int] = {}      # id(tensor object) -> tensor id (aliases share one)
        self._level: dict[int, int] = {}    # tensor id -> level
        self.sizes: dict[int, int] = {}     # tensor id -> bytes of the whole tensor
        self._keep: list[torch.Tensor] = []  # keeps traced tensors alive, so Python ids are not reused
        self._next = 0

    def tid(self, t: torch.Tensor) -> int:
        key = id(t)
        if key not in self._tid:
            self._tid[key] = self._new_id(t)
        return self._tid[key]

    def _new_id(self, t: torch.Tensor) -> int:
        self._keep.append(t)
        self._next += 1
        self.sizes[self._next] = _distinct_bytes(t)
        return self._next

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        schema_args = func._schema.arguments
        named = {a.name: v for a, v in zip(schema_args, args)} | dict(kwargs)
        mutated = {a.name for a in schema_args if a.alias_info is not None and a.alias_info.is_write}
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]

        if func.is_view or name in FREE_OPS or not outs:
            kind = "free"  # a view, an allocation, or no tensor out (promote_types, .item())
        elif func.namespace != "aten":
            kind = "opaque"  # a custom kernel (torch.library op): one launch, not fusable
        elif name in MATMUL_OPS:
            kind = "matmul"
        elif name in OPAQUE_ATEN_OPS:
            kind = "opaque"
        else:
            kind = "pointwise"

        seen: set[int] = set()
        reads = []
        for t in ins:
            tid = self.tid(t)
            view = (t.storage_offset(), tuple(t.shape), tuple(t.stride()))
            if (tid, view) not in seen:
                seen.add((tid, view))
                reads.append((tid, _distinct_bytes(t), view))
        level = max((self._level.get(r[0], 0) for r in reads), default=0)
        out_level = level + (kind in ("matmul", "opaque"))

        writes = []
        for t in outs:
            if kind == "free":
                # an alias (view) of the first input keeps its id; an allocation gets a fresh one
                self._tid[id(t)] = self.tid(ins[0]) if ins and (func.is_view or name in ("detach", "alias",
                                                                                        "_unsafe_view")) \
                    else self._new_id(t)
                self._keep.append(t)
                continue
            new = self._new_id(t)  # a new version, also for an in-place op's output
            self._tid[id(t)] = new
            self._level[new] = out_level
            writes.append((new, _distinct_bytes(t)))
        if kind == "free":
            reads = []
        flops = _matmul_flops(name, named) if kind == "matmul" else 0
        self.ops.append(OpRecord(name, kind, tuple(reads), tuple(writes), int(flops), level, bool(mutated)))
        return out


def trace_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> OpTrace:
    """Run ``fn(*args, **kwargs)`` once and record its ops (backward too, if ``fn`` calls it).

    The tensors it creates are kept alive until the trace is built, so trace small shapes or
    expect one extra step's worth of memory.
    """
    if not callable(fn):
        raise TypeError(f"trace_ops: fn must be callable, got {type(fn).__name__}")
    tracer = _Tracer()
    with tracer:
        result = fn(*args, **kwargs)
    out_ids = frozenset(tracer._tid[id(t)] for t in tree_flatten(result)[0]
                        if isinstance(t, torch.Tensor) and id(t) in tracer._tid)
    trace = OpTrace(tracer.ops, out_ids, dict(tracer.sizes))
    tracer._keep.clear()
    return trace


@dataclass(frozen=True)
class StepPrediction:
    cpu_ms: float     # host time to launch the kernels
    gpu_ms: float     # device time of the kernels
    ms: float         # the step: max (GPU, overlapping) or sum (CPU)
    kernels: int
    bytes: int

    @property
    def launch_bound(self) -> bool:
        return self.cpu_ms > self.gpu_ms


def predict_step(trace: OpTrace, *, launch_us: float, bandwidth_gbps: float, matmul_tflops: float,
                 floor_us: float = 0.0, fused: bool = False, graphed: bool = False,
                 overlap: bool = True) -> StepPrediction:
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
    bw, peak, floor = bandwidth_gbps * 1e9, matmul_tflops * 1e12, floor_us * 1e-6

    def kernel_s(flops: float, nbytes: float) -> float:
        return max(floor, flops / peak, nbytes / bw)

    heavy = [o for o in trace.ops if o.kind in ("matmul", "opaque")]
    gpu = sum(kernel_s(o.flops, o.bytes) for o in heavy)
    if fused:
        est = trace.fused()
        gpu += sum(kernel_s(0, b) for b in est.region_bytes)
        kernels, nbytes = est.kernels, est.bytes
    else:
        gpu += sum(kernel_s(0, o.bytes) for o in trace.of_kind("pointwise"))
        kernels, nbytes = trace.kernels, trace.bytes
    cpu = (1 if graphed else kernels) * launch_us * 1e-6
    step = max(cpu, gpu) if overlap else cpu + gpu
    return StepPrediction(cpu * 1e3, gpu * 1e3, step * 1e3, kernels, nbytes)


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


def try_compile(target: Callable[..., Any], call: Callable[[Callable[..., Any]], Any], *, mode: str | None = None,
                backend: str | Callable = "inductor", dynamic: bool | None = None,
                device: torch.device | str = "cpu", reset: bool = True,
                capture_code: bool = False) -> CompileAttempt:
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
    mark = (mode in CUDAGRAPH_MODES and torch.device(device).type == "cuda"
            and hasattr(torch.compiler, "cudagraph_mark_step_begin"))
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
            raise TypeError(f"{fn}: input {i} must be a torch.Tensor, got {type(t).__name__} "
                            "(capture Python values as tensors, or close over constants)")


class GraphedStep:
    """``fn(*inputs)`` captured once in a CUDA graph and replayed (inference: captured under no_grad).

    Capture: copy the example inputs into static buffers the graph owns, run ``fn`` ``warmup`` times on a
    side stream (lazy initialisation, cuBLAS workspaces, autotuning and allocator growth happen there,
    outside the capture), then record one call into the graph. Each later call::

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
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, pool=pool):
            self.static_outputs = fn(*self.static_inputs)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"GraphedStep: expected {len(self.static_inputs)} inputs, got {len(inputs)}")
        for i, (s, x) in enumerate(zip(self.static_inputs, inputs)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"GraphedStep: input {i} must be a torch.Tensor, got {type(x).__name__}")
            if x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
                raise ValueError(f"GraphedStep: input {i} is {x.dtype} {tuple(x.shape)} on {x.device}, but the "
                                 f"graph was captured for {s.dtype} {tuple(s.shape)} on {s.device}: a graph "
                                 "replays fixed shapes (capture one per shape, or pad to buckets)")
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

    def __init__(self, fn: Callable[..., Any], buckets: Iterable[int], *, dim: int = 0, pad_value: float = 0,
                 warmup: int = 3, capture: bool = True):
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
            raise ValueError(f"BucketedGraphs: all inputs must have the same size along dim {self.dim}, "
                             f"got {sorted(sizes)}")
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
