"""Private production code the notebooks show by a stable public name (04 ``Block._mix``, 05 ``Decoder``'s
capture and step, 09 the GLA scan kernels): ``show_source(listing("decoder_capture"), listing("decoder_step"))``."""

from __future__ import annotations

import functools
import importlib

__all__ = ["LISTINGS", "listing"]

# public name -> (module, attribute path inside the module)
LISTINGS: dict[str, tuple[str, str]] = {
    "gla_intra_kernel": ("mahia.ops.gla_scan.kernels", "_gla_intra_kernel"),  # @triton.jit: shown as Python
    "gla_fwd_kernel": ("mahia.ops.gla_scan.kernels", "_gla_fwd_kernel"),
    "block_mix": ("mahia.model.hybrid", "Block._mix"),
    "decoder_capture": ("mahia.model.optimize", "Decoder._capture"),
    "decoder_step": ("mahia.model.optimize", "Decoder._step"),
}


def listing(name: str):
    """The object listed as ``name`` (a kernel, a function or a method), for ``show_source``."""
    if name not in LISTINGS:
        raise KeyError(f"listing: unknown name {name!r}; listed: {sorted(LISTINGS)}")
    module, path = LISTINGS[name]
    return functools.reduce(getattr, path.split("."), importlib.import_module(module))
