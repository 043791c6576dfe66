"""A static KV cache for graph-capturable decoding, and the position-tensor helpers a decode step needs.

A decode step captured in a CUDA graph (or compiled once) must not change a shape nor read a device value
on the host. So the cache is preallocated at its full length, new keys and values are written at a 0-dim
int64 *tensor* position (``start_pos``), the queries attend over the whole cache with a mask built from
that tensor (:func:`decode_mask`), and the RoPE rows of the new positions are gathered on the device
(:func:`rope_rows`).
"""

from __future__ import annotations

import torch
from torch import nn

from mahia.measure.checks import check_float_dtype, check_int

__all__ = ["StaticKVCache", "decode_mask", "rope_rows"]


def rope_rows(cache: nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) rows of a :class:`~mahia.layers.rope.RotaryCache` at ``positions`` (int64, (T,)): a gather
    on the device, no host sync (out-of-range positions are not checked: on CUDA a device-side assert)."""
    if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 or positions.dim() != 1:
        raise TypeError("rope_rows: positions must be a 1-d int64 tensor")
    return cache.cos[positions], cache.sin[positions]  # (T, D/2) each


def decode_mask(start_pos: torch.Tensor, T: int, max_len: int) -> torch.Tensor:
    """Bool (T, max_len): query i (at position start_pos + i) may attend key j iff j <= start_pos + i."""
    pos = start_pos + torch.arange(T, device=start_pos.device)  # (T,)
    return torch.arange(max_len, device=start_pos.device)[None, :] <= pos[:, None]  # (T, max_len)


class StaticKVCache(nn.Module):
    """Preallocated keys and values, (batch, n_kv_heads, max_len, head_dim) each.

    ``update(start_pos, k_new, v_new)`` writes T positions start_pos .. start_pos+T-1 (``index_copy_``) and
    returns the whole buffers. start_pos + T <= max_len is the caller's to ensure (checking a device value
    would sync; on a CPU an overflow raises IndexError, on CUDA it is a device-side assert).
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
        if not (isinstance(start_pos, torch.Tensor) and start_pos.dim() == 0 and start_pos.dtype == torch.int64):
            raise TypeError(
                f"{fn}: start_pos must be a 0-dim int64 tensor (a Python int would be baked into a captured "
                f"CUDA graph), got {start_pos!r}"
            )
        T = k_new.shape[2] if k_new.dim() == 4 else -1
        want = (self.batch, self.n_kv_heads, T, self.head_dim)
        if tuple(k_new.shape) != want or tuple(v_new.shape) != want or T > self.max_len:
            raise ValueError(
                f"{fn}: k_new and v_new must be (batch, n_kv_heads, T <= max_len, head_dim) = "
                f"({self.batch}, {self.n_kv_heads}, T <= {self.max_len}, {self.head_dim}), "
                f"got {tuple(k_new.shape)}, {tuple(v_new.shape)}"
            )
        for t in (k_new, v_new, start_pos):
            if t.device != self.k.device or (t is not start_pos and t.dtype != self.k.dtype):
                raise TypeError(f"{fn}: k_new, v_new, start_pos must be on {self.k.device}, k and v in {self.k.dtype}")
        pos = start_pos + torch.arange(T, device=start_pos.device)  # (T,) int64, stays on the device
        self.k.index_copy_(2, pos, k_new)
        self.v.index_copy_(2, pos, v_new)
        return self.k, self.v

    def reset(self) -> None:
        """Zero both buffers (positions past the current one are masked anyway; this is for hygiene)."""
        self.k.zero_()
        self.v.zero_()
