"""Production code the notebooks show, by public name: internal methods and kernels of the model.

Used by notebooks 04 (``Block._mix``), 05 (``Decoder``'s capture and step), 08 (the two paths of ``MoE``) and
09 (the GLA scan kernel, the graph memory's and the fabric's loop and batched paths).

A notebook shows the code that runs, but imports only public names. The objects listed here stay
private to their modules (their names may change with the code); :data:`LISTINGS` maps a stable public
name to where each one lives, and :func:`listing` looks it up (read-only) when it is asked for::

    from mahia.lessons.kernel_listings import listing
    show_source(listing("moe_forward_loop"), listing("moe_forward_grouped"))

tests/test_lessons_kernel_listings.py checks that every entry still resolves.
"""

from __future__ import annotations

import importlib

__all__ = ["LISTINGS", "listing"]

# public name -> (module, attribute path inside the module)
LISTINGS: dict[str, tuple[str, str]] = {
    "gla_fwd_kernel": ("mahia.ops.gla_scan.kernels", "_gla_fwd_kernel"),  # @triton.jit: show_source shows its Python
    "block_mix": ("mahia.model.hybrid", "Block._mix"),
    "moe_forward_loop": ("mahia.model.moe", "MoE._forward_loop"),
    "moe_forward_grouped": ("mahia.model.moe", "MoE._forward_grouped"),
    "decoder_capture": ("mahia.model.optimize", "Decoder._capture"),
    "decoder_step": ("mahia.model.optimize", "Decoder._step"),
    "memory_write_loop": ("mahia.model.memory", "_write_loop"),
    "memory_writes_batched": ("mahia.model.memory", "_writes_batched"),
    "memory_diffuse_loop": ("mahia.model.memory", "_diffuse_loop"),
    "fabric_branch": ("mahia.model.fabric", "_branch"),
    "fabric_masked": ("mahia.model.fabric", "_masked"),
}


def _resolve(module: str, path: str):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def listing(name: str):
    """The object listed as ``name`` (a kernel, a function or a method), for ``show_source``."""
    if name not in LISTINGS:
        raise KeyError(f"listing: unknown name {name!r}; listed: {sorted(LISTINGS)}")
    return _resolve(*LISTINGS[name])
