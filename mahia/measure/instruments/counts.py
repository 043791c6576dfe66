"""Which ops launch a kernel; host-device syncs, kernel launches, live tensor memory and byte traffic."""

from __future__ import annotations

import math
import sys
import traceback
import warnings
import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# ATen ops that launch nothing although they are not views by their schema: they allocate, alias, ask
# for metadata, or read one value to the host (a copy and a sync, not a kernel).
NO_KERNEL_OPS = frozenset(
    {
        *("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias"),
        *("lift_fresh", "lift_fresh_copy", "_unsafe_view", "set_", "resize_", "_local_scalar_dense"),
        *("is_nonzero", "equal", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "record_stream"),
    }
)


def _bare_name(func) -> str:
    return func._schema.name.split("::")[-1]  # aten.nonzero.default -> "nonzero"; mahia::rms_norm -> "rms_norm"


def _op_name(func) -> str:
    return f"{func.namespace}.{_bare_name(func)}"


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _named(func, args: tuple, kwargs: dict) -> dict:
    return {a.name: v for a, v in zip(func._schema.arguments, args)} | dict(kwargs)


def _written_tensors(func, args: tuple, kwargs: dict, out: Any) -> list[torch.Tensor]:
    """Its tensor outputs or, for an in-place op that returns nothing (``_foreach_mul_``), its mutated arguments."""
    named = _named(func, args, kwargs)
    mutated = [named.get(a.name) for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    return _tensors(out) or _tensors(mutated)


def _launches(func, written: list[torch.Tensor]) -> bool:
    """Whether an op that wrote ``written`` launches a kernel: every op but views, :data:`NO_KERNEL_OPS`, profiler
    markers and ops that write no tensor."""
    return bool(written) and not (func.is_view or func.namespace == "profiler" or _bare_name(func) in NO_KERNEL_OPS)


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor (view) covers: broadcast (stride-0) dims count once."""
    return math.prod(n for n, s in zip(t.shape, t.stride()) if s) * t.element_size() if t.numel() else 0


@contextmanager
def _on_triton_launch(fn):
    """Call ``fn(metadata)`` at every compiled Triton launch in the block (Triton's launch-enter hook: a chain from
    Triton 3.4, a single hook before). Nothing when Triton is not imported: nothing launches Triton kernels then."""
    runtime = getattr(getattr(sys.modules.get("triton"), "knobs", None), "runtime", None)
    hook = getattr(runtime, "launch_enter_hook", False)
    if hook is False:
        yield
    elif hasattr(hook, "add"):
        hook.add(fn)
        try:
            yield
        finally:
            hook.remove(fn)
    else:
        runtime.launch_enter_hook = lambda m: (fn(m), hook(m) if hook else None)
        try:
            yield
        finally:
            runtime.launch_enter_hook = hook


def _kernel_name(metadata) -> str:
    data = getattr(metadata, "data", None)
    return f"triton.{data.get('name', 'kernel') if isinstance(data, dict) else 'kernel'}"


# --- Host-device syncs ---

# ATen ops that make the host wait for the device when their inputs live on a CUDA device.
SYNCING_OPS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), bool(t), int(t), float(t), if t:, .tolist() per element
        *("aten.is_nonzero", "aten.nonzero", "aten.masked_select", "aten.bincount", "aten.equal", "aten.allclose"),
        *("aten.unique", "aten._unique", "aten._unique2", "aten.unique_consecutive", "aten.unique_dim"),
        "aten.repeat_interleave",  # with a tensor of repeats and no output_size: the size depends on the data
    }
)


@dataclass
class SyncReport:
    """``syncing_ops``: ops that would sync on a GPU (a CPU too); ``cuda_syncs``: PyTorch's own count on CUDA
    (``set_sync_debug_mode("warn")``, a lower bound); ``ops`` by name; ``where``: the caller's line of each."""

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
        return f"{self.count} sync(s)" + (
            "" if not self.ops else " — " + ", ".join(f"{k} ×{v}" for k, v in self.ops.most_common())
        )


_INDEX_OPS = ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl")


def _host_copy(name: str, args: tuple, kwargs: dict) -> bool:
    """A copy from a CUDA tensor into host memory (``.cpu()``, ``.to("cpu")``, ``.numpy()``)."""
    if name == "aten._to_copy":
        dev = kwargs.get("device")
        return args[0].is_cuda and dev is not None and torch.device(dev).type == "cpu"
    return name == "aten.copy_" and isinstance(args[1], torch.Tensor) and args[1].is_cuda and not args[0].is_cuda


class _SyncRecorder(TorchDispatchMode):
    def __init__(self, report: SyncReport, keep_stack: bool):
        super().__init__()
        self.report, self.keep_stack = report, keep_stack

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name, r = _op_name(func), self.report
        r.saw_cuda = r.saw_cuda or any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if name in SYNCING_OPS:
            label = None if name == "aten.repeat_interleave" and kwargs.get("output_size") is not None else name
        elif name in _INDEX_OPS and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ()):
            label = "boolean-mask index"  # x[mask]: as many outputs as Trues
        else:
            label = "copy to host" if _host_copy(name, args, kwargs) else None
        if label is not None:
            r.syncing_ops += 1
            r.ops[label] += 1
            if self.keep_stack:
                f = [
                    f
                    for f in traceback.extract_stack()[:-1]
                    if "torch/" not in f.filename and "instruments/" not in f.filename
                ]
                r.where += [f"{f[-1].filename}:{f[-1].lineno}: {f[-1].line}"] if f else []
        return func(*args, **kwargs)


