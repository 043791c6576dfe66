"""``triton`` and ``triton.language``, or stand-ins where triton does not import.

Each op file defines its kernels at module level with ``@triton.jit``. Where triton is missing (a
machine without it, or a broken install) the stand-in ``jit`` returns the function unchanged, so the
op file still imports and its eager reference still runs; :mod:`mahia.ops.dispatch` then never
chooses the kernels. Any other use of the stand-ins raises ImportError with the original reason.
"""

from __future__ import annotations

try:  # importing triton is the expensive part; do it once
    import triton
    import triton.language as tl

    IMPORT_ERROR: str | None = None
except Exception as exc:  # ImportError, or a broken install raising something else
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

    class _Missing:
        """Stands in for triton / triton.language when they do not import."""

        def __init__(self, name: str):
            self._name = name

        def jit(self, fn=None, **_kw):
            return fn if fn is not None else (lambda f: f)

        def __getattr__(self, attr):
            raise ImportError(f"{self._name}.{attr} is not available: {IMPORT_ERROR}")

    triton = _Missing("triton")
    tl = _Missing("triton.language")

__all__ = ["triton", "tl", "IMPORT_ERROR"]
