"""The GPU probe behind PERFORMANCE.md's 2026-11-22 entries (issue 7): where the remaining gaps come from.

    source .whl/env.sh && python3 tools/probes/issue7_h200.py      # on the lent GPU, ~2 minutes

1. RMSNorm forward: the launcher's (rows per program, warps) grid against Liger-Kernel, and a persistent
   variant (grid = SMs x k, a strided loop over row blocks, optional evict-first loads) that was tried
   and rejected, at 16384 x {1024, 4096, 8192} bf16, device time (CUDA-graph replay);
2. the MoE layer's grouped forward (16384 tokens, 64 experts, top-2, 1024/2048, bf16): device time per
   kernel, from torch.profiler;
3. training steps of the small and dense-350m presets (bf16): bench time and ``mahia.profile`` reports.
It prints a summary last; it records nothing in data/.
"""

import torch
import triton
import triton.language as tl

from _probe import Probe
from mahia.measure.timing import bench

dev = torch.device("cuda")
p = Probe(dev)
log, ceil, summary = p.log, p.ceil, p.summary

# ---------------------------------------------------------------- RMSNorm forward configs
from mahia.ops.rmsnorm import rms_norm_fwd_launch


@triton.jit
def _fwd_persist(X, W, Y, RSTD, n_rows, n_cols, stride, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 EVICT: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    for b in tl.range(pid, n_blocks, nprog, num_stages=STAGES):
        rows = b * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows = rows.to(tl.int64)
        if EVICT:
            x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * stride + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def persist(x, w, bm, warps, per_sm, evict, stages):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(triton.cdiv(n_rows, bm), sms * per_sm),)
    _fwd_persist[grid](x, w, y, rstd, n_rows, n_cols, x.stride(0), 1e-6, BLOCK_M=bm,
                       BLOCK_N=triton.next_power_of_2(n_cols), EVICT=evict, STAGES=stages, num_warps=warps)
    return y


def rms_ref(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


for (M, N) in ((16384, 4096), (16384, 8192), (16384, 1024)):
    x = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, device=dev, dtype=torch.bfloat16)
    ref = rms_ref(x, w)
    nbytes = 2 * M * N * 2 + M * 4
    variants = {}
    for bm in (1, 2, 4):
        for warps in (4, 8, 16):
            if bm * N > 16384 and warps < 8:
                continue
            variants[f"cur bm{bm} w{warps}"] = (lambda bm=bm, warps=warps: rms_norm_fwd_launch(x, w, None, 1e-6, block_m=bm, num_warps=warps)[0])
    for bm, warps, per_sm, evict, stages in ((1, 8, 4, True, 2), (1, 8, 8, True, 2), (1, 16, 2, True, 2),
                                             (1, 8, 4, False, 2), (2, 16, 2, True, 2), (1, 8, 4, True, 3),
                                             (1, 4, 8, True, 2), (1, 8, 2, True, 1)):
        variants[f"persist bm{bm} w{warps} sm{per_sm} ev{int(evict)} st{stages}"] = (
            lambda a=(bm, warps, per_sm, evict, stages): persist(x, w, *a))
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        variants["liger"] = lambda: LigerRMSNormFunction.apply(x, w, 1e-6)
    except Exception as e:
        log("liger missing", e)
    res = []
    for name, fn in variants.items():
        try:
            got = fn()
            err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            if err > 1e-2:
                log(f"{name}: WRONG err {err}")
                continue
            t = bench(fn, cuda_graph=True, rep_ms=200, memory=False)
            res.append((t.median_ms, name, t.p20_ms, t.p80_ms))
        except Exception as e:
            log(f"{name}: failed {type(e).__name__}: {str(e)[:200]}")
    res.sort()
    log(f"\nRMSNorm fwd {M}x{N} bf16 ({nbytes / 1e6:.0f} MB):")
    for med, name, p20, p80 in res:
        log(f"  {med * 1e3:8.1f} us  [{p20 * 1e3:.1f}-{p80 * 1e3:.1f}]  frac {nbytes / med / 1e6 / ceil.copy_gbps:.3f}  {name}")
    summary.append(f"rmsnorm {M}x{N}: best {res[0][1]} {nbytes / res[0][0] / 1e6 / ceil.copy_gbps:.3f}")
    del x, w, ref
p.lap()

# ---------------------------------------------------------------- MoE grouped forward profile
from mahia.model.moe import MoE

torch.manual_seed(0)
moe = MoE(1024, 2048, 64, 2, impl="grouped", device=dev, dtype=torch.bfloat16)
xm = torch.randn(16384, 1024, device=dev, dtype=torch.bfloat16)
with torch.no_grad():
    for _ in range(3):
        moe(xm)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            moe(xm)
        torch.cuda.synchronize()
log("\nMoE grouped fwd, 16384 tok, 64 experts top-2, 1024/2048, bf16: kernels by device time (per call)")
kern = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        kern[e.name] = kern.get(e.name, 0.0) + e.device_time_total / 5
tot = sum(kern.values())
for name, us in sorted(kern.items(), key=lambda kv: -kv[1])[:20]:
    log(f"  {us:9.1f} us  {us / tot:5.1%}  {name[:110]}")
log(f"  total kernel {tot:.1f} us")
t = bench(lambda: moe(xm), cuda_graph=False, rep_ms=300, memory=False)
log(f"  wall {t}")
summary.append(f"moe fwd kernels {tot:.0f} us, wall {t.median_ms * 1e3:.0f} us")
del moe, xm
p.lap()

# ---------------------------------------------------------------- training-step profiles
from mahia.model import HybridConfig, HybridModel, SyntheticTokens, make_train_step
from mahia.profile import block_parts, profile_step


def prof_step(preset, B, T, amp="bf16", ckpt=None, by_module=True, steps=3):
    cfg = HybridConfig.preset(preset).optimized()
    torch.manual_seed(0)
    with dev:
        model = HybridModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    step = make_train_step(model, opt, amp=amp, checkpoint=ckpt)
    batch = SyntheticTokens(cfg.vocab_size, T, seed=0).batch(B, dev)
    r = profile_step(step, batch, steps=steps, rows=18, modules=block_parts(model) if by_module else None)
    t = bench(lambda: step(batch), rep_ms=500, memory=False)
    log(f"\n== {preset} B={B} T={T} amp={amp} ckpt={ckpt}: bench {t}")
    log(str(r))
    flops = model.flops_per_token(T, causal=True) * B * T
    summary.append(f"{preset} B{B} T{T} ckpt={ckpt}: {t.median_ms:.1f} ms, busy {r.busy:.2f}, "
                   f"MFU {flops / t.median_ms / 1e9 / ceil.matmul_bf16_tflops:.3f}")
    del model, opt, step
    torch.cuda.empty_cache()


for args in (("small", 1, 1024), ("small", 16, 1024), ("small", 16, 1024, "bf16", "full"),
             ("small", 16, 1024, "bf16", "selective")):
    try:
        prof_step(*args)
    except Exception as e:
        log(f"{args}: failed {type(e).__name__}: {e}")
    p.lap()
try:
    prof_step("dense-350m", 8, 2048, by_module=False, steps=2)
except Exception as e:
    log(f"dense: failed {type(e).__name__}: {e}")
p.finish()
