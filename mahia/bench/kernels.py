"""Kernel benchmarks: RMSNorm, add + RMSNorm, SwiGLU, RoPE and the MoE combine (``python -m mahia.bench kernels``).

What is measured is what a user meets: every kernel, forward and forward + backward, over a sweep of
shapes fixed here, in bfloat16, float16 and float32, each variant timed two ways, beside the peers a
user could call instead.

Variants, each checked against a float64 run of the eager reference on fresh random inputs at every
shape before it is timed (``mahia.measure.checks.compare_fn``, errors computed on the device); a
wrong one is not timed, the others go on, and the suite ends with a ``CorrectnessError`` naming it:

    eager          the readable reference of mahia.ops (``*_eager``)       role "baseline" (also a peer:
                   plain PyTorch is what a user calls without mahia)
    F.rms_norm     PyTorch's own RMSNorm (RMSNorm; add + RMSNorm: x + r    role "peer"
                   then F.rms_norm)
    torch.compile  Inductor's fusion of the eager reference: default mode, role "peer"  (CUDA only)
                   static shapes, compiled afresh for every shape and dtype
                   (``torch._dynamo.reset()`` first, so no recompile limit is hit)
    liger          Liger-Kernel, when ``import liger_kernel`` works          role "peer"  (CUDA only)
    mahia_triton   mahia.ops                                               role "optimized"

Liger's defaults are kept: its RMSNorm writes dx over dy, its SwiGLU backward writes da, db over the
saved a, b, and its RoPE rotates q and k in place. The timed inputs therefore drift from step to step
(rotations keep their norm; the SwiGLU values may overflow over many steps), which does not change the
work or the bytes of a memory-bound kernel; correctness is checked on fresh inputs first.

Two timings of every step (a step: the forward, or the forward and a backward with fixed output
gradients), in two experiments, so that every record keeps the columns of
:mod:`mahia.measure.results` and a ratio never mixes the two:

    <kernel>_<pass>          device time: ``bench(step, cuda_graph=True)``, a CUDA-graph replay of the step
                             after an L2 flush: what the kernels cost the GPU, without Python, dispatch and
                             launch overhead (on the CPU, ``--quick``: ``bench`` on the CPU)
    <kernel>_<pass>_eager    eager time (:func:`eager_bench`): N calls of the step back to back from Python,
                             one synchronize, per-call time = total / N, repeated for median and spread:
                             what an eager model sees, host overhead included when the host is the slower
                             side. No L2 flush between the calls (inputs under ~50 MB may stay in L2).
                             The variants' samples are interleaved (:func:`eager_bench_interleaved`), so
                             a drift of the host's speed falls on all of them and not on their ratio.
    <kernel>_host_<pass>     host cost: eager time on a tiny tensor (4 x 64; every input that has a gradient
                             requires it, also for the forward, as in training), i.e. Python + dispatch +
                             autograd + launch per call

``<pass>`` is ``fwd`` or ``fwdbwd``. The notes of each record start with ``timing=device``,
``timing=eager`` (and say how it was taken); :func:`timing_mode` reads the mode off an experiment name.
Forward records of the sweep run without autograd (inputs do not require grad).

Bytes are the fewest a kernel must move (each input read once, each output written once); every
record carries them, so GB/s and the fraction of the copy ceiling follow:

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

Size (the x axis of the plots and the thresholds of :func:`summary_keys`) is :func:`input_bytes`: the
bytes of x (RMSNorm, add + RMSNorm), of a (SwiGLU), of q and k (RoPE), of out (MoE combine). MB = 1e6 bytes.

On CUDA, for every device-time experiment at a shape of at least 8 MB, a plain ``copy_`` of the same
bytes is timed (metric ``copy_same_bytes``, as a fraction of the copy ceiling): the ceiling is measured on
a 2 GiB copy, and at a few MB even a copy reaches less of it, which is the honest limit at that size.

The sweep (:data:`GRID`), fixed before measuring; rows are tokens (RoPE: batch x sequence):

    rows          91 (a decode batch: odd, under one wave of programs), 1024, 4096, 16384
    RMSNorm, add  hidden 1000 (not a multiple of a block: masking), 2048, 4096, 5120 (13B), 8192 (70B)
    SwiGLU        intermediate 1000, 2048, 4096, 11008 (Llama-2 7B), 14336 (Llama-3 8B)
    RoPE          (Hq, Hkv, D) = (12, 12, 64) GPT-2, (28, 4, 128) Qwen2 7B, (32, 8, 128) Llama-3 8B,
                  (40, 40, 128) Llama-2 13B, (64, 8, 128) Llama-3 70B; rows as (B, T) = (1, 91), (1, 1024),
                  (2, 2048), (8, 2048)
    MoE combine   k = 2, D = 1000, 1024 (notebook 08), 2048, 4096, 7168 (DeepSeek-V3)
    dtypes        bfloat16, float16, float32

Headline shapes (bfloat16): RMSNorm 16384 x 4096, SwiGLU 16384 x 11008, RoPE B=8 T=2048 Hq=32 Hkv=8 D=128.

Parts: the sweep runs in parts that resume (one lent GPU command lasts at most 10 minutes): ``host`` and
``<kernel>-<dtype>`` (``rmsnorm-bf16`` .. ``moe_combine-fp32``); ``--part rmsnorm`` selects every dtype of a
kernel, ``--part bf16`` every kernel of a dtype, ``--part list`` prints the plan with the time of each part
on an H100 (:data:`EST_MIN_H100`, from the b34185d sweep: 0.4 to 3.8 min a part, about 43 min in all). A
record already in the
suite's CSV for the same commit and profile (same experiment, variant, shape, dtype) is not measured
again (``--fresh`` measures anyway), so a command stopped at its limit is finished by running it again.
:func:`parse_args` parses these options; until ``python -m mahia.bench`` passes them on,
``MAHIA_BENCH_PARTS=rmsnorm-bf16,host`` selects parts, or run ``python -m mahia.bench.kernels --part
rmsnorm-bf16 [--fresh] [mahia.bench options]``. On lent 10-minute commands the simplest plan is the same
command (all parts, stopped by ``tools/reference_run.sh``'s ``DEADLINE``) run again until every part is
recorded: about six commands (b34185d's took six). Or seven groups of under 8 minutes each:

    --part host,rmsnorm-bf16,add_rmsnorm-bf16                   ~5.8 min
    --part swiglu-bf16,rope-bf16                                ~5.5 min
    --part moe_combine-bf16,rmsnorm-fp16,moe_combine-fp32       ~7.3 min
    --part add_rmsnorm-fp16,swiglu-fp16                         ~6.3 min
    --part rope-fp16,moe_combine-fp16                           ~5.3 min
    --part rmsnorm-fp32,add_rmsnorm-fp32                        ~7.5 min
    --part swiglu-fp32,rope-fp32                                ~5.7 min   (+ ~0.4 min each)

Figures (:func:`plot`, at the end of a run but ``--quick``): one per kernel of the selected parts, every
dtype recorded for this commit so far, and the host cost, in ``runs/figures/<device>/bench_kernels_*``.

``--quick`` uses two tiny shapes per kernel, float32 only, no torch.compile on the CPU, no Liger, no copy
and no figures; mahia_triton runs only under TRITON_INTERPRET=1 (the interpreter: a smoke test, not a
performance figure). It says what it ran and what it skipped.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from mahia import ops
from mahia.layers.rope import RotaryCache
from mahia.measure import files, results
from mahia.measure.checks import CorrectnessError, compare_fn, tolerance
from mahia.measure.timing import Timing, bench, synchronize
from mahia.ops.moe_combine import moe_combine_eager
from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager
from mahia.ops.rope import apply_rope_eager
from mahia.ops.swiglu import swiglu_eager

__all__ = [
    "run",
    "newest_rows",
    "min_bytes",
    "input_bytes",
    "eager_bench",
    "eager_bench_interleaved",
    "parse_args",
    "select_parts",
    "PARTS",
    "GRID",
    "HEADLINE",
    "summary_keys",
    "SUMMARY_KEYS",
    "PEER_ROLES",
    "timing_mode",
    "plot",
    "Variant",
]

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


# ------------------------------------------------------------------------------------------- checking


# ------------------------------------------------------------------------------------------- measuring


def _shape_str(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def _dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _key(experiment, variant, shape, dtype) -> tuple[str, str, str, str]:
    return experiment, variant, _shape_str(shape), _dtype_str(dtype)


def _done(recorder) -> set[tuple[str, str, str, str]]:
    """(experiment, variant, shape, dtype) already in the recorder's CSV for its commit and profile."""
    import pandas as pd

    path = Path(recorder.path)
    if not path.exists():
        return set()
    df = pd.read_csv(path, dtype={"shape": str, "dtype": str, "commit": str, "profile": str})
    if df.empty:
        return set()
    commit, profile = getattr(recorder, "commit", None), getattr(recorder, "profile", None)
    if commit is None or "commit" not in df.columns:
        return set()
    sel = df[df["commit"].astype(str) == str(commit)]
    if profile is not None and "profile" in df.columns:
        sel = sel[sel["profile"].astype(str) == str(profile)]
    if "device_slug" in df.columns and getattr(recorder, "slug", None):
        sel = sel[sel["device_slug"].astype(str) == str(recorder.slug)]
    return {(str(r.experiment), str(r.variant), str(r.shape), str(r.dtype)) for r in sel.itertuples()}


