"""Production code the notebooks show, by public name: kernels, internal methods and launch configurations.

Used by notebook 03 (the RMSNorm, SwiGLU and RoPE kernels, the v1 tutorial kernels and the RMSNorm
launch configurations), 04 (``Block._mix``), 05 (``Decoder``'s capture and step), 08 (the two paths of
``MoE``) and 09 (the GLA scan kernel, the graph memory's and the fabric's loop and batched paths).

A notebook shows the code that runs, but imports only public names. The objects listed here stay
private to their modules (their names may change with the code); :data:`LISTINGS` maps a stable public
name to where each one lives, and :func:`listing` looks it up (read-only) when it is asked for::

    from mahia.lessons.kernel_listings import listing, rms_norm_fwd_config
    show_source(listing("rms_norm_v1_kernel"), listing("rms_norm_fwd_kernel"))
    rms_norm_fwd_config(4096)    # (BLOCK_M, BLOCK_N, num_warps) of mahia.ops.rmsnorm

tests/test_lessons_kernel_listings.py checks that every entry still resolves.
"""

from __future__ import annotations

import importlib

import torch

from mahia.ops import rmsnorm

__all__ = [
    "KERNELS",
    "LISTINGS",
    "listing",
    "production_kernels",
    "rms_norm_bwd_config",
    "rms_norm_fwd_config",
    "sm_count",
]

# public name -> (module, attribute path inside the module)
LISTINGS: dict[str, tuple[str, str]] = {
    # @triton.jit kernels of mahia.ops (a show_source of one shows the Python function it compiles)
    "rms_norm_fwd_kernel": ("mahia.ops.rmsnorm", "_rms_norm_fwd_kernel"),
    "rms_norm_bwd_kernel": ("mahia.ops.rmsnorm", "_rms_norm_bwd_kernel"),
    "sum_partials_kernel": ("mahia.ops.rmsnorm", "_sum_partials_kernel"),  # dw from the backward's partials
    "swiglu_fwd_kernel": ("mahia.ops.swiglu", "_swiglu_fwd_kernel"),
    "swiglu_bwd_kernel": ("mahia.ops.swiglu", "_swiglu_bwd_kernel"),
    "rope_kernel": ("mahia.ops.rope", "_rope_kernel"),
    "rope_load_halves": ("mahia.ops.rope", "_load_halves"),  # @triton.jit: one token's heads, loaded
    "rope_rotate_heads": ("mahia.ops.rope", "_rotate_heads"),  # @triton.jit: ... rotated and stored
    "gla_fwd_kernel": ("mahia.ops.gla_scan.kernels", "_gla_fwd_kernel"),
    "gla_bwd_kernel": ("mahia.ops.gla_scan.kernels", "_gla_bwd_kernel"),
    # the tutorial's v1 kernels (notebook 03, section 2)
    "rms_norm_v1_kernel": ("mahia.lessons.triton_tutorial", "_rms_norm_v1_kernel"),
    "rms_norm_v1_bwd_kernel": ("mahia.lessons.triton_tutorial", "_rms_norm_v1_bwd_kernel"),
    # the solutions of its exercises
    "add_rms_norm_v1_kernel": ("mahia.lessons.triton_tutorial", "_add_rms_norm_v1_kernel"),
    "rms_norm_v1_bwd_persistent_kernel": ("mahia.lessons.triton_tutorial", "_rms_norm_v1_bwd_persistent_kernel"),
    # eager code the kernels are compared with, and internal methods of the model
    "rope_rotate_eager": ("mahia.ops.rope", "_rotate"),  # eager RoPE of q or k
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

# The production Triton kernels among them.
KERNELS: tuple[str, ...] = (
    "rms_norm_fwd_kernel",
    "rms_norm_bwd_kernel",
    "swiglu_fwd_kernel",
    "swiglu_bwd_kernel",
    "rope_kernel",
    "rope_load_halves",
    "rope_rotate_heads",
    "gla_fwd_kernel",
    "gla_bwd_kernel",
)


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


def production_kernels() -> dict[str, object]:
    """Every production Triton kernel of :mod:`mahia.ops`, by its public name (see :data:`KERNELS`)."""
    return {name: listing(name) for name in KERNELS}


def rms_norm_fwd_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) the production RMSNorm forward launches with for rows of ``n_cols``."""
    return tuple(rmsnorm.fwd_config(int(n_cols)))


def rms_norm_bwd_config(
    n_cols: int, n_rows: int | None = None, dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs per SM) of the production RMSNorm backward (persistent grid)
    for ``n_rows`` rows (None: a large batch) of ``dtype``."""
    rows = None if n_rows is None else int(n_rows)
    return tuple(rmsnorm.bwd_config(int(n_cols), rows, dtype.itemsize))


def sm_count(device: str | torch.device) -> int:
    """The SM count the production RMSNorm backward sizes its grid with (on a CPU: the interpreter's 4)."""
    return int(rmsnorm.sm_count(torch.device(device)))
