"""Dispatch-mode instruments: what a region of eager PyTorch code does, seen op by op.

Each instrument is a ``TorchDispatchMode`` (or a context manager around one): PyTorch hands it every ATen
op, and every custom ``torch.library`` op, that the region dispatches, forward and backward alike, with its
arguments and outputs. On a CPU they see what the same code would do on a GPU.

    count_syncs, assert_no_syncs   host-device synchronizations (:class:`SyncReport`)
    count_ops                      ops that launch a kernel, and Triton kernels launched from Python
                                   (:class:`OpCount`): an estimate of kernel launches
    LiveTensorMemory               bytes of tensor storage created inside and still alive, and their peak
    trace_ops                      every op with its kind, the bytes it reads and writes and its FLOPs
                                   (:class:`OpTrace`), and what an ideal fusing compiler would launch and move
                                   (:meth:`OpTrace.fused`)
    ByteTraffic                    one row per kernel-launching op: bytes read, bytes written, output shape
    float32_matmuls                the matrix products whose output is float32 (:class:`Float32Matmuls`): the
                                   ones that make Inductor suggest TF32 on a GPU

Eager code only: the kernels of a compiled region do not pass through the dispatcher, and a custom op is
seen as one op (whatever it launches inside). A Triton kernel launched from Python (``kernel[grid](...)``,
as the eager paths of :mod:`mahia.ops` do inside their autograd Functions) does not pass through it
either: ``count_ops`` counts those through Triton's launch hook (compiled kernels on a GPU; the CPU
interpreter calls no hook), the other instruments do not see them.

**Which ops launch a kernel** (:func:`launches_kernel`, the one rule of count_ops, trace_ops and
ByteTraffic). Every op does, about one kernel each (a few launch two; a multi-tensor ``_foreach_*`` op
launches one per batch of tensors), except

* views (``func.is_view``: reshape, transpose, slicing, ``detach``, ...): they alias their input;
* :data:`NO_KERNEL_OPS`: allocations (``empty``, ``new_empty``), aliases, size queries, and reading one
  value to the host (``.item()``, ``bool(t)``: a copy and a sync, which ``count_syncs`` counts);
* profiler markers (the ``record_function`` ranges optimizers open);
* ops that neither return nor write a tensor.

An in-place op that returns nothing (``_foreach_mul_``, ``_fused_adamw_``) writes the tensors of its
mutated arguments, so it launches. The bytes a kernel touches for a tensor are those of its distinct
elements: a broadcast (stride-0) dimension counts once.

**Host-device syncs.** A synchronization is any point where the CPU must wait for the GPU to finish
queued work before it can go on: reading a value (``.item()``, ``bool(t)``, ``if t > 0:``, ``.tolist()``,
``print(t)``), an op whose *output shape* depends on the data (``nonzero``, boolean-mask indexing
``x[mask]``, ``masked_select``, ``unique``, ``bincount`` without a fixed size), or a copy to the host
(``.cpu()``, ``.numpy()``). Each one drains the GPU's queue: the CPU stops running ahead, and the GPU
idles while the CPU issues the next launches. ``count_syncs()`` sees them in two ways:

* ``syncing_ops`` (always, CPU included): the mode records every ATen op known to force a sync on a CUDA
  device. On a CPU nothing actually waits, but the same code *would* sync on a GPU, which is what a test
  or a CPU notebook wants to know. (``.tolist()`` and ``.numpy()`` of a CPU tensor read memory directly
  and are invisible here; on a GPU they show as copies to host.)
* ``cuda_syncs`` (CUDA only): ``torch.cuda.set_sync_debug_mode("warn")`` makes PyTorch itself warn at
  every synchronizing call; the warnings are counted. PyTorch calls this mode a prototype that does not yet
  detect every synchronizing operation, so the CUDA count is a lower bound (its notice is kept out of the
  output: it reads like an error in a notebook).

``count`` is the CUDA count where the region ran CUDA ops, and the op count elsewhere.

**Op traces and the fusion estimate.** :func:`trace_ops` runs a function once and records every op with
its kind:

* ``matmul`` ops (``mm``, ``bmm``, ``addmm``, SDPA kernels, ``_grouped_mm``): ``2 m k n`` FLOPs each
  (attention ``2 B H T S (D + Dv)``, halved when causal); library kernels that no compiler fuses into;
* ``opaque`` ops (custom ``torch.library`` kernels, sorts, ``topk``, ``nonzero``, fused optimizer steps):
  one kernel each, not fusable either;
* ``pointwise`` ops (every other op that launches a kernel: elementwise math, reductions, casts, copies,
  gathers, ``_foreach_*``): memory-bound, and what a compiler fuses;
* ``free`` ops (those that launch nothing, above).

Eager PyTorch launches one kernel per non-free op and each pointwise op reads its inputs from memory and
writes its output back. An ideal fusing compiler merges pointwise ops connected by a data edge into one
kernel (a *region*) unless a matmul or opaque op lies between them on some path (their *level*, the
number of non-fusable ops on the longest path from the inputs, differs). A region reads each outside
tensor once and writes only what leaves it (used by a non-member, returned, or written in place).
:meth:`OpTrace.fused` counts those bytes and kernels: an estimate of what a good fusing compiler reaches
(it may do better where the level rule is cautious, worse where it declines to fuse). What a step of such
kernels costs in time is :mod:`mahia.measure.cost`.
"""

