"""MetaAttention's gated linear attention, forward + backward: loop vs log-space vs Triton scan.

``python -m mahia.bench meta``: experiment ``meta_attention_fwdbwd``, ``gated_linear_attention(q, k, v, g)`` and the
backward to q, k, v and g at B=4, H=8, T=2048, K=V=64 on CUDA (``quick`` or the CPU: B=1, H=2, T=256, K=V=32), with
bfloat16 inputs, the dtype a model trains in. Every path does its recurrence math in float32, so the dtype changes
only the bytes read and what the kernels feed their tensor cores.

* ``loop`` (baseline): the recurrence step by step, 2T steps of a few launches; timed on a tiny budget.
* ``logspace`` (peer): chunked PyTorch (pairwise decays inside 16-row chunks, T/16 state steps).
* ``triton`` (optimized): the fused chunked kernels of :mod:`mahia.ops.gla_scan`; skipped, and said so, where
  Triton cannot run (the CPU interpreter's timings would mean nothing).

Each variant's output and four gradients are checked against the float64 loop first; ``rel_err`` is the largest.

Against flash-linear-attention (issue 36), on CUDA where fla-core is installed (skipped, and said so, elsewhere):
experiments ``gla_fwd`` and ``gla_fwdbwd`` at the model's shapes, ``FLA_SHAPES``, bfloat16. The same function on
both sides (fla's ``chunk_gla`` with scale = 1); each side gets its own layout, (B, H, T, K) and fla's (B, T, H, K),
made before timing; both are checked against the float64 log-space path, warmed and timed by ``bench``. The keys'
experiments time CUDA-graph replays: the kernels' device time. fla's eager calls are host-bound on a slow host (the
H100 machine, 2026-12-05: one shape's median moved by up to 3.7x between runs, mahia's fwd+bwd 1.3%), so its eager time,
recorded as ``gla_fwd_eager`` and ``gla_fwdbwd_eager``, judges the host more than the kernels.

fla's first call at these shapes autotunes about 300 Triton configs (240 s of compiling on an H200, 2026-12-03).
The configs its autotuner chose are saved once per GPU model, in ``data/fla/<gpu>.json`` for the same fla and Triton
versions, and put back into fla's autotuners on later runs: the same kernels, without the search. Delete the file
to tune again.
"""

from __future__ import annotations

import datetime
import gc
import json
import time

import torch
import torch.nn.functional as F

from mahia.measure.checks import check_close, tolerance
from mahia.measure.files import REPO_ROOT, atomic_write_text
from mahia.measure.hardware import device_slug
from mahia.measure.timing import bench
from mahia.ops.dispatch import triton_available_for, why_not
from mahia.ops.gla_scan import gated_linear_attention, gla_bytes, gla_flops

__all__ = ["run", "EXPERIMENT"]

EXPERIMENT = "meta_attention_fwdbwd"
VARIANTS = (("loop", "baseline"), ("logspace", "peer"), ("triton", "optimized"))
FLA_SHAPES = ((16, 8, 1024, 64, 64), (8, 16, 2048, 64, 64))  # (B, H, T, K, V) of the small and hybrid presets' steps


