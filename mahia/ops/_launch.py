"""Launch a compiled Triton kernel without Triton's per-call binder.

``kernel[grid](*args, **meta)`` (Triton's JIT launch) binds every argument, works out its
specialization (dtype, 16-byte alignment of each pointer, ``== 1`` and divisibility by 16 of each
integer), hashes that into a cache key, looks the compiled kernel up and only then calls its launcher.
Measured on the H100 machine's host (triton 3.6, ``tools/probes/host_cost.py`` of 2252f96, 2026-11-24): 17.3 us
per JIT launch of the RMSNorm forward against 6.2 us for calling the compiled kernel's launcher
directly. A 0.02 ms kernel cannot hide the difference in an eager model.

:class:`Launcher` keeps, per specialization key, what the JIT launch compiled and calls its launcher
directly on later calls. The key holds every argument's value, except that a tensor is held by its
dtype and its address modulo 16 (what Triton specializes a pointer on), so two calls with one key get
the same specialization, and so the same compiled code, that Triton's own launch would pick.

The ordinary JIT launch still runs:

* the first time a key is seen (it compiles, and returns the compiled kernel this class keeps);
* under ``TRITON_INTERPRET=1`` (no compiled kernel; the interpreter runs the Python);
* while a Triton launch hook is installed (profilers, :class:`mahia.measure.instruments.count_ops`),
  so hooks see every launch;
* on Triton versions other than 3.x, whose launcher may take other arguments.
"""

from __future__ import annotations

import torch

from mahia.ops._triton import IMPORT_ERROR, triton

__all__ = ["Launcher", "direct_launch_available", "pow2_divisor"]

if IMPORT_ERROR is None:
    _VERSION_OK = triton.__version__.split(".")[0] == "3"
    _runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
else:  # the op files import without triton; no kernel is ever launched then
    _VERSION_OK, _runtime = False, None


def _hooks_installed() -> bool:
    """True when a Triton launch hook would see launches (a HookChain with calls, or a plain hook)."""
    if _runtime is None:  # triton < 3.4 kept the hooks on CompiledKernel
        hook = getattr(getattr(triton.compiler, "CompiledKernel", None), "launch_enter_hook", None)
    else:
        hook = _runtime.launch_enter_hook
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


def direct_launch_available() -> bool:
    """Whether compiled kernels can be launched directly in this process (else every launch is a JIT
    launch): triton imports, is a 3.x release, and kernels compile (not TRITON_INTERPRET=1)."""
    return _VERSION_OK and not getattr(_runtime, "interpret", False)


def pow2_divisor(n: int, cap: int = 16) -> int:
    """The largest power of two, at most ``cap``, that divides ``n`` (``cap`` for 0). Give it the bitwise
    OR of several integers for the largest power of two that divides them all.

    Triton specializes an integer argument only on divisibility by 16 (and on ``== 1``). A hidden size
    or row stride such as 1000 gets no hint at all, so the compiler can prove neither that a row starts
    on a 16-byte boundary nor that a mask ``cols < n_cols`` is constant over a vector, and it loads one
    element at a time. The kernels take this value as a constexpr ``ALIGN`` and rebuild each such
    integer as ``n // ALIGN * ALIGN`` (the same value, now known to be a multiple of ALIGN): 8 for
    1000, enough for 16-byte loads of a bfloat16 row. Where everything is a multiple of 16, ALIGN is
    16 and the kernel is the one Triton's own specialization gives.
    """
    low = n & -n  # the lowest set bit
    return cap if low == 0 or low > cap else low


_Tensor = torch.Tensor
MAX_KEYS = 4096  # per kernel; past it the cache starts again (a process that sees ever new shapes)


def _key(args: tuple) -> list:
    """The arguments as a cache key: a tensor by its dtype and its address modulo 16 (Triton
    specializes a pointer on its dtype and on 16-byte alignment), anything else by its value. Calls
    with one key get one specialization from Triton, so they can share its compiled kernel."""
    return [(a.dtype, a.data_ptr() & 15) if isinstance(a, _Tensor) else a for a in args]


class Launcher:
    """A ``@triton.jit`` kernel, launched directly once compiled for a key.

    ``launch(grid, *args, num_warps=..., num_stages=None, **constexprs)``: ``args`` are the kernel's
    runtime arguments in order, ``constexprs`` its constexpr parameters (which follow them in the
    signature, in any order here). ``grid`` is a tuple of up to three ints.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        # Interpreted kernels (TRITON_INTERPRET=1 at import) are not JITFunctions and never compile.
        jit_function = getattr(getattr(triton, "runtime", None), "JITFunction", None) if _VERSION_OK else None
        self._direct = jit_function is not None and isinstance(kernel, jit_function)
        self._names = tuple(kernel.arg_names) if self._direct else ()
        self._compiled: dict[tuple, tuple | None] = {}  # key -> (run, function, packed, constexpr names)

    def __call__(self, grid: tuple[int, ...], *args, num_warps: int, num_stages: int | None = None, **constexprs):
        key = None
        if self._direct and not _hooks_installed():
            device = _current_device()
            key = (device, num_warps, num_stages, *constexprs.items(), *_key(args))
            entry = self._compiled.get(key)
            if entry is not None:
                run, function, packed, tail = entry
                g = (*grid, 1, 1)
                run(g[0], g[1], g[2], _stream(device), function, packed, None, None, None, *args, *tail)
                return
        options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
        compiled = self.kernel[grid](*args, **options, **constexprs)
        if key is not None and key not in self._compiled:
            if len(self._compiled) >= MAX_KEYS:
                self._compiled.clear()
            self._compiled[key] = _entry(compiled, self._names[len(args) :], constexprs)

    def cache_size(self) -> int:
        """How many specializations launch directly (for tests)."""
        return sum(entry is not None for entry in self._compiled.values())


def _entry(compiled, tail: tuple[str, ...], constexprs: dict):
    """(launcher, function handle, packed metadata, constexpr values in signature order) of a compiled
    kernel, or None when it cannot be launched directly (the constexprs must be exactly the parameters
    after the runtime arguments; a Triton without these attributes keeps the JIT launch). The
    constexpr values are part of the key, so they are fixed per entry."""
    if set(tail) != set(constexprs):
        return None
    try:
        return compiled.run, compiled.function, compiled.packed_metadata, tuple(constexprs[name] for name in tail)
    except AttributeError:
        return None


_driver_calls: list = []  # [get_current_device, get_current_stream], bound on first use


def _driver():
    if not _driver_calls:
        active = triton.runtime.driver.active
        _driver_calls.extend([active.get_current_device, active.get_current_stream])
    return _driver_calls


def _current_device() -> int:
    return _driver()[0]()


def _stream(device: int) -> int:
    return _driver()[1](device)
