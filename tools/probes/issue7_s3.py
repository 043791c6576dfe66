"""The third session's GPU probe for issue 7: three design changes measured before any notebook adopts them.

    source .whl/env.sh && python3 tools/probes/issue7_s3.py [parts]     # on the lent GPU, ~5 minutes

parts (default all): ``ckpt``, ``dense``, ``swiglu``.

1. ``ckpt``: full activation checkpointing of every block against every block but the last, small
   preset, bf16, batch 64 x 1024 (notebook 07's full size): step time and peak memory. The last block's
   backward runs right after the forward ends, so recomputing it only repeats work; the cost is its
   activations, live while the head runs.
2. ``dense``: the dense-350m training step (8 x 2048, bf16 autocast, torch.compile default, SDPA, fused
   AdamW: notebook 10's MFU run) with head dim 64 (16 heads, the preset) and 128 (8 heads): same
   FLOPs, fewer and larger attention tiles.
3. ``swiglu``: the SwiGLU launcher's (BLOCK, warps) grid against torch.compile at 16384 x 11008 bf16,
   forward and forward + backward, device time (CUDA-graph replay).
It prints a summary last and records nothing in data/.
"""
import sys
import time

import torch

from _probe import Probe
from mahia.measure.timing import bench

dev = torch.device("cuda")
parts = set(sys.argv[1:]) or {"ckpt", "dense", "swiglu"}
p = Probe(dev)
log, ceil, summary = p.log, p.ceil, p.summary
MiB = 2**20

# ---------------------------------------------------------------- 1. checkpointing all blocks but the last
if "ckpt" in parts:
    import functools

    import mahia.model.hybrid as hybrid_mod
    from mahia.model import HybridConfig, HybridModel, SyntheticTokens, make_train_step
    from mahia.model.optimize import run_checkpointed

    cfg = HybridConfig.preset("small").optimized()
    batch = SyntheticTokens(cfg.vocab_size, 1024, seed=0).batch(64, dev)

    def run_ckpt(label, mode, skip_last):
        torch.manual_seed(0)
        model = HybridModel(cfg).to(dev)
        last = model.blocks[-1]

        def patched(fn, *args, mode):
            owner = fn.func.__self__ if isinstance(fn, functools.partial) else fn
            return run_checkpointed(fn, *args, mode=None if (skip_last and owner is last) else mode)

        hybrid_mod.run_checkpointed = patched
        try:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            step = make_train_step(model, opt, amp="bf16", checkpoint=mode)
            step(batch)
            t = bench(lambda: step(batch), rep_ms=1500, warmup_ms=200)
        finally:
            hybrid_mod.run_checkpointed = run_checkpointed
        del model, opt, step
        torch.cuda.empty_cache()
        log(f"ckpt {label:22s} {t}  peak {t.peak_mem_bytes / MiB:,.0f} MiB")
        return t

    res = {}
    for label, mode, skip in (("none", None, False), ("full", "full", False), ("full but last", "full", True),
                              ("none (repeat)", None, False), ("full (repeat)", "full", False),
                              ("full but last (repeat)", "full", True)):
        res[label] = run_ckpt(label, mode, skip)
    for rep in ("", " (repeat)"):
        n = res["none" + rep]
        for k in ("full", "full but last"):
            t = res[k + rep]
            line = (f"ckpt{rep} {k}: overhead {t.median_ms / n.median_ms - 1:+.3f}, "
                    f"saving {1 - t.peak_mem_bytes / n.peak_mem_bytes:.3f} "
                    f"({n.median_ms:.1f} -> {t.median_ms:.1f} ms)")
            log(line)
            summary.append(line)
    p.lap()

