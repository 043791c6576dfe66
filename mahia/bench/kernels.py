"""Kernel benchmark: RMSNorm, add + RMSNorm, SwiGLU, RoPE and the MoE combine (``python -m mahia.bench kernels``).

Each kernel, forward and forward + backward, at the cases of :data:`GRID`, beside the calls a user could make
instead. Every variant is checked against a float64 run of the eager reference before it is timed; a wrong one
is not timed, the others go on, and the suite ends with a ``CorrectnessError`` naming it.

    eager          the readable reference of mahia.ops (``*_eager``)    role "baseline" (and a peer)
    F.rms_norm     PyTorch's own RMSNorm                                role "peer"
    torch.compile  Inductor's fusion of the eager reference (CUDA)      role "peer"
    liger          Liger-Kernel, where installed (CUDA)                 role "peer"
    mahia_triton   mahia.ops                                            role "optimized"

Two timings of every step (:func:`mahia.measure.timing.bench`), in two experiments so a ratio never mixes them:

    <kernel>_<pass>          device time: a CUDA-graph replay after an L2 flush (the kernels alone)
    <kernel>_<pass>_eager    calls back to back, no flush, per-call time (:func:`eager_bench`): what an eager
                             model sees, device time plus the gaps, or the host's time where it is slower
    <kernel>_host_<pass>     eager time on a tiny tensor, inputs requiring grad: Python + dispatch + autograd
                             + launch (part ``host``; ``rmsnorm_host_*_vs_native`` = F.rms_norm's / mahia's)

Bytes are the fewest a kernel must move (:func:`min_bytes`: each input read once, each output written once):

    rmsnorm_fwd          read x, write y                                     2 MN + N elements
    rmsnorm_fwdbwd       + read x, dy; write dx; read w, write dw            5 MN + 3 N
    add_rmsnorm_fwd      read x, r; write y, h; read w                       4 MN + N
    add_rmsnorm_fwdbwd   + read dy, dh, h; write dx (= dr); read w, write dw  8 MN + 3 N
    swiglu_fwd           read a, b; write c                                  3 n
    swiglu_fwdbwd        + read dc, a, b; write da, db                       8 n
    rope_fwd             read q, k; write q, k; cos/sin once                 2 (|q| + |k|) + T D float32
    rope_fwdbwd          the same twice                                      4 (|q| + |k|) + 2 T D float32
    moe_combine_fwd      read out (N k, D), write y (N, D); gates, index     N k D + N D + 12 N k bytes
    moe_combine_fwdbwd   + read dy, out; write d_out, d_gates                3 N k D + 2 N D + 28 N k bytes

On CUDA, at inputs of at least 64 MB, a ``copy_`` of the same bytes is timed too (``copy_same_bytes``): the
honest ceiling at that size, which the ``*_frac_of_copy`` keys divide by.

``--part`` (repeatable or comma-separated) picks ``host`` and kernels; ``--part list`` prints the plan.
``--quick`` (and the CPU): two tiny float32 shapes per kernel, no compile, Liger or copy: a smoke test.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from mahia import ops
from mahia.layers.rope import RotaryCache
from mahia.measure import files, summary
from mahia.measure.checks import CorrectnessError, compare_fn, tolerance
from mahia.measure.timing import Timing, bench

EPS = 1e-6
MB = 1e6
KERNELS = ("rmsnorm", "add_rmsnorm", "swiglu", "rope", "moe_combine")
PASSES = ("fwd", "fwdbwd")
PARTS = ("host", *KERNELS)
ROLE = {
    "eager": "baseline",
    "F.rms_norm": "peer",
    "torch.compile": "peer",
    "liger": "peer",
    "mahia_triton": "optimized",
}
# The calls a user could make instead of mahia: every best-peer key takes the fastest of these roles. Eager is
# the baseline the speedups divide by, and a peer too: where plain PyTorch is fastest, mahia is behind.
PEER_ROLES = ("baseline", "peer")
_OPS = dict(zip(KERNELS, ("rms_norm", "add_rms_norm", "swiglu", "rope", "moe_combine")))
MAHIA = {k: getattr(ops, n) for k, n in _OPS.items()}
EAGER = {k: getattr(ops, "apply_rope_eager" if n == "rope" else f"{n}_eager") for k, n in _OPS.items()}  # references
GRAD_INPUTS = {"rmsnorm": [0, 1], "add_rmsnorm": [0, 1, 2], "swiglu": [0, 1], "rope": [0, 1], "moe_combine": [0, 2]}

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# The GPU cases, (shape, dtype): shapes (M, N) for the norms and SwiGLU, (B, T, Hq, Hkv, D) for RoPE, (N, k, D)
# for the MoE combine. They are every shape and dtype at which a summary key took its value in the H100 sweeps of
# b34185d (2026-11-27, data/results/nvidia-h100-80gb-hbm3/) and of 77c878d (the folder as committed at b34185d),
# the runner-up of each worst-case key at b34185d, and the model's shapes of add + RMSNorm and the MoE combine.
# Dropped from b34185d's grid (rows 91, 1024, 4096, 16384 x five hidden sizes per kernel; RoPE's four token counts
# x five head layouts; every kernel in bf16, fp16 and fp32: 300 shapes, 5,488 records, ~43 min on an H100): the
# 274 other cases, none of which set a key in either sweep, and with them the figures over input size.
GRID: dict[str, list[tuple[tuple[int, ...], torch.dtype]]] = {
    "rmsnorm": [
        ((16384, 4096), BF16),  # the headline shape; rmsnorm_fwdbwd_frac_of_copy
        ((16384, 5120), BF16),  # rmsnorm_fwd_worst_frac_of_copy (b34185d)
        ((4096, 8192), FP32),  # its runner-up
        ((16384, 4096), FP16),  # rmsnorm_fwd_worst_frac_of_copy (77c878d)
        ((16384, 2048), FP16),  # rmsnorm_fwdbwd_eager_worst_vs_best_peer (b34185d)
        ((4096, 1000), FP32),  # its runner-up
        ((4096, 5120), FP16),  # rmsnorm_fwdbwd_eager_worst_vs_best_peer (77c878d)
        ((1024, 5120), BF16),  # rmsnorm_device_worst_vs_best_peer (b34185d)
        ((1024, 2048), FP32),  # its runner-up
        ((4096, 1000), BF16),  # rmsnorm_device_worst_vs_best_peer (77c878d)
    ],
    "add_rmsnorm": [((16384, 4096), BF16), ((1024, 5120), BF16)],
    "swiglu": [
        ((16384, 11008), BF16),  # the headline shape
        ((4096, 4096), FP32),  # swiglu_fwdbwd_eager_worst_vs_best_peer (b34185d)
        ((4096, 2048), FP32),  # its runner-up
        ((16384, 11008), FP32),  # swiglu_fwdbwd_eager_worst_vs_best_peer (77c878d)
        ((1024, 4096), FP16),  # swiglu_device_worst_vs_best_peer (b34185d)
        ((1024, 4096), BF16),  # its runner-up, and the key at 77c878d
    ],
    "rope": [
        ((8, 2048, 32, 8, 128), BF16),  # the headline shape
        ((8, 2048, 64, 8, 128), FP32),  # rope_fwdbwd_eager_worst_vs_best_peer (b34185d)
        ((8, 2048, 40, 40, 128), FP32),  # its runner-up
        ((2, 2048, 12, 12, 64), FP32),  # rope_fwdbwd_eager_worst_vs_best_peer (77c878d)
        ((2, 2048, 12, 12, 64), FP16),  # rope_device_worst_vs_best_peer (b34185d)
        ((2, 2048, 12, 12, 64), BF16),  # its runner-up, and the key at 77c878d
    ],
    "moe_combine": [((16384, 2, 1024), BF16), ((4096, 2, 7168), BF16)],  # the MoE suite's layer; DeepSeek-V3's D
}
QUICK_GRID = {"rope": [(1, 3, 3, 1, 32), (1, 8, 4, 2, 64)], "moe_combine": [(5, 2, 100), (16, 2, 256)]}
HEADLINE = {"rmsnorm": (16384, 4096), "swiglu": (16384, 11008), "rope": (8, 2048, 32, 8, 128)}
HOST_SHAPE = dict(zip(KERNELS, [(4, 64), (4, 64), (4, 64), (1, 4, 2, 1, 64), (4, 2, 64)]))  # the host part's
# Budgets (ms). Eager time is host-bound at small shapes and the H100 machine's host is noisy (20-40% between
# samples): it gets the longer budget.
DEVICE_BUDGET = {"warmup_ms": 10.0, "rep_ms": 25.0, "max_reps": 200}
EAGER_BUDGET = {"warmup_ms": 10.0, "rep_ms": 50.0}
QUICK_BUDGET = {"warmup_ms": 1.0, "rep_ms": 3.0, "max_reps": 5}
# Per case on an H100 in the b34185d sweep (the timestamps of its 300 cases), compile, checks and Liger included; the
# host part 25 s. --part list estimates with them. On an H200 without Liger (2026-12-03) this grid took 72 s.
SECONDS_PER_CASE_H100, HOST_SECONDS_H100 = 9.2, 25.0
COPY_MIN_BYTES = 64 * MB
EAGER_WORST_MIN_BYTES, DEVICE_WORST_MIN_BYTES = 16 * MB, 8 * MB
SUMMARY_STEM = "bench_kernels_summary"  # mahia.measure.results reads <folder>/<stem>[-<profile>].json


def cases(kernel: str, quick: bool) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The (shape, dtype) cases of ``kernel``; ``quick``: two tiny float32 shapes (one odd-sized)."""
    if quick:
        return [(s, FP32) for s in QUICK_GRID.get(kernel, [(5, 100), (16, 256)])]
    return GRID[kernel]


