"""Launch a compiled Triton kernel without Triton's per-call binder, and enter an autograd.Function
without torch's Python wrapper: the host cost of a small op in an eager model.

``kernel[grid](*args, **meta)`` (Triton's JIT launch) binds every argument, works out its
specialization (dtype, 16-byte alignment of each pointer, ``== 1`` and divisibility by 16 of each
integer), hashes that into a cache key and looks the compiled kernel up before calling its launcher.
Measured on the H100 machine's host (triton 3.6, 2026-11-24): 17.3 us per JIT launch of the RMSNorm
forward against 6.2 us for calling the compiled kernel's launcher directly.

:class:`Launcher` keeps, per key, what the JIT launch compiled and calls its launcher directly on later
calls. The key holds every argument's value, except that a tensor is held by its dtype and its address
modulo 16 (what Triton specializes a pointer on): two calls with one key get the same specialization,
so the same compiled code, that Triton's own launch would pick. The JIT launch still runs the first
time a key is seen (it compiles), under ``TRITON_INTERPRET=1``, while a Triton launch hook is installed
(profilers, :class:`mahia.measure.instruments.count_ops`: hooks see every launch) and on Triton
versions other than 3.x.
"""

from __future__ import annotations

import functools

import torch

from mahia.ops._triton import IMPORT_ERROR, triton

__all__ = ["Launcher", "c_apply", "cdiv", "direct_launch_available", "next_pow2", "pow2_divisor"]

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

    Triton specializes an integer only on divisibility by 16 (and ``== 1``): for a hidden size or row
    stride such as 1000 the compiler can prove neither 16-byte row starts nor a mask constant over a
    vector, and loads one element at a time. The kernels take this value as a constexpr ``ALIGN`` and
    rebuild each such integer as ``n // ALIGN * ALIGN`` (the same value, now a known multiple of ALIGN):
    8 for 1000, enough for 16-byte loads of a bfloat16 row.
    """
    low = n & -n  # the lowest set bit
    return cap if low == 0 or low > cap else low


# triton.cdiv and triton.next_power_of_2 without their host cost: Triton's are constexpr functions, 2.0 us a call
# (timeit, the 2-core CPU, triton 3.9, 2026-12-06), several a launch.
cdiv = lambda a, b: -(-a // b)
next_pow2 = lambda n: 1 << (n - 1).bit_length() if n > 0 else 0


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 for the CPU interpreter: few programs keep it fast)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def c_apply(function: type[torch.autograd.Function]):
    """``function.apply`` without torch's Python wrapper (3.4 of 10 us on the CPU, 2026-12-03), which binds
    default arguments and unwraps functorch's tensors: the kernels cannot launch on those either way."""
    return super(torch.autograd.Function, function).apply


_Tensor = torch.Tensor
_OPTIONS = ("num_warps", "num_stages")
MAX_KEYS = 4096  # per kernel; past it the cache starts again (a process that sees ever new shapes)


def _key(args: tuple) -> list:
    """The arguments as a cache key: a tensor by its dtype and its address modulo 16 (Triton
    specializes a pointer on its dtype and on 16-byte alignment), anything else by its value."""
    return [(a.dtype, a.data_ptr() & 15) if isinstance(a, _Tensor) else a for a in args]


class Launcher:
    """A ``@triton.jit`` kernel, launched directly once compiled for a key.

    ``launcher(grid, *args, num_warps=..., [num_stages=...], **constexprs)``: ``args`` are the kernel's
    runtime arguments in order, the constexprs follow them in the signature (in any order here); ``grid``
    is a tuple of up to three ints.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        # Interpreted kernels (TRITON_INTERPRET=1 at import) are not JITFunctions and never compile.
        jit_function = getattr(getattr(triton, "runtime", None), "JITFunction", None) if _VERSION_OK else None
        self._direct = jit_function is not None and isinstance(kernel, jit_function)
        self._names = tuple(kernel.arg_names) if self._direct else ()
        self._compiled: dict[tuple, tuple | None] = {}  # key -> (run, function, packed, constexpr values)

    def __call__(self, grid: tuple[int, ...], *args, **meta):
        """Launch; returns the direct-launch entry of these arguments' key, (run, function handle, packed
        metadata, constexpr values), or None where launches are JIT launches."""
        key = None
        if self._direct and not _hooks_installed():
            device = current_device()
            key = (
                device,
                *meta,
                *meta.values(),
                *[(a.dtype, a.data_ptr() & 15) if isinstance(a, _Tensor) else a for a in args],
            )
            entry = self._compiled.get(key)
            if entry is not None:
                run, function, packed, tail = entry
                g = (*grid, 1, 1)
                run(g[0], g[1], g[2], _driver[1](device), function, packed, None, None, None, *args, *tail)
                return entry
        compiled = self.kernel[grid](*args, **meta)
        if key is None:
            return None
        if key not in self._compiled:
            if len(self._compiled) >= MAX_KEYS:
                self._compiled.clear()
            constexprs = {k: v for k, v in meta.items() if k not in _OPTIONS}
            self._compiled[key] = _entry(compiled, self._names[len(args) :], constexprs)
        return self._compiled[key]

    def cache_size(self) -> int:
        """How many specializations launch directly (for tests)."""
        return sum(entry is not None for entry in self._compiled.values())


def _entry(compiled, tail: tuple[str, ...], constexprs: dict):
    """(launcher, function handle, packed metadata, constexpr values in signature order) of a compiled
    kernel, or None when it cannot be launched directly (the constexprs must be exactly the parameters
    after the runtime arguments; a Triton without these attributes keeps the JIT launch)."""
    if set(tail) != set(constexprs):
        return None
    try:
        return compiled.run, compiled.function, compiled.packed_metadata, tuple(constexprs[name] for name in tail)
    except AttributeError:
        return None


_driver: list = []  # [get_current_device, get_current_stream] of Triton's active driver, bound on first use


def current_device() -> int:
    """The device Triton's launches use (its driver's current device)."""
    if not _driver:
        active = triton.runtime.driver.active
        _driver.extend([active.get_current_device, active.get_current_stream])
    return _driver[0]()


def current_stream(device: int) -> int:
    """The stream Triton's launches use on ``device`` (call :func:`current_device` first)."""
    return _driver[1](device)