_DEVICE_NOTE = {
    "cuda": "timing=device (CUDA graph replay, L2 flushed)",
    "cpu": "timing=device (CPU: bench(), host time is device time)",
}
_EAGER_NOTE = "timing=eager ({n} calls back to back, one synchronize; per-call time)"


def _measure(
    recorder,
    experiment: str,
    variants: list[Variant],
    make_inputs: Callable,
    reference: Callable,
    *,
    backward: bool,
    grad_inputs: list[int],
    nbytes: float,
    shape,
    dtype,
    modes: dict[str, str] | None = None,
    requires_grad: bool | None = None,
    done: set | None = None,
    copy: bool | None = None,
    budget: dict | None = None,
    failures: list | None = None,
    phases: dict | None = None,
) -> None:
    """Check (:func:`mahia.measure.checks.compare_fn`, errors on the device), then time each variant: forward only,
    or forward + backward with fixed output grads.

    ``modes`` maps a timing mode to the experiment it is recorded under: 'device' (``bench``, on CUDA a
    CUDA-graph replay, one variant after the other) and/or 'eager' (:func:`eager_bench_interleaved`: every
    variant's samples interleaved, so that their ratios come from one window of the host's time); default
    ``{"device": experiment}``. ``requires_grad`` (default ``backward``) makes the ``grad_inputs`` leaves
    require grad, also for a forward. Records whose key is in ``done`` are not measured again (nor checked,
    when none is left). ``copy`` (default: on CUDA) times a copy of the same bytes after the device-time rows.
    A variant that fails its check raises ``CorrectnessError``; with a ``failures`` list it is appended
    there instead (and not timed), and the other variants go on. ``phases``, when given, adds the seconds
    spent checking, timing device time, timing eager time and timing the copy (keys ``check``, ``device``,
    ``eager``, ``copy``): where a part's time goes.
    """
    modes = modes or {"device": experiment}
    done = done if done is not None else set()
    phases = phases if phases is not None else {}
    dev = torch.device(recorder.device)
    cuda = dev.type == "cuda"
    budget = budget or {}
    requires_grad = backward if requires_grad is None else requires_grad
    tol = tolerance(dtype)
    eager_steps: dict[str, Callable] = {}  # variant -> its step, timed together after the loop
    checked: dict[str, tuple] = {}  # variant -> (Variant, Comparison, check seconds)

    def record(v, exp, timing, note, cmp, check_s):
        if v.name == "torch.compile":
            note += f"; check incl. compile {check_s:.1f} s"
        recorder.timing(
            exp,
            v.name,
            ROLE[v.name],
            timing,
            shape=shape,
            dtype=dtype,
            bytes=nbytes,
            limit="copy",
            rel_err=cmp.max_error,
            notes="; ".join(filter(None, [note, v.notes])),
        )
        done.add(_key(exp, v.name, shape, dtype))
        print(
            f"  {exp:24s} {_shape_str(shape):18s} {_dtype_str(dtype):8s} {v.name:13s} "
            f"{timing.median_ms:9.4f} ms {nbytes / timing.median_ms / 1e6:8.1f} GB/s  "
            f"err {cmp.max_error:.1e}  (check {check_s:.1f} s)",
            flush=True,
        )

    for v in variants:
        todo = {m: e for m, e in modes.items() if _key(e, v.name, shape, dtype) not in done}
        if not todo:
            continue
        # Correct first, on fresh inputs (compare_fn upcasts them to float64 for the reference).
        t0 = time.perf_counter()
        try:
            cmp = compare_fn(
                lambda *a, v=v: v.fn(*v.adapt(a)),
                reference,
                make_inputs(),
                grads=backward,
                grad_inputs=grad_inputs,
                tol=tol,
                name=f"{experiment} {v.name} {_shape_str(shape)} {_dtype_str(dtype)}",
            )
        except CorrectnessError as e:
            if failures is None:
                raise
            failures.append(str(e))
            print(
                f"  {experiment:24s} {_shape_str(shape):18s} {_dtype_str(dtype):8s} {v.name:13s} "
                f"FAILED its check, not timed: {e}",
                flush=True,
            )
            continue
        check_s = time.perf_counter() - t0
        phases["check"] = phases.get("check", 0.0) + check_s
        inputs = v.adapt(make_inputs())
        leaves = [inputs[i] for i in grad_inputs] if requires_grad else []
        for t in leaves:
            t.requires_grad_(True)
        if backward:
            with torch.no_grad():
                outs = v.fn(*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.randn_like(o) for o in outs]
            del outs

            def step(v=v, inputs=inputs, leaves=leaves, grads=grads):
                for t in leaves:
                    t.grad = None
                outs = v.fn(*inputs)
                torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)
        else:

            def step(v=v, inputs=inputs):
                v.fn(*inputs)

        unknown = set(todo) - {"device", "eager"}
        if unknown:
            raise ValueError(f"unknown timing mode {sorted(unknown)[0]!r}; known: device, eager")
        if "device" in todo:
            t0 = time.perf_counter()
            kw = {k: budget[k] for k in ("warmup_ms", "rep_ms", "max_reps") if k in budget}
            note = _DEVICE_NOTE.get(dev.type, f"timing=device ({dev.type})")
            if cuda:
                try:
                    timing = bench(step, device=dev, cuda_graph=True, **kw)
                except RuntimeError as e:  # not capturable: time it launched, and say so
                    timing = bench(step, device=dev, **kw)
                    note = f"timing=device (launched: not capturable in a CUDA graph: {str(e)[:120]})"
            else:
                timing = bench(step, device=dev, **kw)
            record(v, todo["device"], timing, note, cmp, check_s)
            phases["device"] = phases.get("device", 0.0) + time.perf_counter() - t0
        if "eager" in todo:
            eager_steps[v.name] = step
            checked[v.name] = (v, cmp, check_s)
        del inputs, leaves, step
    if eager_steps:
        t0 = time.perf_counter()
        kw = {k: budget[k] for k in ("warmup_ms", "rep_ms", "sample_ms", "min_calls", "min_samples") if k in budget}
        info: dict = {}
        timings = eager_bench_interleaved(eager_steps, device=dev, info=info, **kw)
        others = len(eager_steps) - 1
        for name, timing in timings.items():
            v, cmp, check_s = checked[name]
            note = _EAGER_NOTE.format(n=info[name]["calls"])
            if others:
                note += f"; samples interleaved with {others} other variant(s)"
            record(v, modes["eager"], timing, note, cmp, check_s)
        phases["eager"] = phases.get("eager", 0.0) + time.perf_counter() - t0
        del eager_steps
    if (cuda if copy is None else copy) and "device" in modes:
        exp = modes["device"]
        if _key(exp, "copy_same_bytes", shape, dtype) not in done:
            t0 = time.perf_counter()
            kw = {k: budget[k] for k in ("warmup_ms", "rep_ms", "max_reps") if k in budget}
            _copy_of_same_bytes(recorder, exp, nbytes, shape, dtype, **kw)
            done.add(_key(exp, "copy_same_bytes", shape, dtype))
            phases["copy"] = phases.get("copy", 0.0) + time.perf_counter() - t0