def _inputs(B: int, H: int, T: int, K: int, V: int, device: torch.device, dtype: torch.dtype):
    """q, k, v, g as a MetaAttention layer makes them: q scaled by 1/sqrt(K), g = logsigmoid(.) / 16."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, H, T, K, generator=gen) * K**-0.5
    k = torch.randn(B, H, T, K, generator=gen)
    v = torch.randn(B, H, T, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, H, T, K, generator=gen)) / 16.0
    do = torch.randn(B, H, T, V, generator=gen)
    return [t.to(device, dtype) for t in (q, k, v, g)], do.to(device, dtype)


def _fwd_bwd(impl: str, inputs, do):
    leaves = [t.detach().requires_grad_() for t in inputs]

    def fn():
        o = gated_linear_attention(*leaves, impl=impl)
        grads = torch.autograd.grad(o, leaves, do)
        return o, grads

    return fn


def _limit(flops: int, n_bytes: int, ceilings, dtype: torch.dtype) -> str:
    """The roofline ceiling the variant is held to: compute or bandwidth, whichever the intensity hits."""
    compute = "matmul_bf16" if dtype in (torch.bfloat16, torch.float16) else "matmul_fp32"
    ridge = ceilings.limit(compute) * 1e12 / (ceilings.limit("copy") * 1e9)  # FLOP per byte
    return compute if flops / n_bytes >= ridge else "copy"


def run(recorder, ceilings=None, *, quick: bool) -> None:
    dev = recorder.device
    cuda = dev.type == "cuda"
    B, H, T, K, V = (4, 8, 2048, 64, 64) if cuda and not quick else (1, 2, 256, 32, 32)
    dtype = torch.bfloat16
    shape = f"B={B},H={H},T={T},K={K},V={V}"
    inputs, do = _inputs(B, H, T, K, V, dev, dtype)

    # Reference: the float64 loop, once.
    ref_o, ref_grads = _fwd_bwd("loop", [t.double() for t in inputs], do.double())()
    ref = [ref_o, *ref_grads]

    flops = gla_flops(B, H, T, K, V, 16)
    n_bytes = gla_bytes(B, H, T, K, V, element_size=torch.finfo(dtype).bits // 8)
    limit = _limit(flops, n_bytes, ceilings, dtype)
    tol = tolerance(dtype)
    for impl, role in VARIANTS:
        if impl == "triton" and not (triton_available_for(inputs[0]) and cuda):
            reason = why_not(inputs[0]) or "the CPU interpreter is for correctness, not timing"
            print(f"{EXPERIMENT}: triton skipped ({reason})")
            continue
        fn = _fwd_bwd(impl, inputs, do)
        o, grads = fn()
        errs = [
            check_close(f"{EXPERIMENT} {impl} {name}", got, want, tol)
            for name, got, want in zip(("o", "dq", "dk", "dv", "dg"), (o, *grads), ref)
        ]
        del o, grads
        # The loop takes ~2T small launches per call: a tiny budget still gives one or two repetitions.
        budget = dict(warmup_ms=1, rep_ms=1) if impl == "loop" else dict(warmup_ms=25, rep_ms=100 if quick else 300)
        t = bench(fn, device=dev, **budget)
        recorder.timing(
            EXPERIMENT,
            impl,
            role,
            t,
            shape=shape,
            dtype=dtype,
            bytes=n_bytes,
            flops=flops,
            limit=limit,
            rel_err=max(errs),
            notes="forward + backward to q, k, v, g; flops/bytes: chunked algorithm, chunk 16",
        )
    if cuda and triton_available_for(inputs[0]):
        _against_fla(recorder, ceilings, dev, quick=quick)


def _against_fla(recorder, ceilings, dev: torch.device, *, quick: bool) -> None:
    """``gla_fwd`` and ``gla_fwdbwd``: mahia's Triton scan (optimized) against fla's ``chunk_gla`` (peer)."""
    try:
        from fla.ops.gla import chunk_gla
    except ImportError as exc:
        print(f"gla_fwd, gla_fwdbwd: skipped (fla-core: {exc})")
        return
    dtype, tol = torch.bfloat16, tolerance(torch.bfloat16)
    saved = REPO_ROOT / "data" / "fla" / f"{device_slug(dev)}.json"
    tuned = _load_fla_configs(saved)
    for B, H, T, K, V in FLA_SHAPES:
        inputs, do = _inputs(B, H, T, K, V, dev, dtype)
        ref_o, ref_grads = _fwd_bwd("logspace", [t.double() for t in inputs], do.double())()
        mine = [t.detach().requires_grad_() for t in inputs]
        theirs = [t.transpose(1, 2).contiguous().requires_grad_() for t in inputs]  # (B, T, H, K)
        sides = {  # name: (forward, leaves, output gradient, back to (B, H, T, .), role)
            "triton": (lambda m=mine: gated_linear_attention(*m, impl="triton"), mine, do, lambda t: t, "optimized"),
            "fla": (lambda th=theirs: chunk_gla(*th, scale=1.0)[0], theirs, do.transpose(1, 2).contiguous(),
                    lambda t: t.transpose(1, 2), "peer"),
        }  # fmt: skip
        for name, (fwd, leaves, d, back, role) in sides.items():
            t0 = time.perf_counter()
            o = fwd()
            got = [back(t) for t in (o, *torch.autograd.grad(o, leaves, d))]
            err = max(
                check_close(f"gla {name} {x} at B={B},H={H},T={T}", a, b, tol)
                for x, a, b in zip(("o", "dq", "dk", "dv", "dg"), got, (ref_o, *ref_grads))
            )
            del o, got
            if name == "fla" and not tuned:
                print(f"fla: first call at B={B},H={H},T={T}: {time.perf_counter() - t0:.0f} s (autotuning)")
            for exp, fn, backward in (
                ("gla_fwd", fwd, False),
                ("gla_fwdbwd", lambda fwd=fwd, leaves=leaves, d=d: torch.autograd.grad(fwd(), leaves, d), True),
            ):
                n_bytes = gla_bytes(B, H, T, K, V, element_size=2, backward=backward)
                flops = gla_flops(B, H, T, K, V, 16, backward=backward)
                for suffix, graph in (("", True), ("_eager", False)):
                    try:
                        t = bench(fn, device=dev, warmup_ms=25, rep_ms=100 if quick else 300, cuda_graph=graph)
                    except RuntimeError as e:  # not capturable: its eager time only, and the key not measured
                        if not graph:
                            raise
                        print(f"{exp} {name}: {e}")
                        continue
                    recorder.timing(exp + suffix, name, role, t, shape=f"B={B},H={H},T={T},K={K},V={V}", dtype=dtype,
                                    bytes=n_bytes, flops=flops, limit=_limit(flops, n_bytes, ceilings, dtype), rel_err=err,
                                    notes=f"{'CUDA-graph replay' if graph else 'eager calls'}; fla: chunk_gla(scale=1), "
                                    f"(B, T, H, K), {tuned or 'autotuned in this run'}; flops: chunk 16")  # fmt: skip
        del inputs, do, mine, theirs, sides, ref_o, ref_grads  # free this shape before the next
    if not tuned:
        _save_fla_configs(saved)


def _fla_autotuners() -> dict:
    """fla's Triton autotuners by module and kernel name (a ``triton.heuristics`` wrapper's included)."""
    from triton.runtime.autotuner import Autotuner

    return {f"{a.base_fn.__module__}.{a.base_fn.__name__}": a for a in gc.get_objects()
            if issubclass(type(a), Autotuner) and a.base_fn.__module__.startswith("fla.")}  # fmt: skip


def _versions() -> dict:
    import fla
    import triton

    return {"fla": fla.__version__, "triton": triton.__version__}


def _load_fla_configs(path) -> str | None:
    """Put the saved configs into fla's autotuners (their cache: key -> config); a note for the records, or None."""
    import triton

    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    if saved["versions"] != _versions():
        print(f"fla: {path.name} was tuned with {saved['versions']}, this is {_versions()}: autotuning again")
        return None
    tuners = _fla_autotuners()
    for name, entries in saved["kernels"].items():
        for e in entries if name in tuners else ():
            config = triton.Config({})
            config.__dict__.update(e["config"])  # every attribute as this Triton version saved it
            tuners[name].cache[tuple(e["key"])] = config
    return f"fla's own autotuned configs of {saved['date']} (data/fla/{path.name})"


def _save_fla_configs(path) -> None:
    kernels = {}
    for name, tuner in sorted(_fla_autotuners().items()):
        entries = [{"key": list(k), "config": {a: v for a, v in vars(c).items() if a != "pre_hook"}}
                   for k, c in tuner.cache.items()
                   if c.pre_hook is None and all(isinstance(x, (bool, int, float, str, type(None))) for x in k)]  # fmt: skip
        if entries:
            kernels[name] = entries
    doc = {"versions": _versions(), "gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "shapes": FLA_SHAPES, "kernels": kernels}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    print(f"fla: the configs its autotuner chose for {len(kernels)} kernels saved to {path} (commit it)")
