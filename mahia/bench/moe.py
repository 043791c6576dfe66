"""Mixture-of-experts layer: the per-expert loop against the sync-free grouped path.

``python -m mahia.bench moe``. One ``mahia.model.moe.MoE`` layer, top-2 of 64 SwiGLU experts, 16384
tokens, d_model 1024, d_ff 2048, bfloat16 on CUDA (``quick`` or the CPU: 512 tokens, d_model 64, d_ff 96,
8 experts, float32). Two experiments:

* ``moe_fwd``: the forward under ``torch.no_grad()`` (inference), and (variant ``gemms``) the grouped
  path's two grouped matmuls alone on the same routing (``MoE.expert_gemms``): the rest of the layer is
  routing, sorting, the SwiGLU and the combine, measured as ``moe_layer_over_gemms``;
* ``moe_fwdbwd``: forward, then the gradients of x and of the three weights (router, w13, w2).

Variants, with the same weights and input: ``loop`` (baseline: one expert at a time, a host sync per
expert) and ``grouped`` (optimized: one sort, two grouped matmuls, no sync; the notes name the grouped
matmul backend). FLOPs are ``moe_flops`` (expert matmuls and router), 3x for forward + backward.

Correctness first: the grouped output, aux loss and (for ``moe_fwdbwd``) the four gradients are checked
against the loop path in the same dtype before anything is timed; a wrong one raises
``CorrectnessError``. The loop is the reference rather than a float64 run because the routing decision
is taken on bfloat16 logits: a float64 router would send a few near-tie tokens to other experts, which
is a different function, not a rounding error. Both paths share the router code, so they route alike.

A metric ``moe_syncs`` per variant counts host-device syncs in one forward (``mahia.measure.instruments``).
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


def _check(experiment: str, got, want, dtype: torch.dtype) -> float:
    """Largest norm-wise error of the grouped outputs against the loop's; raises if over tolerance."""
    names = ("y", "aux", "dx", "dw_router", "dw13", "dw2")
    return max(
        check_close(f"{experiment}: grouped {n} vs loop", g, w, tolerance(dtype)) for n, g, w in zip(names, got, want)
    )


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
        err = _check(experiment, fns["grouped"](), fns["loop"](), dtype)
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
