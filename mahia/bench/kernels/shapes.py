"""The kernel sweep's shapes, parts, byte counts, variants, inputs and eager timing."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from mahia import ops
from mahia.layers.rope import RotaryCache
from mahia.measure.timing import Timing, synchronize
from mahia.ops.moe_combine import moe_combine_eager
from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager
from mahia.ops.rope import apply_rope_eager
from mahia.ops.swiglu import swiglu_eager

EPS = 1e-6
MB = 1e6
ROLE = {
    "eager": "baseline",
    "F.rms_norm": "peer",
    "torch.compile": "peer",
    "liger": "peer",
    "mahia_triton": "optimized",
}
# The variants a user could call instead of mahia: every best-peer key and sentence takes the fastest of these.
# Eager is the baseline the speedups divide by, and a peer too: where plain PyTorch is fastest, mahia is behind.
PEER_ROLES = ("baseline", "peer")
KERNELS = ("rmsnorm", "add_rmsnorm", "swiglu", "rope", "moe_combine")
PASSES = ("fwd", "fwdbwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OP = {
    "rmsnorm": "rms_norm",
    "add_rmsnorm": "add_rms_norm",
    "swiglu": "swiglu",
    "rope": "rope",
    "moe_combine": "moe_combine",
}

# ------------------------------------------------------------------------------------------- the sweep

ROWS = (91, 1024, 4096, 16384)
_ROPE_TOKENS = ((1, 91), (1, 1024), (2, 2048), (8, 2048))  # (B, T): B*T = ROWS
_ROPE_HEADS = ((12, 12, 64), (28, 4, 128), (32, 8, 128), (40, 40, 128), (64, 8, 128))  # (Hq, Hkv, D)
_HIDDEN = {
    "rmsnorm": (1000, 2048, 4096, 5120, 8192),
    "add_rmsnorm": (1000, 2048, 4096, 5120, 8192),
    "swiglu": (1000, 2048, 4096, 11008, 14336),
    "moe_combine": (1000, 1024, 2048, 4096, 7168),
}
MOE_K = 2


def _grid(kernel: str, quick: bool) -> list[tuple[int, ...]]:
    """The sweep of ``kernel``; ``quick``: two tiny shapes (one odd-sized, one a little larger)."""
    if quick:
        return {"rope": [(1, 3, 3, 1, 32), (1, 8, 4, 2, 64)], "moe_combine": [(5, MOE_K, 100), (16, MOE_K, 256)]}.get(
            kernel, [(5, 100), (16, 256)]
        )
    if kernel == "rope":
        return [(B, T, Hq, Hkv, D) for B, T in _ROPE_TOKENS for Hq, Hkv, D in _ROPE_HEADS]
    if kernel == "moe_combine":
        return [(n, MOE_K, d) for n in ROWS for d in _HIDDEN[kernel]]
    return [(m, n) for m in ROWS for n in _HIDDEN[kernel]]


GRID: dict[str, list[tuple[int, ...]]] = {k: _grid(k, quick=False) for k in KERNELS}
HEADLINE = {"rmsnorm": (16384, 4096), "swiglu": (16384, 11008), "rope": (8, 2048, 32, 8, 128)}
HOST_SHAPE = {
    "rmsnorm": (4, 64),
    "add_rmsnorm": (4, 64),
    "swiglu": (4, 64),
    "rope": (1, 4, 2, 1, 64),
    "moe_combine": (4, MOE_K, 64),
}

# Per-timing budgets (ms). Short on purpose: the sweep has ~2000 timings; medians of >= 5 samples.
DEVICE_BUDGET = {"warmup_ms": 10.0, "rep_ms": 25.0, "max_reps": 200}
# Eager time is host-bound at small shapes, and the H100 machine's host is noisy (20-40% between samples):
# longer samples and more of them than for the device time.
EAGER_BUDGET = {"warmup_ms": 10.0, "rep_ms": 50.0, "sample_ms": 4.0}
QUICK_BUDGET = {"warmup_ms": 1.0, "rep_ms": 3.0, "max_reps": 5, "min_calls": 1, "min_samples": 3}
COPY_MIN_BYTES = 8 * MB  # copy_same_bytes at shapes of at least this input size (CUDA)


@dataclass(frozen=True)
class Part:
    name: str
    kernel: str | None  # None: the host-cost rows of every kernel
    dtype: torch.dtype | None


PARTS: list[Part] = [Part("host", None, None)] + [
    Part(f"{k}-{short}", k, dt) for short, dt in DTYPES.items() for k in KERNELS
]
# Wall time of each part on an H100 (minutes), printed by --part list: the span of its records' timestamps in the
# b34185d sweep (2026-11-27, torch 2.11, triton 3.6, Liger 0.8.5, `python -m mahia reference --bench kernels`, six
# 10-minute commands). Four parts were split between two commands, so their span holds a restart: swiglu-bf16,
# rmsnorm-fp16 and rope-fp16 take the other 16-bit dtype's time (same bytes, same kernels); add_rmsnorm-fp32 and
# rope-fp32 the time their second command alone spent on them (220 s and 136 s), a floor.
# Each command adds ~0.4 min: imports, the ceilings of a fresh results folder, the figures.
EST_MIN_H100: dict[str, float] = {
    "host": 0.4,
    "rmsnorm-bf16": 2.6,
    "add_rmsnorm-bf16": 2.8,
    "swiglu-bf16": 2.7,  # = swiglu-fp16
    "rope-bf16": 2.75,
    "moe_combine-bf16": 2.0,
    "rmsnorm-fp16": 2.6,  # = rmsnorm-bf16
    "add_rmsnorm-fp16": 3.6,
    "swiglu-fp16": 2.7,
    "rope-fp16": 2.75,  # = rope-bf16
    "moe_combine-fp16": 2.5,
    "rmsnorm-fp32": 3.8,
    "add_rmsnorm-fp32": 3.7,  # at least
    "swiglu-fp32": 3.4,
    "rope-fp32": 2.3,  # at least
    "moe_combine-fp32": 2.7,
}


def select_parts(spec: Iterable[str] | str | None) -> list[Part]:
    """Parts named by ``spec`` (names, kernels, dtypes as bf16/fp16/fp32, or 'all'; a string may hold
    several, comma-separated), in the order of :data:`PARTS`. None or empty: all."""
    if spec is None:
        return list(PARTS)
    tokens = [t.strip() for s in ([spec] if isinstance(spec, str) else spec) for t in str(s).split(",")]
    tokens = [t for t in tokens if t]
    if not tokens or "all" in tokens:
        return list(PARTS)
    chosen = set()
    for t in tokens:
        hit = {p.name for p in PARTS if t == p.name or t == p.kernel or (t in DTYPES and p.dtype == DTYPES[t])}
        if not hit:
            raise ValueError(
                f"kernels: unknown part {t!r}; parts are {', '.join(p.name for p in PARTS)} "
                f"(or a kernel {', '.join(KERNELS)}, a dtype {', '.join(DTYPES)}, or all)"
            )
        chosen |= hit
    return [p for p in PARTS if p.name in chosen]


def parse_args(argv: Sequence[str] | None = None) -> dict:
    """The suite's own options, for ``python -m mahia.bench kernels ...`` to pass on to :func:`run`:
    ``--part P`` (repeatable, or comma-separated; 'list' prints the plan and measures nothing) and
    ``--fresh`` (measure again what this commit already recorded). Returns ``run``'s keyword arguments."""
    p = argparse.ArgumentParser(prog="python -m mahia.bench kernels", add_help=False)
    p.add_argument(
        "--part",
        action="append",
        default=None,
        help="parts to run: " + ", ".join(q.name for q in PARTS) + "; a kernel, a dtype, all, list",
    )
    p.add_argument("--fresh", action="store_true", help="do not skip what this commit already recorded")
    args = p.parse_args(list(argv or []))
    return {"parts": args.part, "resume": not args.fresh}


