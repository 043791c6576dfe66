"""Count host-device synchronizations in a region of code.

A synchronization is any point where the CPU must wait for the GPU to finish queued work before it
can go on: reading a value (``.item()``, ``bool(t)``, ``if t > 0:``, ``.tolist()``, ``print(t)``),
an op whose *output shape* depends on the data (``nonzero``, boolean-mask indexing ``x[mask]``,
``masked_select``, ``unique``, ``bincount`` without a fixed size), or a copy to the host
(``.cpu()``, ``.numpy()``). Each one drains the GPU's queue: the CPU stops running ahead, and the
GPU idles while the CPU issues the next launches.

``count_syncs()`` sees them in two ways:

* ``syncing_ops`` (always, CPU included): a ``TorchDispatchMode`` records every ATen op known to
  force a sync on a CUDA device. On a CPU nothing actually waits, but the same code *would* sync on
  a GPU, which is what a test or a CPU notebook wants to know. (``.tolist()`` and ``.numpy()`` of a
  CPU tensor read memory directly and are invisible here; on a GPU they show as copies to host.)
* ``cuda_syncs`` (CUDA only): ``torch.cuda.set_sync_debug_mode("warn")`` makes PyTorch itself warn
  at every synchronizing call; the warnings are counted. This is the ground truth on a GPU.

``count`` is the CUDA count where the region ran CUDA ops, and the op count elsewhere.
"""
from __future__ import annotations

import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNCING_OPS", "SyncReport", "count_syncs", "assert_no_syncs"]

# ATen ops that make the host wait for the device when their inputs live on a CUDA device.
SYNCING_OPS = frozenset({
    "aten._local_scalar_dense",  # .item(), bool(t), int(t), float(t), if t:, .tolist() per element
    "aten.is_nonzero",
    "aten.nonzero",
    "aten.masked_select",
    "aten.unique", "aten._unique", "aten._unique2", "aten.unique_consecutive", "aten.unique_dim",
    "aten.bincount",
    "aten.repeat_interleave",  # with a tensor of repeats: output size depends on the data
    "aten.equal",
    "aten.allclose",
})


def _op_name(func) -> str:
    # func is an OpOverload like aten.nonzero.default -> "aten.nonzero"
    return f"{func.namespace}.{func._schema.name.split('::')[-1]}"


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
            s += " — " + ", ".join(f"{k} x{v}" for k, v in self.ops.most_common())
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
                    frames = [f for f in traceback.extract_stack()[:-1]
                              if "torch/" not in f.filename and "mahia/measure/instruments.py" not in f.filename]
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
        torch.cuda.set_sync_debug_mode("warn")
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
            torch.cuda.set_sync_debug_mode(prev)


@contextmanager
def assert_no_syncs():
    """Raise ``AssertionError`` listing where, if the block performs any synchronizing op."""
    with count_syncs() as r:
        yield r
    if r.count:
        where = "\n  ".join(r.where[:10])
        raise AssertionError(f"expected no host-device syncs, found {r}\n  {where}")
