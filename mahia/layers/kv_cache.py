"""A static KV cache for graph-capturable decoding, and the position-tensor helpers a decode step needs.

A decode step that is captured in a CUDA graph (or compiled once) must not change a shape and must not
read a device value on the host. So the cache is preallocated at its full length, new keys and values
are written at positions given by a 0-dim int64 *tensor* (``start_pos``), the queries attend over the
whole cache with a mask built from that tensor (:func:`decode_mask`), and the RoPE rows of the new
positions are gathered on the device (:func:`rope_rows`).
"""

from __future__ import annotations

import torch
from torch import nn

from mahia.measure.checks import check_float_dtype, check_float_tensor, check_int

__all__ = ["StaticKVCache", "decode_mask", "rope_rows"]


def _check_start_pos(fn: str, start_pos: object, device: torch.device) -> torch.Tensor:
    if not isinstance(start_pos, torch.Tensor):
        raise TypeError(
            f"{fn}: start_pos must be a 0-dim int64 tensor on {device} (a Python int would be "
            f"baked into a captured CUDA graph), got {type(start_pos).__name__}"
        )
    if start_pos.dim() != 0 or start_pos.dtype != torch.int64:
        raise TypeError(
            f"{fn}: start_pos must be a 0-dim int64 tensor, got shape {tuple(start_pos.shape)} dtype {start_pos.dtype}"
        )
    if start_pos.device != device:
        raise ValueError(f"{fn}: start_pos must be on {device}, got {start_pos.device}")
    return start_pos


def rope_rows(cache: nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) rows of a :class:`~mahia.layers.rope.RotaryCache` at ``positions`` (int64, shape (T,)).

    A gather on the device (no host sync): ``rope_rows(rope, start_pos + torch.arange(T))`` gives the
    rows a decode step needs from a position *tensor*. Out-of-range positions are not checked (that
    would sync); on CUDA they trip a device-side assert.
    """
    if not (
        isinstance(getattr(cache, "cos", None), torch.Tensor) and isinstance(getattr(cache, "sin", None), torch.Tensor)
    ):
        raise TypeError(
            f"rope_rows: cache must be a RotaryCache (with .cos and .sin tables), got {type(cache).__name__}"
        )
    if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 or positions.dim() != 1:
        raise TypeError("rope_rows: positions must be a 1-d int64 tensor")
    return cache.cos[positions], cache.sin[positions]  # (T, D/2) each


def decode_mask(start_pos: torch.Tensor, T: int, max_len: int) -> torch.Tensor:
    """Bool (T, max_len): query i (at position start_pos + i) may attend key j iff j <= start_pos + i.

    Built from tensors only, so it needs no host sync and can be captured in a CUDA graph.
    """
    device = start_pos.device
    pos = start_pos + torch.arange(T, device=device)  # (T,)
    return torch.arange(max_len, device=device)[None, :] <= pos[:, None]  # (T, max_len)


class StaticKVCache(nn.Module):
    """Preallocated keys and values, (batch, n_kv_heads, max_len, head_dim) each.

    ``update(start_pos, k_new, v_new)`` writes T new positions start_pos .. start_pos+T-1 with
    ``index_copy_`` and returns the whole buffers; shapes never change, so a decode step that uses it
    can be captured in a CUDA graph. Everything that can be checked from shapes is checked; that
    start_pos + T <= max_len is the caller's responsibility (checking a device value would sync; on a
    CPU an overflow raises IndexError, on CUDA it is a device-side assert). For inference: call it under
    ``torch.no_grad()`` / ``torch.inference_mode()``.
    """

    def __init__(
        self,
        batch: int,
        max_len: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        for name, val in (("batch", batch), ("max_len", max_len), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            check_int("StaticKVCache", name, val)
        check_float_dtype("StaticKVCache", dtype)
        self.batch, self.max_len, self.n_kv_heads, self.head_dim = batch, max_len, n_kv_heads, head_dim
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    def update(
        self, start_pos: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k_new, v_new (batch, n_kv_heads, T, head_dim) at positions start_pos .. start_pos+T-1."""
        fn = "StaticKVCache.update"
        expected = (self.batch, self.n_kv_heads, None, self.head_dim)
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            check_float_tensor(fn, name, t, min_dim=4)
            if t.dim() != 4 or any(e is not None and s != e for s, e in zip(t.shape, expected)):
                raise ValueError(
                    f"{fn}: {name} must be (batch, n_kv_heads, T, head_dim) = ({self.batch}, "
                    f"{self.n_kv_heads}, T, {self.head_dim}), got {tuple(t.shape)}"
                )
            if t.dtype != self.k.dtype:
                raise TypeError(f"{fn}: {name} must have the cache dtype {self.k.dtype}, got {t.dtype}")
            if t.device != self.k.device:
                raise ValueError(f"{fn}: {name} must be on the cache device {self.k.device}, got {t.device}")
        T = k_new.shape[2]
        if v_new.shape[2] != T:
            raise ValueError(
                f"{fn}: k_new and v_new must hold the same number of positions, got {T} and {v_new.shape[2]}"
            )
        if T > self.max_len:
            raise ValueError(f"{fn}: cannot write T={T} positions into a cache of max_len={self.max_len}")
        start_pos = _check_start_pos(fn, start_pos, self.k.device)
        pos = start_pos + torch.arange(T, device=start_pos.device)  # (T,) int64, stays on the device
        self.k.index_copy_(2, pos, k_new)
        self.v.index_copy_(2, pos, v_new)
        return self.k, self.v

    def reset(self) -> None:
        """Zero both buffers (positions past the current one are masked anyway; this is for hygiene)."""
        self.k.zero_()
        self.v.zero_()

    def extra_repr(self) -> str:
        return (
            f"batch={self.batch}, max_len={self.max_len}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, dtype={self.k.dtype}"
        )