from __future__ import annotations

import math
import sys
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = [
    "NO_KERNEL_OPS",
    "launches_kernel",
    "SYNCING_OPS",
    "SyncReport",
    "count_syncs",
    "assert_no_syncs",
    "OpCount",
    "count_ops",
    "LiveTensorMemory",
    "MATMUL_OPS",
    "OPAQUE_ATEN_OPS",
    "OpRecord",
    "FusedEstimate",
    "OpTrace",
    "trace_ops",
    "ByteTraffic",
    "FLOAT32_MATMUL_OPS",
    "Float32Product",
    "Float32Matmuls",
    "float32_matmuls",
]


# ---------------------------------------------------------------------------------------------------
# Which ops launch a kernel, and the bytes they touch
# ---------------------------------------------------------------------------------------------------

# ATen ops that launch nothing although they are not views by their schema: they allocate, alias, ask
# for metadata, or read one value to the host (a copy and a sync, not a kernel).
NO_KERNEL_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "detach",
        "alias",
        "lift_fresh",
        "lift_fresh_copy",
        "_unsafe_view",
        "set_",
        "resize_",
        "_local_scalar_dense",
        "is_nonzero",
        "equal",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "record_stream",
    }
)


def _op_name(func) -> str:
    # func is an OpOverload like aten.nonzero.default -> "aten.nonzero"
    return f"{func.namespace}.{_bare_name(func)}"


def _bare_name(func) -> str:
    # aten.nonzero.default -> "nonzero"; mahia::rms_norm_fwd -> "rms_norm_fwd"
    return func._schema.name.split("::")[-1]


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _written_tensors(func, args: tuple, kwargs: dict, out: Any) -> list[torch.Tensor]:
    """The tensors an op writes: its tensor outputs or, for an in-place op that returns nothing
    (``_foreach_mul_``, ``_fused_adamw_``), its mutated arguments."""
    outs = _tensors(out)
    if outs:
        return outs
    schema_args = func._schema.arguments
    named = {a.name: v for a, v in zip(schema_args, args)} | dict(kwargs)
    return _tensors([named.get(a.name) for a in schema_args if a.alias_info is not None and a.alias_info.is_write])


def _launches(func, written: list[torch.Tensor]) -> bool:
    if func.is_view or func.namespace == "profiler" or _bare_name(func) in NO_KERNEL_OPS:
        return False
    return bool(written)


def launches_kernel(func, out: Any, args: tuple = (), kwargs: dict | None = None) -> bool:
    """Whether the op ``func`` (an ``OpOverload``), called with ``args``/``kwargs`` and returning ``out``,
    launches a device kernel: the rule of the module docstring."""
    return _launches(func, _written_tensors(func, args, kwargs or {}, out))


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor (view) covers: broadcast (stride-0) dims count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0


# ---------------------------------------------------------------------------------------------------
# Host-device syncs
# ---------------------------------------------------------------------------------------------------

