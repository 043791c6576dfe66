# ruff: noqa: B023  (each closure is timed within its own loop iteration)
"""Three open questions of issue 13, answered in one lent GPU command of about four minutes.

    source .whl/env.sh && python3 tools/probes/issue13_next.py [align eager fp32bwd]   # on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python tools/probes/issue13_next.py --smoke       # CPU: does it run

1. ``align``: does telling Triton what divides a row length and the row strides (the ALIGN constexpr,
   ``mahia.ops._launch.pow2_divisor``, bb7320b) speed up the kernels at sizes that are multiples of 8 but
   not of 16? Device time (CUDA-graph replay, L2 flushed) with ALIGN as computed against ALIGN forced
   to 1 (the code before bb7320b), beside torch.compile (static shapes: it knows the width) where it led.
   Prediction: the forward at N = 1000 gains up to the 8% an earlier constexpr-width probe found
   (PERFORMANCE.md, 2026-11-24), aligned shapes (N = 4096) do not move.
2. ``eager``: why is mahia's RMSNorm forward+backward, timed eagerly, 2-3x its tiny-tensor host cost at
   4-67 MB (7fed682: 0.31-0.37 ms per call at 1024x8192 .. 16384x2048 bf16, against 0.165 ms at 4x64 and
   0.05-0.14 ms of device time), while F.rms_norm stays at 0.11-0.21 ms? Per call, samples of the two
   interleaved (A, B, A, B: a drift of the host hits both): the per-call time, the host's issue time of
   the same calls (no synchronize inside), a check for synchronizations (CUDA's sync debug mode), and
   the profiler's CPU-side operators of 20 mahia steps at 4096x2048.
3. ``fp32bwd``: which backward configuration closes the fp32 gap to Liger at large N (77c878d:
   0.86-0.89 of Liger at 4096-16384 x 5120-8192 fp32 forward+backward)? Rows per tile x warps x programs
   per SM, the backward alone, beside Liger's forward+backward minus its forward.

Prints a table per question and a summary last; records nothing.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from mahia.measure.timing import bench, synchronize

# the op modules (mahia.ops re-exports functions named like some of them)
MC, R, RP, S = (importlib.import_module(f"mahia.ops.{m}") for m in ("moe_combine", "rmsnorm", "rope", "swiglu"))

SMOKE = "--smoke" in sys.argv
DEV = torch.device("cuda" if torch.cuda.is_available() and not SMOKE else "cpu")
EPS = 1e-6
SUMMARY: list[str] = []


def log(*a) -> None:
    print(*a, flush=True)


def dev_ms(fn) -> float:
    """Device time: CUDA-graph replay after an L2 flush (the kernel benchmark's 'device' timing)."""
    if DEV.type != "cuda":
        return bench(fn, device=DEV, warmup_ms=1, rep_ms=3, max_reps=5).median_ms
    return bench(fn, device=DEV, cuda_graph=True, warmup_ms=5, rep_ms=25, memory=False).median_ms


@contextmanager
def align_forced_to_one(*modules):
    """ALIGN = 1 in these op modules: the kernels as before bb7320b (no divisibility hint)."""
    saved = [m.pow2_divisor for m in modules]
    for m in modules:
        m.pow2_divisor = lambda n, cap=16: 1
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.pow2_divisor = f


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False) if DEV.type == "cuda" else fn


def row(name: str, t_align: float, t_one: float, peer: float | None = None) -> None:
    extra = f"   compile {peer * 1e3:8.2f} us  align/compile {peer / t_align:5.2f}" if peer else ""
    log(
        f"  {name:34s} ALIGN {t_align * 1e3:8.2f} us   ALIGN=1 {t_one * 1e3:8.2f} us   gain {t_one / t_align:5.3f}{extra}"
    )
    SUMMARY.append(f"align {name}: x{t_one / t_align:.3f} (ALIGN=1 {t_one * 1e3:.2f} -> {t_align * 1e3:.2f} us)")


