"""Which Triton kernels run, and why not: the one decision every op in :mod:`mahia.ops` asks before it launches.

A kernel runs when ``import triton`` works, ``MAHIA_DISABLE_TRITON`` is not ``1`` and the input lives on
a CUDA device or ``TRITON_INTERPRET=1`` (Triton's CPU interpreter: slow, exact, used by the tests); the
variables are read at each call. Otherwise the public functions run the eager PyTorch reference (the
same function, slower) and say so once per kernel with ``warnings.warn`` (a CPU input without the
interpreter takes it silently). Also sent to the eager path, silently: a floating input that is not
float32/float16/bfloat16 (float64 means reference precision), a non-tensor (the eager path's check names
it) and ``meta`` tensors (shapes only); with the one-time warning: an input the kernel cannot take
(``unsupported=``). Under ``torch.compile`` the decision is frozen into the graph and the warning skipped
(Dynamo cannot trace ``warnings.warn`` without a graph break).
"""

from __future__ import annotations

import os
import warnings

import torch

from mahia.ops._triton import IMPORT_ERROR as _TRITON_IMPORT_ERROR

__all__ = [
    "KERNELS",
    "DISABLE_ENV",
    "triton_import_error",
    "triton_available_for",
    "use_triton",
    "why_not",
    "status",
    "warn_fallback_once",
    "reset_fallback_warnings",
    "KERNEL_DTYPES",
]

# Every public kernel of mahia.ops, by the name status() and the warnings use.
KERNELS: tuple[str, ...] = (
    "rms_norm",
    "add_rms_norm",
    "swiglu",
    "rope",
    "gla",  # gated linear attention scan (ops/gla_scan/)
    "moe_grouped_mm",  # grouped GEMM of the MoE layer (ops/grouped_mm.py)
    "moe_combine",
)  # the MoE layer's un-permute + gated sum (ops/moe_combine.py)
DISABLE_ENV = "MAHIA_DISABLE_TRITON"

# Kernels that already warned about falling back (once per process per kernel).
_warned: set[str] = set()


def triton_import_error() -> str | None:
    """None if ``import triton`` worked, else the error it raised."""
    return _TRITON_IMPORT_ERROR


# Read on every call of every op: CPython's os.environ keeps an encoded dict current (its setters, so
# monkeypatch.setenv, write through) that answers in tens of nanoseconds, os.environ.get in about a microsecond.
_environ = os.environ._data
_DISABLE_KEY, _INTERPRET_KEY, _ONE = (
    os.environ.encodekey(DISABLE_ENV),
    os.environ.encodekey("TRITON_INTERPRET"),
    os.environ.encodevalue("1"),
)


def _disabled_by_env() -> bool:
    return _environ.get(_DISABLE_KEY) == _ONE


def _interpreting() -> bool:
    return _environ.get(_INTERPRET_KEY) == _ONE


def why_not(t: torch.Tensor | None = None) -> str | None:
    """None when Triton kernels can run on ``t`` (or on this machine, if ``t`` is None); else the reason."""
    if _TRITON_IMPORT_ERROR is not None:
        return f"triton is not installed ({_TRITON_IMPORT_ERROR})"
    if _disabled_by_env():
        return f"disabled by {DISABLE_ENV}=1"
    if t is not None and t.device.type == "meta":
        return "input on the meta device (no data: shapes come from the eager path or the fake kernels)"
    on_cuda = t.is_cuda if t is not None else torch.cuda.is_available()
    if not (on_cuda or _interpreting()):
        where = f"input on {t.device}" if t is not None else "no CUDA device"
        return f"{where} and TRITON_INTERPRET is not 1"
    return None


def triton_available_for(t: torch.Tensor) -> bool:
    """True when triton imports, is not disabled, and ``t`` is on CUDA (or TRITON_INTERPRET=1)."""
    return why_not(t) is None


def status() -> dict[str, str]:
    """Each kernel of :mod:`mahia.ops` and whether it is active on this machine (and why not)."""
    reason = why_not(None)
    if reason is None:
        state = "active (CUDA)" if torch.cuda.is_available() else "active (TRITON_INTERPRET=1, CPU interpreter)"
    else:
        state = f"inactive: {reason}; the eager PyTorch reference runs"
    return {name: state for name in KERNELS}


# Floating dtypes the kernels take; any other floating input (float64, float8) runs the eager path.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KERNEL_DTYPES = frozenset(KERNEL_DTYPES)  # one hash per lookup


def use_triton(kernel: str, *tensors: torch.Tensor, unsupported: str | None = None) -> bool:
    """True when ``kernel``'s Triton path should run on these inputs (module docstring); else False,
    warning once where Triton is unavailable for a CUDA input or under the interpreter, or with
    ``unsupported`` (the reason the kernel cannot take these inputs)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.is_meta or (t.dtype not in _KERNEL_DTYPES and t.is_floating_point()):
            return False
    first = tensors[0]
    # the common case in few attribute reads: this runs on every call of every op
    if (
        unsupported is None
        and _TRITON_IMPORT_ERROR is None
        and (first.is_cuda or _interpreting())
        and not _disabled_by_env()
    ):
        return True
    if not triton_available_for(first):
        if first.is_cuda or _interpreting():  # a CPU tensor without the interpreter: no warning box in CPU notebooks
            warn_fallback_once(kernel, first)
        return False
    if unsupported is not None:
        warn_fallback_once(kernel, first, reason=unsupported)
        return False
    return True


def warn_fallback_once(kernel: str, t: torch.Tensor, reason: str | None = None) -> None:
    """Warn (once per process per kernel, and once more for inputs the kernel cannot take) that
    ``kernel`` runs its eager reference, and why (``reason``, default: why Triton is unavailable)."""
    key = kernel if reason is None else f"{kernel} (unsupported input)"
    if key in _warned or torch.compiler.is_compiling():
        return
    _warned.add(key)
    warnings.warn(
        f"mahia.ops.{kernel}: Triton kernel not used ({why_not(t) if reason is None else reason}); running "
        "the eager PyTorch reference (same result, slower).",
        RuntimeWarning,
        stacklevel=4,  # the caller of the public function (warn_fallback_once <- use_triton <- public)
    )


def reset_fallback_warnings() -> None:
    """Forget which kernels already warned (for tests)."""
    _warned.clear()
