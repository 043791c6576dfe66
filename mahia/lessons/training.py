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
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

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

    Note: Triton kernels choose their own precision (``tl.dot`` defaults to TF32 for float32 inputs).
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
    "head": "final norm in/out, log-softmax (fp32)",
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
