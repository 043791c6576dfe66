"""Where the host time of one eager RMSNorm call goes (issue 13): each piece of the call path timed alone.

    python3 tools/probes/host_cost.py        # on a GPU; prints per-call microseconds, median of 7 repeats

A tiny tensor (4 x 64, bf16, weight requiring grad), so the GPU finishes each kernel long before the
host issues the next: the time per call is the host's. Each row runs ``CALLS`` back-to-back calls and
one synchronize; the median of 7 such repeats is reported with the min and max.
"""

import inspect
import statistics
import time

import torch
import torch.nn.functional as F
import triton

from mahia.ops import rmsnorm as R
from mahia.ops.dispatch import use_triton

CALLS = 2000


def per_call_us(fn, calls: int = CALLS, repeats: int = 7) -> tuple[float, float, float]:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out), min(out), max(out)


def main() -> None:
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}", flush=True)
    src = inspect.getsource(triton.runtime.jit.JITFunction.run)
    print("\n".join(line for line in src.splitlines() if "kernel.run(" in line or "launch_metadata =" in line))
    x = torch.randn(4, 64, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    xg = x.clone().requires_grad_(True)
    g = torch.randn_like(x)
    eps = 1e-6

    y, _ = R.rms_norm_fwd_launch(x, w.detach(), None, eps)
    bm, bn, nw = R.fwd_config(64)
    args = (x, x, w.detach(), y, x, 4, 64, 64, 64, 64, 64, eps)
    meta = dict(HAS_RESIDUAL=False, BLOCK_M=bm, BLOCK_N=bn)
    R._rms_norm_fwd_kernel[(1,)](*args, **meta, num_warps=nw)

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, gy):
            return gy, None

    from mahia import ops

    a, b = (
        torch.randn(4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True),
        torch.randn(4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True),
    )
    rows = {
        "F.rms_norm fwd": lambda: F.rms_norm(x, (64,), w, eps),
        "mahia rms_norm fwd": lambda: R.rms_norm(x, w, eps),
        "F.rms_norm fwd+bwd": lambda: F.rms_norm(xg, (64,), w, eps).backward(g),
        "mahia rms_norm fwd+bwd": lambda: R.rms_norm(xg, w, eps).backward(g),
        "eager swiglu fwd+bwd": lambda: (F.silu(a) * b).backward(g),
        "mahia swiglu fwd+bwd": lambda: ops.swiglu(a, b).backward(g),
        "check_rms_norm_inputs": lambda: R.check_rms_norm_inputs("rms_norm", x, w, eps=eps),
        "use_triton": lambda: use_triton("rms_norm", x, w),
        "fwd launcher (alloc + launch)": lambda: R.rms_norm_fwd_launch(x, w.detach(), None, eps, check=False),
        "JIT launch only": lambda: R._rms_norm_fwd_kernel[(1,)](*args, **meta, num_warps=nw),
        "Launcher (direct) only": lambda: R._launch_fwd((1,), *args, num_warps=nw, **meta),
        "torch.empty(shape)": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "empty_like": lambda: torch.empty_like(x),
        "empty autograd.Function fwd": lambda: Empty.apply(xg, w),
        "empty autograd.Function fwd+bwd": lambda: Empty.apply(xg, w).backward(g),
        "bwd launcher": lambda: R.rms_norm_bwd_launch(g, x, w.detach(), eps, None, check=False),
        "x*1 fwd+bwd (autograd floor)": lambda: (xg * 1).backward(g),
    }
    print(f"\n{'row':40s} {'median us':>10s} {'min':>8s} {'max':>8s}", flush=True)
    for name, fn in rows.items():
        med, lo, hi = per_call_us(fn)
        print(f"{name:40s} {med:10.2f} {lo:8.2f} {hi:8.2f}", flush=True)


if __name__ == "__main__":
    main()
