# ruff: noqa: B023  (each closure is timed within its own loop iteration)
"""Issue 13, round 3: why Liger's RMSNorm forward is faster at a few MB, and RoPE before/after.

* rmsnorm forward: mahia's kernel (2-D tile) against a 1-D one-row kernel like Liger's (scalar row base,
  int32 column offsets), with n_cols at run time or as a constexpr, beside Liger and torch.compile;
* rmsnorm backward: configurations at N = 1000 and 2048;
* rope: the committed kernel (stores between q's and k's loads) against all loads first.
"""

import importlib
import itertools
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from _probe import Probe

from mahia.measure.timing import bench

R = importlib.import_module("mahia.ops.rmsnorm")
P = importlib.import_module("mahia.ops.rope")
OLD = importlib.import_module("_rope_head")  # git show <commit>:mahia/ops/rope.py > tools/probes/_rope_head.py

DEV = torch.device("cuda")
EPS = 1e-6


def t_ms(fn) -> float:
    return bench(fn, device=DEV, cuda_graph=True, warmup_ms=5, rep_ms=25, memory=False).median_ms


@triton.jit
def _row_kernel(X, W, Y, stride_x, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(Y + row * n_cols + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _row_kernel_const(X, W, Y, stride_x, eps, N: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Y + row * N + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


def rmsnorm_fwd(p):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction as L

    for n, m in itertools.product((1000, 2048, 4096, 5120, 8192), (1024, 4096, 16384)):
        x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        bn = triton.next_power_of_2(n)
        ref = F.rms_norm(x.float(), (n,), w.float(), EPS)
        res = {}
        res["mahia"] = t_ms(lambda: R.rms_norm_fwd_launch(x, w, None, EPS))
        for nw in (4, 8, 16):
            if nw * 32 > bn:
                continue
            _row_kernel[(m,)](x, w, y, n, n, EPS, BLOCK_N=bn, num_warps=nw)
            assert (y.float() - ref).abs().max() < 0.1
            res[f"row{nw}"] = t_ms(lambda: _row_kernel[(m,)](x, w, y, n, n, EPS, BLOCK_N=bn, num_warps=nw))
            _row_kernel_const[(m,)](x, w, y, n, EPS, N=n, BLOCK_N=bn, num_warps=nw)
            assert (y.float() - ref).abs().max() < 0.1
            res[f"const{nw}"] = t_ms(lambda: _row_kernel_const[(m,)](x, w, y, n, EPS, N=n, BLOCK_N=bn, num_warps=nw))
        res["liger"] = t_ms(lambda: L.apply(x, w, EPS))
        torch._dynamo.reset()
        comp = torch.compile(lambda x, w: R.rms_norm_eager(x, w, EPS), dynamic=False)
        comp(x, w)
        res["compile"] = t_ms(lambda: comp(x, w))
        b = min(res.values())
        p.log(
            f"rms fwd {m}x{n}: "
            + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in res.items())
            + f"  | mahia/best {b / res['mahia']:.3f}"
        )


def rmsnorm_bwd(p):
    for n, m in itertools.product((1000, 2048), (1024, 4096, 16384)):
        x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        t = {}
        for bm, nw, ps in itertools.product((1, 2, 4), (4, 8, 16), (1, 2, 4)):
            t[(bm, nw, ps)] = t_ms(
                lambda: R.rms_norm_bwd_launch(dy, x, w, EPS, None, block_m=bm, num_warps=nw, programs_per_sm=ps)
            )
        cur = R.bwd_config(n)
        b = min(t.values())
        top = sorted((v / b, k) for k, v in t.items())[:4]
        p.log(
            f"rms bwd {m}x{n}: now {cur} {t[(cur[0], cur[2], cur[3])] * 1e3:.1f} us (x{t[(cur[0], cur[2], cur[3])] / b:.3f}); top "
            + ", ".join(f"{k} {r:.3f}" for r, k in top)
        )


def rope(p):
    for (B, T), (hq, hk, d) in itertools.product(
        ((1, 1024), (2, 2048), (8, 2048)), ((12, 12, 64), (28, 4, 128), (32, 8, 128), (40, 40, 128), (64, 8, 128))
    ):
        q = torch.randn(B, T, hq, d, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(B, T, hk, d, device=DEV, dtype=torch.bfloat16)
        ang = torch.randn(T, d // 2, device=DEV)
        cos, sin = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
        a = P.rope_launch(q, k, cos, sin)
        o = OLD.rope_launch(q, k, cos, sin)
        assert all(torch.equal(u, v) for u, v in zip(a, o))
        res = {}
        for nw in (2, 4, 8):
            res[f"old{nw}"] = t_ms(lambda: OLD.rope_launch(q, k, cos, sin, num_warps=nw))
            res[f"new{nw}"] = t_ms(lambda: P.rope_launch(q, k, cos, sin, num_warps=nw))
        from liger_kernel.ops.rope import LigerRopeFunction as L

        c2, s2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        res["liger"] = t_ms(lambda: L.apply(qt, kt, c2, s2))
        p.log(f"rope {B}x{T}x{hq}x{hk}x{d}: " + "  ".join(f"{k_} {v * 1e3:.1f}" for k_, v in res.items()))


if __name__ == "__main__":
    pr = Probe(DEV)
    for part in sys.argv[1:] or ["rmsnorm_fwd", "rope", "rmsnorm_bwd"]:
        globals()[part](pr)
        pr.lap()
    pr.finish()
