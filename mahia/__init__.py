"""mahia: make PyTorch transformer and mixture-of-experts models fast on NVIDIA GPUs.

The package is built in floors; each imports only the floors below it (CI checks this with
import-linter, see pyproject.toml):

    mahia.lessons                         what only the notebooks need (set-up, listings, explorers)
    mahia.runner, mahia.bench, mahia.profile, mahia.__main__      command-line entry points
    mahia.model                           the MAHIA-X hybrid model, and apply_* optimizations
    mahia.layers                          RMSNorm, SwiGLU, rotary embedding, attention
    mahia.ops                             one file per op: eager reference, Triton kernels, dispatch
    mahia.measure                         timing, checks, instruments, hardware, results, plots, cost model

Subpackages are imported on first use, so ``import mahia`` stays light.
"""

import importlib
import os

# torch.profiler leaves CUPTI attached after it stops unless TEARDOWN_CUPTI=1 (pytorch#144455), and every later launch
# pays for it. H100, torch 2.11, 2026-12-06: after one profiled step the compiled training step of notebook 10 went from
# 26.1 to 29 ms and the bf16 eager step from 39 to 47 ms; with TEARDOWN_CUPTI=1 neither moved.
os.environ.setdefault("TEARDOWN_CUPTI", "1")

__version__ = "0.1.0"

_LAZY = {"measure", "ops", "layers", "model", "lessons", "bench", "runner", "profile"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mahia' has no attribute {name!r}")
