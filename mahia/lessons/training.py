"""Helpers for the training notebooks (06 mixed precision, 07 gradient checkpointing).

What a training step costs besides time, measured or modelled:

* loss curves: :func:`train_run` runs a step function on fresh batches and returns the losses as one
  device tensor (read once, at the end: no host sync per step); :func:`smoothed_rel_dev` and
  :func:`tail_rel_diff` compare two curves.
* precision: :func:`matmul_precision` switches TF32 for float32 matrix products (and restores it);
  :func:`lost_in_cast` counts the values a cast to a narrow dtype flushes to zero or to infinity;
  :func:`running_sum` adds numbers one by one with the accumulator rounded to a dtype.
* memory, modelled: :func:`block_activation_table` itemizes, per block and part, the bytes per token
  autograd keeps (:meth:`mahia.model.HybridModel.activation_bytes_per_token` with ``itemized=True``, with
  what each part keeps spelled out); :func:`step_peak_estimate` is the peak of a step that model predicts,
  per checkpointing policy (the arithmetic of :mod:`mahia.measure.cost`).
* memory, measured: :func:`saved_tensor_bytes` sums the tensors autograd keeps, per module;
  :func:`peak_bytes` is the peak a call adds, from the CUDA allocator or, on any device, from
  :class:`mahia.measure.instruments.LiveTensorMemory` (:func:`with_peak` puts it into a ``Timing``
  measured on the CPU);
  :func:`fits` tries a call and reports whether it ran out of GPU memory, and :func:`largest_fitting`
  searches the largest batch that fits with a few such calls.
* what is resident at the peak, measured: :func:`peak_composition` labels the live tensors a call made by
  the op that made them, their dtype and the phase (forward, or backward and optimizer), as they were
  at the call's peak; :func:`allocator_summary` reads the CUDA caching allocator's statistics and memory
  snapshot (reserved against allocated, fragmentation, ``cudaMalloc`` calls); :func:`state_bytes` sums
  the weights, gradients and optimizer state that live outside a step.
* which dtype each op ran in: :func:`op_dtypes` (what autocast, or the model's own casts, chose).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mahia.measure.checks import check_int
from mahia.measure.cost import training_peak_bytes
from mahia.measure.instruments import LiveTensorMemory
from mahia.measure.timing import Timing

__all__ = [
    "train_run",
    "smoothed_rel_dev",
    "tail_rel_diff",
    "matmul_precision",
    "lost_in_cast",
    "running_sum",
    "saved_tensor_bytes",
    "block_activation_table",
    "step_peak_estimate",
    "peak_bytes",
    "with_peak",
    "fits",
    "largest_fitting",
    "PeakComposition",
    "peak_composition",
    "allocator_summary",
    "allocator_step_summary",
    "state_bytes",
    "op_dtypes",
]


# ---------------------------------------------------------------------------------------------------
# Loss curves
# ---------------------------------------------------------------------------------------------------


def train_run(
    step: Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor],
    data,
    *,
    steps: int,
    batch_size: int,
    device: torch.device | str,
) -> torch.Tensor:
    """Run ``steps`` calls of ``step((idx, targets))`` on fresh batches ``data.batch(batch_size, device)``.

    Returns the losses as one float32 tensor of shape (steps,) on ``device``, stacked after the loop:
    nothing is read back to the host while training (convert it once, at the end).
    """
    if not callable(step):
        raise TypeError(f"train_run: step must be callable, got {type(step).__name__}")
    if not hasattr(data, "batch"):
        raise TypeError(f"train_run: data must have batch(batch_size, device), got {type(data).__name__}")
    check_int("train_run", "steps", steps)
    check_int("train_run", "batch_size", batch_size)
    losses = [step(data.batch(batch_size, device)).reshape(()) for _ in range(steps)]
    return torch.stack(losses).float()


def _curve(fn: str, name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if x.dim() != 1 or x.numel() < 1 or not x.is_floating_point():
        raise ValueError(f"{fn}: {name} must be a 1-D float tensor of losses, got {x.dtype} {tuple(x.shape)}")
    return x.detach().to("cpu", torch.float64)


def _pair(fn: str, a, b) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _curve(fn, "a", a), _curve(fn, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"{fn}: a and b must have the same length, got {a.numel()} and {b.numel()}")
    return a, b


def tail_rel_diff(a, b, *, frac: float = 0.1) -> float:
    """``|mean(a_tail) - mean(b_tail)| / |mean(b_tail)|`` over the last ``frac`` of the steps (at least one).

    ``b`` is the reference curve. NaN or Inf anywhere in the tails gives ``inf``.
    """
    if not (isinstance(frac, (int, float)) and 0 < frac <= 1):
        raise ValueError(f"tail_rel_diff: frac must be in (0, 1], got {frac!r}")
    a, b = _pair("tail_rel_diff", a, b)
    n = max(1, round(frac * a.numel()))
    ta, tb = a[-n:].mean(), b[-n:].mean()
    if not (torch.isfinite(ta) and torch.isfinite(tb)) or tb == 0:
        return math.inf
    return float((ta - tb).abs() / tb.abs())


def smoothed_rel_dev(a, b, *, window: int) -> float:
    """Largest relative distance of curve ``a`` from reference ``b`` after a moving average of ``window``
    steps: ``max_t |ma(a)_t - ma(b)_t| / |ma(b)_t|``. Step-to-step noise averages out; a run that drifts
    away or diverges does not. NaN or Inf anywhere gives ``inf``."""
    a, b = _pair("smoothed_rel_dev", a, b)
    check_int("smoothed_rel_dev", "window", window)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    w = min(window, a.numel())
    kernel = torch.full((1, 1, w), 1.0 / w, dtype=torch.float64)
    ma = torch.nn.functional.conv1d(a.view(1, 1, -1), kernel).flatten()  # (steps - w + 1,)
    mb = torch.nn.functional.conv1d(b.view(1, 1, -1), kernel).flatten()
    return float(((ma - mb).abs() / mb.abs()).max())


# ---------------------------------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def matmul_precision(tf32: bool) -> Iterator[None]:
    """Inside the block, float32 matrix products and convolutions on CUDA use TF32 tensor cores
    (``tf32=True``: 10-bit mantissa inputs, float32 accumulation) or true float32 (``False``).
    The previous settings are restored on exit. No effect on the CPU.

    Triton kernels choose their own precision and are not reached by this switch: mahia's (the GLA scan, the
    grouped GEMM) take float32 products in full precision (``tl.dot(..., input_precision="ieee")``), so TF32
    leaves them at the fp32 speed.
    """
    if not isinstance(tf32, bool):
        raise TypeError(f"matmul_precision: tf32 must be a bool, got {tf32!r}")
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def lost_in_cast(x: torch.Tensor, dtype: torch.dtype, *, scale: float = 1.0) -> dict[str, float]:
    """What casting ``x * scale`` to ``dtype`` loses, as fractions of the finite nonzero entries of ``x``:

        underflow = share that becomes 0 (|x s| below half the smallest subnormal of ``dtype``)
        overflow  = share that becomes +-inf (|x s| above the largest finite value)

    The product ``x * scale`` is formed in float64, so only the cast rounds.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"lost_in_cast: x must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"lost_in_cast: dtype must be a floating torch.dtype, got {dtype!r}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"lost_in_cast: scale must be a finite positive number, got {scale!r}")
    v = x.detach().double().flatten()
    v = v[torch.isfinite(v) & (v != 0)] * scale
    if v.numel() == 0:
        return {"underflow": 0.0, "overflow": 0.0, "n": 0}
    c = v.to(dtype)
    return {
        "underflow": float((c == 0).double().mean()),
        "overflow": float(torch.isinf(c).double().mean()),
        "n": int(v.numel()),
    }