# ATen ops that make the host wait for the device when their inputs live on a CUDA device.
SYNCING_OPS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), bool(t), int(t), float(t), if t:, .tolist() per element
        "aten.is_nonzero",
        "aten.nonzero",
        "aten.masked_select",
        "aten.unique",
        "aten._unique",
        "aten._unique2",
        "aten.unique_consecutive",
        "aten.unique_dim",
        "aten.bincount",
        "aten.repeat_interleave",  # with a tensor of repeats: output size depends on the data
        "aten.equal",
        "aten.allclose",
    }
)


def _is_mask_index(func, args) -> bool:
    """``x[mask]`` / ``x[mask] = v`` with a boolean mask: the output size is the number of Trues."""
    if _op_name(func) not in ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl"):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()))


def _is_host_copy(func, args, kwargs) -> bool:
    """A copy from a CUDA tensor into host memory (``.cpu()``, ``.to('cpu')``, ``.numpy()``)."""
    name = _op_name(func)
    if name == "aten._to_copy":
        src = args[0] if args else None
        dev = kwargs.get("device")
        return isinstance(src, torch.Tensor) and src.is_cuda and dev is not None and torch.device(dev).type == "cpu"
    if name == "aten.copy_":
        dst, src = args[0], args[1]
        return isinstance(src, torch.Tensor) and src.is_cuda and not dst.is_cuda
    return False


@dataclass
class SyncReport:
    syncing_ops: int = 0
    cuda_syncs: int | None = None
    ops: Counter = field(default_factory=Counter)
    where: list[str] = field(default_factory=list)

    saw_cuda: bool = False

    @property
    def count(self) -> int:
        """PyTorch's own count where the region ran CUDA ops, else the syncing-op count."""
        return self.cuda_syncs if (self.cuda_syncs is not None and self.saw_cuda) else self.syncing_ops

    def __str__(self) -> str:
        s = f"{self.count} sync(s)"
        if self.ops:
            s += " — " + ", ".join(f"{k} ×{v}" for k, v in self.ops.most_common())
        return s


class _Recorder(TorchDispatchMode):
    def __init__(self, report: SyncReport, keep_stack: bool):
        super().__init__()
        self.report, self.keep_stack = report, keep_stack

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        if not self.report.saw_cuda:
            self.report.saw_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        mask_index = _is_mask_index(func, args)
        if name in SYNCING_OPS or mask_index or _is_host_copy(func, args, kwargs):
            # repeat_interleave only syncs when repeats is a tensor and no output_size is given.
            if not (name == "aten.repeat_interleave" and kwargs.get("output_size") is not None):
                self.report.syncing_ops += 1
                label = name if name in SYNCING_OPS else ("boolean-mask index" if mask_index else "copy to host")
                self.report.ops[label] += 1
                if self.keep_stack:
                    frames = [
                        f
                        for f in traceback.extract_stack()[:-1]
                        if "torch/" not in f.filename and "mahia/measure/instruments.py" not in f.filename
                    ]
                    if frames:
                        f = frames[-1]
                        self.report.where.append(f"{f.filename}:{f.lineno}: {f.line}")
        return func(*args, **kwargs)


@contextmanager
def count_syncs(*, keep_stack: bool = True):
    """Context manager yielding a ``SyncReport`` filled in when the block exits.

    >>> with count_syncs() as r:
    ...     loss.item()
    >>> r.count
    1
    """
    report = SyncReport()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        prev = torch.cuda.get_sync_debug_mode()
        _set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _Recorder(report, keep_stack):
                yield report
        if cuda:
            torch.cuda.synchronize()
            report.cuda_syncs = sum("synchronizing" in str(w.message).lower() for w in caught)
        for w in caught:  # hand on the warnings that were not ours
            if not (cuda and "synchronizing" in str(w.message).lower()):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    finally:
        if cuda:
            _set_sync_debug_mode(prev)


