# ruff: noqa: B023  (each closure is timed within its own loop iteration)
"""Issue 13: would a looped two-pass RMSNorm forward close the device-time misses of the b34185d sweep?

The misses (H100, b34185d, `bench_kernels.csv`): the forward at 1024 x 5120 bf16 is 0.797x torch.compile
(14.0 against 11.2 us), 1024 x 2048 fp32 0.813x, 1024 x 4096 bf16 0.891x, 16384 x 5120 bf16 0.939x. mahia's
kernel holds a whole row padded to a power of two (5120 -> 8192 lanes, 37.5% of them masked) with up to 16
warps a row. What Inductor generates instead (tools/probes/inductor_rmsnorm.py) is a loop over chunks: pass 1
sums x^2 chunk by chunk, pass 2 loads x again (from L2) and writes y. Prediction: no masked lanes for
N = 5120 with 1024-wide chunks, and several rows per program at small row counts, win back 10-20% at
1024 rows and a few % at 16384 x 5120; at powers of two the whole-row kernel stays as fast or faster.

For each shape and dtype: mahia's forward, the looped kernel over a small grid of (rows per program, chunk,
warps), torch.compile of the eager code. Device time by CUDA-graph replay (`mahia.measure.timing.bench`,
as the benchmark). Every variant is first checked against float64. Printed, nothing recorded.

    PYTHONPATH=$PWD python3 tools/probes/rms_looped.py                               # GPU, ~1 min
    PYTHONPATH=$PWD python3 tools/probes/rms_looped.py --grid                        # GPU: the benchmark's grid
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python tools/probes/rms_looped.py --smoke     # CPU: correctness only

``--grid`` times the benchmark's whole RMSNorm grid (``mahia.bench.kernels.GRID``, 4 row counts x 5 hidden
sizes) in bf16, fp16 and fp32 with the four loop configurations that won above, to choose where each kernel
runs; it prints one line per shape and, last, the shapes where the best of the two is behind torch.compile.

Outcome of the default run (H100, 2026-11-27 ~20:05 UTC, 61 s, from 9534e94): the looped forward wins at
1024 rows (bf16 1024 x 5120: 11.0 us against mahia's 14.0 and torch.compile's 11.8; 1024 x 4096 9.3 against
11.4; fp32 1024 x 2048 9.2 against 10.9) and at N = 5120 in bf16 (16384 x 5120: 117.5 against 122.9,
torch.compile 115.0); it loses at N = 1000 (4096 x 1000 bf16: 11.9 against 11.1, torch.compile 9.6) and in
fp32 from 4096 rows (16384 x 5120: 242.7 against 227.7). PERFORMANCE.md has the table.
"""

import itertools
import sys

import torch
import triton
import triton.language as tl

from mahia.ops.rmsnorm import rms_norm_eager, rms_norm_fwd_launch

EPS = 1e-6
SHAPES = ((1024, 2048), (1024, 4096), (1024, 5120), (4096, 1000), (4096, 5120), (16384, 5120), (16384, 4096))
DTYPES = (torch.bfloat16, torch.float32)
CONFIGS = list(itertools.product((1, 2, 4), (1024, 2048), (4, 8)))  # (rows per program, chunk, warps)
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}


