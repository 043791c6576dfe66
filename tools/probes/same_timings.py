"""Do two checkouts' kernels take the same device time? (a refactor must not move the headline timings)

    source .whl/env.sh
    PYTHONPATH=<old checkout> python3 tools/probes/same_timings.py old $OUT/old.json   # on the lent GPU
    PYTHONPATH=<new checkout> python3 tools/probes/same_timings.py new $OUT/new.json
    python3 tools/probes/same_timings.py compare $OUT/old.json $OUT/new.json

Times mahia's RMSNorm, SwiGLU, RoPE and MoE combine (forward, and forward + backward) at the
benchmark's headline shapes in bfloat16: device time by CUDA-graph replay, median of 7 rounds of
``triton.testing.do_bench_cudagraph`` (which replays a graph of 20 calls and so hides host launch),
each round on fresh inputs. It imports the ops through whichever layout the checkout has (``mahia.ops``,
or ``mahia.kernels`` before the layout change), so the same script measures both. ``compare`` prints
new/old per experiment with the spread of each (p20-p80 of the rounds): a ratio inside the spreads is
noise. Records nothing in data/.
"""

import json
import statistics
import sys


def _ops():
    try:
        from mahia import ops  # the layout with mahia/ops
    except ImportError:
        from mahia import kernels as ops  # before it
    return ops


def measure(out_path: str) -> None:
    import torch
    import triton

    ops = _ops()
    dev, dt = torch.device("cuda"), torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, device=dev, dtype=dt)

    def rms():
        x, w = rnd(16384, 4096), 1 + 0.1 * rnd(4096)
        return ops.rms_norm, (x, w)

    def swi():
        return ops.swiglu, (rnd(16384, 11008), rnd(16384, 11008))

    def rope():
        T, D = 2048, 128
        ang = torch.outer(
            torch.arange(T, device=dev, dtype=torch.float32),
            10000.0 ** (-torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D),
        )
        return ops.rope, (rnd(8, T, 32, D), rnd(8, T, 8, D), ang.cos(), ang.sin())

    def comb():
        N, k, D = 16384, 2, 1024
        return ops.moe_combine, (
            rnd(N * k, D),
            torch.randperm(N * k, device=dev),
            torch.rand(N, k, device=dev).softmax(-1),
        )

    results = {}
    for name, make, grad_idx in (
        ("rmsnorm", rms, (0, 1)),
        ("swiglu", swi, (0, 1)),
        ("rope", rope, (0, 1)),
        ("moe_combine", comb, (0, 2)),
    ):
        for backward in (False, True):
            rounds = []
            for _ in range(7):
                fn, args = make()
                if backward:
                    for i in grad_idx:
                        args[i].requires_grad_(True)
                    with torch.no_grad():  # shapes only: a graph kept from here would tie the leaves to this stream
                        outs = fn(*args)
                    outs = outs if isinstance(outs, tuple) else (outs,)
                    grads = [torch.randn_like(o) for o in outs]

                    def step(fn=fn, args=args, grads=grads, grad_idx=grad_idx):
                        for i in grad_idx:
                            args[i].grad = None
                        o = fn(*args)
                        torch.autograd.backward(o if isinstance(o, tuple) else (o,), grads)
                else:

                    def step(fn=fn, args=args):
                        with torch.no_grad():
                            fn(*args)

                rounds.append(triton.testing.do_bench_cudagraph(step, rep=50))
            key = f"{name}_{'fwdbwd' if backward else 'fwd'}"
            q = statistics.quantiles(rounds, n=5)
            results[key] = {"median_ms": statistics.median(rounds), "p20": q[0], "p80": q[3]}
            print(f"{key:20s} {results[key]['median_ms']:.4f} ms [{q[0]:.4f}, {q[3]:.4f}]", flush=True)
    results["_device"] = torch.cuda.get_device_name()
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


def compare(old_path: str, new_path: str) -> None:
    old, new = json.load(open(old_path)), json.load(open(new_path))
    print(f"device: {new.get('_device')}")
    print(f"{'experiment':20s} {'old ms [p20, p80]':>28s} {'new ms [p20, p80]':>28s}  new/old  within spread")
    for key in (k for k in old if not k.startswith("_")):
        o, n = old[key], new[key]
        overlap = n["p20"] <= o["p80"] and o["p20"] <= n["p80"]
        print(
            f"{key:20s} {o['median_ms']:8.4f} [{o['p20']:.4f}, {o['p80']:.4f}] "
            f"{n['median_ms']:8.4f} [{n['p20']:.4f}, {n['p80']:.4f}]  {n['median_ms'] / o['median_ms']:6.3f}  "
            f"{'yes' if overlap else 'NO'}"
        )


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        measure(sys.argv[2])