def _set_sync_debug_mode(mode) -> None:
    """``torch.cuda.set_sync_debug_mode`` without the notice it prints when turned on ("Synchronization debug mode
    is a prototype feature and does not yet detect all synchronizing operations"): in a notebook's output it reads
    like an error. What it says is in this module's docstring: the CUDA count is a lower bound."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"[\s\S]*Synchronization debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode(mode)


@contextmanager
def assert_no_syncs():
    """Raise ``AssertionError`` listing where, if the block performs any synchronizing op."""
    with count_syncs() as r:
        yield r
    if r.count:
        where = "\n  ".join(r.where[:10])
        raise AssertionError(f"expected no host-device syncs, found {r}\n  {where}")


# ---------------------------------------------------------------------------------------------------
# Kernel launches
# ---------------------------------------------------------------------------------------------------


@dataclass
class OpCount:
    """Ops that launched a kernel in a region (:func:`launches_kernel`): ``total`` and ``by_op`` (ATen ops
    by name, custom ops as ``namespace.name``)."""

    total: int = 0
    by_op: Counter = field(default_factory=Counter)


class _OpCounter(TorchDispatchMode):
    def __init__(self, report: OpCount):
        super().__init__()
        self.report = report
        self.triton = 0  # Triton kernels launched so far (by the launch hook)

    def launched_triton(self, metadata=None) -> None:
        """Triton's launch-enter hook: one compiled Triton kernel launched."""
        data = getattr(metadata, "data", None)
        name = data.get("name", "kernel") if isinstance(data, dict) else "kernel"
        self.triton += 1
        self.report.total += 1
        self.report.by_op[f"triton.{name}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.triton
        out = func(*args, **kwargs)
        # a custom op that launched Triton kernels inside was counted kernel by kernel, by the hook
        if launches_kernel(func, out, args, kwargs) and not (func.namespace != "aten" and self.triton > before):
            self.report.total += 1
            self.report.by_op[_bare_name(func) if func.namespace == "aten" else _op_name(func)] += 1
        return out


def _triton_runtime():
    """Triton's runtime knobs (where its launch hooks live), if Triton is imported and has them."""
    triton = sys.modules.get("triton")  # not imported: nothing in this process launches Triton kernels
    knobs = getattr(triton, "knobs", None) if triton is not None else None
    runtime = getattr(knobs, "runtime", None)
    return runtime if runtime is not None and hasattr(runtime, "launch_enter_hook") else None


class _TritonLaunchHook:
    """Adds a function to Triton's launch-enter hook while installed (a hook chain, or a single hook
    that the function then calls on, by Triton version) and restores the hook afterwards."""

    def __init__(self, fn: Callable):
        self.fn, self.runtime, self.previous, self.wrapper = fn, _triton_runtime(), None, None

    def install(self) -> None:
        if self.runtime is None:
            return
        hook = self.runtime.launch_enter_hook
        if hasattr(hook, "add") and hasattr(hook, "remove"):  # triton >= 3.4: a HookChain
            hook.add(self.fn)
            return
        self.previous = hook

        def wrapper(metadata):
            self.fn(metadata)
            if self.previous is not None:
                self.previous(metadata)

        self.wrapper = wrapper
        self.runtime.launch_enter_hook = wrapper

    def remove(self) -> None:
        if self.runtime is None:
            return
        if self.wrapper is None:
            self.runtime.launch_enter_hook.remove(self.fn)
        else:
            self.runtime.launch_enter_hook = self.previous


class count_ops:
    """Context manager counting the ops run inside it (backward included) that launch a kernel
    (:func:`launches_kernel`), and the compiled Triton kernels launched from Python (``by_op`` names them
    ``triton.<kernel>``; a custom op whose kernels the hook saw is not counted again): an estimate of the
    number of kernel launches.

    >>> with count_ops() as c:
    ...     y = x @ w + b
    >>> c.total
    2
    """

    def __init__(self):
        self.report = OpCount()
        self._mode: _OpCounter | None = None
        self._hook: _TritonLaunchHook | None = None

    def __enter__(self) -> OpCount:
        self._mode = _OpCounter(self.report)
        self._hook = _TritonLaunchHook(self._mode.launched_triton)
        self._hook.install()
        self._mode.__enter__()
        return self.report

    def __exit__(self, *exc):
        try:
            return self._mode.__exit__(*exc)
        finally:
            self._hook.remove()


# ---------------------------------------------------------------------------------------------------
# Live tensor memory
# ---------------------------------------------------------------------------------------------------


class LiveTensorMemory(TorchDispatchMode):
    """Bytes of tensor storage created inside the mode and still alive: ``current`` and its maximum ``peak``.

    Every op's outputs are checked; a storage not seen before is counted (at its full size) and a weak
    reference subtracts it again when it is freed. This is what ``torch.cuda.max_memory_allocated`` minus
    the memory at entry reports, without the allocator's rounding and caching, and it works on any
    device (the CPU has no allocator statistics). Storages that existed before entry are not counted;
    in-place ops and views add nothing. Eager mode only (not under ``torch.compile``).

    >>> with LiveTensorMemory() as mem:
    ...     loss = model(x).sum(); loss.backward()
    >>> mem.peak
    """

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._alive: dict[int, weakref.ref] = {}

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        ptr, n = st.data_ptr(), st.nbytes()
        if n == 0 or ptr in self._alive:
            return

        def freed(_, ptr=ptr, n=n):
            self.current -= n
            self._alive.pop(ptr, None)

        self._alive[ptr] = weakref.ref(st, freed)
        self.current += n
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # An output on an input's storage (in place, out=, a view) is not new memory, even when that storage
        # existed before entry and so is not tracked.
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs:
                self._track(t)
        return out


# ---------------------------------------------------------------------------------------------------
# Op traces and the fusion estimate
# ---------------------------------------------------------------------------------------------------

# Library kernels a compiler calls but does not fuse into (ATen names without the overload).
MATMUL_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_grouped_mm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    }
)
# ATen ops that launch a kernel a compiler keeps as is (data-dependent sizes, sorting, fused optimizer steps).
OPAQUE_ATEN_OPS = frozenset(
    {
        "sort",
        "argsort",
        "topk",
        "nonzero",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "masked_select",
        "multinomial",
        "randperm",
        "bincount",
        "_fused_adam_",
        "_fused_adamw_",
        "_fused_sgd_",
        "_fused_adagrad_",
    }
)


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

    regions: int  # fused pointwise kernels
    kernels: int  # regions + matmul + opaque kernels
    pointwise_bytes: int  # bytes the fused regions move
    bytes: int  # all bytes: regions + matmul + opaque ops
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
            return sum(
                min(sum(views.values()), self.sizes.get(tid, math.inf)) for tid, views in reads.get(r, {}).items()
            )

        region_bytes = tuple(int(read_bytes(r)) + sum(writes.get(r, {}).values()) for r in roots)
        other = [o for o in self.ops if o.kind in ("matmul", "opaque")]
        pointwise_bytes = sum(region_bytes)
        return FusedEstimate(
            regions=len(roots),
            kernels=len(roots) + len(other),
            pointwise_bytes=pointwise_bytes,
            bytes=pointwise_bytes + sum(o.bytes for o in other),
            region_bytes=region_bytes,
        )


