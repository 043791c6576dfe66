"""Where the host time of one eager RMSNorm forward+backward step goes (issue 13), piece by piece.

    source .whl/env.sh && python3 tools/probes/host_step.py          # on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python tools/probes/host_step.py --smoke   # CPU: does it run

issue13_next.py (2026-11-27, H100; ``git show 2252f96:tools/probes/issue13_next.py``) found mahia's step ``x.grad = w.grad = None; rms_norm(x, w).backward(g)``
at 218-247 us of host time against F.rms_norm's 114-134 us, at every size from 4 x 64 to 16384 x 2048, and
no synchronization in it. This probe splits the step: each piece is timed alone (per call, as the benchmark's eager time:
``mahia.bench.kernels.eager_bench``, back-to-back calls and one synchronize per sample), the backward's body is timed from inside (it runs on autograd's
device thread), and cProfile lists the Python functions of the forward and backward launchers.
Prints tables; records nothing.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F

from mahia.bench.kernels import eager_bench
from mahia.ops import rmsnorm as R

SMOKE = "--smoke" in sys.argv
DEV = torch.device("cuda" if torch.cuda.is_available() and not SMOKE else "cpu")
EPS = 1e-6
inside: dict[str, list[float]] = {"fwd": [], "bwd": []}
threads: set[str] = set()


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn) -> tuple[float, float, float]:
    """Median, p20 and p80 of the time per call an eager program sees: the benchmark's own
    ``eager_bench`` (back-to-back calls, one synchronize per sample), in microseconds."""
    t = eager_bench(fn, device=DEV, warmup_ms=5 if SMOKE else 20, rep_ms=5 if SMOKE else 100)
    return t.median_ms * 1e3, t.p20_ms * 1e3, t.p80_ms * 1e3


class Timed(torch.autograd.Function):
    """mahia's _RMSNorm with its forward and backward bodies timed from inside."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        t0 = time.perf_counter()
        y, _ = R.rms_norm_fwd_launch(x, weight, None, eps)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        inside["fwd"].append(time.perf_counter() - t0)
        return y

    @staticmethod
    def backward(ctx, dy):
        t0 = time.perf_counter()
        threads.add(threading.current_thread().name)
        x, weight = ctx.saved_tensors
        dx, dw = R.rms_norm_bwd_launch(dy, x, weight, ctx.eps, None)
        inside["bwd"].append(time.perf_counter() - t0)
        return dx, dw, None


class NoLaunch(torch.autograd.Function):
    """The floor of a Python autograd.Function: saves two tensors, allocates the outputs, launches nothing."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight), None


def cprofile(fn, calls: int, top: int = 18) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    sync()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return "\n".join(line for line in s.getvalue().splitlines() if line.strip())[:4000]


def shape_rows(m: int, n: int) -> None:
    dtype = torch.float32 if SMOKE else torch.bfloat16
    x = torch.randn(m, n, device=DEV, dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device=DEV, dtype=dtype)).requires_grad_()
    g = torch.randn(m, n, device=DEV, dtype=dtype)
    xd, wd = x.detach(), w.detach()

    def step(f):
        def run():
            x.grad = w.grad = None
            f().backward(g)

        return run

    y_fn = R._RMSNorm.apply(x, None, w, EPS)  # a graph to run backward through repeatedly
    rows = {
        "F.rms_norm step": step(lambda: F.rms_norm(x, (n,), w, EPS)),
        "mahia rms_norm step": step(lambda: R.rms_norm(x, w, EPS)),
        "_RMSNorm step": step(lambda: R._RMSNorm.apply(x, None, w, EPS)),
        "Timed step (bodies timed)": step(lambda: Timed.apply(x, w, EPS)),
        "NoLaunch step (Function floor)": step(lambda: NoLaunch.apply(x, w, EPS)),
        "x*1 step (engine floor)": step(lambda: x * 1),
        "F.rms_norm fwd (grad on)": lambda: F.rms_norm(x, (n,), w, EPS),
        "mahia rms_norm fwd (grad on)": lambda: R.rms_norm(x, w, EPS),
        "_RMSNorm.apply fwd": lambda: R._RMSNorm.apply(x, None, w, EPS),
        "NoLaunch.apply fwd": lambda: NoLaunch.apply(x, w, EPS),
        "fwd launcher, main thread": lambda: R.rms_norm_fwd_launch(xd, wd, None, EPS),
        "bwd launcher, main thread": lambda: R.rms_norm_bwd_launch(g, xd, wd, EPS, None),
        "backward only (retain_graph)": lambda: torch.autograd.grad(y_fn, (x, w), g, retain_graph=True),
        "empty_like(x)": lambda: torch.empty_like(xd),
        "torch.empty((264, n), fp32)": lambda: torch.empty((264, n), dtype=torch.float32, device=DEV),
    }
    print(f"\n== {m} x {n} {dtype}", flush=True)
    print(f"{'row':34s} {'median us':>10s} {'p20':>8s} {'p80':>8s}", flush=True)
    for name, fn in rows.items():
        inside["fwd"].clear()
        inside["bwd"].clear()
        med, lo, hi = per_call_us(fn)
        extra = ""
        if inside["fwd"]:
            extra = (
                f"  forward body {statistics.median(inside['fwd']) * 1e6:.1f} us,"
                f" backward body {statistics.median(inside['bwd']) * 1e6:.1f} us"
            )
        print(f"{name:34s} {med:10.2f} {lo:8.2f} {hi:8.2f}{extra}", flush=True)
    print("backward ran on threads:", threads, flush=True)
    if (m, n) == (4, 64) or SMOKE:
        calls = 20 if SMOKE else 3000
        print("\ncProfile, forward launcher:", flush=True)
        print(cprofile(lambda: R.rms_norm_fwd_launch(xd, wd, None, EPS), calls))
        print("\ncProfile, backward launcher:", flush=True)
        print(cprofile(lambda: R.rms_norm_bwd_launch(g, xd, wd, EPS, None), calls))


def main() -> None:
    if DEV.type == "cuda":
        import triton

        print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for m, n in [(4, 64), (16, 256)] if SMOKE else [(4, 64), (4096, 2048)]:
        shape_rows(m, n)


if __name__ == "__main__":
    main()
