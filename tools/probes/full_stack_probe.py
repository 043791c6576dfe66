"""Issue 14 probe: where the full stack's time goes at real size, before changing anything (GPU only).

    python tools/probes/full_stack_probe.py attn moe ckpt ladder     # eager parts, minutes
    python tools/probes/full_stack_probe.py dense                    # compiled dense model vs PlainGPT

* attn: SDPA forward+backward per backend at the dense preset's attention shape (8 x 16 x 2048 x 64,
  causal, bf16), TFLOP/s (causal counted once).
* moe: the MoE layer of notebook 08 (16384 tokens, D 1024, H 2048, E 64, top-2, bf16): forward, its two
  grouped GEMMs alone, forward+backward; the forward's kernels by device time (torch.profiler).
* ckpt: notebook 07's full-profile step (preset small, 64 x 1024, bf16): none, full, selective and
  "full but keep the attention output" policies: step time and peak memory.
* ladder: notebook 10's model (small) at 16 x 1024 on the loop-free stacks: one rung at a time.
* dense: dense-350m at 8 x 2048, bf16, compile default + fused AdamW: HybridModel (every impl), with
  the cuDNN attention backend, with eager norms; PlainGPT; the top kernels of each.
Prints tables; writes nothing.
"""

from __future__ import annotations

import gc
import sys
import time

import torch
import torch.nn.functional as F

from mahia.measure.timing import bench

dev = torch.device("cuda")


def free():
    gc.collect()
    torch.cuda.empty_cache()


