"""Which Triton kernels run (and why not), plus the input checks the kernels and their eager references share.

A kernel runs when three things hold, all read at call time (so tests can flip them with
``monkeypatch.setenv``):

1. ``import triton`` works (checked once, when this module is imported);
2. ``MAHIA_DISABLE_TRITON`` is not set to ``1``;
3. the input lives on a CUDA device, or ``TRITON_INTERPRET=1`` (Triton's CPU interpreter: slow, exact,
   used by the tests).

Otherwise the public functions in :mod:`mahia.kernels` run the eager PyTorch reference and say so once
per kernel per process with ``warnings.warn``; the result is the same function, only slower.

Under ``torch.compile`` the decision is taken while tracing and frozen into the compiled graph, and the
warning is skipped (Dynamo cannot trace ``warnings.warn`` without a graph break); ``status()`` still
tells which path is active.
"""
from __future__ import annotations

import os
import warnings

import torch

__all__ = [
    "KERNELS",
    "DISABLE_ENV",
    "triton_import_error",
    "triton_available_for",
    "why_not",
    "status",
    "warn_fallback_once",
    "reset_fallback_warnings",
    "check_float_tensor",
    "check_same_device",
    "check_rms_norm_inputs",
    "check_swiglu_inputs",
    "check_rope_inputs",
    "check_gla_inputs",
    "check_moe_combine_inputs",
]

# Every public kernel of mahia.kernels, by the name status() and the warnings use.
KERNELS: tuple[str, ...] = ("rms_norm", "add_rms_norm", "swiglu", "rope",
                             "gla",           # gated linear attention scan (kernels/scan.py)
                             "moe_grouped_mm",  # grouped GEMM fallback of the MoE layer (model/moe.py)
                             "moe_combine")     # the MoE layer's un-permute + gated sum (kernels/moe_combine.py)
DISABLE_ENV = "MAHIA_DISABLE_TRITON"

try:  # importing triton is the expensive part; do it once
    import triton  # noqa: F401

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as exc:  # ImportError, or a broken install raising something else
    _TRITON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

# Kernels that already warned about falling back (once per process per kernel).
_warned: set[str] = set()


def triton_import_error() -> str | None:
    """None if ``import triton`` worked, else the error it raised."""
    return _TRITON_IMPORT_ERROR


def _disabled_by_env() -> bool:
    return os.environ.get(DISABLE_ENV, "") == "1"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def why_not(t: torch.Tensor | None = None) -> str | None:
    """None when Triton kernels can run on ``t`` (or on this machine, if ``t`` is None); else the reason."""
    if _TRITON_IMPORT_ERROR is not None:
        return f"triton is not installed ({_TRITON_IMPORT_ERROR})"
    if _disabled_by_env():
        return f"disabled by {DISABLE_ENV}=1"
    on_cuda = t.is_cuda if t is not None else torch.cuda.is_available()
    if not (on_cuda or _interpreting()):
        where = f"input on {t.device}" if t is not None else "no CUDA device"
        return f"{where} and TRITON_INTERPRET is not 1"
    return None


def triton_available_for(t: torch.Tensor) -> bool:
    """True when triton imports, is not disabled, and ``t`` is on CUDA (or TRITON_INTERPRET=1)."""
    return why_not(t) is None


def status() -> dict[str, str]:
    """Each kernel of :mod:`mahia.kernels` and whether it is active on this machine (and why not)."""
    reason = why_not(None)
    if reason is None:
        state = "active (CUDA)" if torch.cuda.is_available() else "active (TRITON_INTERPRET=1, CPU interpreter)"
    else:
        state = f"inactive: {reason}; the eager PyTorch reference runs"
    return {name: state for name in KERNELS}


def warn_fallback_once(kernel: str, t: torch.Tensor) -> None:
    """Warn (once per process per kernel) that ``kernel`` runs its eager reference, and why."""
    if kernel in _warned or torch.compiler.is_compiling():
        return
    _warned.add(kernel)
    warnings.warn(
        f"mahia.kernels.{kernel}: Triton kernel not used ({why_not(t)}); running the eager PyTorch "
        "reference (same result, slower).",
        RuntimeWarning,
        stacklevel=3,
    )


def reset_fallback_warnings() -> None:
    """Forget which kernels already warned (for tests)."""
    _warned.clear()


# ---------------------------------------------------------------------------------------------------
# Input checks: shared by the eager references (mahia.layers) and the Triton launchers, so both paths
# reject the same bad inputs with the same message.
# ---------------------------------------------------------------------------------------------------

def check_float_tensor(fn: str, name: str, t: object, *, min_dim: int = 1) -> torch.Tensor:
    """Raise TypeError/ValueError unless ``t`` is a floating-point tensor with at least ``min_dim`` dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{fn}: {name} must be a floating-point tensor (float32, float16 or bfloat16), "
                        f"got dtype {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{fn}: {name} must have at least {min_dim} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_same_device(fn: str, **tensors: torch.Tensor) -> None:
    """Raise ValueError naming the tensors if they are not all on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"{fn}: all inputs must be on the same device, got {listing}")