def q_align() -> None:
    log("\n== 1. ALIGN as computed against ALIGN = 1 (device time)")
    shapes = [(16, 1000), (8, 4096)] if SMOKE else [(4096, 1000), (16384, 1000), (91, 1000), (4096, 4096)]
    dtypes = [torch.float32] if SMOKE else [torch.bfloat16, torch.float32]
    for dtype in dtypes:
        for m, n in shapes:
            x = torch.randn(m, n, device=DEV, dtype=dtype)
            r = torch.randn_like(x)
            w = torch.randn(n, device=DEV, dtype=dtype)
            dy = torch.randn_like(x)
            tag = f"{m}x{n} {str(dtype)[6:]}"
            cases = {
                "rmsnorm fwd": (lambda: R.rms_norm_fwd_launch(x, w, None, EPS, check=False), R.rms_norm_eager),
                "add_rmsnorm fwd": (lambda: R.rms_norm_fwd_launch(x, w, r, EPS, check=False), None),
                "rmsnorm bwd": (lambda: R.rms_norm_bwd_launch(dy, x, w, EPS, None, check=False), None),
                "swiglu fwd": (lambda: S.swiglu_fwd_launch(x, r, check=False), None),
                "swiglu bwd": (lambda: S.swiglu_bwd_launch(dy, x, r, check=False), None),
            }
            for name, (fn, eager) in cases.items():
                t = dev_ms(fn)
                with align_forced_to_one(R, S):
                    t1 = dev_ms(fn)
                peer = None
                if eager is not None and DEV.type == "cuda":
                    comp = compiled(lambda x, w: eager(x, w, EPS))
                    comp(x, w)
                    peer = dev_ms(lambda: comp(x, w))
                row(f"{name} {tag}", t, t1, peer)
    # the MoE combine at D = 1000 and RoPE at a head dim of 80 (half = 40: a multiple of 8, not of 16)
    n, d = (8, 100) if SMOKE else (16384, 1000)
    out = torch.randn(n * 2, d, device=DEV, dtype=torch.bfloat16 if not SMOKE else torch.float32)
    inv, gates = torch.randperm(n * 2, device=DEV), torch.rand(n, 2, device=DEV).softmax(-1)
    dyc = torch.randn(n, d, device=DEV, dtype=out.dtype)
    for name, fn in {
        f"moe_combine fwd {n}x2x{d}": lambda: MC.moe_combine_fwd_launch(out, inv, gates, check=False),
        f"moe_combine bwd {n}x2x{d}": lambda: MC.moe_combine_bwd_launch(dyc, out, inv, gates, check=False),
    }.items():
        t = dev_ms(fn)
        with align_forced_to_one(MC):
            t1 = dev_ms(fn)
        row(name, t, t1)
    B, T, H, D = (1, 8, 4, 80) if SMOKE else (8, 2048, 32, 80)
    q = torch.randn(B, T, H, D, device=DEV, dtype=out.dtype)
    k = torch.randn(B, T, H // 4, D, device=DEV, dtype=out.dtype)
    cos, sin = torch.randn(T, D // 2, device=DEV), torch.randn(T, D // 2, device=DEV)
    fn = lambda: RP.rope_launch(q, k, cos, sin, check=False)
    t = dev_ms(fn)
    with align_forced_to_one(RP):
        t1 = dev_ms(fn)
    row(f"rope {B}x{T}x{H}x{H // 4}x{D}", t, t1)


def per_call_samples(fns: dict, calls: int, samples: int) -> tuple[dict, dict]:
    """Interleaved samples: for each round, every fn runs ``calls`` times back to back, then one
    synchronize. Returns per-call wall ms and per-call issue ms (the host's time to issue the calls,
    read before the synchronize) as lists per name."""
    wall = {k: [] for k in fns}
    issue = {k: [] for k in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            synchronize(DEV)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            synchronize(DEV)
            t2 = time.perf_counter()
            issue[name].append((t1 - t0) * 1e3 / calls)
            wall[name].append((t2 - t0) * 1e3 / calls)
    return wall, issue


def q_eager() -> None:
    log("\n== 2. eager forward+backward per call: F.rms_norm against mahia, interleaved samples")
    shapes = [(4, 64), (16, 256)] if SMOKE else [(4, 64), (1024, 8192), (4096, 2048), (4096, 8192), (16384, 2048)]
    dtype = torch.float32 if SMOKE else torch.bfloat16
    for m, n in shapes:
        x = torch.randn(m, n, device=DEV, dtype=dtype, requires_grad=True)
        w = (1 + 0.1 * torch.randn(n, device=DEV, dtype=dtype)).requires_grad_()
        g = torch.randn(m, n, device=DEV, dtype=dtype)
        dev_t = {}

        def steps(f):
            def step():
                x.grad = w.grad = None
                f(x, w).backward(g)

            return step

        fns = {
            "F.rms_norm": steps(lambda x, w: F.rms_norm(x, (n,), w, EPS)),
            "mahia": steps(lambda x, w: R.rms_norm(x, w, EPS)),
        }
        for name, fn in fns.items():
            fn()
            dev_t[name] = dev_ms(fn) if DEV.type == "cuda" else float("nan")
        wall, issue = per_call_samples(fns, calls=3 if SMOKE else 20, samples=3 if SMOKE else 15)
        med = {k: statistics.median(v) for k, v in wall.items()}
        iss = {k: statistics.median(v) for k, v in issue.items()}
        for name in fns:
            log(
                f"  {m}x{n} {name:11s} per call {med[name] * 1e3:7.1f} us  issue {iss[name] * 1e3:7.1f} us  "
                f"device {dev_t[name] * 1e3:7.1f} us  (samples {min(wall[name]) * 1e3:.0f}-{max(wall[name]) * 1e3:.0f})"
            )
        SUMMARY.append(
            f"eager {m}x{n}: F.rms_norm / mahia per call = {med['F.rms_norm'] / med['mahia']:.2f} "
            f"(issue {iss['F.rms_norm'] * 1e3:.0f} / {iss['mahia'] * 1e3:.0f} us)"
        )
        if DEV.type == "cuda":
            torch.cuda.set_sync_debug_mode(2)  # an error on any synchronizing call
            try:
                fns["mahia"]()
                log("  no synchronization in mahia's step (CUDA sync debug mode)")
            except RuntimeError as e:
                log(f"  mahia's step synchronizes: {str(e)[:200]}")
                SUMMARY.append(f"eager {m}x{n}: mahia's step synchronizes")
            finally:
                torch.cuda.set_sync_debug_mode(0)
        if (m, n) == ((16, 256) if SMOKE else (4096, 2048)):
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    fns["mahia"]()
                synchronize(DEV)
            log(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def q_fp32bwd() -> None:
    log("\n== 3. RMSNorm backward in fp32 at large N: configurations (device time)")
    shapes = [(64, 512)] if SMOKE else [(4096, 5120), (4096, 8192), (16384, 8192)]
    configs = [(1, 16, 1), (1, 8, 1), (1, 8, 2), (1, 16, 2), (1, 32, 1), (2, 16, 1), (1, 4, 4)]
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:
        LigerRMSNormFunction = None
        log(f"  liger: not available ({type(e).__name__})")
    for m, n in shapes:
        x = torch.randn(m, n, device=DEV)
        w = 1 + 0.1 * torch.randn(n, device=DEV)
        dy = torch.randn_like(x)
        cur = R.bwd_config(n, m, 4)
        times = {}
        for bm, nw, per_sm in configs:
            fn = lambda: R.rms_norm_bwd_launch(dy, x, w, EPS, None, block_m=bm, num_warps=nw, programs_per_sm=per_sm)
            try:
                times[(bm, nw, per_sm)] = dev_ms(fn)
            except Exception as e:  # out of registers or shared memory
                log(f"  {m}x{n} config {(bm, nw, per_sm)}: {type(e).__name__}")
        if not times:
            continue
        best = min(times, key=times.get)
        cur_key = (cur[0], cur[2], cur[3])
        cur_t = times.get(cur_key) or dev_ms(lambda: R.rms_norm_bwd_launch(dy, x, w, EPS, None))
        line = f"  {m}x{n} fp32: current {cur_key} {cur_t * 1e3:.1f} us, best {best} {times[best] * 1e3:.1f} us"
        if LigerRMSNormFunction is not None and DEV.type == "cuda":
            xl = x.clone().requires_grad_()
            wl = w.clone().requires_grad_()

            def liger_fb():
                xl.grad = wl.grad = None
                LigerRMSNormFunction.apply(xl, wl, EPS).backward(dy.clone())

            lf = dev_ms(lambda: LigerRMSNormFunction.apply(xl.detach(), wl.detach(), EPS))
            lfb = dev_ms(liger_fb)
            line += f"; liger fwd+bwd {lfb * 1e3:.1f} - fwd {lf * 1e3:.1f} = bwd ~{(lfb - lf) * 1e3:.1f} us"
        log(line)
        log("    " + "  ".join(f"{k}: {v * 1e3:.1f}" for k, v in sorted(times.items(), key=lambda kv: kv[1])))
        SUMMARY.append(f"fp32bwd {m}x{n}: current {cur_t * 1e3:.1f} us, best {best} {times[best] * 1e3:.1f} us")


def main() -> None:
    t0 = time.perf_counter()
    which = [a for a in sys.argv[1:] if not a.startswith("--")] or ["align", "eager", "fp32bwd"]
    name = torch.cuda.get_device_name() if DEV.type == "cuda" else "CPU (smoke test: no performance figure)"
    log(f"{name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for q in which:
        {"align": q_align, "eager": q_eager, "fp32bwd": q_fp32bwd}[q]()
        log(f"[{time.perf_counter() - t0:.0f} s]")
    log("\nSUMMARY")
    for line in SUMMARY:
        log("  " + line)


if __name__ == "__main__":
    main()