def running_sum(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``s_i = round_dtype(s_{i-1} + x_i)``, ``s_0 = 0``: the prefix sums of a 1-D ``x`` with the accumulator
    kept in ``dtype`` (each addition rounded to it, as a naive loop in that dtype does). Returns (n,) in
    ``dtype`` on the CPU. Sequential by nature, so meant for a few thousand elements.

    Once ``|s|`` is large, its spacing ``eps(dtype) * |s|`` exceeds the addends and the sum stalls.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.is_floating_point():
        raise ValueError(
            f"running_sum: x must be a 1-D floating tensor, got {getattr(x, 'dtype', type(x))} "
            f"{tuple(getattr(x, 'shape', ()))}"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"running_sum: dtype must be a floating torch.dtype, got {dtype!r}")
    xs = x.detach().to("cpu", dtype)
    out = torch.empty_like(xs)
    acc = torch.zeros((), dtype=dtype)
    for i in range(xs.numel()):
        acc = acc + xs[i]  # one rounding to dtype per addition
        out[i] = acc
    return out


# ---------------------------------------------------------------------------------------------------
# Memory: what autograd keeps, modelled and measured
# ---------------------------------------------------------------------------------------------------


def saved_tensor_bytes(
    fn: Callable[[], object],
    *,
    modules: dict[str, nn.Module] | None = None,
    exclude: tuple[torch.Tensor, ...] | list[torch.Tensor] = (),
) -> dict[str, int]:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs, per module label.

    Every saved tensor is attributed to the innermost module of ``modules`` (name -> module) running when
    it was saved, else to ``"other"``; each storage is counted once, at its full size (a view keeps its
    whole storage alive). Storages of ``exclude`` (e.g. the parameters, which exist anyway) are skipped.
    Returns ``{label: bytes}`` with the labels in first-saved order, plus ``"total"``.

    Measured with ``torch.autograd.graph.saved_tensors_hooks``, so it sees what a plain forward saves;
    inside ``torch.utils.checkpoint`` regions the checkpoint's own hooks take over (use
    :func:`peak_bytes` to see what checkpointing saves).
    """
    if not callable(fn):
        raise TypeError(f"saved_tensor_bytes: fn must be callable, got {type(fn).__name__}")
    modules = modules or {}
    for name, m in modules.items():
        if not isinstance(m, nn.Module):
            raise TypeError(f"saved_tensor_bytes: modules[{name!r}] must be an nn.Module, got {type(m).__name__}")
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


# What each part of a block keeps for backward (the bytes are the model's: activation_bytes_per_token).
_KEPT_TENSORS = {
    "attention": "norm in/out, q, k, v, output, {core}",
    "meta-attention": "q, k, g, v, output, gain input",
    "graph memory": "k, v, q, read output, write/read weights; per segment: state, diffused state, read keys "
    "and values",
    "MoE": "norm in/out; x{k}: input, up, act, output; router",
    "SwiGLU": "norm in/out, up (2F), activation (F)",
    "head": "final norm in/out, float32 log-probabilities (nll_loss's input)",
}


def block_activation_table(model: nn.Module, seq_len: int, dtype: torch.dtype = torch.float32) -> list[dict]:
    """The activation model of a :class:`~mahia.model.HybridModel`, itemized: one row per part of every
    block (and one for the LM head) with the tensors it keeps for backward and their bytes per token,
    ``{"block", "part", "bytes_per_token", "tensors"}``.

    The bytes are the model's own table (``model.activation_bytes_per_token(seq_len, dtype,
    itemized=True)``, formulas in :meth:`~mahia.model.HybridModel.memory_estimate`), without
    checkpointing: the rows sum to ``model.activation_bytes_per_token(seq_len, dtype)[0]``.
    """
    for attr in ("cfg", "blocks", "activation_bytes_per_token"):
        if not hasattr(model, attr):
            raise TypeError(
                f"block_activation_table: model must be a HybridModel (needs .{attr}), got {type(model).__name__}"
            )
    check_int("block_activation_table", "seq_len", seq_len)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"block_activation_table: dtype must be a floating torch.dtype, got {dtype!r}")
    cfg = model.cfg
    core = "log-sum-exp (fp32)" if cfg.attention_impl == "sdpa" else "probabilities T x T (fp32)"
    return [
        {
            "block": r["block"],
            "part": r["part"],
            "bytes_per_token": r["full"],
            "tensors": _KEPT_TENSORS[r["part"]].format(core=core, k=cfg.top_k),
        }
        for r in model.activation_bytes_per_token(seq_len, dtype, itemized=True)
    ]


def step_peak_estimate(
    model: nn.Module, batch: int, seq_len: int, dtype: torch.dtype = torch.float32, *, checkpoint: str | None = None
) -> int:
    """Predicted peak bytes of one training step on top of the weights and the optimizer state:

        peak = activations kept for backward + what one block recomputes + gradients

    (:func:`mahia.measure.cost.training_peak_bytes`) from :meth:`~mahia.model.HybridModel.memory_estimate`.
    What one block recomputes: nothing without checkpointing, its whole activations with ``"full"``, and
    with ``"selective"`` only what selective checkpointing does not keep (norms, activations; the saved
    matmul outputs are not recomputed), the largest over the blocks
    (:func:`mahia.measure.cost.activation_bytes`).
    """
    if not hasattr(model, "memory_estimate") or not hasattr(model, "cfg"):
        raise TypeError(
            f"step_peak_estimate: model must be a HybridModel (needs memory_estimate), got {type(model).__name__}"
        )
    est = model.memory_estimate(batch, seq_len, dtype, checkpoint=checkpoint)
    return training_peak_bytes(activations=est["activations"], recompute=est["recompute"], gradients=est["gradients"])


def peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes that ``fn()`` allocates on top of what was allocated before it.

    On CUDA: ``torch.cuda.max_memory_allocated - memory_allocated`` at entry (the allocator's view). Elsewhere:
    :class:`mahia.measure.instruments.LiveTensorMemory` (the live tensors' view, without allocator rounding).
    """
    if not callable(fn):
        raise TypeError(f"peak_bytes: fn must be callable, got {type(fn).__name__}")
    device = torch.device(device)
    if device.type == "cuda":
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
    if not isinstance(timing, Timing):
        raise TypeError(f"with_peak: timing must be a mahia.measure.timing.Timing, got {type(timing).__name__}")
    if timing.peak_mem_bytes is not None:
        return timing
    return dataclasses.replace(timing, peak_mem_bytes=peak_bytes(fn, device))


