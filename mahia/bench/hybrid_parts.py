"""Before/after timings of three MAHIA-X hybrid parts (``python -m mahia.bench hybrid``).

* ``graph_memory_fwd``: GraphDiffusionMemory, ``loop`` (per node, per step) vs ``batched`` (batched write, P^k
  built once and applied as one matmul).
* ``fabric_fwd``: DynamicNeuroFabric over L Linear layers, ``branch`` (a Python ``if`` on every per-sample gate:
  B*L host syncs, one sample at a time) vs ``masked`` (every layer on the whole batch under a tensor mask: no sync,
  but the skipped pairs' FLOPs are spent).
* ``momentum_update``: Titans-style update of L memory weights, ``loop`` (per layer, ``.item()`` on the tensor
  eta/theta/alpha) vs ``foreach`` (multi-tensor ops, no sync).

Each pair is checked against a float64 run of the reference path first. Sizes on CUDA: B=8, T=1024, D=1024, N=64
nodes, k=4 steps, L=8 layers (bfloat16, inference forwards under ``no_grad``), 24 float32 memory layers of
1024 x 1024; ``quick`` or the CPU: tiny sizes in float32.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from mahia.measure.checks import check_close, tolerance
from mahia.measure.instruments import count_syncs
from mahia.measure.timing import bench
from mahia.model.fabric import DynamicNeuroFabric
from mahia.model.memory import GraphDiffusionMemory
from mahia.model.momentum import momentum_update_foreach, momentum_update_loop

__all__ = ["run"]


def _sizes(full: bool) -> dict:
    if full:
        return dict(B=8, T=1024, D=1024, N=64, steps=4, L=8, mem_layers=24, mem_dim=1024)
    return dict(B=2, T=33, D=48, N=8, steps=4, L=5, mem_layers=6, mem_dim=48)


def _time(recorder, experiment: str, fns: dict, errs: dict, notes: str, **record) -> None:
    """Count the syncs of one call of each ``(role, fn)`` of ``fns``, time it and record it."""
    for impl, (role, fn) in fns.items():
        with count_syncs(keep_stack=False) as r:
            fn()
        t = bench(fn, device=recorder.device)
        recorder.timing(
            experiment, impl, role, t, rel_err=errs[impl], notes=f"{notes}; {r.count} sync(s) per call", **record
        )


def _matmul(dtype: torch.dtype) -> str:
    return "matmul_bf16" if dtype in (torch.bfloat16, torch.float16) else "matmul_fp32"


def _threshold_in_gap(g: torch.Tensor, lo: float = 0.3, hi: float = 0.7) -> float:
    """Midpoint of the widest gap between gate values in [lo, hi]: a threshold no gate sits near, so
    the bfloat16 path and its float64 reference switch the same (sample, layer) pairs on."""
    vals = (
        torch.cat([torch.tensor([lo, hi], dtype=torch.float64), g.detach().double().flatten().cpu().clamp(lo, hi)])
        .sort()
        .values
    )  # one sync
    i = int((vals[1:] - vals[:-1]).argmax())
    return float(vals[i] + vals[i + 1]) / 2


def _graph_memory(recorder, s, dev, dtype) -> None:
    B, T, D, N, k = s["B"], s["T"], s["D"], s["N"], s["steps"]
    torch.manual_seed(0)
    ref = GraphDiffusionMemory(D, N, k, 0.5, impl="loop").to(dev, torch.float64)
    with torch.no_grad():
        ref.adj_logits.normal_(std=2.0)  # a non-uniform graph, as after training
    x64 = torch.randn(B, T, D, device=dev, dtype=torch.float64)
    mods = {impl: copy.deepcopy(ref).to(dtype) for impl in ("loop", "batched")}
    mods["batched"].impl = "batched"
    x = x64.to(dtype)
    with torch.no_grad():
        want = ref(x64)
        errs = {impl: check_close(f"graph memory {impl}", m(x), want, tolerance(dtype)) for impl, m in mods.items()}

    # FLOPs of the function (the batched path's count; P^k's N x N products are negligible).
    flops = (
        4 * 2 * B * T * D * D  # write k, v; read q; output projection
        + 2 * N * D * D
        + 2 * 2 * B * N * D * D  # write q of the nodes; read k, v of the nodes
        + 2 * 2 * B * N * T * D  # write scores and weighted sum
        + 2 * B * N * N * D  # apply P^k
        + 2 * 2 * B * T * N * D
    )  # read scores and weighted sum
    fns = {impl: (role, lambda m=mods[impl]: m(x)) for impl, role in (("loop", "baseline"), ("batched", "optimized"))}
    with torch.no_grad():
        record = dict(shape=f"{B}x{T}x{D},N={N},k={k}", dtype=dtype, flops=flops, limit=_matmul(dtype))
        _time(recorder, "graph_memory_fwd", fns, errs, "forward under no_grad", **record)


def _fabric(recorder, s, dev, dtype) -> None:
    B, T, D, L = s["B"], s["T"], s["D"], s["L"]
    torch.manual_seed(0)
    layers64 = nn.ModuleList(nn.Linear(D, D) for _ in range(L)).to(dev, torch.float64)
    fab64 = DynamicNeuroFabric(D, L, impl="branch").to(dev, torch.float64)
    with torch.no_grad():
        fab64.gate.bias.copy_(torch.linspace(-1.0, 1.0, L))  # layers from mostly off to mostly on
    # A per-sample offset gives each sample its own token mean, so gates differ between samples.
    x64 = torch.randn(B, T, D, device=dev, dtype=torch.float64) + torch.randn(B, 1, D, device=dev, dtype=torch.float64)
    layers = copy.deepcopy(layers64).to(dtype)
    fabs = {impl: copy.deepcopy(fab64).to(dtype) for impl in ("branch", "masked")}
    fabs["masked"].impl = "masked"
    x = x64.to(dtype)
    with torch.no_grad():
        g = fabs["masked"].gates(x)
        threshold = _threshold_in_gap(torch.cat([g.flatten(), fab64.gates(x64).flatten()]))
        for f in (fab64, *fabs.values()):
            f.threshold = threshold
        active = (g > threshold).float().mean().item()
        all_off = (g <= threshold).all(dim=0).sum().item()
        want = fab64(x64, layers64)
        errs = {impl: check_close(f"fabric {impl}", f(x, layers), want, tolerance(dtype)) for impl, f in fabs.items()}

    useful = 2 * B * T * D * D * active * L  # FLOPs of the (sample, layer) pairs that are on
    fns = {
        impl: (role, lambda f=fabs[impl]: f(x, layers))
        for impl, role in (("branch", "baseline"), ("masked", "optimized"))
    }
    notes = (
        f"threshold {threshold:.3f}: {active:.0%} of (sample, layer) pairs on, {int(all_off)} layer(s) off for every "
        "sample; flops count the pairs that are on (masked also computes the others)"
    )
    with torch.no_grad():
        record = dict(shape=f"{B}x{T}x{D},L={L}", dtype=dtype, flops=useful, limit=_matmul(dtype))
        _time(recorder, "fabric_fwd", fns, errs, notes, **record)


def _momentum(recorder, s, dev) -> None:
    n, d = s["mem_layers"], s["mem_dim"]
    dtype = torch.float32  # memory weights and their momenta are kept in float32
    torch.manual_seed(0)
    w0 = [torch.randn(d, d, device=dev, dtype=torch.float64) / d**0.5 for _ in range(n)]
    m0 = [torch.randn(d, d, device=dev, dtype=torch.float64) * 1e-2 for _ in range(n)]
    g0 = [torch.randn(d, d, device=dev, dtype=torch.float64) for _ in range(n)]
    # Data-dependent hyper-parameters: 0-dim tensors on the device, as a gate network would emit.
    hyper = [torch.tensor(v, device=dev) for v in (0.9, 1e-2, 1e-3)]

    ref_w, ref_m = [w.clone() for w in w0], [m.clone() for m in m0]
    momentum_update_loop(ref_w, ref_m, g0, *(h.double() for h in hyper))
    grads = [g.to(dtype) for g in g0]
    state, errs = {}, {}
    for impl, update in (("loop", momentum_update_loop), ("foreach", momentum_update_foreach)):
        w, m = [t.to(dtype) for t in w0], [t.to(dtype) for t in m0]
        update(w, m, grads, *hyper)
        errs[impl] = max(
            check_close(f"momentum {impl} weights", torch.stack(w), torch.stack(ref_w), tolerance(dtype)),
            check_close(f"momentum {impl} momenta", torch.stack(m), torch.stack(ref_m), tolerance(dtype)),
        )
        state[impl] = (w, m)

    # Minimum traffic: read w, m, g and write w, m once (the foreach path makes more passes).
    n_bytes = 5 * n * d * d * torch.finfo(dtype).bits // 8
    fns = {
        impl: (role, lambda update=update, w=state[impl][0], m=state[impl][1]: update(w, m, grads, *hyper))
        for impl, update, role in (
            ("loop", momentum_update_loop, "baseline"),
            ("foreach", momentum_update_foreach, "optimized"),
        )
    }
    notes = "eta/theta/alpha as 0-dim device tensors; bytes = one read of w, m, g and one write of w, m"
    _time(recorder, "momentum_update", fns, errs, notes, shape=f"{n}x{d}x{d}", dtype=dtype, bytes=n_bytes, limit="copy")


def run(recorder, ceilings, *, quick: bool) -> None:
    """Check, then time, the three pairs on ``recorder.device``; records go through ``recorder``.

    ``ceilings`` is unused here: the recorder computes the fraction of the ceiling from the bytes or
    FLOPs given with each record.
    """
    dev = torch.device(recorder.device)
    full = dev.type == "cuda" and not quick
    s = _sizes(full)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    _graph_memory(recorder, s, dev, dtype)
    _fabric(recorder, s, dev, dtype)
    _momentum(recorder, s, dev)