class _Tracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[OpRecord] = []
        self._tid: dict[int, int] = {}  # id(tensor object) -> tensor id (aliases share one)
        self._level: dict[int, int] = {}  # tensor id -> level
        self.sizes: dict[int, int] = {}  # tensor id -> bytes of the whole tensor
        self._keep: list[torch.Tensor] = []  # keeps traced tensors alive, so Python ids are not reused
        self._next = 0
        self._depth = 0  # dispatched ops running now: a Triton launch inside one belongs to that op

    def launched_triton(self, metadata=None) -> None:
        """Triton's launch-enter hook: a compiled Triton kernel launched from Python outside any dispatched op
        (an autograd Function calling its launcher, as mahia's eager fast paths do) is one opaque kernel that
        the dispatcher never sees; its tensors are unknown, so it records no bytes."""
        if self._depth:
            return
        data = getattr(metadata, "data", None)
        name = data.get("name", "kernel") if isinstance(data, dict) else "kernel"
        self.ops.append(OpRecord(f"triton.{name}", "opaque", (), (), 0, 0, False))

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
        self._depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self._depth -= 1
        name = _bare_name(func)
        schema_args = func._schema.arguments
        named = {a.name: v for a, v in zip(schema_args, args)} | dict(kwargs)
        mutated = {a.name for a in schema_args if a.alias_info is not None and a.alias_info.is_write}
        ins = _tensors((args, kwargs))
        outs = _tensors(out)
        written = outs or _written_tensors(func, args, kwargs, out)

        if not _launches(func, written):
            kind = "free"  # a view, an allocation, a size query, .item(), or no tensor out (promote_types)
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
        if kind == "free":
            for t in outs:
                # an alias (view) of the first input keeps its id; an allocation gets a fresh one
                self._tid[id(t)] = (
                    self.tid(ins[0])
                    if ins and (func.is_view or name in ("detach", "alias", "_unsafe_view"))
                    else self._new_id(t)
                )
                self._keep.append(t)
            reads = []
        for t in written if kind != "free" else ():
            new = self._new_id(t)  # a new version, also for an in-place op's output or mutated argument
            self._tid[id(t)] = new
            self._level[new] = out_level
            writes.append((new, _distinct_bytes(t)))
        flops = _matmul_flops(name, named) if kind == "matmul" else 0
        self.ops.append(OpRecord(name, kind, tuple(reads), tuple(writes), int(flops), level, bool(mutated)))
        return out


