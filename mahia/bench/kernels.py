"""Kernel benchmarks: RMSNorm, SwiGLU, RoPE and the MoE combine (``python -m mahia.bench kernels``).

Variants, each checked against a float64 run of the eager reference on fresh random inputs before it
is timed (a wrong one raises ``CorrectnessError`` and nothing is recorded):

    eager          the readable reference of mahia.layers           role "baseline"
    F.rms_norm     PyTorch's own RMSNorm (RMSNorm only)             role "peer"
    torch.compile  Inductor's fusion of the eager reference         role "peer"  (CUDA only)
    liger          Liger-Kernel, when ``import liger_kernel`` works role "peer"  (CUDA only)
    mahia_triton   mahia.ops                                    role "optimized"

Liger's defaults are kept: its RMSNorm writes dx over dy, its SwiGLU backward writes da, db over the
saved a, b, and its RoPE rotates q and k in place. The timed inputs therefore drift from step to step
(rotations keep their norm; the SwiGLU values may overflow over many steps), which does not change the
work or the bytes of a memory-bound kernel; correctness is checked on fresh inputs first.

On CUDA each variant is timed twice: by replaying a CUDA graph of the step (the device time, the
recorded figure) and launched from Python as usual (in the record's notes). Short fwd+bwd steps are
otherwise dominated by host overhead (autograd, dispatch, Triton's launcher), which says nothing
about the kernels and which a real model hides by running ahead of the GPU or by graphs.

On CUDA each experiment also times a plain ``copy_`` that moves the same bytes (metric
``copy_same_bytes``, as a fraction of the copy ceiling): the ceiling is measured on a 2 GiB copy, and at a
few hundred MB even a copy reaches less of it, which is the honest limit for a kernel of that size.

Bytes are the fewest a kernel must move (each input read once, each output written once):

    rmsnorm_fwd      read x, write y                                  2 MN + N elements
    rmsnorm_fwdbwd   + read x, dy; write dx; read w, write dw        5 MN + 3 N
    swiglu_fwd       read a, b; write c                               3 n
    swiglu_fwdbwd    + read dc, a, b; write da, db                    8 n
    rope_fwdbwd      read q, k; write q, k, twice; + cos/sin twice    4 (|q| + |k|) + 2 T D float32
    moe_combine_fwd  read out (N k, D), write y (N, D); gates, index  N k D + N D + 12 N k bytes
    moe_combine_fwdbwd  + read dy, out; write d_out, d_gates          3 N k D + 2 N D + 28 N k bytes

Sizes on CUDA (bfloat16): RMSNorm 16384 x 4096, SwiGLU 16384 x 11008, RoPE B=8 T=2048 Hq=32 Hkv=8
D=128, the MoE combine N=16384 tokens, k=2, D=1024 (notebook 08's layer), and an RMSNorm forward sweep over hidden sizes 512 .. 16384 at 2^26 elements each. ``quick``
on the CPU uses tiny shapes and runs only eager, F.rms_norm and (under TRITON_INTERPRET=1, as a smoke
test, not a performance figure) mahia_triton.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

from mahia import ops
from mahia.measure.checks import compare_fn, tolerance
from mahia.ops.swiglu import swiglu_eager
from mahia.ops.rmsnorm import rms_norm_eager
from mahia.layers.rope import RotaryCache
from mahia.ops.rope import apply_rope_eager
from mahia.ops.moe_combine import moe_combine_eager
from mahia.measure.timing import bench

__all__ = ["run", "min_bytes"]

EPS = 1e-6
ROLE = {"eager": "baseline", "F.rms_norm": "peer", "torch.compile": "peer", "liger": "peer",
        "mahia_triton": "optimized"}


@dataclass
class Variant:
    name: str
    fn: Callable
    # Converts mahia's inputs to the variant's (done once, outside the timed region).
    adapt: Callable[[tuple], tuple] = lambda inputs: inputs
    notes: str = ""


# ----------------------------------------------------------------------------------------- peers

def _liger_ops():
    """Liger-Kernel's autograd functions, or None when it does not import (the reason is printed)."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception as exc:  # not installed, or built for another torch/triton
        print(f"  liger: skipped ({type(exc).__name__}: {exc})")
        return None
    return SimpleNamespace(rms_norm=LigerRMSNormFunction, swiglu=LigerSiLUMulFunction, rope=LigerRopeFunction)


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