def _copy_of_same_bytes(recorder, experiment: str, nbytes: int, shape, dtype, **bench_kw) -> None:
    """Time a plain copy that moves ``nbytes`` (half read, half written) and record its GB/s as a
    fraction of the measured copy ceiling: the limit at *this* size. The ceiling is measured on a 2 GiB
    copy; a smaller one loses its ramp-up and its last partial wave, so a kernel that moves a few
    hundred MB cannot reach 1.0 of the ceiling either (notebook 00's copy sweep)."""
    n = max(1, int(nbytes) // 8)  # float32 elements per side: half the bytes read, half written
    src = torch.empty(n, device=recorder.device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    # Launched, as the ceiling is measured: captured in a CUDA graph, copy_ becomes a memcpy node that
    # the copy engines run, at about 2/3 of the SMs' rate on an H200.
    t = bench(lambda: dst.copy_(src), device=recorder.device, **bench_kw)
    moved = 2 * n * 4  # bytes
    gbps = moved / t.median_ms / 1e6
    frac = gbps / recorder.ceilings.copy_gbps if recorder.ceilings else float("nan")
    recorder.metric(
        experiment,
        "copy_same_bytes",
        frac,
        unit="fraction of the copy ceiling",
        shape=shape,
        dtype=dtype,
        notes=f"torch copy_ of {moved / 1e6:.0f} MB moved, device time "
        f"{t.median_ms:.4f} ms: the copy limit at this size",
    )
    print(
        f"  {experiment:24s} {_shape_str(shape):18s} {_dtype_str(dtype):8s} {'copy, same MB':13s} "
        f"{t.median_ms:9.4f} ms {gbps:8.1f} GB/s  = {frac:.3f} of the copy ceiling",
        flush=True,
    )


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _phase_text(total_s: float, phases: dict) -> str:
    """'9.1 s (checks incl. compiling 3.2, device time 2.1, eager time 1.5, copy 0.3, the rest 2.0)': where a
    shape's seconds went, so a part's plan can be cut where the time is."""
    names = {"check": "checks incl. compiling", "device": "device time", "eager": "eager time", "copy": "copy"}
    parts = [f"{names[k]} {phases[k]:.1f}" for k in names if k in phases]
    rest = total_s - sum(phases.values())
    return f"{total_s:.1f} s ({', '.join([*parts, f'the rest {rest:.1f}'])})"


def _all_done(done, experiments, names, shape, dtype) -> bool:
    return all(_key(e, n, shape, dtype) in done for e in experiments for n in names)


def _run_kernel(
    recorder,
    kernel: str,
    dtype: torch.dtype,
    shapes,
    *,
    liger,
    done: set,
    budget: dict,
    with_compile: bool,
    stats: dict,
    failures: list,
) -> None:
    """Every shape of one kernel in one dtype: device and eager time of fwd and fwd+bwd, per variant."""
    dev = torch.device(recorder.device)
    op, eager, mahia = OP[kernel], _REFERENCE[kernel], _MAHIA[kernel]
    for shape in shapes:
        t0 = time.perf_counter()
        names = [v.name for v in _variants(op, eager, mahia, dev, liger, with_compile=False)]
        names += ["torch.compile"] if with_compile else []
        exps = [f"{kernel}_{p}{s}" for p in PASSES for s in ("", "_eager")]
        big = input_bytes(kernel, shape, dtype) >= COPY_MIN_BYTES and dev.type == "cuda"
        copies = [f"{kernel}_{p}" for p in PASSES] if big else []
        if _all_done(done, exps, names, shape, dtype) and _all_done(done, copies, ["copy_same_bytes"], shape, dtype):
            stats["skipped"] += 1
            continue
        if with_compile:
            torch._dynamo.reset()  # compile per shape, and never hit Dynamo's recompile limit
        variants = _variants(op, eager, mahia, dev, liger, with_compile=with_compile)
        phases: dict = {}
        for p in PASSES:
            exp = f"{kernel}_{p}"
            _measure(
                recorder,
                exp,
                variants,
                lambda shape=shape: make_inputs(kernel, shape, dtype, dev),
                eager,
                backward=p == "fwdbwd",
                grad_inputs=GRAD_INPUTS[kernel],
                nbytes=min_bytes(exp, shape, dtype),
                shape=shape,
                dtype=dtype,
                modes={"device": exp, "eager": f"{exp}_eager"},
                done=done,
                copy=big,
                budget=budget,
                failures=failures,
                phases=phases,
            )
        del variants
        _free(dev)
        stats["shapes"] += 1
        print(
            f"  -- {kernel} {_shape_str(shape)} {_dtype_str(dtype)}: {_phase_text(time.perf_counter() - t0, phases)}",
            flush=True,
        )


def _run_host(
    recorder, dtype: torch.dtype, *, liger, done: set, budget: dict, with_compile: bool, stats: dict, failures: list
) -> None:
    """Host cost: eager per-call time of every variant on a tiny tensor, inputs requiring grad."""
    dev = torch.device(recorder.device)
    for kernel in KERNELS:
        shape = HOST_SHAPE[kernel]
        if with_compile:
            torch._dynamo.reset()
        variants = _variants(OP[kernel], _REFERENCE[kernel], _MAHIA[kernel], dev, liger, with_compile=with_compile)
        for p in PASSES:
            exp = f"{kernel}_host_{p}"
            _measure(
                recorder,
                exp,
                variants,
                lambda k=kernel, s=shape: make_inputs(k, s, dtype, dev),
                _REFERENCE[kernel],
                backward=p == "fwdbwd",
                grad_inputs=GRAD_INPUTS[kernel],
                requires_grad=True,
                nbytes=min_bytes(exp, shape, dtype),
                shape=shape,
                dtype=dtype,
                modes={"eager": exp},
                done=done,
                copy=False,
                budget=budget,
                failures=failures,
            )
        stats["shapes"] += 1
    _free(dev)


def _plan_text(parts: list[Part], quick: bool) -> str:
    lines = []
    for p in parts:
        est = "" if quick else f"  (~{EST_MIN_H100.get(p.name, float('nan')):.1f} min on an H100)"
        if p.kernel is None:
            what = ", ".join(f"{k} {_shape_str(HOST_SHAPE[k])}" for k in KERNELS)
            lines.append(f"  {p.name:18s} eager time of fwd and fwd+bwd (inputs require grad): {what}{est}")
        else:
            lines.append(
                f"  {p.name:18s} {len(_grid(p.kernel, quick))} shapes x (fwd, fwd+bwd) x (device, eager time){est}"
            )
    if not quick:
        total = sum(EST_MIN_H100.get(p.name, 0.0) for p in parts)
        lines.append(f"  total ~{total:.1f} min on an H100, + ~0.4 min per command (one lent GPU command: 10 min)")
    return "\n".join(lines)


def run(recorder, ceilings, *, quick: bool, parts: Iterable[str] | str | None = None, resume: bool = True) -> None:
    """Benchmark the kernels on ``recorder.device`` and record two rows (device, eager time) per variant,
    pass, shape and dtype of the selected ``parts`` (default: ``MAHIA_BENCH_PARTS``, else all).

    ``resume``: skip records this commit and profile already have in the suite's CSV. ``ceilings``
    (mahia.measure.hardware.Ceilings) is what ``recorder`` divides achieved GB/s by.
    """
    t_start = time.perf_counter()
    dev = torch.device(recorder.device)
    if os.environ.get("MAHIA_BENCH_FRESH") == "1":
        resume = False
    spec = parts if parts is not None else (os.environ.get("MAHIA_BENCH_PARTS") or None)
    listing = spec is not None and "list" in [
        t.strip() for s in ([spec] if isinstance(spec, str) else spec) for t in str(s).split(",")
    ]
    if listing:
        spec = [
            t.strip()
            for s in ([spec] if isinstance(spec, str) else spec)
            for t in str(s).split(",")
            if t.strip() not in ("list", "")
        ] or None
    chosen = select_parts(spec)
    if quick:  # a smoke test: float32 only
        chosen = [p for p in chosen if p.dtype is None or p.dtype == torch.float32]
    if listing:
        print("kernels: plan (nothing measured)\n" + _plan_text(chosen, quick))
        return
    if dev.type != "cuda" and not quick:
        print("kernels: skipped: these are GPU kernels; on the CPU run with --quick (tiny shapes, smoke test)")
        return
    copy_gbps = getattr(ceilings, "copy_gbps", None)
    if copy_gbps:
        print(f"  measured copy bandwidth: {copy_gbps:,.0f} GB/s")
    cuda = dev.type == "cuda"
    liger = _liger_ops() if cuda else None
    with_compile = cuda
    budget = QUICK_BUDGET if quick else {**DEVICE_BUDGET, **EAGER_BUDGET}
    done = _done(recorder) if resume else set()
    skipped = []
    if not cuda:
        skipped.append("torch.compile (CPU: Inductor's C++ compile costs seconds per shape)")
        skipped.append("liger (Liger-Kernel's kernels are Triton GPU kernels)")
        skipped.append("copy_same_bytes (a GPU memory-bandwidth limit)")
    elif liger is None:
        skipped.append("liger (does not import)")
    if not ops.triton_available_for(torch.empty(0, device=dev)):
        skipped.append(f"mahia_triton ({ops.why_not(torch.empty(0, device=dev))})")
    elif not cuda:
        print("  mahia_triton: TRITON_INTERPRET=1, the CPU interpreter: a smoke test, not a performance figure")
    print(
        f"kernels ({'quick, tiny shapes' if quick else 'full sweep'}, {dev}): parts "
        f"{', '.join(p.name for p in chosen) or 'none'}"
        + (f"; {len(done)} records of commit {recorder.commit} already there: skipped" if done else "")
    )
    print(_plan_text(chosen, quick))
    for s in skipped:
        print(f"  skipped: {s}")
    stats = {"shapes": 0, "skipped": 0}
    failures: list[str] = []
    for p in chosen:
        t0 = time.perf_counter()
        before = len(recorder.rows)
        print(f"== part {p.name}", flush=True)
        if p.kernel is None:
            dtype = torch.bfloat16 if cuda else torch.float32
            _run_host(
                recorder,
                dtype,
                liger=liger,
                done=done,
                budget=budget if quick else EAGER_BUDGET,
                with_compile=with_compile,
                stats=stats,
                failures=failures,
            )
        else:
            _run_kernel(
                recorder,
                p.kernel,
                p.dtype,
                _grid(p.kernel, quick),
                liger=liger,
                done=done,
                budget=budget,
                with_compile=with_compile,
                stats=stats,
                failures=failures,
            )
        print(
            f"== part {p.name}: {len(recorder.rows) - before} records in {time.perf_counter() - t0:.0f} s", flush=True
        )
    print(
        f"kernels: {len(recorder.rows)} records, {stats['shapes']} shapes measured, {stats['skipped']} "
        f"already recorded, {time.perf_counter() - t_start:.0f} s"
    )
    if quick:
        print("  figures: not drawn in --quick (kernels.plot(records, folder) draws them from the CSV)")
    elif recorder.rows or stats["skipped"]:
        paths = plot_recorded(recorder, chosen)
        if paths:
            print(f"  figures: {', '.join(str(p) for p in paths[::2])} (+ .svg)")
    if recorder.rows or stats["skipped"]:
        path = write_summary(recorder.folder, recorder.profile)
        print(f"  summary keys: {path} (merged into the folder's summary by mahia.measure.results)")
    if failures:
        raise CorrectnessError(
            f"kernels: {len(failures)} variant(s) failed their check and were not timed "
            "(the others were measured and recorded):\n  " + "\n  ".join(failures)
        )


# ------------------------------------------------------------------------------------------- summary

SUMMARY_STEM = "bench_kernels_summary"  # mahia.measure.results reads <folder>/<stem>[-<profile>].json
SUMMARY_KEYS = results.SUITE_SUMMARIES[SUMMARY_STEM]
EAGER_WORST_MIN_BYTES = 16 * MB
DEVICE_WORST_MIN_BYTES = 8 * MB
COPY_FRAC_MIN_BYTES = 64 * MB


def newest_rows(df):
    """Newest row per (experiment, variant, shape, dtype)."""
    if df.empty:
        return df
    d = df.copy()
    for c in ("shape", "dtype", "experiment", "variant"):
        d[c] = d[c].astype(str)
    if "date" in d.columns:
        d = d.sort_values("date", kind="stable")
    return d.groupby(["experiment", "variant", "shape", "dtype"], sort=False).tail(1)


def _parse_shape(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in str(s).split("x"))


def _dtype_of(name: str) -> torch.dtype | None:
    return getattr(torch, str(name), None) if str(name) in ("bfloat16", "float16", "float32", "float64") else None


def _vs_best_peer(g) -> float | None:
    """time(best peer) / time(mahia_triton) in the rows ``g`` of one experiment, shape and dtype."""
    t = g[g["median_ms"].notna()]
    mine = t[t["variant"] == "mahia_triton"]
    peers = t[t["role"].isin(PEER_ROLES)]
    if mine.empty or peers.empty:
        return None
    return float(peers["median_ms"].min()) / float(mine["median_ms"].iloc[0])


def _frac_of_copy(g) -> float | None:
    """mahia_triton's fraction of the copy ceiling / the same-bytes copy's: its GB/s over the copy's."""
    mine = g[(g["variant"] == "mahia_triton") & g["frac_of_limit"].notna()]
    cp = g[(g["variant"] == "copy_same_bytes") & g["value"].notna()]
    if mine.empty or cp.empty or not float(cp["value"].iloc[0]) > 0:
        return None
    return float(mine["frac_of_limit"].iloc[0]) / float(cp["value"].iloc[0])


def _over_shapes(df, experiments, fn, min_bytes_: float, dtypes=None) -> tuple[float | None, dict | None]:
    """The smallest ``fn`` over (experiment, shape, dtype) groups whose input is at least ``min_bytes_``."""
    worst, where = None, None
    sel = df[df["experiment"].isin(experiments)]
    for (exp, shape, dt), g in sel.groupby(["experiment", "shape", "dtype"], sort=False):
        dtype = _dtype_of(dt)
        if dtype is None or (dtypes is not None and dt not in dtypes):
            continue
        try:
            size = input_bytes(exp, _parse_shape(shape), dtype)
        except (ValueError, TypeError):
            continue
        if size < min_bytes_:
            continue
        v = fn(g)
        if v is not None and not math.isnan(v) and (worst is None or v < worst):
            worst, where = v, {"experiment": exp, "shape": shape, "dtype": dt}
    return worst, where


def summary_keys(records, *, where: bool = False) -> dict:
    """The kernel benchmark's summary keys from its records (``load_records`` of a device folder, one
    profile; the newest row per experiment, variant, shape and dtype is used). ``x_vs_y`` = time(y) /
    time(x), y the best peer (the fastest variant of a role in PEER_ROLES, eager PyTorch included, at
    that shape and dtype); above 1 means mahia is faster. None where the records are missing. With ``where=True`` each value comes as
    ``{"value", "experiment", "shape", "dtype"}`` (which shape made a worst case).

    rmsnorm_host_fwd[bwd]_vs_native     time(F.rms_norm) / time(mahia_triton), eager time, tiny tensor
                                        (rmsnorm_host_fwd[bwd], bfloat16 if recorded, else any dtype)
    <k>_fwdbwd_eager_vs_best_peer       <k>_fwdbwd_eager at the headline shape (HEADLINE), bfloat16;
                                        k = rmsnorm, swiglu, rope
    <k>_fwdbwd_eager_worst_vs_best_peer the smallest such ratio over every shape with an input of at least
                                        16 MB, all dtypes (<k>_fwdbwd_eager)
    <k>_device_worst_vs_best_peer       the smallest ratio of device time over <k>_fwd and <k>_fwdbwd,
                                        every shape with an input of at least 8 MB, all dtypes
    rmsnorm_fwdbwd_frac_of_copy         mahia_triton's GB/s / the same-bytes copy's (rmsnorm_fwdbwd, device
                                        time, 16384x4096 bfloat16): frac_of_limit / copy_same_bytes value
    rmsnorm_fwd_worst_frac_of_copy      the smallest such fraction for rmsnorm_fwd over every shape with an
                                        input of at least 64 MB, all dtypes
    """
    import pandas as pd

    df = (
        newest_rows(pd.DataFrame(records))
        if len(records)
        else pd.DataFrame(
            columns=["experiment", "variant", "role", "shape", "dtype", "median_ms", "frac_of_limit", "value"]
        )
    )
    out: dict = {}

    def put(key, value, loc=None):
        value = None if value is None or math.isnan(value) else float(value)
        out[key] = {"value": value, **(loc or {})} if where else value

    def at(experiment, shape, dtype):
        return df[(df["experiment"] == experiment) & (df["shape"] == shape) & (df["dtype"] == dtype)]

    for p in PASSES:
        exp = f"rmsnorm_host_{p}"
        sel = df[df["experiment"] == exp]
        value, loc = None, None
        if not sel.empty:
            dts = ["bfloat16"] if (sel["dtype"] == "bfloat16").any() else sorted(set(sel["dtype"]))
            for (shape, dt), g in sel[sel["dtype"].isin(dts)].groupby(["shape", "dtype"], sort=False):
                t = g[g["median_ms"].notna()].set_index("variant")["median_ms"]
                if "F.rms_norm" in t.index and "mahia_triton" in t.index:
                    value, loc = (
                        float(t["F.rms_norm"]) / float(t["mahia_triton"]),
                        {"experiment": exp, "shape": shape, "dtype": dt},
                    )
                    break
        put(f"rmsnorm_host_{p}_vs_native", value, loc)
    for k in ("rmsnorm", "swiglu", "rope"):
        exp, shape = f"{k}_fwdbwd_eager", _shape_str(HEADLINE[k])
        put(
            f"{k}_fwdbwd_eager_vs_best_peer",
            _vs_best_peer(at(exp, shape, "bfloat16")),
            {"experiment": exp, "shape": shape, "dtype": "bfloat16"},
        )
    for k in ("rmsnorm", "swiglu", "rope"):
        put(
            f"{k}_fwdbwd_eager_worst_vs_best_peer",
            *_over_shapes(df, [f"{k}_fwdbwd_eager"], _vs_best_peer, EAGER_WORST_MIN_BYTES),
        )
    for k in ("rmsnorm", "swiglu", "rope"):
        put(
            f"{k}_device_worst_vs_best_peer",
            *_over_shapes(df, [f"{k}_fwd", f"{k}_fwdbwd"], _vs_best_peer, DEVICE_WORST_MIN_BYTES),
        )
    shape = _shape_str(HEADLINE["rmsnorm"])
    put(
        "rmsnorm_fwdbwd_frac_of_copy",
        _frac_of_copy(at("rmsnorm_fwdbwd", shape, "bfloat16")),
        {"experiment": "rmsnorm_fwdbwd", "shape": shape, "dtype": "bfloat16"},
    )
    put("rmsnorm_fwd_worst_frac_of_copy", *_over_shapes(df, ["rmsnorm_fwd"], _frac_of_copy, COPY_FRAC_MIN_BYTES))
    return out


def write_summary(folder: str | Path, profile: str) -> Path:
    """Write :func:`summary_keys` of the folder's kernel records of ``profile`` to ``<folder>/
    bench_kernels_summary.json`` (``-<profile>`` for other than full), with where each worst case is
    and the commits of the records. :func:`mahia.measure.results.headline` merges these keys into the
    folder's ``summary.json``: the rules live here, beside the experiments they read, and the results
    floor reads only the file."""
    df = results.load_records(folder)
    if not df.empty:
        df = df[(df["notebook"] == "bench_kernels") & (df["profile"] == profile)]
    keys = summary_keys(df, where=True)
    doc = {
        "profile": profile,
        "commits": sorted(set(df["commit"].astype(str))) if not df.empty else [],
        "metrics": {k: v["value"] for k, v in keys.items()},
        "where": {k: {f: v[f] for f in ("experiment", "shape", "dtype") if f in v} for k, v in keys.items()},
    }
    path = files.profile_file(folder, SUMMARY_STEM, profile)
    files.atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    return path


# ------------------------------------------------------------------------------------------- plots


def plot(
    records,
    folder: str | Path,
    *,
    prefix: str = "bench_kernels",
    kernels: Iterable[str] | None = None,
    host: bool = True,
) -> list[Path]:
    """One figure per kernel: rows = dtypes, columns = (fwd, fwd+bwd) x (device, eager time); each panel
    the fraction of the copy ceiling (GB/s on the fewest bytes when no ceiling was known) against the
    input size, a line per variant, and the same-bytes copy as a dashed black line. Plus one figure of
    the host cost (eager per-call time on the tiny tensor). Saved as ``<folder>/<prefix>_<kernel>.png``
    and ``.svg``; returns the paths. ``kernels`` (default all) and ``host`` choose the figures."""
    import pandas as pd

    from mahia.measure import plotting

    plt = plotting.plt

    df = newest_rows(pd.DataFrame(records))
    paths: list[Path] = []
    if df.empty:
        return paths
    colors = plotting.palette_for(df["variant"])  # one colour per variant in every panel and figure
    for kernel in [k for k in KERNELS if kernels is None or k in set(kernels)]:
        sub = df[df["experiment"].isin([f"{kernel}_{p}{s}" for p in PASSES for s in ("", "_eager")])]
        if sub.empty:
            continue
        dts = [d for d in ("bfloat16", "float16", "float32") if (sub["dtype"] == d).any()]
        use_frac = sub["frac_of_limit"].notna().any()
        fig, axes = plt.subplots(len(dts), 4, figsize=(18, 3.6 * len(dts) + 0.8), squeeze=False, sharex=True)
        for i, dt in enumerate(dts):
            dtype = _dtype_of(dt)
            for j, (p, s) in enumerate((("fwd", ""), ("fwd", "_eager"), ("fwdbwd", ""), ("fwdbwd", "_eager"))):
                ax = axes[i, j]
                exp = f"{kernel}_{p}{s}"
                g = sub[(sub["experiment"] == exp) & (sub["dtype"] == dt)].copy()
                if g.empty:
                    ax.set_visible(False)
                    continue
                g["size_mb"] = [input_bytes(kernel, _parse_shape(sh), dtype) / MB for sh in g["shape"]]
                g = g.sort_values("size_mb")
                for name, gv in g[g["median_ms"].notna()].groupby("variant", sort=False):
                    y = gv["frac_of_limit"] if use_frac else gv["gbps"]
                    ax.plot(gv["size_mb"], y, marker="o", ms=3, lw=1, label=name, color=colors[name])
                cp = sub[
                    (sub["experiment"] == f"{kernel}_{p}")
                    & (sub["dtype"] == dt)
                    & (sub["variant"] == "copy_same_bytes")
                ].copy()
                if use_frac and not cp.empty:
                    cp["size_mb"] = [input_bytes(kernel, _parse_shape(sh), dtype) / MB for sh in cp["shape"]]
                    cp = cp.sort_values("size_mb")
                    ax.plot(cp["size_mb"], cp["value"], color="black", ls="--", lw=1, label="copy, same bytes")
                ax.set_xscale("log")
                ax.set_title(f"{kernel} {p} {dt}: {'eager' if s else 'device'} time", fontsize=10)
                if j == 0:
                    ax.set_ylabel("fraction of copy ceiling" if use_frac else "GB/s (fewest bytes)")
                if i == len(dts) - 1:
                    ax.set_xlabel("input size (MB)")
                ax.legend(fontsize=7)
        fig.suptitle(
            f"{kernel}: device time (CUDA graph replay) and eager time (back-to-back calls) "
            f"per variant; {df['device'].iloc[0] if 'device' in df.columns else ''}",
            fontsize=11,
        )
        paths += plotting.save(fig, f"{prefix}_{kernel}", folder)
        plt.close(fig)
    host_rows = df[df["experiment"].str.contains("_host_") & df["median_ms"].notna()]
    if host and not host_rows.empty:
        host = host_rows
        exps = list(dict.fromkeys(host["experiment"]))
        fig, axes = plt.subplots(len(exps), 1, figsize=(7, 1.6 + 1.5 * len(exps)), squeeze=False)
        for ax, exp in zip(axes[:, 0], exps, strict=True):
            g = host[host["experiment"] == exp].copy()
            g["us"] = g["median_ms"] * 1e3
            plotting.bars(
                g.rename(columns={"us": "µs per call"}),
                value="µs per call",
                ax=ax,
                title=f"{exp} {g['shape'].iloc[0]} {g['dtype'].iloc[0]}",
            )
        fig.suptitle("host cost: eager per-call time on a tiny tensor (inputs require grad)", fontsize=10)
        paths += plotting.save(fig, f"{prefix}_host", folder)
        plt.close(fig)
    return paths


def plot_recorded(recorder, parts: Sequence[Part] | None = None) -> list[Path]:
    """:func:`plot` of this commit's and profile's records in the recorder's CSV, into the figures folder
    (``mahia.measure.files.default_figures_dir() / <device slug>``): the figures of ``parts``' kernels
    (default all), each with every dtype recorded so far."""
    import pandas as pd

    from mahia.measure import files

    path = Path(recorder.path)
    if not path.exists():
        return []
    df = pd.read_csv(path, dtype={"shape": str, "dtype": str, "commit": str, "profile": str})
    for col, want in (("commit", getattr(recorder, "commit", None)), ("profile", getattr(recorder, "profile", None))):
        if want is not None and col in df.columns:
            df = df[df[col].astype(str) == str(want)]
    folder = files.default_figures_dir() / recorder.slug
    files.check_writable(folder)
    if parts is None:
        return plot(df, folder)
    return plot(df, folder, kernels={p.kernel for p in parts if p.kernel}, host=any(p.kernel is None for p in parts))


# ------------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mahia.bench.kernels [--part P ...] [--fresh] [--quick] [--device D] [--results-dir R]``:
    this suite alone, with its own options (passed to :func:`run` through ``MAHIA_BENCH_PARTS`` and
    ``MAHIA_BENCH_FRESH`` until ``python -m mahia.bench`` forwards them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m mahia.bench.kernels", add_help=False)
    p.add_argument("--part", action="append", default=None)
    p.add_argument("--fresh", action="store_true")
    own, rest = p.parse_known_args(argv)
    if own.part:
        os.environ["MAHIA_BENCH_PARTS"] = ",".join(own.part)
    if own.fresh:
        os.environ["MAHIA_BENCH_FRESH"] = "1"
    from mahia.bench.__main__ import main as bench_main

    return bench_main(["kernels", *rest])


if __name__ == "__main__":
    sys.exit(main())