def trace_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> OpTrace:
    """Run ``fn(*args, **kwargs)`` once and record its ops (backward too, if ``fn`` calls it): the module
    docstring says what is recorded. A compiled Triton kernel launched from Python outside any dispatched op
    (seen by Triton's launch hook) is recorded as an opaque op ``triton.<kernel>`` with no bytes: the
    dispatcher never sees it, but eager mode launches it.

    The tensors it creates are kept alive until the trace is built, so trace small shapes or
    expect one extra step's worth of memory.
    """
    if not callable(fn):
        raise TypeError(f"trace_ops: fn must be callable, got {type(fn).__name__}")
    tracer = _Tracer()
    hook = _TritonLaunchHook(tracer.launched_triton)  # Triton kernels launched outside the dispatcher
    hook.install()
    try:
        with tracer:
            result = fn(*args, **kwargs)
    finally:
        hook.remove()
    out_ids = frozenset(
        tracer._tid[id(t)] for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor) and id(t) in tracer._tid
    )
    trace = OpTrace(tracer.ops, out_ids, dict(tracer.sizes))
    tracer._keep.clear()
    return trace


# ---------------------------------------------------------------------------------------------------
# Byte traffic per op
# ---------------------------------------------------------------------------------------------------


class ByteTraffic(TorchDispatchMode):
    """One row per op that launches a kernel (:func:`launches_kernel`): ``op`` (its name), ``read_bytes``
    (the distinct bytes of each tensor input, summed over its inputs), ``written_bytes`` (of the tensors it
    writes) and ``out_shape`` (of the first one), in ``rows``.

    In eager PyTorch each such op is (at least) one kernel that reads its inputs from memory and writes
    its outputs back, so ``read_bytes + written_bytes`` summed over the rows is the memory traffic of the
    eager code. Views, allocations and ``.item()`` move no data and get no row.

    >>> with ByteTraffic() as traffic:
    ...     y = torch.nn.functional.rms_norm(x, (n,))
    >>> traffic.rows[0]
    """

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        written = _written_tensors(func, args, kwargs, out)
        if _launches(func, written):
            self.rows.append(
                {
                    "op": func.overloadpacket.__name__,
                    "read_bytes": sum(_distinct_bytes(t) for t in _tensors((args, kwargs))),
                    "written_bytes": sum(_distinct_bytes(t) for t in written),
                    "out_shape": "x".join(map(str, written[0].shape)),
                }
            )
        return out


# ---------------------------------------------------------------------------------------------------
# Float32 matrix products (Inductor's TF32 hint)
# ---------------------------------------------------------------------------------------------------

# The products Inductor checks before it warns that TF32 is available but off
# (torch._inductor.compile_fx.is_tf32_warning_applicable). linear and matmul are composite: they reach a
# dispatch mode as addmm/mm/bmm already, and are listed in case a PyTorch hands them over whole.
FLOAT32_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "linear", "matmul"})

