"""RMSNorm forward+backward device time at the benchmark's sweep shapes, for comparing two checkouts, and
the dw reduction alone (issue 13: the backward's partial-sum kernel against torch's sum).

    PYTHONPATH=<checkout> python3 tools/probes/rmsnorm_shapes.py <label>     # on the lent GPU

Device time: ``triton.testing.do_bench_cudagraph`` (a CUDA graph of repeated calls, so host launch is
hidden), median of 5 rounds on fresh inputs, bf16.
"""

# ruff: noqa: B023  (each closure is timed within its own loop iteration)
import statistics
import sys

import torch
import triton

from mahia import ops

SHAPES = [(91, 1000), (91, 4096), (1024, 1000), (1024, 4096), (4096, 1000), (4096, 4096), (16384, 4096), (16384, 8192)]


def fwdbwd_ms(m: int, n: int) -> float:
    times = []
    for _ in range(5):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

        def step():
            x.grad = w.grad = None
            ops.rms_norm(x, w).backward(dy)

        step()
        times.append(triton.testing.do_bench_cudagraph(step, rep=50))
    return statistics.median(times)


def main() -> None:
    label = sys.argv[1]
    for m, n in SHAPES:
        print(f"{label} rmsnorm fwd+bwd {m}x{n}: {fwdbwd_ms(m, n) * 1e3:8.1f} us", flush=True)
    try:
        from mahia.ops import rmsnorm as R
    except ImportError:
        return
    if not hasattr(R, "_launch_sum"):
        return
    for parts, n in ((264, 1000), (264, 4096), (132, 8192)):
        p = torch.randn(parts, n, device="cuda")
        dw = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        kern = triton.testing.do_bench_cudagraph(
            lambda: R._launch_sum((-(-n // 32),), p, dw, parts, n, num_warps=4, BLOCK_P=128, BLOCK_N=32)
        )
        torch_sum = triton.testing.do_bench_cudagraph(lambda: p.sum(0).to(torch.bfloat16))
        print(f"{label} dw sum {parts}x{n}: kernel {kern * 1e3:6.1f} us, torch sum+to {torch_sum * 1e3:6.1f} us")


if __name__ == "__main__":
    main()
