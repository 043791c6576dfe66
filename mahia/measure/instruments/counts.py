"""Which ops launch a kernel; host-device syncs, kernel launches, live tensor memory and byte traffic."""

from __future__ import annotations

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
                        if "torch/" not in f.filename and "mahia/measure/instruments/" not in f.filename
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
    """Without the "prototype feature" notice: in a notebook it reads like an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"[\s\S]*Synchronization debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode(mode)


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
