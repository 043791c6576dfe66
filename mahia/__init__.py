"""mahia: make PyTorch transformer and mixture-of-experts models fast on NVIDIA GPUs.

Measurement helpers (imported eagerly, they are light):
    mahia.timing.bench, mahia.checks.compare_fn, mahia.hardware.ceilings,
    mahia.results.Recorder, mahia.syncs.count_syncs, mahia.plotting
Components (imported on first use):
    mahia.layers   RMSNorm, SwiGLU, rotary embedding, attention
    mahia.kernels  Triton kernels (RMSNorm, SwiGLU, RoPE, MoE combine, gated linear attention scan)
    mahia.model    the MAHIA-X hybrid model and its parts
"""
import importlib

__version__ = "0.1.0"

from . import checks, hardware, syncs, timing  # noqa: E402,F401

_LAZY = {"layers", "kernels", "model", "results", "plotting", "notebook", "runner", "report", "bench"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mahia' has no attribute {name!r}")