# The two factors of each op, by schema argument name (addmm's and baddbmm's ``self`` is the added term).
_FACTORS = {
    "mm": ("self", "mat2"),
    "addmm": ("mat1", "mat2"),
    "bmm": ("self", "mat2"),
    "baddbmm": ("batch1", "batch2"),
    "linear": ("input", "weight"),
    "matmul": ("self", "other"),
}


@dataclass(frozen=True)
class Float32Product:
    """``count`` matrix products of one op and one pair of factor shapes with a float32 output; where they
    ran: the innermost Python function outside PyTorch that called them (``function``, its qualified name)
    and the innermost submodule running (``module``: qualified name and class; None when untold)."""

    op: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    count: int
    function: str | None = None
    module: str | None = None

    def __str__(self) -> str:
        a, b = ("×".join(map(str, s)) for s in (self.a, self.b))
        text = f"`{self.op}` ({a}) @ ({b})" + (f" ×{self.count}" if self.count > 1 else "")
        text += f" in `{self.function}`" if self.function else ""
        return text + (f" of {self.module}" if self.module else "")


@dataclass
class Float32Matmuls:
    """What :func:`float32_matmuls` saw: the float32 products (first seen first) and every product's
    output dtype (``by_dtype``: dtype name -> products, float32 included)."""

    products: list[Float32Product]
    by_dtype: Counter

    @property
    def count(self) -> int:
        return sum(p.count for p in self.products)

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())


_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


def _caller() -> str | None:
    """The qualified name of the innermost function on the stack outside PyTorch and this module."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(_TORCH_DIR) or f.f_code.co_filename == __file__):
        f = f.f_back
    return None if f is None else getattr(f.f_code, "co_qualname", f.f_code.co_name)


class _MatmulDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.where: list[str] = []  # the submodules running now, outermost first
        self.float32: Counter = Counter()  # (op, a, b, function, module) -> calls, in first-seen order
        self.by_dtype: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _bare_name(func)
        if func.namespace == "aten" and name in FLOAT32_MATMUL_OPS and isinstance(out, torch.Tensor):
            self.by_dtype[str(out.dtype).removeprefix("torch.")] += 1
            if out.dtype == torch.float32:
                named = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
                a, b = (tuple(named[k].shape) for k in _FACTORS[name])
                self.float32[(name, a, b, _caller(), self.where[-1] if self.where else None)] += 1
        return out


def float32_matmuls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Float32Matmuls:
    """Run ``fn(*args, **kwargs)`` once and return the matrix products (:data:`FLOAT32_MATMUL_OPS`) whose
    output is float32, with their factor shapes and counts; where ``fn`` is an ``nn.Module``, each product
    also names the innermost submodule that ran it ("`blocks.1.mlp` (MoE)"; the class alone for the root).

    Why: on a GPU with TF32 (sm 8.0 or newer) and TF32 off, Inductor warns "TensorFloat32 tensor cores ...
    available but not enabled" once per process, as soon as a graph it compiles holds such a product. In a
    bf16 model these are the products computed in float32 on purpose (or by accident); this names them.
    The mode sees the ops after autocast's casts, so an autocast-covered product shows its autocast dtype.
    It runs on any device, but sees what this device runs: a custom op counts as one op, as it does for
    Inductor, while a PyTorch fallback that runs instead of a GPU's Triton kernel shows its products.
    """
    if not callable(fn):
        raise TypeError(f"float32_matmuls: fn must be callable, got {type(fn).__name__}")
    mode = _MatmulDtypes()
    hooks = []

    def enter(label: str) -> Callable[..., None]:
        return lambda *_: mode.where.append(label)  # None: a hook that returns a value would replace one

    def leave(*_) -> None:
        mode.where.pop()

    if isinstance(fn, torch.nn.Module):
        for qual, sub in fn.named_modules():
            label = f"`{qual}` ({type(sub).__name__})" if qual else type(sub).__name__
            hooks.append(sub.register_forward_pre_hook(enter(label)))
            hooks.append(sub.register_forward_hook(leave, always_call=True))
    try:
        with mode:
            fn(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    products = [Float32Product(op, a, b, n, *where) for (op, a, b, *where), n in mode.float32.items()]
    return Float32Matmuls(products, mode.by_dtype)
