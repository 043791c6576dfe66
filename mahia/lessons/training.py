"""Memory instruments of the training notebooks (06 mixed precision, 07 gradient checkpointing); the taught
code (autocast and GradScaler, checkpointing policies) is in the notebooks' own cells."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mahia.measure.instruments import LiveTensorMemory
from mahia.measure.timing import Timing

__all__ = ["saved_tensor_bytes", "peak_bytes", "with_peak", "fits", "PeakComposition", "peak_composition"]


def saved_tensor_bytes(
    fn: Callable[[], object],
    *,
    modules: dict[str, nn.Module] | None = None,
    exclude: tuple[torch.Tensor, ...] | list[torch.Tensor] = (),
) -> dict[str, int]:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs, ``{label: bytes, "total": ...}``:
    each storage counted once at its full size (a view keeps its storage alive), under the innermost module of
    ``modules`` (name -> module) running when it was saved, else ``"other"``; ``exclude``'s storages (the
    parameters) skipped. Inside ``torch.utils.checkpoint`` its own hooks take over: :func:`peak_bytes` sees those."""
    modules = modules or {}
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    stack: list[str] = []
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in skip and ptr not in seen and st.nbytes() > 0:
            seen[ptr] = (stack[-1] if stack else "other", st.nbytes())
        return t

    def enter(name: str):
        def hook(*_):
            stack.append(name)  # returns None: the module's input is left alone

        return hook

    def leave(*_):
        stack.pop()  # returns None: the module's output is left alone

    handles = []
    for name, m in modules.items():
        handles.append(m.register_forward_pre_hook(enter(name)))
        handles.append(m.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
    finally:
        for h in handles:
            h.remove()
    out: dict[str, int] = {}
    for label, n in seen.values():
        out[label] = out.get(label, 0) + n
    out["total"] = sum(n for _, n in seen.values())
    return out


def peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes ``fn()`` allocates on top of what was allocated before: the allocator's view on CUDA, the live
    tensors' (:class:`mahia.measure.instruments.LiveTensorMemory`, no allocator rounding) elsewhere."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with LiveTensorMemory() as mem:
        fn()
    return mem.peak


def with_peak(timing: Timing, fn: Callable[[], object], device: torch.device | str) -> Timing:
    """``timing`` with ``peak_mem_bytes`` filled in by :func:`peak_bytes` (one more call of ``fn``) where
    ``bench`` could not measure it (on the CPU, where PyTorch keeps no allocator statistics)."""
    if timing.peak_mem_bytes is not None:
        return timing
    return dataclasses.replace(timing, peak_mem_bytes=peak_bytes(fn, device))


def fits(fn: Callable[[], object], *, cleanup: Callable[[], object] | None = None) -> bool:
    """Run ``fn()``: True if it finished, False if it ran out of GPU memory (other errors propagate). Then
    ``cleanup()`` (drop what a half-finished step left) and empty the allocator's cache: the next try starts clean."""
    try:
        fn()
        ok = True
    except torch.cuda.OutOfMemoryError:
        ok = False  # the exception (and the frames holding tensors) is released when this block ends
    finally:
        if cleanup is not None:
            cleanup()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return ok


@dataclass
class PeakComposition:
    """The live tensors a call had made, at its peak (storage bytes, each counted once), keyed by
    ``"<phase>: <op> (<dtype>)"``: ``forward`` where grad mode was on, ``backward/optimizer`` where it was off
    (the backward and ``optimizer.step()``); the op is the ATen op that made the tensor."""

    peak: int
    by_label: dict[str, int] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def top(self, n: int = 8) -> list[tuple[str, int, int]]:
        """The ``n`` largest labels at the peak: (label, bytes, tensors), largest first."""
        ranked = sorted(self.by_label.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [(k, v, self.count.get(k, 0)) for k, v in ranked]

    def phase_bytes(self) -> dict[str, int]:
        """Bytes at the peak per phase."""
        out = Counter()
        for label, n in self.by_label.items():
            out[label.split(":", 1)[0]] += n
        return dict(out)


class _PeakTracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.current = 0
        self.result = PeakComposition(0)
        self._by_label, self._count = Counter(), Counter()
        self._alive: dict[int, weakref.ref] = {}

    def _track(self, t: torch.Tensor, label: str) -> None:
        st = t.untyped_storage()
        ptr, n = st.data_ptr(), st.nbytes()
        if n == 0 or ptr in self._alive:
            return

        def freed(_, ptr=ptr, n=n, label=label):
            self.current -= n
            self._by_label[label] -= n
            self._count[label] -= 1
            self._alive.pop(ptr, None)

        self._alive[ptr] = weakref.ref(st, freed)
        self.current += n
        self._by_label[label] += n
        self._count[label] += 1
        if self.current > self.result.peak:  # unary + drops the labels at 0
            self.result = PeakComposition(self.current, dict(+self._by_label), dict(+self._count))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        phase = "forward" if torch.is_grad_enabled() else "backward/optimizer"
        # an output on an input's storage (in place, out=, a view) is no new memory
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs:
                self._track(t, f"{phase}: {func.overloadpacket.__name__} ({str(t.dtype)[6:]})")
        return out


def peak_composition(fn: Callable[[], object]) -> PeakComposition:
    """Run ``fn()``: what it had allocated and still held at its peak, by label (the peak
    :class:`mahia.measure.instruments.LiveTensorMemory` measures, itemized). Eager code only."""
    tracker = _PeakTracker()
    with tracker:
        fn()
    return tracker.result
