"""GPU probe for the fused MoE combine (``mahia.ops.moe_combine``): is it right, is it at the copy roof,
and what does it buy the MoE layer.

    source .whl/env.sh && python3 tools/probes/moe_combine.py      # on the lent GPU (H200), ~1 minute
    TRITON_INTERPRET=1 python tools/probes/moe_combine.py           # no GPU: a smoke test of the script

The combine is the grouped MoE path's last step: y[n] = sum_j g[n, j] * out[inverse[n*k + j]]. At the
canonical size (bf16, N=16384 tokens, k=2, D=1024; routing from a real MoE(1024, 2048, 64, 2) router,
out = randn(N*k, D)):

1. correctness: the fused output and both gradients (d_out, d_gates) against the float64 eager
   reference, norm-wise relative error <= mahia.measure.checks.tolerance(bf16);
2. device time (CUDA-graph replay) of the eager reference (gather, gate multiply, k-sum) and the fused
   kernel, forward and forward + backward: median, p20-p80, GB/s of the compulsory bytes and the
   fraction of the measured copy ceiling; then a small sweep of the launchers' (BLOCK_T, BLOCK_D, warps)
   against the default rule (``_config``);
3. the whole MoE layer's forward under no_grad (eager and CUDA graph) with the fused combine and with
   ``mahia.ops.moe_combine`` monkeypatched to the eager reference, and the loop path once: the
   grouped / loop speedup before and after.
It prints a summary last; it records nothing in data/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, if mahia is not installed

import torch  # noqa: E402
from _probe import Probe  # noqa: E402

import mahia.ops  # noqa: E402
from mahia.measure.checks import rel_error, tolerance  # noqa: E402
from mahia.measure.timing import bench  # noqa: E402
from mahia.model.moe import MoE
from mahia.ops.moe_combine import (  # noqa: E402
    _config,
    moe_combine_bwd_launch,
    moe_combine_eager,  # noqa: E402
    moe_combine_fwd_launch,
)

# Without a GPU it runs as a smoke test of this script only (TRITON_INTERPRET=1, tiny sizes, CPU "timings").
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SMOKE = dev.type != "cuda"
p = Probe(dev)
log, ceil, summary = p.log, p.ceil, p.summary

# ---------------------------------------------------------------- routing of a real layer
N, D, H, E, K = (16384, 1024, 2048, 64, 2) if not SMOKE else (64, 96, 64, 8, 2)
dt = torch.bfloat16
torch.manual_seed(0)
moe = MoE(D, H, E, K, impl="grouped", device=dev, dtype=dt)
x = torch.randn(N, D, device=dev, dtype=dt)
with torch.no_grad():
    _probs, experts, gates = moe._route(x)  # gates (N, k) float32
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(N * K, device=dev))
out = torch.randn(N * K, D, device=dev, dtype=dt)
dy = torch.randn(N, D, device=dev, dtype=dt)
gates = gates.contiguous()
log(f"combine: N={N} k={K} D={D} {dt}, gates {gates.dtype}; routing of MoE({D}, {H}, {E}, {K})")

# ---------------------------------------------------------------- 1. correctness
tol = tolerance(dt)
o_f = out.detach().clone().requires_grad_(True)
g_f = gates.detach().clone().requires_grad_(True)
y_f = mahia.ops.moe_combine(o_f, inverse, g_f, dt)
y_f.backward(dy)
o_64 = out.detach().double().requires_grad_(True)
g_64 = gates.detach().double().requires_grad_(True)
y_64 = moe_combine_eager(o_64, inverse, g_64, torch.float64)
y_64.backward(dy.double())
errs = {"y": rel_error(y_f, y_64), "d_out": rel_error(o_f.grad, o_64.grad), "d_gates": rel_error(g_f.grad, g_64.grad)}
o_e = out.detach().clone().requires_grad_(True)
g_e = gates.detach().clone().requires_grad_(True)
y_e = moe_combine_eager(o_e, inverse, g_e, dt)
y_e.backward(dy)
errs_eager = {
    "y": rel_error(y_e, y_64),
    "d_out": rel_error(o_e.grad, o_64.grad),
    "d_gates": rel_error(g_e.grad, g_64.grad),
}
ok = all(e <= tol for e in errs.values())
log(
    f"\n1. correctness vs float64 (tol {tol:.0e}): fused "
    + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
    + f" -> {'OK' if ok else 'WRONG'};  eager bf16 "
    + ", ".join(f"{k} {v:.2e}" for k, v in errs_eager.items())
)
summary.append(f"correct: {'OK' if ok else 'WRONG'} (" + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) + ")")
del o_64, g_64, y_64, o_f, g_f, y_f, o_e, g_e, y_e

# ---------------------------------------------------------------- 2. kernel time
s_o, s_g, s_i = out.element_size(), gates.element_size(), inverse.element_size()
bytes_fwd = N * K * D * s_o + N * K * (s_g + s_i) + N * D * s_o  # read out, gates, inverse; write y
bytes_bwd = N * D * s_o + 2 * N * K * D * s_o + N * K * (2 * s_g + s_i)  # dy, out, g, inverse; d_out, d_g
bytes_fb = bytes_fwd + bytes_bwd
log(
    f"\n2. device time (CUDA graph); compulsory bytes: fwd {bytes_fwd / 1e6:.1f} MB, "
    f"fwd+bwd {bytes_fb / 1e6:.1f} MB; default configs (KP, BLOCK_T, BLOCK_D, warps): fwd {_config(N, K, D, 4096)}, bwd {_config(N, K, D, 2048)}"
)
o_req = out.detach().clone().requires_grad_(True)
g_req = gates.detach().clone().requires_grad_(True)


def fwd(fn):
    def run():
        with torch.no_grad():
            return fn(out, inverse, gates, dt)

    return run


def fwdbwd(fn, o_req=o_req, g_req=g_req):
    def run():
        y = fn(o_req, inverse, g_req, dt)
        return torch.autograd.grad(y, (o_req, g_req), dy)

    return run


def row(label, t, nbytes):
    gbps = nbytes / (t.median_ms * 1e-3) / 1e9
    log(
        f"  {t.median_ms * 1e3:8.1f} us  [{t.p20_ms * 1e3:.1f}-{t.p80_ms * 1e3:.1f}]  {gbps:6.0f} GB/s  "
        f"frac {gbps / ceil.copy_gbps:.3f}  {label}"
    )
    return t.median_ms * 1e3, gbps / ceil.copy_gbps


kt = {}
for name, fn in (("eager", moe_combine_eager), ("fused", mahia.ops.moe_combine)):
    kt[name, "fwd"] = row(f"{name} fwd", bench(fwd(fn), cuda_graph=True, memory=False), bytes_fwd)
for name, fn in (("eager", moe_combine_eager), ("fused", mahia.ops.moe_combine)):
    kt[name, "fwdbwd"] = row(f"{name} fwd+bwd", bench(fwdbwd(fn), cuda_graph=True, memory=False), bytes_fb)
for what in ("fwd", "fwdbwd"):
    (e_us, _), (f_us, f_frac) = kt["eager", what], kt["fused", what]
    summary.append(
        f"combine {what}: eager {e_us:.1f} us, fused {f_us:.1f} us ({e_us / f_us:.2f}x), fused at {f_frac:.2f} of copy"
    )
p.lap()

# launcher configs: forward alone and backward alone (gate gradient on), against the default
log("  launcher sweep (BLOCK_T, BLOCK_D, warps):")
configs = [None, (1, 1024, 4), (1, 1024, 8), (2, 1024, 4), (4, 1024, 8), (2, 512, 4), (8, 256, 8)]
if SMOKE:
    configs = configs[:2]
bytes_bwd_only = bytes_bwd
sweep = {"fwd": [], "bwd": []}
for cfg in configs:
    kw = {} if cfg is None else dict(block_t=cfg[0], block_d=cfg[1], num_warps=cfg[2])
    label = "default" if cfg is None else str(cfg)
    try:
        t = bench(lambda kw=kw: moe_combine_fwd_launch(out, inverse, gates, dt, **kw), cuda_graph=True, memory=False)
        sweep["fwd"].append((t.median_ms, label))
        row(f"fwd {label}", t, bytes_fwd)
        t = bench(
            lambda kw=kw: moe_combine_bwd_launch(dy, out, inverse, gates, True, **kw), cuda_graph=True, memory=False
        )
        sweep["bwd"].append((t.median_ms, label))
        row(f"bwd {label}", t, bytes_bwd_only)
    except Exception as e:  # a config the compiler rejects (registers, shared memory)
        log(f"  {label}: failed {type(e).__name__}: {str(e)[:160]}")
for what, nbytes in (("fwd", bytes_fwd), ("bwd", bytes_bwd_only)):
    res = sorted(sweep[what])
    if res:
        default = dict((lbl, ms) for ms, lbl in res).get("default", float("nan"))
        summary.append(
            f"launcher {what}: best {res[0][1]} {res[0][0] * 1e3:.1f} us "
            f"({nbytes / res[0][0] / 1e6 / ceil.copy_gbps:.2f} of copy), default {default * 1e3:.1f} us"
        )
del o_req, g_req
p.lap()

# ---------------------------------------------------------------- 3. the whole layer's forward
log(f"\n3. MoE({D}, {H}, {E}, {K}) forward under no_grad, {N} tokens, {dt}; backend {moe.backend_for(x)}")


def layer_fwd(m):
    def run():
        with torch.no_grad():
            return m(x)

    return run


def layer_time(m, graph):
    try:
        return bench(layer_fwd(m), cuda_graph=graph, memory=False).median_ms
    except Exception as e:
        log(f"  cuda_graph={graph}: failed {type(e).__name__}: {str(e)[:160]}")
        return float("nan")


with torch.no_grad():
    y_fused = moe(x)[0]
lt = {}
for graph in (False, True):
    lt["fused", graph] = layer_time(moe, graph)
fused_fn = mahia.ops.moe_combine
mahia.ops.moe_combine = moe_combine_eager  # the grouped path looks it up at call time
try:
    with torch.no_grad():
        y_eager = moe(x)[0]
    for graph in (False, True):
        lt["eager", graph] = layer_time(moe, graph)
finally:
    mahia.ops.moe_combine = fused_fn
loop = MoE(D, H, E, K, impl="loop", device=dev, dtype=dt)
loop.load_state_dict(moe.state_dict())
with torch.no_grad():
    y_loop = loop(x)[0]
t_loop = layer_time(loop, False)
log(f"  y: fused vs eager combine {rel_error(y_fused, y_eager):.2e}, grouped vs loop {rel_error(y_fused, y_loop):.2e}")
for graph in (False, True):
    e, f = lt["eager", graph] * 1e3, lt["fused", graph] * 1e3
    log(f"  cuda_graph={graph!s:5}: eager combine {e:8.1f} us, fused {f:8.1f} us, saved {e - f:6.1f} us ({e / f:.3f}x)")
log(f"  loop (cuda_graph=False): {t_loop * 1e3:.1f} us")
before, after = t_loop / lt["eager", False], t_loop / lt["fused", False]
log(f"  grouped / loop speedup (no graph): before {before:.2f}x, after {after:.2f}x")
summary.append(
    f"layer fwd: eager combine {lt['eager', False] * 1e3:.0f} us -> fused "
    f"{lt['fused', False] * 1e3:.0f} us (graph {lt['eager', True] * 1e3:.0f} -> "
    f"{lt['fused', True] * 1e3:.0f} us); loop {t_loop * 1e3:.0f} us; "
    f"speedup vs loop {before:.2f}x -> {after:.2f}x"
)
p.finish()
