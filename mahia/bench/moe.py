"""Mixture-of-experts layer: the per-expert loop against the sync-free grouped path (``python -m mahia.bench moe``).

One ``mahia.model.moe.MoE`` layer at :data:`FULL` sizes in bfloat16 on CUDA (:data:`QUICK` in float32 on the CPU or
with ``--quick``), variants ``loop`` (baseline: one expert at a time, a host sync per expert) and ``grouped``
(optimized: one sort, two grouped matmuls, no sync), same weights and input:

* ``moe_fwd``: the forward under ``no_grad``, and (variant ``gemms``) the grouped path's two grouped matmuls alone on
  the same routing: the rest of the layer (routing, sort, SwiGLU, combine) is ``moe_layer_over_gemms``;
* ``moe_fwdbwd``: forward, then the gradients of x and of the router, w13 and w2;
* ``moe_syncs``: host-device syncs in one forward.

The grouped outputs, aux loss and gradients are checked against the loop's in the same dtype before timing. The loop
is the reference rather than a float64 run: routing is decided on bfloat16 logits, and a float64 router would send a
few near-tie tokens elsewhere, a different function rather than a rounding error. FLOPs are ``moe_flops``.
"""

from __future__ import annotations

import torch

from mahia.measure.checks import check_close, tolerance
from mahia.measure.instruments import count_syncs
from mahia.measure.timing import bench
from mahia.model.moe import MoE, moe_flops

__all__ = ["run", "FULL", "QUICK"]

FULL = dict(n_tokens=16384, dim=1024, hidden=2048, n_experts=64, top_k=2)
QUICK = dict(n_tokens=512, dim=64, hidden=96, n_experts=8, top_k=2)
VARIANTS = (("loop", "baseline"), ("grouped", "optimized"))


def _layers(sizes: dict, device: torch.device, dtype: torch.dtype) -> dict[str, MoE]:
    torch.manual_seed(0)
    args = (sizes["dim"], sizes["hidden"], sizes["n_experts"], sizes["top_k"])
    loop = MoE(*args, impl="loop", device=device, dtype=dtype)
    grouped = MoE(*args, impl="grouped", device=device, dtype=dtype)
    grouped.load_state_dict(loop.state_dict())
    return {"loop": loop, "grouped": grouped}


def _fwd(moe: MoE, x: torch.Tensor):
    def fn():
        with torch.no_grad():
            return moe(x)

    return fn


def _fwdbwd(moe: MoE, x: torch.Tensor, dy: torch.Tensor):
    leaves = [x.detach().requires_grad_(), *moe.parameters()]

    def fn():
        y, aux = moe(leaves[0])
        grads = torch.autograd.grad([y, aux], leaves, [dy, torch.ones_like(aux)])
        return (y, aux, *grads)

    return fn


def run(recorder, ceilings=None, *, quick: bool) -> None:
    """Record moe_fwd and moe_fwdbwd for both variants, and moe_syncs. ``ceilings`` is not needed
    here: the recorder holds the measured ceilings and relates each timing to ``limit``."""
    dev = recorder.device
    cuda = dev.type == "cuda"
    sizes = FULL if cuda and not quick else QUICK
    dtype = torch.bfloat16 if cuda else torch.float32
    limit = "matmul_bf16" if dtype == torch.bfloat16 else "matmul_fp32"
    N, D, Hd, E, k = (sizes[n] for n in ("n_tokens", "dim", "hidden", "n_experts", "top_k"))
    shape = f"N={N},D={D},H={Hd},E={E},k={k}"
    flops = moe_flops(N, D, Hd, k, E)

    layers = _layers(sizes, dev, dtype)
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(N, D, generator=gen).to(dev, dtype)
    dy = torch.randn(N, D, generator=gen).to(dev, dtype)
    backend = layers["grouped"].backend_for(x)
    stats = layers["loop"].routing_stats(x)
    route_note = (
        f"tokens per expert: cv {stats['cv']:.3f}, max/mean {stats['max_over_mean']:.2f}, "
        f"{stats['empty_experts']} empty"
    )
    print(f"moe: {shape} {dtype}, grouped backend {backend}; {route_note}")

    # Host syncs per forward (on CUDA counted by PyTorch's sync debug mode, elsewhere by op).
    for impl, _role in VARIANTS:
        _fwd(layers[impl], x)()  # warm up first: one-time set-up may sync
        with count_syncs(keep_stack=False) as r:
            _fwd(layers[impl], x)()
        recorder.metric("moe_syncs", impl, r.count, unit="syncs per forward", shape=shape, dtype=dtype, notes=str(r))
        if impl == "grouped" and r.count:
            print(f"moe: WARNING the grouped forward synchronized: {r}")

    for experiment, make, n_flops in (
        ("moe_fwd", lambda m: _fwd(m, x), flops),
        ("moe_fwdbwd", lambda m: _fwdbwd(m, x, dy), 3 * flops),
    ):
        fns = {impl: make(layers[impl]) for impl, _ in VARIANTS}
        names = ("y", "aux", "dx", "dw_router", "dw13", "dw2")
        err = max(  # the largest norm-wise error of the grouped outputs against the loop's; raises over tolerance
            check_close(f"{experiment}: grouped {n} vs loop", g, w, tolerance(dtype))
            for n, g, w in zip(names, fns["grouped"](), fns["loop"]())
        )
        for impl, role in VARIANTS:
            t = bench(fns[impl], device=dev)
            note = "reference for rel_err" if impl == "loop" else f"backend={backend}; rel_err vs loop"
            recorder.timing(
                experiment,
                impl,
                role,
                t,
                shape=shape,
                dtype=dtype,
                flops=n_flops,
                limit=limit,
                rel_err=None if impl == "loop" else err,
                notes=f"{note}; {route_note}",
            )
            print(f"{experiment} {impl}: {t}, {n_flops / t.median_ms / 1e9:.3g} TFLOP/s")
        if experiment == "moe_fwd":  # the grouped forward against its own two GEMMs (moe_layer_over_gemms)
            t = bench(layers["grouped"].expert_gemms(x), device=dev)
            gemm_flops = moe_flops(N, D, Hd, k, E, router=False)
            recorder.timing(
                experiment,
                "gemms",
                "reference",
                t,
                shape=shape,
                dtype=dtype,
                flops=gemm_flops,
                limit=limit,
                notes=f"the grouped path's two grouped matmuls alone; backend={backend}",
            )
            print(f"{experiment} gemms: {t}, {gemm_flops / t.median_ms / 1e9:.3g} TFLOP/s")