@contextmanager
def count_syncs(*, keep_stack: bool = True):
    """Yields a :class:`SyncReport`, filled in when the block exits. The CPU waits for the GPU when it reads a
    value (``.item()``, ``if t > 0:``), when an output's shape depends on the data (``nonzero``, ``x[mask]``,
    ``unique``) and on a copy to the host.

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
            with _SyncRecorder(report, keep_stack):
                yield report
        ours = [cuda and "synchronizing" in str(w.message).lower() for w in caught]
        if cuda:
            torch.cuda.synchronize()
            report.cuda_syncs = sum(ours)
        for w, mine in zip(caught, ours):  # hand on the warnings that were not ours
            if not mine:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    finally:
        if cuda:
            _set_sync_debug_mode(prev)


def _set_sync_debug_mode(mode) -> None:
    """Without the "prototype feature" notice: in a notebook it reads like an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"[\s\S]*Synchronization debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode(mode)


# --- Kernel launches, live memory, byte traffic ---


@dataclass
class OpCount:
    """Ops that launched a kernel: ``total`` and ``by_op`` (ATen ops by name, custom ops as ``namespace.name``,
    Triton kernels launched from Python as ``triton.<kernel>``)."""

    total: int = 0
    by_op: Counter = field(default_factory=Counter)


class _OpCounter(TorchDispatchMode):
    def __init__(self, report: OpCount):
        super().__init__()
        self.report, self.triton = report, 0

    def launched_triton(self, metadata=None) -> None:
        self.triton += 1
        self.report.total += 1
        self.report.by_op[_kernel_name(metadata)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.triton
        out = func(*args, **kwargs)
        # a custom op whose Triton kernels the hook saw was counted kernel by kernel
        if _launches(func, _written_tensors(func, args, kwargs, out)) and not (
            func.namespace != "aten" and self.triton > before
        ):
            self.report.total += 1
            self.report.by_op[_bare_name(func) if func.namespace == "aten" else _op_name(func)] += 1
        return out


@contextmanager
def count_ops():
    """Yields an :class:`OpCount` of the ops run in the block (backward included) that launch a kernel
    (:func:`_launches`) and of the compiled Triton kernels launched from Python: the kernel launches of
    eager code (a compiled region's kernels skip the dispatcher).

    >>> with count_ops() as c:
    ...     y = x @ w + b
    >>> c.total
    2
    """
    report = OpCount()
    mode = _OpCounter(report)
    with _on_triton_launch(mode.launched_triton), mode:
        yield report


class LiveTensorMemory(TorchDispatchMode):
    """Bytes of tensor storage created inside the mode and still alive: ``current`` and its maximum ``peak``.

    A storage not seen before is counted at its full size when an op returns it, and a weak reference subtracts
    it when it is freed: ``torch.cuda.max_memory_allocated`` minus the memory at entry, without the allocator's
    rounding and caching, on any device. In-place ops, ``out=`` and views add nothing. Eager mode only.
    """

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
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
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}  # also storages made before
        for t in _tensors(out):
            if t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs:
                self._track(t)
        return out


class ByteTraffic(TorchDispatchMode):
    """One row in ``rows`` per op that launches a kernel: ``op``, ``read_bytes`` (the distinct bytes of its tensor
    inputs), ``written_bytes`` and ``out_shape``. In eager PyTorch each such op reads its inputs from memory and
    writes its outputs back: the rows sum to the eager code's memory traffic."""

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