def _shape_str(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def _dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------------- bytes


def min_bytes(experiment: str, shape, dtype: torch.dtype) -> int:
    """The fewest bytes of ``experiment`` (table in the module docstring). Timing-mode suffixes (``_eager``,
    ``_host_``) and notebook 03's ``_sweep`` are ignored."""
    exp = experiment.replace("_host_", "_").removesuffix("_eager").removesuffix("_sweep")
    es = torch.empty(0, dtype=dtype).element_size()
    if exp in ("moe_combine_fwd", "moe_combine_fwdbwd"):
        N, k, D = shape
        fwd = (N * k * D + N * D) * es + N * k * (4 + 8)
        return fwd if exp == "moe_combine_fwd" else 2 * fwd + N * k * D * es + N * k * 4  # + d_out, d_gates
    if exp in ("rope_fwd", "rope_fwdbwd"):
        B, T, Hq, Hkv, D = shape
        one = 2 * B * T * (Hq + Hkv) * D * es + T * D * 4  # read + write q, k; cos/sin tables float32
        return one if exp == "rope_fwd" else 2 * one
    per_element = {"rmsnorm": (2, 1, 5, 3), "add_rmsnorm": (4, 1, 8, 3), "swiglu": (3, 0, 8, 0)}
    kernel, _, p = exp.rpartition("_")
    if kernel not in per_element or p not in PASSES:
        raise ValueError(f"min_bytes: unknown experiment {experiment!r}")
    M, N = shape
    xs, ws = per_element[kernel][2:] if p == "fwdbwd" else per_element[kernel][:2]
    return (xs * M * N + ws * N) * es


def input_bytes(experiment_or_kernel: str, shape, dtype: torch.dtype) -> int:
    """The size of a case: bytes of x (RMSNorm, add + RMSNorm), a (SwiGLU), q and k (RoPE), out (MoE)."""
    n = math.prod(shape)
    if experiment_or_kernel.startswith("rope"):
        B, T, Hq, Hkv, D = shape
        n = B * T * (Hq + Hkv) * D
    return n * torch.empty(0, dtype=dtype).element_size()


# ------------------------------------------------------------------------------------------- inputs and peers


def make_inputs(kernel: str, shape, dtype: torch.dtype, dev) -> tuple:
    """Fresh random inputs of ``kernel`` at ``shape``: weights near 1 (as after init: keeps the in-place
    peers' iterated gradients bounded), float32 RoPE tables and MoE gates, an int64 permutation."""
    dev = torch.device(dev)

    def randn(*s, scale=1.0, shift=0.0):
        return torch.randn(*s, device=dev, dtype=dtype) * scale + shift

    if kernel in ("rmsnorm", "add_rmsnorm"):
        M, N = shape
        x, w = randn(M, N), randn(N, scale=0.1, shift=1.0)
        return (x, w) if kernel == "rmsnorm" else (x, randn(M, N), w)
    if kernel == "swiglu":
        return randn(*shape), randn(*shape)
    if kernel == "rope":
        B, T, Hq, Hkv, D = shape
        cos, sin = RotaryCache(D, T, device=dev).get(T)
        return randn(B, T, Hq, D), randn(B, T, Hkv, D), cos, sin
    if kernel == "moe_combine":
        N, k, D = shape
        inverse = torch.randperm(N * k, device=dev)  # where each (token, slot) sits in expert order
        return randn(N * k, D), inverse, torch.rand(N, k, device=dev).softmax(-1)  # gates float32, as routed
    raise ValueError(f"make_inputs: unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")


@dataclass
class Variant:
    name: str
    fn: Callable
    adapt: Callable[[tuple], tuple] = lambda inputs: inputs  # mahia's inputs to the variant's, outside the timing
    notes: str = ""


def _liger() -> dict[str, Variant]:
    """Liger-Kernel's variants by kernel; none (and the reason printed) where it does not import."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as AddRMS
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction as RMS
        from liger_kernel.ops.rope import LigerRopeFunction as Rope
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction as SiLUMul
    except Exception as exc:  # not installed, or built for another torch/triton
        print(f"  skipped: liger ({type(exc).__name__}: {exc})")
        return {}

    # Liger's RoPE takes q (B, H, T, D), a transposed view of (B, T, H, D) memory that it rotates in place, and
    # cos/sin (T, D) with the D/2 angles repeated.
    def rope(q, k, cos2, sin2):
        qr, kr = Rope.apply(q.transpose(1, 2), k.transpose(1, 2), cos2, sin2)
        return qr.transpose(1, 2), kr.transpose(1, 2)

    def rope_inputs(inputs):
        q, k, cos, sin = inputs
        return q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    return {
        "rmsnorm": Variant("liger", lambda x, w: RMS.apply(x, w, EPS), notes="casting_mode=llama, in_place=True"),
        "add_rmsnorm": Variant("liger", lambda x, r, w: AddRMS.apply(x, r, w, EPS), notes="casting_mode=llama"),
        "swiglu": Variant("liger", SiLUMul.apply, notes="backward overwrites a, b (default)"),
        "rope": Variant("liger", rope, rope_inputs, notes="rotates q, k in place; cos/sin (T, D)"),
    }


def _f_add_rms_norm(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, EPS), h


def _variants(kernel: str, dev: torch.device, liger: dict) -> list[Variant]:
    """The variants of ``kernel`` on ``dev``: build them afresh per case (after ``torch._dynamo.reset()``) so that
    torch.compile compiles for that shape."""
    out = [Variant("eager", EAGER[kernel])]
    if kernel == "rmsnorm":
        out.append(Variant("F.rms_norm", lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS)))
    if kernel == "add_rmsnorm":
        out.append(Variant("F.rms_norm", _f_add_rms_norm, notes="h = x + r, then F.rms_norm(h)"))
    if dev.type == "cuda":
        compiled = torch.compile(EAGER[kernel], dynamic=False)
        out.append(Variant("torch.compile", compiled, notes="default mode, static shapes, compiled for this shape"))
        out += [liger[kernel]] if kernel in liger else []
    if ops.triton_available_for(torch.empty(0, device=dev)):
        cpu = "TRITON_INTERPRET=1: the CPU interpreter, not a performance figure"
        out.append(Variant("mahia_triton", MAHIA[kernel], notes="" if dev.type == "cuda" else cpu))
    return out


# ------------------------------------------------------------------------------------------- measuring


def eager_bench(fn: Callable[[], object], *, device: torch.device | str | None = None, **budget) -> Timing:
    """The per-call time an eager program sees: ``fn`` called back to back with no L2 flush
    (:func:`mahia.measure.timing.bench` with ``flush_l2=False``). Where the device is the slower side this is the
    device time plus the gaps between kernels; where the host is, the host's time per call (Python, dispatch,
    autograd, launches)."""
    return bench(fn, device=device, flush_l2=False, memory=False, **budget)


def _step(v: Variant, kernel: str, shape, dtype, dev, *, backward: bool, requires_grad: bool) -> Callable[[], None]:
    """One call of ``v`` on fresh inputs; ``backward``: and its backward with fixed output gradients."""
    inputs = v.adapt(make_inputs(kernel, shape, dtype, dev))
    leaves = [inputs[i].requires_grad_() for i in GRAD_INPUTS[kernel]] if requires_grad else []
    if not backward:
        return lambda: v.fn(*inputs)
    with torch.no_grad():
        outs = v.fn(*inputs)
    grads = [torch.randn_like(o) for o in (outs if isinstance(outs, tuple) else (outs,))]

    def step():
        for t in leaves:
            t.grad = None
        outs = v.fn(*inputs)
        torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)

    return step


def _measure(recorder, kernel: str, shape, dtype, variants, *, host: bool, quick: bool, failures: list) -> None:
    """Check each variant, then record its device and eager time (``host``: its eager time as ``*_host_*``) of
    the forward and the forward + backward at one case; on CUDA at >= 64 MB, a copy of the same bytes too."""
    dev = torch.device(recorder.device)
    cuda = dev.type == "cuda"
    device_budget, eager_budget = (QUICK_BUDGET, QUICK_BUDGET) if quick else (DEVICE_BUDGET, EAGER_BUDGET)
    case = f"{_shape_str(shape):18s} {_dtype_str(dtype):8s}"
    for p in PASSES:
        backward = p == "fwdbwd"
        exp = f"{kernel}_host_{p}" if host else f"{kernel}_{p}"
        nbytes = min_bytes(exp, shape, dtype)
        for v in variants:
            t0 = time.perf_counter()
            try:  # correct first, on fresh inputs (compare_fn runs the reference in float64)
                err = compare_fn(
                    lambda *a, v=v: v.fn(*v.adapt(a)),
                    EAGER[kernel],
                    make_inputs(kernel, shape, dtype, dev),
                    grads=backward,
                    grad_inputs=GRAD_INPUTS[kernel],
                    tol=tolerance(dtype),
                    name=f"{exp} {v.name} {_shape_str(shape)} {_dtype_str(dtype)}",
                ).max_error
            except CorrectnessError as e:
                failures.append(str(e))
                print(f"  {exp:22s} {case} {v.name:13s} FAILED its check, not timed: {e}", flush=True)
                continue
            check_s = time.perf_counter() - t0
            step = _step(v, kernel, shape, dtype, dev, backward=backward, requires_grad=backward or host)
            t = eager_bench(step, device=dev, **eager_budget)
            timed = [(exp if host else f"{exp}_eager", t, "timing=eager (back to back, per-call time)")]
            if not host and not cuda:  # the CPU runs the work when called: its device time is the same timing
                timed.append((exp, t, "timing=device (CPU: the eager timing, host time is device time)"))
            elif not host:
                note = "timing=device (CUDA graph replay, L2 flushed)"
                try:
                    t = bench(step, device=dev, cuda_graph=True, memory=False, **device_budget)
                except RuntimeError as e:  # not capturable: time it launched, and say so
                    t, note = bench(step, device=dev, memory=False, **device_budget), f"timing=device (launched: {e})"
                timed.append((exp, t, note[:200]))
            for e, t, note in timed:
                if v.name == "torch.compile":
                    note += f"; check incl. compile {check_s:.1f} s"
                recorder.timing(
                    e,
                    v.name,
                    ROLE[v.name],
                    t,
                    shape=shape,
                    dtype=dtype,
                    bytes=nbytes,
                    limit="copy",
                    rel_err=err,
                    notes="; ".join(filter(None, [note, v.notes])),
                )
                print(f"  {e:22s} {case} {v.name:13s} {t.median_ms:9.4f} ms  err {err:.1e}", flush=True)
        if not host and cuda and input_bytes(kernel, shape, dtype) >= COPY_MIN_BYTES:
            _copy_same_bytes(recorder, exp, nbytes, shape, dtype)


def _copy_same_bytes(recorder, experiment: str, nbytes: int, shape, dtype) -> None:
    """Record a plain copy of ``nbytes`` (half read, half written) as a fraction of the measured copy ceiling: the
    limit at *this* size. The ceiling is measured on a 2 GiB copy; a smaller one loses its ramp-up and its last
    partial wave (notebook 00's copy sweep). Launched, as the ceiling is measured: in a CUDA graph copy_ becomes
    a memcpy node that the copy engines run, at about 2/3 of the SMs' rate on an H200."""
    src = torch.empty(max(1, int(nbytes) // 8), device=recorder.device).normal_()
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), device=recorder.device, memory=False, **DEVICE_BUDGET)
    gbps = 2 * src.nbytes / t.median_ms / 1e6
    frac = gbps / recorder.ceilings.copy_gbps if recorder.ceilings else float("nan")
    recorder.metric(
        experiment,
        "copy_same_bytes",
        frac,
        unit="fraction of the copy ceiling",
        shape=shape,
        dtype=dtype,
        notes=f"torch copy_ of {2 * src.nbytes / MB:.0f} MB moved, device time {t.median_ms:.4f} ms",
    )
    print(f"  {experiment:22s} {_shape_str(shape):18s} copy, same MB: {gbps:,.0f} GB/s = {frac:.3f} of the ceiling")


def _select(parts) -> tuple[list[str], bool]:
    """(the parts named, in PARTS order; all when none is; whether 'list' was among them)."""
    names = [t.strip() for s in ([parts] if isinstance(parts, str) else parts or []) for t in str(s).split(",")]
    listing = "list" in names
    names = [n for n in names if n and n not in ("list", "all")]
    bad = [n for n in names if n not in PARTS]
    if bad:
        raise ValueError(f"kernels: unknown part {bad[0]!r}; parts are {', '.join(PARTS)}, all or list")
    return [p for p in PARTS if p in names or not names], listing


def plan(parts: list[str], quick: bool) -> str:
    """The cases of each part, one line each, and (full grid) an estimate of the minutes on an H100."""
    lines = []
    for p in parts:
        if p == "host":
            what = "eager time of " + ", ".join(f"{k} {_shape_str(HOST_SHAPE[k])}" for k in KERNELS)
        else:
            what = ", ".join(f"{_shape_str(s)} {_dtype_str(d)}" for s, d in cases(p, quick))
        lines.append(f"  {p:12s} {what}")
    if not quick:
        n = sum(len(GRID[p]) for p in parts if p != "host")
        est = (n * SECONDS_PER_CASE_H100 + HOST_SECONDS_H100 * ("host" in parts)) / 60
        lines.append(f"  {n} cases x (fwd, fwd+bwd) x (device, eager time): ~{est:.1f} min on an H100")
    return "\n".join(lines)


def run(recorder, ceilings, *, quick: bool, parts=None) -> None:
    """Check and time the ``parts`` (default all; see :func:`plan`) on ``recorder.device``, record the rows and
    write the summary keys (:func:`write_summary`). ``ceilings`` is what the copy fractions divide by."""
    chosen, listing = _select(parts)
    if listing:
        print("kernels: plan (nothing measured)\n" + plan(chosen, quick))
        return
    dev = torch.device(recorder.device)
    cuda = dev.type == "cuda"
    if not cuda and not quick:
        print("kernels: skipped: these are GPU kernels; on the CPU run with --quick (tiny shapes, smoke test)")
        return
    print(f"kernels ({'quick, tiny shapes' if quick else 'the full grid'}, {dev}):\n{plan(chosen, quick)}")
    if not cuda:
        print("  skipped: torch.compile (CPU: Inductor's C++ compile costs seconds per shape)")
        print("  skipped: liger, copy_same_bytes (GPU kernels, a GPU bandwidth limit)")
    if not ops.triton_available_for(torch.empty(0, device=dev)):
        print(f"  skipped: mahia_triton ({ops.why_not(torch.empty(0, device=dev))})")
    liger = _liger() if cuda else {}
    failures: list[str] = []
    t_start = time.perf_counter()
    for p in chosen:
        t0, before = time.perf_counter(), len(recorder.rows)
        todo = [(k, HOST_SHAPE[k], BF16 if cuda else FP32) for k in KERNELS] if p == "host" else []
        todo += [(p, s, d) for s, d in cases(p, quick)] if p != "host" else []
        for kernel, shape, dtype in todo:
            torch._dynamo.reset()  # compile per case, and never hit Dynamo's recompile limit
            variants = _variants(kernel, dev, liger)
            _measure(recorder, kernel, shape, dtype, variants, host=p == "host", quick=quick, failures=failures)
        print(f"== part {p}: {len(recorder.rows) - before} records in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"kernels: {len(recorder.rows)} records in {time.perf_counter() - t_start:.0f} s")
    if recorder.rows:
        print(f"  summary keys: {write_summary(recorder.folder, recorder.profile)}")
    if failures:
        raise CorrectnessError(
            f"kernels: {len(failures)} variant(s) failed their check and were not timed "
            "(the others were measured and recorded):\n  " + "\n  ".join(failures)
        )


# ------------------------------------------------------------------------------------------- summary keys


def _vs(g, peer: str | None = None) -> float | None:
    """time(best peer) / time(mahia_triton) in the rows ``g`` of one experiment, shape and dtype; ``peer``: that
    variant's time instead of the best peer's."""
    t = g[g["median_ms"].notna()]
    mine = t[t["variant"] == "mahia_triton"]
    peers = t[t["variant"] == peer] if peer else t[t["role"].isin(PEER_ROLES)]
    return None if mine.empty or peers.empty else float(peers["median_ms"].min() / mine["median_ms"].iloc[0])


def _frac_of_copy(g) -> float | None:
    """mahia_triton's fraction of the copy ceiling / the same-bytes copy's: its GB/s over the copy's."""
    mine = g[(g["variant"] == "mahia_triton") & g["frac_of_limit"].notna()]
    cp = g[(g["variant"] == "copy_same_bytes") & (g["value"] > 0)]
    return None if mine.empty or cp.empty else float(mine["frac_of_limit"].iloc[0] / cp["value"].iloc[0])


def summary_keys(records, *, where: bool = False) -> dict:
    """The kernel benchmark's summary keys from its records (one profile; the newest row per experiment,
    variant, shape and dtype counts). ``x_vs_y`` = time(y) / time(x), y the best peer (the fastest variant of a
    role in PEER_ROLES at that shape and dtype): above 1, mahia is faster. None where records are missing. With
    ``where=True`` each value comes as ``{"value", "experiment", "shape", "dtype"}``.

    rmsnorm_host_fwd[bwd]_vs_native     time(F.rms_norm) / time(mahia_triton), rmsnorm_host_fwd[bwd] at HOST_SHAPE
                                        (bfloat16 if recorded, else another dtype)
    <k>_fwdbwd_eager_vs_best_peer       <k>_fwdbwd_eager at HEADLINE[k], bfloat16; k = rmsnorm, swiglu, rope
    <k>_fwdbwd_eager_worst_vs_best_peer the smallest such ratio over every case with an input >= 16 MB
    <k>_device_worst_vs_best_peer       the smallest device-time ratio over <k>_fwd and <k>_fwdbwd, inputs >= 8 MB
    rmsnorm_fwdbwd_frac_of_copy         :func:`_frac_of_copy` of rmsnorm_fwdbwd at 16384x4096 bfloat16
    rmsnorm_fwd_worst_frac_of_copy      the smallest such fraction of rmsnorm_fwd (the copy runs at >= 64 MB)
    """
    import pandas as pd

    df = pd.DataFrame(records)
    cols = ["experiment", "variant", "role", "shape", "dtype", "median_ms", "frac_of_limit", "value"]
    df = df.reindex(columns=[*cols, *(c for c in df.columns if c not in cols)]).astype({c: str for c in cols[:5]})
    if "date" in df.columns:
        df = df.sort_values("date", kind="stable")
    df = df.groupby(cols[:2] + cols[3:5], sort=False).tail(1)
    out: dict = {}

    def put(key, value, exp=None, shape=None, dtype=None):
        value = None if value is None or math.isnan(value) else float(value)
        out[key] = {"value": value, "experiment": exp, "shape": shape, "dtype": dtype} if where else value

    def one(key, fn, exp, shape, dtype):
        put(key, fn(df[(df["experiment"] == exp) & (df["shape"] == shape) & (df["dtype"] == dtype)]), exp, shape, dtype)

    def worst(key, exps, fn, min_bytes_):
        found = []
        for (exp, shape, dt), g in df[df["experiment"].isin(exps)].groupby(["experiment", "shape", "dtype"]):
            dtype = getattr(torch, dt, None)
            size = input_bytes(exp, [int(s) for s in shape.split("x")], dtype) if isinstance(dtype, torch.dtype) else 0
            v = fn(g) if size >= min_bytes_ else None
            found += [(v, exp, shape, dt)] if v is not None and not math.isnan(v) else []
        put(key, *min(found, default=(None,)))

    for p in PASSES:
        exp = f"rmsnorm_host_{p}"
        dts = sorted(set(df.loc[df["experiment"] == exp, "dtype"]))
        dt = "bfloat16" if "bfloat16" in dts or not dts else dts[0]
        one(f"{exp}_vs_native", lambda g: _vs(g, "F.rms_norm"), exp, _shape_str(HOST_SHAPE["rmsnorm"]), dt)
    for k in ("rmsnorm", "swiglu", "rope"):
        exp = f"{k}_fwdbwd_eager"
        one(f"{exp}_vs_best_peer", _vs, exp, _shape_str(HEADLINE[k]), "bfloat16")
        worst(f"{exp}_worst_vs_best_peer", [exp], _vs, EAGER_WORST_MIN_BYTES)
        worst(f"{k}_device_worst_vs_best_peer", [f"{k}_fwd", f"{k}_fwdbwd"], _vs, DEVICE_WORST_MIN_BYTES)
    one("rmsnorm_fwdbwd_frac_of_copy", _frac_of_copy, "rmsnorm_fwdbwd", _shape_str(HEADLINE["rmsnorm"]), "bfloat16")
    worst("rmsnorm_fwd_worst_frac_of_copy", ["rmsnorm_fwd"], _frac_of_copy, COPY_MIN_BYTES)
    return out


def write_summary(folder: str | Path, profile: str) -> Path:
    """Write :func:`summary_keys` of the folder's kernel records of ``profile`` to ``<folder>/
    bench_kernels_summary.json`` (``-<profile>`` for other than full), with where each worst case is and the
    records' commits. :func:`mahia.measure.summary.headline` merges these keys into the folder's summary."""
    df = summary.load_records(folder)
    if not df.empty:  # the newest commit's sweep only (resumed runs of one commit append to it)
        df = summary.latest(df[(df["notebook"] == "bench_kernels") & (df["profile"] == profile)])
    keys = summary_keys(df, where=True)
    doc = {
        "profile": profile,
        "commits": sorted(set(df["commit"].astype(str))) if not df.empty else [],
        "metrics": {k: v["value"] for k, v in keys.items()},
        "where": {k: {f: v[f] for f in ("experiment", "shape", "dtype") if v[f] is not None} for k, v in keys.items()},
    }
    path = files.profile_file(folder, SUMMARY_STEM, profile)
    files.atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    return path