@triton.jit
def _looped_fwd(X, W, Y, n_rows, n_cols, stride_x, eps, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    row_ok = rows < n_rows
    base = rows.to(tl.int64)[:, None] * stride_x  # (XBLOCK, 1)
    acc = tl.zeros((XBLOCK, RBLOCK), dtype=tl.float32)
    for off in range(0, n_cols, RBLOCK):  # pass 1: sum of squares, chunk by chunk
        cols = off + tl.arange(0, RBLOCK)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(X + base + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)  # (XBLOCK,)
    for off in range(0, n_cols, RBLOCK):  # pass 2: x again (an L2 hit), times rstd and w
        cols = off + tl.arange(0, RBLOCK)
        col_ok = cols < n_cols
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + base + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows.to(tl.int64)[:, None] * n_cols + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def looped(x, w, xblock, rblock, warps):
    m, n = x.shape
    y = torch.empty_like(x)
    _looped_fwd[(triton.cdiv(m, xblock),)](
        x, w, y, m, n, x.stride(0), EPS, XBLOCK=xblock, RBLOCK=rblock, num_warps=warps
    )
    return y


def check(name, y, x, w):
    ref = rms_norm_eager(x.double(), w.double(), EPS)
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    if not err <= TOL[x.dtype]:
        raise AssertionError(f"{name}: relative error {err:.2e} over {TOL[x.dtype]:.0e} ({x.dtype})")


def smoke():
    for (m, n), dt in itertools.product(((5, 40), (3, 1000), (9, 128)), (torch.float32, torch.bfloat16)):
        x, w = torch.randn(m, n, dtype=dt), torch.randn(n, dtype=dt)
        for xb, rb, nw in ((1, 16, 1), (4, 32, 1), (2, 1024, 4)):
            check(f"looped {xb}x{rb} {m}x{n}", looped(x, w, xb, rb, nw), x, w)
    print("smoke: looped forward agrees with float64 (interpreter)")


GRID_CONFIGS = ((1, 2048, 8), (1, 1024, 4), (2, 1024, 8), (2, 2048, 8))


def main(grid: bool = False):
    from _probe import Probe  # python3 tools/probes/rms_looped.py puts this folder on sys.path

    from mahia.measure.timing import bench

    dev = torch.device("cuda")
    p = Probe(dev)

    def t_us(fn) -> float:
        return bench(fn, device=dev, cuda_graph=True, warmup_ms=5, rep_ms=25, memory=False).median_ms * 1e3

    if grid:
        from mahia.bench.kernels import GRID

        shapes, dtypes, configs = GRID["rmsnorm"], (torch.bfloat16, torch.float16, torch.float32), GRID_CONFIGS
    else:
        shapes, dtypes, configs = SHAPES, DTYPES, CONFIGS
    behind = []
    for dt, (m, n) in itertools.product(dtypes, shapes):
        x = torch.randn(m, n, device=dev, dtype=dt)
        w = torch.randn(n, device=dev, dtype=dt)
        mb = 2 * x.numel() * x.element_size() / 2**20  # read x, write y
        res = {"mahia": t_us(lambda: rms_norm_fwd_launch(x, w, None, EPS))}
        loops = {}
        for xb, rb, nw in configs:
            if rb > triton.next_power_of_2(n) * 2:
                continue
            check(f"looped {xb}x{rb}x{nw}", looped(x, w, xb, rb, nw), x, w)
            loops[(xb, rb, nw)] = t_us(lambda: looped(x, w, xb, rb, nw))
        best_cfg = min(loops, key=loops.get)
        res["looped_best"] = loops[best_cfg]
        torch._dynamo.reset()
        comp = torch.compile(lambda x, w: rms_norm_eager(x, w, EPS), dynamic=False)
        check("torch.compile", comp(x, w), x, w)
        res["compile"] = t_us(lambda: comp(x, w))
        copy_us = mb * 2**20 / (p.ceil.copy_gbps * 1e9) * 1e6  # the same bytes at the measured copy ceiling
        line = (
            f"{str(dt)[6:]:8s} {m}x{n} ({mb:.0f} MB moved, copy floor {copy_us:.1f} us): "
            + "  ".join(f"{k} {v:.1f}" for k, v in res.items())
            + f"  best loop {best_cfg}  | mahia/compile {res['compile'] / res['mahia']:.3f}"
            f"  loop/compile {res['compile'] / res['looped_best']:.3f}"
        )
        p.log(line)
        if min(res["mahia"], res["looped_best"]) > res["compile"] / 0.97:
            behind.append(line)
        if not grid:
            p.summary.append(line)
        top = sorted(loops.items(), key=lambda kv: kv[1])[:3]
        p.log("   top loops: " + ", ".join(f"{k} {v:.1f}" for k, v in top))
    if grid:
        p.summary.append(f"{len(behind)} shape(s) where neither kernel is within 3% of torch.compile:")
        p.summary.extend(behind)
    p.lap()
    p.finish()


if __name__ == "__main__":
    smoke() if "--smoke" in sys.argv else main(grid="--grid" in sys.argv)