def _variants(op: str, eager: Callable, mahia: Callable, dev: torch.device, liger) -> list[Variant]:
    out = [Variant("eager", eager)]
    if op == "rms_norm" and hasattr(F, "rms_norm"):  # torch >= 2.4
        out.append(Variant("F.rms_norm", lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)))
    if dev.type == "cuda":
        out.append(Variant("torch.compile", torch.compile(eager, dynamic=False)))
        if liger is not None:
            if op == "rms_norm":
                out.append(Variant("liger", lambda x, w: liger.rms_norm.apply(x, w, EPS),
                                   notes="casting_mode=llama, in_place=True (defaults)"))
            elif op == "swiglu":
                out.append(Variant("liger", liger.swiglu.apply, notes="backward overwrites a, b (default)"))
            elif op == "rope":
                fn, adapt = _liger_rope(liger.rope)
                out.append(Variant("liger", fn, adapt, notes="rotates q, k in place; cos/sin (T, D)"))
    if ops.triton_available_for(torch.empty(0, device=dev)):
        notes = "" if dev.type == "cuda" else "TRITON_INTERPRET=1: CPU interpreter, not a performance figure"
        out.append(Variant("mahia_triton", mahia, notes=notes))
    else:
        print(f"  mahia_triton: skipped ({ops.status()[op]})")
    return out


# ------------------------------------------------------------------------------------ bytes

def min_bytes(experiment: str, shape, dtype: torch.dtype) -> int:
    """The fewest bytes of ``experiment`` (table in the module docstring); shape (M, N) for RMSNorm
    and SwiGLU, (B, T, Hq, Hkv, D) for RoPE, (N, k, D) for the MoE combine (float32 gates, int64 index)."""
    es = torch.empty(0, dtype=dtype).element_size()
    if experiment.startswith("moe_combine"):
        N, k, D = shape
        fwd = (N * k * D + N * D) * es + N * k * (4 + 8)
        return fwd if experiment == "moe_combine_fwd" else 2 * fwd + N * k * D * es + N * k * 4  # + d_out, d_gates
    if experiment.startswith("rope"):
        B, T, Hq, Hkv, D = shape
        return 4 * B * T * (Hq + Hkv) * D * es + 2 * T * D * 4  # cos/sin tables are float32
    M, N = shape
    per_element = {"rmsnorm_fwd": 2, "rmsnorm_fwd_sweep": 2, "rmsnorm_fwdbwd": 5,
                   "swiglu_fwd": 3, "swiglu_fwdbwd": 8}[experiment]
    weight = {"rmsnorm_fwd": N, "rmsnorm_fwd_sweep": N, "rmsnorm_fwdbwd": 3 * N}.get(experiment, 0)
    return (per_element * M * N + weight) * es


# ------------------------------------------------------------------------------------ measuring

