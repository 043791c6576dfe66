"""The MAHIA-X hybrid model: config, model, components, synthetic data and the named optimizations.

    from mahia.model import HybridConfig, HybridModel, SyntheticTokens, apply, make_train_step

Names are imported on first use (PEP 562), so importing one part does not import (or break on) the others.
"""

from __future__ import annotations

import importlib

# public name -> the submodule that defines it
_EXPORTS = {
    "HybridConfig": "config",
    "PRESETS": "config",
    "HybridModel": "hybrid",
    "Block": "hybrid",
    "MoE": "moe",
    "MetaAttention": "meta_attention",
    "GraphDiffusionMemory": "memory",
    "DynamicNeuroFabric": "fabric",
    "SyntheticTokens": "data",
    "OPTIMIZATIONS": "optimize",
    "apply": "optimize",
    "apply_checkpointing": "optimize",
    "apply_compile": "optimize",
    "make_train_step": "optimize",
    "MasterAdamW": "optimize",
    "make_decoder": "optimize",
    "Decoder": "optimize",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mahia.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mahia.model.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