def fits(fn: Callable[[], object], *, cleanup: Callable[[], object] | None = None) -> bool:
    """Run ``fn()``; True if it finished, False if it ran out of GPU memory (``torch.cuda.OutOfMemoryError``).

    Any other exception propagates. Afterwards, in both cases, ``cleanup()`` runs (e.g. drop the gradients a
    half-finished backward left) and the freed memory is returned to the CUDA allocator's pool, so the
    next attempt starts clean.
    """
    if not callable(fn):
        raise TypeError(f"fits: fn must be callable, got {type(fn).__name__}")
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


def largest_fitting(
    fits_at: Callable[[int], bool], start: int, *, probes: int = 3, grow: float = 1.15, shrink: float = 0.85
) -> tuple[int, int | None]:
    """Search the largest size ``n`` with ``fits_at(n)`` true, in at most ``probes`` calls, from a predicted ``start``.

    While every trial has fit, the next one is ``grow`` times larger; while every trial has failed,
    ``shrink`` times smaller; once there is one of each, bisect. Stops early when the bracket is tighter
    than 5%. Returns ``(largest size that fit or 0, smallest size that did not or None)``; the truth lies
    between the two.
    """
    if not callable(fits_at):
        raise TypeError(f"largest_fitting: fits_at must be callable, got {type(fits_at).__name__}")
    check_int("largest_fitting", "start", start)
    check_int("largest_fitting", "probes", probes)
    if not (grow > 1 and 0 < shrink < 1):
        raise ValueError(f"largest_fitting: need grow > 1 and 0 < shrink < 1, got grow={grow}, shrink={shrink}")
    ok, bad, n = 0, None, start
    for _ in range(probes):
        if fits_at(n):
            ok = max(ok, n)
        else:
            bad = n if bad is None else min(bad, n)
        if bad is not None and (bad - ok <= max(1, ok // 20) or bad == 1):
            break
        if ok and bad is not None:
            n = (ok + bad) // 2
        elif bad is None:
            n = max(n + 1, int(n * grow))
        else:
            n = max(1, min(n - 1, int(n * shrink)))
    return ok, bad


# ---------------------------------------------------------------------------------------------------
# What is resident at the peak, and in which dtype each op ran
# ---------------------------------------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass
class PeakComposition:
    """The live tensors a call had made, as they were at its peak (bytes of storage, each counted once).

    ``by_label`` and ``count`` are keyed by ``"<phase>: <op> (<dtype>)"``: the phase is ``forward`` where
    grad mode was on when the op ran, ``backward/optimizer`` where it was off (the backward pass and
    ``optimizer.step()`` run without grad mode); the op is the ATen op that made the tensor."""

    peak: int
    by_label: dict[str, int] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def top(self, n: int = 8) -> list[tuple[str, int, int]]:
        """The ``n`` largest labels at the peak: (label, bytes, tensors), largest first."""
        ranked = sorted(self.by_label.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [(k, v, self.count.get(k, 0)) for k, v in ranked]

    def phase_bytes(self) -> dict[str, int]:
        """Bytes at the peak per phase."""
        out: dict[str, int] = {}
        for label, n in self.by_label.items():
            phase = label.split(":", 1)[0]
            out[phase] = out.get(phase, 0) + n
        return out


class _PeakTracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.current = 0
        self.result = PeakComposition(0)
        self._by_label: dict[str, int] = {}
        self._count: dict[str, int] = {}
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
        self._by_label[label] = self._by_label.get(label, 0) + n
        self._count[label] = self._count.get(label, 0) + 1
        if self.current > self.result.peak:
            self.result = PeakComposition(
                self.current,
                {k: v for k, v in self._by_label.items() if v > 0},
                {k: v for k, v in self._count.items() if v > 0},
            )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        phase = "forward" if torch.is_grad_enabled() else "backward/optimizer"
        # an output on an input's storage (in place, out=, a view) is no new memory
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs:
                self._track(t, f"{phase}: {func.overloadpacket.__name__} ({_dtype_name(t.dtype)})")
        return out


def peak_composition(fn: Callable[[], object]) -> PeakComposition:
    """Run ``fn()`` and return what it had allocated and still held at its peak, by label
    (:class:`PeakComposition`): the same peak :class:`mahia.measure.instruments.LiveTensorMemory` measures
    (storages made inside ``fn``, each at its full size; what existed before is not counted), itemized.
    Eager code only (a compiled region's buffers do not pass through the dispatcher)."""
    if not callable(fn):
        raise TypeError(f"peak_composition: fn must be callable, got {type(fn).__name__}")
    tracker = _PeakTracker()
    with tracker:
        fn()
    return tracker.result


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of what lives across steps: the weights, the gradients that exist now, the optimizer's state
    tensors (``optimizer.state``), each storage counted once."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"state_bytes: model must be an nn.Module, got {type(model).__name__}")
    seen: set[int] = set()

    def total(tensors) -> int:
        n = 0
        for t in tensors:
            st = t.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                n += st.nbytes()
        return n

    params = list(model.parameters())
    out = {"weights": total(params), "gradients": total(p.grad for p in params if p.grad is not None)}
    if optimizer is not None:
        out["optimizer state"] = total(
            v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
        )
    return out


def allocator_summary(device: torch.device | str) -> dict[str, float]:
    """The CUDA caching allocator on ``device``, from ``torch.cuda.memory_stats`` and
    ``torch.cuda.memory_snapshot`` (bytes unless named otherwise):

    * ``allocated``, ``allocated peak``: live tensors now and at the peak since the last reset;
    * ``reserved``, ``reserved peak``: what the allocator holds from the driver (cached free blocks too);
    * ``inactive split``: free pieces of partly used blocks (fragmentation), now and ``... peak``;
    * ``segments``, ``cudaMalloc calls``, ``alloc retries`` (a retry frees the cache and tries again: the
      sign of memory pressure); ``largest free block``: the largest cached free block in the snapshot.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"allocator_summary: needs a CUDA device, got {device}")
    torch.cuda.synchronize(device)
    st = torch.cuda.memory_stats(device)
    free_blocks = [
        b.get("size", 0)
        for seg in torch.cuda.memory_snapshot()
        if seg.get("device", device.index or 0) == (device.index or 0)
        for b in seg.get("blocks", [])
        if b.get("state") == "inactive"
    ]
    return {
        "allocated": st.get("allocated_bytes.all.current", 0),
        "allocated peak": st.get("allocated_bytes.all.peak", 0),
        "reserved": st.get("reserved_bytes.all.current", 0),
        "reserved peak": st.get("reserved_bytes.all.peak", 0),
        "inactive split": st.get("inactive_split_bytes.all.current", 0),
        "inactive split peak": st.get("inactive_split_bytes.all.peak", 0),
        "segments": st.get("segment.all.current", 0),
        "cudaMalloc calls": st.get("num_device_alloc", st.get("segment.all.allocated", 0)),
        "alloc retries": st.get("num_alloc_retries", 0),
        "largest free block": max(free_blocks, default=0),
    }


def allocator_step_summary(fn: Callable[[], object], device: torch.device | str) -> dict[str, float]:
    """:func:`allocator_summary` of one call of ``fn``: the peaks and the accumulated counters (``cudaMalloc
    calls``, ``alloc retries``) are reset just before it, so they count this call only, not everything since the
    process started (``torch.cuda.reset_peak_memory_stats`` leaves those counters alone). Adds ``allocated
    before``: the bytes of tensors alive when the call began (weights, optimizer state, and whatever else the
    process still holds), so ``allocated peak - allocated before`` is what the call itself allocated at its peak.
    ``segments`` stays what the cache holds after the call, whichever call made them."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"allocator_step_summary: needs a CUDA device, got {device}")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.reset_accumulated_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    out = allocator_summary(device)
    out["allocated before"] = before
    return out


class _DtypeCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if first is not None:
            by = self.seen.setdefault(func.overloadpacket.__name__, {})
            by[_dtype_name(first.dtype)] = by.get(_dtype_name(first.dtype), 0) + 1
        return out


def op_dtypes(fn: Callable[[], object]) -> dict[str, dict[str, int]]:
    """``{op: {dtype: calls}}``: the ATen ops ``fn()`` ran and the dtype of each call's first floating
    output, as dispatched (after autocast has chosen: autocast's casts show as ``_to_copy``)."""
    if not callable(fn):
        raise TypeError(f"op_dtypes: fn must be callable, got {type(fn).__name__}")
    counter = _DtypeCounter()
    with counter:
        fn()
    return counter.seen