def first_call_s(step, data):
    """Seconds of the first call of ``step(data)`` (compilation, autotuning and allocator growth included)."""
    t0 = time.perf_counter()
    step(data)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def top_kernels(fn, n=12, steps=2):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = e.device_time_total if hasattr(e, "device_time_total") else getattr(e, "cuda_time_total", 0)
        if e.device_type.name == "CUDA" or (t and not e.cpu_children and e.self_device_time_total):
            rows.append((e.self_device_time_total / steps / 1e3, e.count // steps, e.key[:90]))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"  device kernel time per call {total:.3f} ms")
    for ms, cnt, name in rows[:n]:
        print(f"  {ms:8.3f} ms {ms / total:5.1%} x{cnt:<4d} {name}")
    return total


def part_attn():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, T, D = 8, 16, 2048, 64
    q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    flops_f = 4 * B * H * T * T * D / 2
    print("\n== attn: SDPA fwd and fwd+bwd, (8,16,2048,64) causal bf16")
    for name, be in (
        ("default", None),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):

        def f():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fb():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.autograd.grad(o, (q, k, v), do)

        try:
            ctxm = sdpa_kernel(be) if be is not None else torch.enable_grad()
            with ctxm:
                tf, tfb = bench(f, device=dev), bench(fb, device=dev)
            print(
                f"  {name:10s} fwd {tf.median_ms:.3f} ms {flops_f / tf.median_ms / 1e9:6.0f} TFLOP/s | fwd+bwd "
                f"{tfb.median_ms:.3f} ms {3.5 * flops_f / tfb.median_ms / 1e9:6.0f} TFLOP/s (bwd 2.5x fwd flops)"
            )
        except Exception as exc:
            print(f"  {name:10s} failed: {type(exc).__name__}: {str(exc)[:100]}")


def part_moe():
    from mahia.model.moe import MoE, moe_flops
    from mahia.ops.grouped_mm import grouped_mm

    N, D, Hd, E, k = 16384, 1024, 2048, 64, 2
    torch.manual_seed(0)
    m = MoE(D, Hd, E, k, impl="grouped", device=dev, dtype=torch.bfloat16)
    x = torch.randn(N, D, device=dev, dtype=torch.bfloat16)
    fl = moe_flops(N, D, Hd, k, E)
    print(f"\n== moe: N={N} D={D} H={Hd} E={E} k={k} bf16, backend {m.backend_for(x)}")

    def fwd():
        with torch.no_grad():
            return m(x)

    # the two GEMMs alone, on the layer's own routing
    with torch.no_grad():
        _, experts, _ = m._route(x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device=dev).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32)
        )
        offs = counts.cumsum(0, dtype=torch.int32)
        xs = x.index_select(0, order // k)
        a = torch.randn(N * k, Hd, device=dev, dtype=torch.bfloat16)

    def gemms():
        with torch.no_grad():
            grouped_mm(xs, m.w13, offs)
            return grouped_mm(a, m.w2, offs)

    def g1():
        return grouped_mm(xs, m.w13, offs)

    def g2():
        return grouped_mm(a, m.w2, offs)

    xg = x.detach().requires_grad_()
    dy = torch.randn_like(x)

    def fb():
        y, aux = m(xg)
        return torch.autograd.grad([y, aux], [xg, *m.parameters()], [dy, torch.ones_like(aux)])

    t = {
        n: bench(f, device=dev)
        for n, f in (("fwd", fwd), ("gemms", gemms), ("gemm1", g1), ("gemm2", g2), ("fwdbwd", fb))
    }
    tg = {n: bench(f, device=dev, cuda_graph=True) for n, f in (("fwd", fwd), ("gemms", gemms))}
    for n, tt in t.items():
        print(f"  {n:7s} {tt.median_ms:.3f} ms (p20 {tt.p20_ms:.3f}, p80 {tt.p80_ms:.3f})")
    print(
        f"  graphed: fwd {tg['fwd'].median_ms:.3f} gemms {tg['gemms'].median_ms:.3f}; layer/gemms eager "
        f"{t['fwd'].median_ms / t['gemms'].median_ms:.2f}, graphed {tg['fwd'].median_ms / tg['gemms'].median_ms:.2f}"
    )
    print(
        f"  fwd {fl / t['fwd'].median_ms / 1e9:.0f} TFLOP/s, fwd+bwd {3 * fl / t['fwdbwd'].median_ms / 1e9:.0f} TFLOP/s"
    )
    top_kernels(fwd, n=16)
    print("  fwd+bwd kernels:")
    top_kernels(fb, n=16)


def part_ckpt():
    from torch.utils.checkpoint import CheckpointPolicy

    from mahia.model import HybridConfig, HybridModel, SyntheticTokens, make_train_step, optimize

    cfg = HybridConfig.preset("small").optimized()
    B, T = 64, 1024
    data = SyntheticTokens(cfg.vocab_size, T, seed=0).batch(B, dev)
    attn_ops = {o for o in optimize._SAVE_OPS if "attention" in str(o)}

    def keep_attention(ctx, op, *a, **kw):
        return CheckpointPolicy.MUST_SAVE if op in attn_ops else CheckpointPolicy.PREFER_RECOMPUTE

    print(f"\n== ckpt: small preset optimized, {B}x{T}, bf16 eager")
    res = {}
    for name in ("none", "full", "selective", "keep_attention"):
        torch.manual_seed(0)
        model = HybridModel(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        if name == "keep_attention":
            orig = optimize.selective_checkpoint_policy
            optimize.selective_checkpoint_policy = keep_attention
            step = make_train_step(model, opt, amp="bf16", checkpoint="selective")
        else:
            step = make_train_step(model, opt, amp="bf16", checkpoint=None if name == "none" else name)
        try:
            step(data)
            t = bench(lambda step=step: step(data), device=dev, rep_ms=1500, memory=True)
        finally:
            if name == "keep_attention":
                optimize.selective_checkpoint_policy = orig
        res[name] = t
        print(
            f"  {name:15s} {t.median_ms:8.2f} ms (p20 {t.p20_ms:.2f} p80 {t.p80_ms:.2f}) peak {t.peak_mem_bytes / 2**30:.2f} GiB"
        )
        del model, opt, step
        free()
    n = res["none"]
    for name, t in res.items():
        print(
            f"  {name:15s} saving {1 - t.peak_mem_bytes / n.peak_mem_bytes:.3f} overhead {t.median_ms / n.median_ms - 1:+.3f}"
        )


def part_ladder():
    from mahia.lessons.full_stack import Stack, build
    from mahia.model import HybridConfig, SyntheticTokens

    cfg = HybridConfig.preset("small")
    B, T = 16, 1024
    data = SyntheticTokens(cfg.vocab_size, T, seed=0).batch(B, dev)
    loopfree = ("triton_scan", "batched_memory", "masked_gating")
    stacks = [
        ("loop-free fp32", Stack(model=loopfree)),
        ("+sync_free", Stack(model=loopfree, sync_free_logging=True)),
        ("+sdpa", Stack(model=loopfree + ("sdpa",), sync_free_logging=True)),
        ("+triton", Stack(model=loopfree + ("sdpa", "triton"), sync_free_logging=True)),
        ("+grouped_moe", Stack(model=loopfree + ("sdpa", "triton", "grouped_moe"), sync_free_logging=True)),
        ("+bf16", Stack(model=loopfree + ("sdpa", "triton", "grouped_moe"), sync_free_logging=True, amp="bf16")),
    ]
    print(f"\n== ladder: small, {B}x{T} = {B * T} tokens")
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, st in stacks:
        torch.manual_seed(0)
        b = build(cfg, st, device=dev)
        first = first_call_s(b.step, data)
        t = bench(lambda b=b: b.step(data), device=dev, rep_ms=2000, warmup_ms=1, memory=False, max_reps=10)
        print(
            f"  {name:16s} first {first:7.2f} s, median {t.median_ms:8.1f} ms (p20 {t.p20_ms:.1f}, p80 {t.p80_ms:.1f}), n={t.n}"
        )
        del b
        free()


def part_ladder2():
    """The ladder's top rungs: where the bf16 step goes, then compiled (default, max-autotune-no-cudagraphs)."""
    from mahia.lessons.full_stack import Stack, build
    from mahia.model import HybridConfig, SyntheticTokens

    cfg = HybridConfig.preset("small")
    B, T = 16, 1024
    data = SyntheticTokens(cfg.vocab_size, T, seed=0).batch(B, dev)
    print(f"\n== ladder2: small, {B}x{T}")
    for comp in (None, "default"):
        torch._dynamo.reset()
        st = Stack(model=("all",), sync_free_logging=True, amp="bf16", compile=comp)
        torch.manual_seed(0)
        b = build(cfg, st, device=dev)
        first = first_call_s(b.step, data)
        t = bench(lambda b=b: b.step(data), device=dev, rep_ms=2000, memory=False)
        print(f"  compile={comp}: first {first:.1f} s, {t}")
        top_kernels(lambda b=b: b.step(data), n=20, steps=1)
        del b
        free()


def part_dense():
    from mahia.model import HybridConfig, HybridModel, SyntheticTokens, make_train_step
    from mahia.model.plain_gpt import PlainGPT

    cfg = HybridConfig.preset("dense-350m")
    B, T = 8, 2048
    data = SyntheticTokens(cfg.vocab_size, T, seed=0).batch(B, dev)
    with torch.device("meta"):
        fpt = HybridModel(cfg).flops_per_token(T, causal=True)
    variants = [
        ("plain", lambda: PlainGPT(cfg)),
        ("mahia all", lambda: HybridModel(cfg.optimized())),
        ("mahia all cudnn", lambda: HybridModel(cfg.optimized().replace(attention_backend="cudnn"))),
        ("mahia eager norms", lambda: HybridModel(cfg.optimized().replace(kernels="eager"))),
        ("plain cudnn", "cudnn"),
    ]
    print(f"\n== dense: dense-350m {B}x{T}, bf16, compile default, fused AdamW; {fpt / 1e9:.3f} GFLOP/token")
    for name, make in variants:
        torch._dynamo.reset()
        torch.manual_seed(0)
        ctxm = None
        if make == "cudnn":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            ctxm = sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
            ctxm.__enter__()
            make = lambda: PlainGPT(cfg)  # noqa: E731
        try:
            with dev:
                model = make()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            step = make_train_step(torch.compile(model), opt, amp="bf16")
            first = first_call_s(step, data)
            t = bench(lambda step=step: step(data), device=dev, rep_ms=2000, memory=True)
            tps = B * T / (t.median_ms * 1e-3)
            print(
                f"  {name:18s} first {first:5.1f} s, {t.median_ms:7.2f} ms (p20 {t.p20_ms:.2f} p80 {t.p80_ms:.2f}), "
                f"{tps:,.0f} tok/s, {fpt * tps / 1e12:.0f} TFLOP/s = {fpt * tps / 989e12:.3f} of 989; peak "
                f"{t.peak_mem_bytes / 2**30:.1f} GiB"
            )
            if name in ("plain", "mahia all"):
                top_kernels(lambda step=step: step(data), n=14, steps=1)
        except Exception as exc:
            print(f"  {name}: failed {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            if ctxm is not None:
                ctxm.__exit__(None, None, None)
        model = opt = step = None
        free()


if __name__ == "__main__":
    parts = sys.argv[1:] or ["attn", "moe", "ckpt", "ladder"]
    for p in parts:
        t0 = time.perf_counter()
        try:
            globals()[f"part_{p}"]()
        except Exception as exc:
            import traceback

            traceback.print_exc()
            print(f"part {p} failed: {exc}")
        print(f"  [{p}: {time.perf_counter() - t0:.0f} s]", flush=True)
