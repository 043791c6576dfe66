"""Where the host time of one eager RMSNorm backward goes (issue 13, second probe): the backward's
body timed from inside an autograd.Function, on autograd's device thread, against the same body on
the main thread.

    python3 tools/probes/host_cost_bwd.py
"""

import statistics
import threading
import time

import torch
import torch.nn.functional as F

from mahia.ops import rmsnorm as R

CALLS = 1000
inside: list[float] = []
threads: set[str] = set()


class Timed(torch.autograd.Function):
    """RMSNorm whose backward records its own duration (perf_counter) and the thread it ran on."""

    @staticmethod
    def forward(ctx, x, w, eps):
        y, _, rstd = R.rms_norm_fwd_launch(x, w, None, eps, check=False)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        t0 = time.perf_counter()
        threads.add(threading.current_thread().name)
        x, w, rstd = ctx.saved_tensors
        dx, dw = R.rms_norm_bwd_launch(dy, x, w, rstd, None, check=False)
        inside.append(time.perf_counter() - t0)
        return dx, dw, None


class NoLaunch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w)


def per_call_us(fn, calls=CALLS, repeats=5):
    for _ in range(30):
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


def main():
    dev = torch.device("cuda")
    x = torch.randn(4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(4, 64, device=dev, dtype=torch.bfloat16)
    xd, wd = x.detach(), w.detach()
    _, _, rstd = R.rms_norm_fwd_launch(xd, wd, None, 1e-6)

    def grads_none():
        x.grad = None
        w.grad = None

    rows = {
        "F.rms_norm fwd+bwd (grads accumulate)": lambda: F.rms_norm(x, (64,), w, 1e-6).backward(g),
        "F.rms_norm fwd+bwd (grads reset)": lambda: (grads_none(), F.rms_norm(x, (64,), w, 1e-6).backward(g)),
        "Timed fwd+bwd": lambda: Timed.apply(x, w, 1e-6).backward(g),
        "Timed fwd+bwd (grads reset)": lambda: (grads_none(), Timed.apply(x, w, 1e-6).backward(g)),
        "NoLaunch fwd+bwd": lambda: NoLaunch.apply(x, w).backward(g),
        "torch.autograd.grad(Timed)": lambda: torch.autograd.grad(Timed.apply(x, w, 1e-6), (x, w), g),
        "bwd launcher on main thread": lambda: R.rms_norm_bwd_launch(g, xd, wd, rstd, None, check=False),
    }
    print(f"{'row':42s} {'median us':>10s} {'min':>8s} {'max':>8s}", flush=True)
    for name, fn in rows.items():
        inside.clear()
        med, lo, hi = per_call_us(fn)
        extra = f"  backward body {statistics.median(inside) * 1e6:.1f} us" if inside else ""
        print(f"{name:42s} {med:10.2f} {lo:8.2f} {hi:8.2f}{extra}", flush=True)
    print("backward ran on threads:", threads)


if __name__ == "__main__":
    main()