def _measure(recorder, experiment: str, variants: list[Variant], make_inputs: Callable, reference: Callable,
             *, backward: bool, grad_inputs: list[int], nbytes: float, shape, dtype) -> None:
    """Check, then time each variant: forward only, or forward + backward with fixed output grads."""
    tol = tolerance(dtype)
    for v in variants:
        # Correct first, on fresh inputs (compare_fn upcasts them to float64 for the reference).
        cmp = compare_fn(lambda *a: v.fn(*v.adapt(a)), reference, make_inputs(), grads=backward,
                         grad_inputs=grad_inputs, tol=tol, name=f"{experiment} {v.name}")
        inputs = v.adapt(make_inputs())
        if backward:
            leaves = [inputs[i] for i in grad_inputs]
            for t in leaves:
                t.requires_grad_(True)
            with torch.no_grad():
                outs = v.fn(*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.randn_like(o) for o in outs]

            def step(v=v, inputs=inputs, leaves=leaves, grads=grads):
                for t in leaves:
                    t.grad = None
                outs = v.fn(*inputs)
                torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)
        else:
            def step(v=v, inputs=inputs):
                v.fn(*inputs)
        notes = v.notes
        if recorder.device.type == "cuda":
            # Device time (graph replay) is what the kernels cost the GPU; the eager-launched time
            # adds this host's Python/dispatch/launch overhead, which a model hides by running
            # ahead. Both are kept: the first as the figure, the second in the notes.
            launched = bench(step, device=recorder.device)
            timing = bench(step, device=recorder.device, cuda_graph=True)
            notes = "; ".join(filter(None, [f"device time (CUDA graph replay); launched from Python: "
                                            f"{launched.median_ms:.4f} ms", v.notes]))
        else:
            timing = bench(step, device=recorder.device)
        recorder.timing(experiment, v.name, ROLE[v.name], timing, shape=shape, dtype=dtype, bytes=nbytes,
                        limit="copy", rel_err=cmp.max_error, notes=notes)
        print(f"  {experiment:18s} {v.name:14s} {timing.median_ms:8.4f} ms  "
              f"{nbytes / timing.median_ms / 1e6:8.1f} GB/s  rel err {cmp.max_error:.1e}  ({notes})")
    if recorder.device.type == "cuda":
        _copy_of_same_bytes(recorder, experiment, nbytes, shape, dtype)