# ---------------------------------------------------------------- 2. dense MFU: head dim 64 vs 128
if "dense" in parts:
    from mahia.lessons.full_stack import Stack, build, mfu, tokens_per_s
    from mahia.model import HybridConfig, SyntheticTokens

    stack = Stack(model=("all",), sync_free_logging=True, amp="bf16", compile="default")
    B, T = 8, 2048
    for label, over in (("hd64 (16 heads)", {}), ("hd128 (8 heads)", dict(n_heads=8, n_kv_heads=8))):
        torch.compiler.reset()
        torch.manual_seed(0)
        mcfg = HybridConfig.preset("dense-350m", **over)
        b = build(mcfg, stack, device=dev)
        xb = SyntheticTokens(mcfg.vocab_size, T, seed=0).batch(B, dev)
        t0 = time.perf_counter()
        b.step(xb)
        torch.cuda.synchronize()
        comp_s = time.perf_counter() - t0
        t = bench(lambda: b.step(xb), rep_ms=2000, warmup_ms=300)
        fpt = b.model.flops_per_token(T, causal=True)
        u = mfu(fpt, tokens_per_s(B * T, t), ceil.matmul_bf16_tflops)
        line = f"dense {label}: {t.median_ms:.2f} ms [{t.p20_ms:.2f}-{t.p80_ms:.2f}], MFU {u:.3f} (compile {comp_s:.0f} s)"
        log(line)
        summary.append(line)
        del b, xb
        torch.cuda.empty_cache()
        p.lap()

# ---------------------------------------------------------------- 3. SwiGLU launcher grid vs torch.compile
if "swiglu" in parts:
    from mahia.ops.swiglu import swiglu_bwd_launch, swiglu_fwd_launch
    from mahia.ops.swiglu import swiglu_eager

    M, H = 16384, 11008
    a = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    b = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    dc = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    n = M * H * 2
    comp_f = torch.compile(swiglu_eager, dynamic=False)
    a_g, b_g = a.clone().requires_grad_(), b.clone().requires_grad_()

    def comp_fb():
        a_g.grad = b_g.grad = None
        comp_f(a_g, b_g).backward(dc)

    ref = swiglu_eager(a.double(), b.double())
    fwd = {"torch.compile": lambda: comp_f(a, b)}
    bwd = {"torch.compile (fwd+bwd)": comp_fb}
    for blk in (1024, 2048, 4096, 8192, 16384):
        for w in (4, 8, 16):
            if blk // (32 * w) < 4:  # fewer than 4 elements per thread
                continue
            fwd[f"mahia block {blk} warps {w}"] = lambda blk=blk, w=w: swiglu_fwd_launch(a, b, block=blk, num_warps=w)
            bwd[f"mahia bwd block {blk} warps {w}"] = lambda blk=blk, w=w: swiglu_bwd_launch(dc, a, b, block=blk, num_warps=w)
    for name, fn in fwd.items():
        err = ((fn().double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (name, err)
    rows = []
    for group, fns, nbytes in (("fwd", fwd, 3 * n), ("bwd", bwd, 5 * n)):
        for name, fn in fns.items():
            t = bench(fn, cuda_graph=True, rep_ms=300, memory=False)
            moved = 8 * n if "fwd+bwd" in name else nbytes
            rows.append((group, t.median_ms, name, t.p20_ms, t.p80_ms, moved / t.median_ms / 1e6 / ceil.copy_gbps))
    for group in ("fwd", "bwd"):
        log(f"\nSwiGLU {group} {M}x{H} bf16:")
        for g, med, name, p20, p80, frac in sorted(r for r in rows if r[0] == group):
            log(f"  {med * 1e3:8.1f} us  [{p20 * 1e3:.1f}-{p80 * 1e3:.1f}]  frac {frac:.3f}  {name}")
    best_f = min((r for r in rows if r[0] == "fwd" and "mahia" in r[2]), key=lambda r: r[1])
    cur_f = next(r for r in rows if r[2] == "mahia block 4096 warps 8")
    comp = next(r for r in rows if r[2] == "torch.compile")
    summary.append(f"swiglu fwd: compile {comp[1] * 1e3:.1f} us, current {cur_f[1] * 1e3:.1f} us, "
                   f"best {best_f[2]} {best_f[1] * 1e3:.1f} us")
    best_b = min((r for r in rows if r[0] == "bwd" and "mahia" in r[2]), key=lambda r: r[1])
    cur_b = next(r for r in rows if r[2] == "mahia bwd block 4096 warps 8")
    summary.append(f"swiglu bwd: current {cur_b[1] * 1e3:.1f} us, best {best_b[2]} {best_b[1] * 1e3:.1f} us; "
                   f"compile fwd+bwd {next(r for r in rows if 'fwd+bwd' in r[2])[1] * 1e3:.1f} us")
    p.lap()

p.finish()