# ------------------------------------------------------------------------------------------- bytes


def _es(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _base_experiment(experiment: str) -> str:
    """'rmsnorm_fwdbwd_eager' / 'rmsnorm_host_fwdbwd' / 'rmsnorm_fwd_sweep' -> the byte-count experiment."""
    e = experiment.replace("_host_", "_")
    return e.removesuffix("_eager").removesuffix("_sweep")


def timing_mode(experiment: str) -> str:
    """'eager' for ``*_eager`` and ``*_host_*`` experiments (per-call time of back-to-back eager calls),
    else 'device' (CUDA-graph replay on a GPU)."""
    return "eager" if experiment.endswith("_eager") or "_host_" in experiment else "device"


def _kernel_of(experiment: str) -> str:
    for k in sorted(KERNELS, key=len, reverse=True):  # add_rmsnorm before rmsnorm
        if experiment.startswith(k + "_"):
            return k
    raise ValueError(f"no kernel of this benchmark makes experiment {experiment!r}")


def min_bytes(experiment: str, shape, dtype: torch.dtype) -> int:
    """The fewest bytes of ``experiment`` (table in the module docstring); shape (M, N) for RMSNorm,
    add + RMSNorm and SwiGLU, (B, T, Hq, Hkv, D) for RoPE, (N, k, D) for the MoE combine (float32 gates,
    int64 index). Timing-mode suffixes (``_eager``, ``_host_``) and ``_sweep`` are ignored."""
    exp = _base_experiment(experiment)
    es = _es(dtype)
    if exp.startswith("moe_combine"):
        N, k, D = shape
        fwd = (N * k * D + N * D) * es + N * k * (4 + 8)
        if exp == "moe_combine_fwd":
            return fwd
        if exp == "moe_combine_fwdbwd":
            return 2 * fwd + N * k * D * es + N * k * 4  # + d_out, d_gates
    elif exp.startswith("rope"):
        B, T, Hq, Hkv, D = shape
        one = 2 * B * T * (Hq + Hkv) * D * es + T * D * 4  # read + write q, k; cos/sin tables float32
        if exp == "rope_fwd":
            return one
        if exp == "rope_fwdbwd":
            return 2 * one
    else:
        M, N = shape
        per_element = {
            "rmsnorm_fwd": 2,
            "rmsnorm_fwdbwd": 5,
            "add_rmsnorm_fwd": 4,
            "add_rmsnorm_fwdbwd": 8,
            "swiglu_fwd": 3,
            "swiglu_fwdbwd": 8,
        }
        weight = {"rmsnorm_fwd": N, "rmsnorm_fwdbwd": 3 * N, "add_rmsnorm_fwd": N, "add_rmsnorm_fwdbwd": 3 * N}
        if exp in per_element:
            return (per_element[exp] * M * N + weight.get(exp, 0)) * es
    raise ValueError(f"min_bytes: unknown experiment {experiment!r}")


def input_bytes(experiment_or_kernel: str, shape, dtype: torch.dtype) -> int:
    """The size of a shape: bytes of x (RMSNorm, add + RMSNorm), a (SwiGLU), q and k (RoPE), out (MoE)."""
    k = experiment_or_kernel if experiment_or_kernel in KERNELS else _kernel_of(experiment_or_kernel)
    n = math.prod(shape)
    if k == "rope":
        B, T, Hq, Hkv, D = shape
        n = B * T * (Hq + Hkv) * D
    return n * _es(dtype)


# ------------------------------------------------------------------------------------------- peers


@dataclass
class Variant:
    name: str
    fn: Callable
    # Converts mahia's inputs to the variant's (done once, outside the timed region).
    adapt: Callable[[tuple], tuple] = lambda inputs: inputs
    notes: str = ""


def _liger_ops():
    """Liger-Kernel's autograd functions, or None when it does not import (the reason is printed).
    ``add_rms_norm`` is None when this Liger has no fused add + RMSNorm."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception as exc:  # not installed, or built for another torch/triton
        print(f"  liger: skipped ({type(exc).__name__}: {exc})")
        return None
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except Exception:  # older Liger
        LigerFusedAddRMSNormFunction = None
    return SimpleNamespace(
        rms_norm=LigerRMSNormFunction,
        swiglu=LigerSiLUMulFunction,
        rope=LigerRopeFunction,
        add_rms_norm=LigerFusedAddRMSNormFunction,
    )


def _liger_rope(rope_fn):
    # Liger takes q (B, H, T, D) (a transposed view of (B, T, H, D) memory, which it rotates in place)
    # and cos/sin (T, D) with the D/2 angles repeated: cat(cos, cos).
    def fn(q, k, cos2, sin2):
        qr, kr = rope_fn.apply(q.transpose(1, 2), k.transpose(1, 2), cos2, sin2)
        return qr.transpose(1, 2), kr.transpose(1, 2)

    def adapt(inputs):
        q, k, cos, sin = inputs
        return q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    return fn, adapt


def _f_rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _f_add_rms_norm(x, r, w):
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, EPS), h


def _variants(
    op: str, eager: Callable, mahia: Callable, dev: torch.device, liger, *, with_compile: bool | None = None
) -> list[Variant]:
    """The variants of ``op`` ('rms_norm', 'add_rms_norm', 'swiglu', 'rope', 'moe_combine') on ``dev``.
    ``with_compile`` (default: on CUDA) adds torch.compile of ``eager``: build the list afresh for each shape
    (after ``torch._dynamo.reset()``) to compile per shape."""
    out = [Variant("eager", eager)]
    if op == "rms_norm" and hasattr(F, "rms_norm"):  # torch >= 2.4
        out.append(Variant("F.rms_norm", _f_rms_norm))
    if op == "add_rms_norm" and hasattr(F, "rms_norm"):
        out.append(Variant("F.rms_norm", _f_add_rms_norm, notes="h = x + r, then F.rms_norm(h)"))
    if with_compile if with_compile is not None else dev.type == "cuda":
        out.append(
            Variant(
                "torch.compile",
                torch.compile(eager, dynamic=False),
                notes="default mode, static shapes, compiled for this shape",
            )
        )
    if dev.type == "cuda" and liger is not None:
        if op == "rms_norm":
            out.append(
                Variant(
                    "liger",
                    lambda x, w: liger.rms_norm.apply(x, w, EPS),
                    notes="casting_mode=llama, in_place=True (defaults)",
                )
            )
        elif op == "add_rms_norm" and getattr(liger, "add_rms_norm", None) is not None:
            out.append(
                Variant(
                    "liger",
                    lambda x, r, w: liger.add_rms_norm.apply(x, r, w, EPS),
                    notes="LigerFusedAddRMSNormFunction, casting_mode=llama (defaults)",
                )
            )
        elif op == "swiglu":
            out.append(Variant("liger", liger.swiglu.apply, notes="backward overwrites a, b (default)"))
        elif op == "rope":
            fn, adapt = _liger_rope(liger.rope)
            out.append(Variant("liger", fn, adapt, notes="rotates q, k in place; cos/sin (T, D)"))
    if ops.triton_available_for(torch.empty(0, device=dev)):
        notes = "" if dev.type == "cuda" else "TRITON_INTERPRET=1: CPU interpreter, not a performance figure"
        out.append(Variant("mahia_triton", mahia, notes=notes))
    return out


# ------------------------------------------------------------------------------------------- inputs

_REFERENCE = {
    "rmsnorm": rms_norm_eager,
    "add_rmsnorm": add_rms_norm_eager,
    "swiglu": swiglu_eager,
    "rope": apply_rope_eager,
    "moe_combine": moe_combine_eager,
}
_MAHIA = {
    "rmsnorm": ops.rms_norm,
    "add_rmsnorm": ops.add_rms_norm,
    "swiglu": ops.swiglu,
    "rope": ops.rope,
    "moe_combine": ops.moe_combine,
}
GRAD_INPUTS = {"rmsnorm": [0, 1], "add_rmsnorm": [0, 1, 2], "swiglu": [0, 1], "rope": [0, 1], "moe_combine": [0, 2]}


def _randn(*shape, dev, dtype, scale=1.0, shift=0.0):
    return torch.randn(*shape, device=dev, dtype=dtype) * scale + shift


def make_inputs(kernel: str, shape, dtype: torch.dtype, dev) -> tuple:
    """Fresh random inputs of ``kernel`` at ``shape``: weights near 1 (as after init: keeps the in-place
    peers' iterated gradients bounded), float32 RoPE tables and MoE gates, an int64 permutation."""
    dev = torch.device(dev)
    if kernel in ("rmsnorm", "add_rmsnorm"):
        M, N = shape
        x = _randn(M, N, dev=dev, dtype=dtype)
        w = _randn(N, dev=dev, dtype=dtype, scale=0.1, shift=1.0)
        return (x, w) if kernel == "rmsnorm" else (x, _randn(M, N, dev=dev, dtype=dtype), w)
    if kernel == "swiglu":
        M, N = shape
        return _randn(M, N, dev=dev, dtype=dtype), _randn(M, N, dev=dev, dtype=dtype)
    if kernel == "rope":
        B, T, Hq, Hkv, D = shape
        cos, sin = RotaryCache(D, T, device=dev).get(T)
        return _randn(B, T, Hq, D, dev=dev, dtype=dtype), _randn(B, T, Hkv, D, dev=dev, dtype=dtype), cos, sin
    if kernel == "moe_combine":
        N, k, D = shape
        inverse = torch.randperm(N * k, device=dev)  # where each (token, slot) sits in expert order
        gates = torch.rand(N, k, device=dev).softmax(-1)  # float32, as the router makes them
        return _randn(N * k, D, dev=dev, dtype=dtype), inverse, gates
    raise ValueError(f"unknown kernel {kernel!r}; known: {KERNELS}")


# ------------------------------------------------------------------------------------------- timing


def _pcts(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return statistics.median(xs), q[1], q[7]


def _calls(fn: Callable[[], object], n: int, dev: torch.device) -> float:
    """ms per call of ``n`` calls back to back, then one synchronize (from an idle device)."""
    synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    synchronize(dev)
    return (time.perf_counter() - t0) * 1e3 / n


def eager_bench(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 10.0,
    rep_ms: float = 25.0,
    sample_ms: float = 2.0,
    min_calls: int = 5,
    max_calls: int = 2000,
    min_samples: int = 5,
    max_samples: int = 200,
    info: dict | None = None,
) -> Timing:
    """The per-call time an eager program sees: ``fn`` called N times back to back from Python, then one
    synchronize; a sample is total / N. N is chosen so that a sample lasts ``sample_ms`` (at least
    ``min_calls``), which amortizes the first launch and the final synchronize; samples repeat within
    ``rep_ms`` (at least ``min_samples``) for the median and the 20-80 percentile spread.

    When the device is the slower side this is the device time plus the gaps between kernels; when the
    host is, it is the host's time per call (Python, dispatch, autograd, launches). Nothing is flushed
    between calls: inputs small enough stay in L2, as they would for back-to-back calls on the same data.

    ``info``, when given, receives ``calls`` (N) and ``samples``. One step of
    :func:`eager_bench_interleaved`, which times several side by side.
    """
    infos: dict = {}
    timing = eager_bench_interleaved(
        {"fn": fn},
        device=device,
        warmup_ms=warmup_ms,
        rep_ms=rep_ms,
        sample_ms=sample_ms,
        min_calls=min_calls,
        max_calls=max_calls,
        min_samples=min_samples,
        max_samples=max_samples,
        info=infos,
    )["fn"]
    if info is not None:
        info.update(infos["fn"])
    return timing


def eager_bench_interleaved(
    steps: dict[str, Callable[[], object]],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 10.0,
    rep_ms: float = 25.0,
    sample_ms: float = 2.0,
    min_calls: int = 5,
    max_calls: int = 2000,
    min_samples: int = 5,
    max_samples: int = 200,
    info: dict | None = None,
) -> dict[str, Timing]:
    """:func:`eager_bench` of several steps at once, their samples interleaved: each round takes one sample
    of every step, in the given order on even rounds and in reverse on odd ones. A host whose speed drifts
    (clock, other tenants; 20-40% between samples on the H100 machine) then slows every step alike, and
    the ratio of two steps' medians is measured within one window rather than seconds apart.

    Each step gets its own N (calls per sample, about ``sample_ms`` each) and the same number of samples:
    as many rounds as ``rep_ms`` per step allows, at least ``min_samples``. ``info``, when given, receives
    ``{name: {"calls": N, "samples": rounds}}``.
    """
    if not steps:
        raise ValueError("eager_bench_interleaved: needs at least one step")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    first: dict[str, float] = {}
    n_calls: dict[str, int] = {}
    longest = 0.0  # ms of the longest sample
    for name, fn in steps.items():
        synchronize(dev)
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        first[name] = (time.perf_counter() - t0) * 1e3
        est = max(_calls(fn, 1 if first[name] > warmup_ms else 3, dev), 1e-4)
        if warmup_ms > 3 * est:
            est = max(_calls(fn, max(1, int(warmup_ms / est)), dev), 1e-4)
        n_calls[name] = int(min(max_calls, max(min_calls, math.ceil(sample_ms / est))))
        longest = max(longest, n_calls[name] * est)
    rounds = int(min(max_samples, max(min_samples, rep_ms // longest)))
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(_calls(steps[name], n_calls[name], dev))
    if info is not None:
        info.update({name: {"calls": n_calls[name], "samples": rounds} for name in steps})
    out = {}
    for name in steps:
        med, p20, p80 = _pcts(times[name])
        out[name] = Timing(med, p20, p80, rounds, first[name], None, dev.type)
    return out


def _shape_str(shape) -> str:
    return "x".join(str(int(s)) for s in shape)
