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

__version__ = "0.1.0"

_LAZY = {"measure", "ops", "layers", "model", "lessons", "bench", "runner", "profile"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mahia' has no attribute {name!r}")
