"""The pieces of one direct launch (mahia.ops._launch.Launcher) on the host, each timed alone, and the
RMSNorm forward path step by step (issue 13, third probe). Rows alternate over 5 rounds, so a host
that slows down for a while slows every row alike; the median of the rounds is printed.

    python3 tools/probes/host_cost_launch.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

from mahia.ops import _launch as L
from mahia.ops import rmsnorm as R

CALLS = 3000


def once(fn) -> float:
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / CALLS * 1e6


def main():
    dev = torch.device("cuda")
    x = torch.randn(4, 64, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    wd = w.detach()
    y = torch.empty_like(x)
    args = (x, x, wd, y, x, 4, 64, 64, 64, 64, 64, 1e-6)
    meta = dict(HAS_RESIDUAL=False, BLOCK_M=64, BLOCK_N=64)
    launcher = R._launch_fwd
    launcher((1,), *args, num_warps=8, **meta)
    launcher((1,), *args, num_warps=8, **meta)
    key = (0, 8, None, *meta.items(), *L._key(args))
    run, function, packed, tail = launcher._compiled[key]
    stream = L._stream(0)
    rows = {
        "F.rms_norm fwd": lambda: F.rms_norm(x, (64,), w, 1e-6),
        "mahia rms_norm fwd (Function)": lambda: R.rms_norm(x, w, 1e-6),
        "mahia rms_norm fwd (no grad)": lambda: R.rms_norm(x, wd, 1e-6),
        "_RMSNorm.apply": lambda: R._RMSNorm.apply(x, None, w, 1e-6),
        "rms_norm_fwd_launch": lambda: R.rms_norm_fwd_launch(x, wd, None, 1e-6),
        "Launcher call": lambda: launcher((1,), *args, num_warps=8, **meta),
        "raw compiled run": lambda: run(1, 1, 1, stream, function, packed, None, None, None, *args, *tail),
        "_hooks_installed": L._hooks_installed,
        "_current_device": L._current_device,
        "torch._C._cuda_getDevice": torch._C._cuda_getDevice,
        "_stream": lambda: L._stream(0),
        "key build": lambda: (0, 8, None, *meta.items(), *L._key(args)),
        "dict get": lambda: launcher._compiled.get(key),
        "check_rms_norm_inputs": lambda: R.check_rms_norm_inputs("rms_norm", x, w, eps=1e-6),
        "empty_like": lambda: torch.empty_like(x),
    }
    for fn in rows.values():
        for _ in range(100):
            fn()
    samples = {name: [] for name in rows}
    for _ in range(5):
        for name, fn in rows.items():
            samples[name].append(once(fn))
    print(f"{'row':34s} {'median us':>10s} {'min':>8s} {'max':>8s}")
    for name, s in samples.items():
        print(f"{name:34s} {statistics.median(s):10.2f} {min(s):8.2f} {max(s):8.2f}", flush=True)


if __name__ == "__main__":
    main()