def _copy_of_same_bytes(recorder, experiment: str, nbytes: int, shape, dtype) -> None:
    """Time a plain copy that moves ``nbytes`` (half read, half written) and record its GB/s as a
    fraction of the measured copy ceiling: the limit at *this* size. The ceiling is measured on a 2 GiB
    copy; a smaller one loses its ramp-up and its last partial wave, so a kernel that moves a few
    hundred MB cannot reach 1.0 of the ceiling either (notebook 00's copy sweep)."""
    n = max(1, int(nbytes) // 8)  # float32 elements per side: half the bytes read, half written
    src = torch.empty(n, device=recorder.device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    # Launched, as the ceiling is measured: captured in a CUDA graph, copy_ becomes a memcpy node that
    # the copy engines run, at about 2/3 of the SMs' rate on an H200.
    t = bench(lambda: dst.copy_(src), device=recorder.device)
    moved = 2 * n * 4  # bytes
    gbps = moved / t.median_ms / 1e6
    frac = gbps / recorder.ceilings.copy_gbps if recorder.ceilings else float("nan")
    recorder.metric(experiment, "copy_same_bytes", frac, unit="fraction of the copy ceiling", shape=shape,
                    dtype=dtype, notes=f"torch copy_ of {moved / 1e6:.0f} MB moved, device time "
                                       f"{t.median_ms:.4f} ms: the copy limit at this size")
    print(f"  {experiment:18s} {'copy, same MB':14s} {t.median_ms:8.4f} ms  {gbps:8.1f} GB/s  "
          f"= {frac:.3f} of the copy ceiling")


def _randn(*shape, dev, dtype, scale=1.0, shift=0.0):
    return torch.randn(*shape, device=dev, dtype=dtype) * scale + shift


def run(recorder, ceilings, *, quick: bool) -> None:
    """Benchmark the kernels on ``recorder.device`` and record one row per variant and size.

    ``ceilings`` (mahia.measure.hardware.Ceilings) is what ``recorder`` divides achieved GB/s by; the copy
    bandwidth is printed here for the reader.
    """
    dev = torch.device(recorder.device)
    if dev.type != "cuda" and not quick:
        print("kernels: skipped: these are GPU kernels; on the CPU run with --quick (tiny shapes, smoke test)")
        return
    full = dev.type == "cuda" and not quick
    dtype = torch.bfloat16
    copy_gbps = getattr(ceilings, "copy_gbps", None)
    if copy_gbps:
        print(f"  measured copy bandwidth: {copy_gbps:,.0f} GB/s")
    liger = _liger_ops() if dev.type == "cuda" else None

    # -- RMSNorm: forward, forward + backward ----------------------------------------------------
    M, N = (16384, 4096) if full else (64, 1000)
    rms = _variants("rms_norm", rms_norm_eager, ops.rms_norm, dev, liger)

    def rms_inputs(M=M, N=N):
        # weights near 1, as after init: keeps in-place peers' iterated gradients bounded
        return _randn(M, N, dev=dev, dtype=dtype), _randn(N, dev=dev, dtype=dtype, scale=0.1, shift=1.0)

    _measure(recorder, "rmsnorm_fwd", rms, rms_inputs, rms_norm_eager, backward=False, grad_inputs=[0, 1],
             nbytes=min_bytes("rmsnorm_fwd", (M, N), dtype), shape=(M, N), dtype=dtype)
    _measure(recorder, "rmsnorm_fwdbwd", rms, rms_inputs, rms_norm_eager, backward=True, grad_inputs=[0, 1],
             nbytes=min_bytes("rmsnorm_fwdbwd", (M, N), dtype), shape=(M, N), dtype=dtype)

    # -- SwiGLU -----------------------------------------------------------------------------------
    M, H = (16384, 11008) if full else (64, 1000)
    swi = _variants("swiglu", swiglu_eager, ops.swiglu, dev, liger)

    def swi_inputs():
        return _randn(M, H, dev=dev, dtype=dtype), _randn(M, H, dev=dev, dtype=dtype)

    _measure(recorder, "swiglu_fwd", swi, swi_inputs, swiglu_eager, backward=False, grad_inputs=[0, 1],
             nbytes=min_bytes("swiglu_fwd", (M, H), dtype), shape=(M, H), dtype=dtype)
    _measure(recorder, "swiglu_fwdbwd", swi, swi_inputs, swiglu_eager, backward=True, grad_inputs=[0, 1],
             nbytes=min_bytes("swiglu_fwdbwd", (M, H), dtype), shape=(M, H), dtype=dtype)

    # -- RoPE: forward + backward -----------------------------------------------------------------
    B, T, Hq, Hkv, D = (8, 2048, 32, 8, 128) if full else (2, 16, 4, 2, 32)
    cache = RotaryCache(D, T, device=dev)
    rope = _variants("rope", apply_rope_eager, ops.rope, dev, liger)

    def rope_inputs():
        cos, sin = cache.get(T)
        return _randn(B, T, Hq, D, dev=dev, dtype=dtype), _randn(B, T, Hkv, D, dev=dev, dtype=dtype), cos, sin

    _measure(recorder, "rope_fwdbwd", rope, rope_inputs, apply_rope_eager, backward=True, grad_inputs=[0, 1],
             nbytes=min_bytes("rope_fwdbwd", (B, T, Hq, Hkv, D), dtype),
             shape=(B, T, Hq, Hkv, D), dtype=dtype)

    # -- MoE combine: each token's k expert rows gathered, gated and summed ------------------------
    N, k, D = (16384, 2, 1024) if full else (64, 2, 100)
    comb = _variants("moe_combine", moe_combine_eager, ops.moe_combine, dev, liger)

    def comb_inputs():
        inverse = torch.randperm(N * k, device=dev)  # where each (token, slot) sits in expert order
        gates = torch.rand(N, k, device=dev).softmax(-1)  # float32, as the router makes them
        return _randn(N * k, D, dev=dev, dtype=dtype), inverse, gates

    for experiment, backward in (("moe_combine_fwd", False), ("moe_combine_fwdbwd", True)):
        _measure(recorder, experiment, comb, comb_inputs, moe_combine_eager, backward=backward,
                 grad_inputs=[0, 2], nbytes=min_bytes(experiment, (N, k, D), dtype), shape=(N, k, D),
                 dtype=dtype)

    # -- RMSNorm forward over hidden sizes ----------------------------------------------------------
    sizes = [512, 1024, 2048, 4096, 8192, 16384] if full else [128, 1000]
    total = 2**26 if full else 2**14
    for N in sizes:
        M = total // N
        variants = _variants("rms_norm", rms_norm_eager, ops.rms_norm, dev, liger)
        _measure(recorder, "rmsnorm_fwd_sweep", variants, lambda M=M, N=N: rms_inputs(M, N), rms_norm_eager,
                 backward=False, grad_inputs=[0, 1], nbytes=min_bytes("rmsnorm_fwd_sweep", (M, N), dtype),
                 shape=(M, N), dtype=dtype)