def check_rms_norm_inputs(fn: str, x: torch.Tensor, weight: torch.Tensor,
                          residual: torch.Tensor | None = None, eps: float = 1e-6) -> None:
    """x (..., N), weight (N,), residual like x, eps >= 0."""
    check_float_tensor(fn, "x", x)
    check_float_tensor(fn, "weight", weight)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"{fn}: weight must have shape ({x.shape[-1]},) to match the last dim of x "
                         f"{tuple(x.shape)}, got {tuple(weight.shape)}")
    tensors = {"x": x, "weight": weight}
    if residual is not None:
        check_float_tensor(fn, "residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"{fn}: residual must have the shape of x {tuple(x.shape)}, "
                             f"got {tuple(residual.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"{fn}: residual must have the dtype of x ({x.dtype}), got {residual.dtype}")
        tensors["residual"] = residual
    check_same_device(fn, **tensors)
    if not eps >= 0.0:  # also rejects NaN
        raise ValueError(f"{fn}: eps must be >= 0, got {eps}")


def check_swiglu_inputs(fn: str, a: torch.Tensor, b: torch.Tensor) -> None:
    """a and b: same shape, dtype and device."""
    check_float_tensor(fn, "a", a)
    check_float_tensor(fn, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"{fn}: a and b must have the same shape, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{fn}: a and b must have the same dtype, got a {a.dtype} and b {b.dtype}")
    check_same_device(fn, a=a, b=b)


def check_rope_inputs(fn: str, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """q (B, T, Hq, D), k (B, T, Hkv, D) of one dtype, D even, cos and sin (T, D/2), one device."""
    for name, t in (("q", q), ("k", k)):
        check_float_tensor(fn, name, t)
        if t.dim() != 4:
            raise ValueError(f"{fn}: {name} must be 4-D (B, T, H, D), got shape {tuple(t.shape)}")
    check_float_tensor(fn, "cos", cos)
    check_float_tensor(fn, "sin", sin)
    B, T, _, D = q.shape
    if k.shape[0] != B or k.shape[1] != T or k.shape[3] != D:
        raise ValueError(f"{fn}: k must be (B, T, Hkv, D) = ({B}, {T}, Hkv, {D}) to match q "
                         f"{tuple(q.shape)}, got {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"{fn}: k must have the dtype of q ({q.dtype}), got {k.dtype}")
    if D % 2 != 0:
        raise ValueError(f"{fn}: head dim D must be even, got {D}")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (T, D // 2):
            raise ValueError(f"{fn}: {name} must have shape (T, D/2) = ({T}, {D // 2}), got {tuple(t.shape)}")
    check_same_device(fn, q=q, k=k, cos=cos, sin=sin)


def check_gla_inputs(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     do: torch.Tensor | None = None) -> None:
    """q, k, g (B, H, T, K) and v, do (B, H, T, V); floating point; q, k, v of one dtype; one device."""
    named = {"q": q, "k": k, "v": v, "g": g}
    if do is not None:
        named["do"] = do
    for name, t in named.items():
        check_float_tensor(fn, name, t)
        if t.dim() != 4:
            last = "V" if name in ("v", "do") else "K"
            raise ValueError(f"{fn}: {name} must be 4-D (B, H, T, {last}), got shape {tuple(t.shape)}")
    for name in ("k", "g"):
        if named[name].shape != q.shape:
            raise ValueError(f"{fn}: {name} must have the shape of q {tuple(q.shape)}, "
                             f"got {tuple(named[name].shape)}")
    if v.shape[:3] != q.shape[:3]:
        B, H, T, _ = q.shape
        raise ValueError(f"{fn}: v must be (B, H, T, V) = ({B}, {H}, {T}, V) to match q {tuple(q.shape)}, "
                         f"got {tuple(v.shape)}")
    if do is not None and do.shape != v.shape:
        raise ValueError(f"{fn}: do must have the shape of v {tuple(v.shape)}, got {tuple(do.shape)}")
    for name in ("k", "v"):
        if named[name].dtype != q.dtype:
            raise TypeError(f"{fn}: {name} must have the dtype of q ({q.dtype}), got {named[name].dtype}")
    check_same_device(fn, **named)


def check_moe_combine_inputs(fn: str, out: torch.Tensor, inverse: torch.Tensor, gates: torch.Tensor,
                             dtype: torch.dtype | None = None) -> None:
    """out (N*k, D) and gates (N, k) floating point, inverse (N*k,) int64, one device; dtype None or floating.

    That ``inverse`` is a permutation of 0..N*k-1 is not checked (it would need the values on the host).
    """
    check_float_tensor(fn, "out", out)
    check_float_tensor(fn, "gates", gates)
    if gates.dim() != 2:
        raise ValueError(f"{fn}: gates must be 2-D (N, k), got shape {tuple(gates.shape)}")
    N, k = gates.shape
    if out.dim() != 2 or out.shape[0] != N * k:
        raise ValueError(f"{fn}: out must be (N*k, D) with N*k = {N}*{k} = {N * k} rows (gates is (N, k) = "
                         f"{tuple(gates.shape)}), got shape {tuple(out.shape)}")
    if not isinstance(inverse, torch.Tensor):
        raise TypeError(f"{fn}: inverse must be a torch.Tensor, got {type(inverse).__name__}")
    if inverse.dtype != torch.int64:
        raise TypeError(f"{fn}: inverse must be an int64 tensor (row of out for each assignment n*k + j), "
                        f"got dtype {inverse.dtype}")
    if inverse.dim() != 1 or inverse.shape[0] != N * k:
        raise ValueError(f"{fn}: inverse must have shape (N*k,) = ({N * k},), got {tuple(inverse.shape)}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{fn}: dtype must be None or a floating torch.dtype, got {dtype!r}")
    check_same_device(fn, out=out, inverse=inverse, gates=gates)
