"""Attention: the textbook path, PyTorch's fused SDPA kernels with an explicit backend, a chunked path,
and the attention layer (decoding through :class:`mahia.layers.kv_cache.StaticKVCache`).

    out = softmax(q @ k^T * scale + mask) @ v,        q (T, D), k (S, D), v (S, Dv) per head, scale = D^-0.5

GQA: q has Hq heads, k and v Hkv with Hq % Hkv == 0; query head h reads kv head h // (Hq / Hkv) (the
layout of ``repeat_interleave`` and SDPA's ``enable_gqa``). Causal masking aligns the queries to the END
of the keys: query i sees keys j <= i + S - T (for S > T: the T new tokens of a decode step). SDPA's
``is_causal`` aligns top-left, so for S != T the SDPA path passes an explicit mask.

Edge cases, the same on every path: a query row that sees no key gives 0 and zero gradients, as SDPA's
kernels do (a plain softmax would give 0/0 = NaN); T = 0 gives an empty (B, Hq, 0, Dv); a float mask has
each row shifted to a maximum of 0 first (softmax ignores the shift), so its offset costs no precision.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from mahia.layers.kv_cache import StaticKVCache, decode_mask
from mahia.layers.rope import IMPLS as ROPE_IMPLS
from mahia.layers.rope import apply_rope
from mahia.measure.checks import check_float_tensor, check_int, check_same_device

__all__ = [
    "IMPLS",
    "BACKENDS",
    "manual_attention",
    "sdpa_attention",
    "chunked_attention",
    "attention",
    "available_backends",
    "fused_backends",
    "attention_flops",
    "attention_bytes",
    "chunk_blocks",
    "Attention",
]

IMPLS = ("sdpa", "manual", "chunked")
# Fallback order: fastest kernels first, "math" (always runnable) last.
BACKENDS = ("flash", "cudnn", "efficient", "math")
_SDP_BACKEND = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
DEFAULT_CHUNK_SIZE = 1024


def _check(fn: str, q, k, v, attn_mask=None, causal: bool = False, backend: str | None = None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(fn, name, t, min_dim=4)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{fn}: q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    check_same_device(fn, q=q, k=k, v=v)
    if not (q.dim() == k.dim() == v.dim() == 4 and k.shape[::3] == q.shape[::3] and v.shape[:3] == k.shape[:3]):
        raise ValueError(
            f"{fn}: q, k, v must be (B, Hq, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv) with one batch size and head "
            f"dim, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, Hq, T, _ = q.shape
    if k.shape[1] == 0 or Hq % k.shape[1] != 0:
        raise ValueError(f"{fn}: Hq={Hq} query heads must be a multiple of the number of kv heads Hkv={k.shape[1]}")
    _check_causal_lengths(fn, T, k.shape[2], causal)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"{fn}: backend must be None or one of {BACKENDS}, got {backend!r}")
    if attn_mask is not None:
        full = (B, Hq, T, k.shape[2])
        try:
            kind_ok = attn_mask.dtype == torch.bool or attn_mask.is_floating_point()
            ok = kind_ok and attn_mask.dim() >= 2 and torch.broadcast_shapes(attn_mask.shape, full) == full
        except (AttributeError, RuntimeError):
            ok = False
        if not ok:
            raise ValueError(
                f"{fn}: attn_mask must be None or a bool (True = attend) or float tensor of >= 2 dims "
                f"broadcastable to (B, Hq, T, S) = {full}, got {getattr(attn_mask, 'shape', type(attn_mask))}"
            )
        check_same_device(fn, q=q, attn_mask=attn_mask)


def _check_causal_lengths(fn: str, T: int, S: int, causal: bool) -> None:
    if causal and S < T:
        raise ValueError(
            f"{fn}: causal attention aligns the T={T} queries to the end of the S={S} keys and "
            "needs S >= T (otherwise the first queries see no key)"
        )


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * n_rep, S, D); head h of the result is kv head h // n_rep."""
    if n_rep == 1:
        return x
    B, Hkv, S, D = x.shape
    return x[:, :, None].expand(B, Hkv, n_rep, S, D).reshape(B, Hkv * n_rep, S, D)


def causal_mask(T: int, S: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool (T, S), True where query i may attend key j, i.e. j <= i + S - T (aligned to the end)."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


def _combined_mask(
    q: torch.Tensor, k: torch.Tensor, causal: bool, attn_mask: torch.Tensor | None
) -> tuple[torch.Tensor | None, bool]:
    """The (mask, is_causal) for SDPA to compute bottom-right causal attention: its own ``is_causal`` (which
    lets flash run) only for S == T without a user mask, else the triangle goes into the mask. A float
    mask goes in q's dtype (cuDNN's and the memory-efficient kernel's rule), shifted by :func:`_float_mask`."""
    T, S = q.shape[2], k.shape[2]
    if causal and attn_mask is None and S == T:
        return None, True
    keep = causal_mask(T, S, q.device) if causal else None  # (T, S)
    if attn_mask is not None and attn_mask.is_floating_point():
        return _float_mask(attn_mask, keep, q.dtype), False
    if keep is None or attn_mask is None:
        return (attn_mask if keep is None else keep), False
    return attn_mask & keep, False


def _float_mask(mask: torch.Tensor, keep: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A float mask with the bool ``keep`` (None: all) applied as -inf and each row shifted to a maximum of
    0, in ``dtype``. Softmax ignores a constant added to a row; shifted, what the scores' dtype keeps is the
    row's range, not its offset (unshifted, a row of -1e5 rounds to -inf in float16, a bias near 300 keeps 3
    significant bits in bfloat16, and one near 1e5 swamps float32 scores). A row of -inf stays one."""
    if keep is not None:
        mask = mask.masked_fill(~keep, float("-inf"))
    if mask.numel():
        top = mask.detach().amax(dim=-1, keepdim=True)
        mask = mask - torch.where(top.isfinite(), top, 0.0)
    return mask.to(dtype)


def manual_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q @ k^T * scale + mask) @ v, the textbook way: the (B, Hq, T, S) scores are materialized.

    q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> (B, Hq, T, Dv) in q's dtype. Scaling, masking
    and softmax run in float32 (float64 for float64 inputs). ``attn_mask``: bool (True = attend) or float
    (added), broadcastable to (B, Hq, T, S); with ``causal`` both apply. Rows that see no key (found from
    the mask alone) are softmaxed unmasked and their output zeroed.
    """
    _check("manual_attention", q, k, v, attn_mask, causal)
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    scale = D**-0.5 if scale is None else scale
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, Hq, S, D)

    dt = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q, k.transpose(-2, -1)).to(dt) * scale  # (B, Hq, T, S)
    keep = causal_mask(T, S, q.device) if causal else None  # bool, broadcastable to (B, Hq, T, S)
    bias = None  # a float mask, added to the scores
    dead = None  # (..., T, 1): rows that see no key (causal alone hides none: S >= T)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = attn_mask if keep is None else attn_mask & keep
            seen = keep
        else:
            bias = _float_mask(attn_mask, keep, dt)  # the causal triangle included
            keep, seen = None, bias > float("-inf")
        dead = ~seen.any(dim=-1, keepdim=True)
        # a dead row is softmaxed over all its keys (finite) and its output zeroed below
        keep = None if keep is None else keep | dead
        bias = None if bias is None else bias.masked_fill(dead, 0.0)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(v.dtype), v)  # (B, Hq, T, Dv)
    return out if dead is None else out.masked_fill(dead, 0.0)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    backend: str | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The same function as :func:`manual_attention`, through ``F.scaled_dot_product_attention``.

    ``backend``: "flash" (FlashAttention-2, CUDA sm80+ fp16/bf16, no arbitrary mask; on a CPU PyTorch's
    tiled kernel of that name), "cudnn" (CUDA sm80+), "efficient" (memory-efficient, CUDA), "math" (runs
    everywhere), or None (PyTorch chooses). One that cannot run on these inputs is replaced by the first
    of ``BACKENDS`` that can, with a warning once. GQA uses ``enable_gqa`` where the kernel takes it, else
    the kv heads are repeated first. Rows that see no key give 0 (cuDNN's kernel does not: fixed up).
    """
    _check("sdpa_attention", q, k, v, attn_mask, causal, backend)
    mask, is_causal = _combined_mask(q, k, causal, attn_mask)
    if q.shape[2] == 0:  # no query: SDPA's CUDA kernels refuse it ("No available kernel"); same result
        return manual_attention(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    gqa = q.shape[1] != k.shape[1]
    if backend is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)
        return _zero_dead_rows(out, mask)
    name, native_gqa = _plan(q, k, v, backend, mask, is_causal)
    if gqa and not native_gqa:
        n_rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    with sdpa_kernel(_SDP_BACKEND[name]):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa and native_gqa
        )
    return _zero_dead_rows(out, mask)


def _zero_dead_rows(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the output rows whose mask sees no key: cuDNN's kernel (torch 2.11, H100) does not; no sync."""
    if mask is None:
        return out
    seen = mask if mask.dtype == torch.bool else mask > float("-inf")
    return out.masked_fill(~seen.any(dim=-1, keepdim=True), 0.0)


def _slice_mask(attn_mask: torch.Tensor, t0: int, t1: int, s1: int) -> torch.Tensor:
    """Rows t0:t1 and columns :s1 of a mask broadcastable to (B, H, T, S) (size-1 dims kept)."""
    if attn_mask.shape[-2] != 1:
        attn_mask = attn_mask[..., t0:t1, :]
    if attn_mask.shape[-1] != 1:
        attn_mask = attn_mask[..., :s1]
    return attn_mask


def chunked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    backend: str | None = None,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The same function as :func:`manual_attention`, ``chunk_size`` queries at a time.

    Rows of softmax(q k^T) are independent, so splitting the queries changes only the peak memory:
    O(B Hq chunk_size S). With ``causal`` the chunk of queries t0 .. t1-1 sees no key past t1 - 1 + S - T,
    so keys are cut there (skipping the masked blocks); causal attention on the cut keys, aligned to
    their end, is the full problem's pattern. Chunks run :func:`manual_attention`, or with a
    ``backend`` :func:`sdpa_attention`.
    """
    _check("chunked_attention", q, k, v, attn_mask, causal, backend)
    check_int("chunked_attention", "chunk_size", chunk_size)
    T, S = q.shape[2], k.shape[2]
    outs = []
    for t0 in range(0, max(T, 1), chunk_size):  # T = 0: one empty chunk, so the output keeps its shape
        t1 = min(t0 + chunk_size, T)
        s1 = t1 + S - T if causal else S  # last key any query of this chunk sees, plus one
        qc, kc, vc = q[:, :, t0:t1], k[:, :, :s1], v[:, :, :s1]  # (B, Hq, c, D), (B, Hkv, s1, D)
        mc = None if attn_mask is None else _slice_mask(attn_mask, t0, t1, s1)
        if backend is None:
            outs.append(manual_attention(qc, kc, vc, causal=causal, attn_mask=mc, scale=scale))
        else:
            outs.append(sdpa_attention(qc, kc, vc, causal=causal, attn_mask=mc, backend=backend, scale=scale))
    return torch.cat(outs, dim=2)  # (B, Hq, T, Dv)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    impl: str = "sdpa",
    causal: bool = True,
    backend: str | None = None,
    chunk_size: int | None = None,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`sdpa_attention`, :func:`manual_attention` or :func:`chunked_attention` (``backend``: "sdpa"
    and "chunked"; ``chunk_size``: "chunked" only, default 1024)."""
    _check_impl_args("attention", impl, backend, chunk_size)
    kw = dict(causal=causal, attn_mask=attn_mask, scale=scale)
    if impl == "manual":
        return manual_attention(q, k, v, **kw)
    if impl == "sdpa":
        return sdpa_attention(q, k, v, backend=backend, **kw)
    return chunked_attention(q, k, v, chunk_size=chunk_size or DEFAULT_CHUNK_SIZE, backend=backend, **kw)


def _check_impl_args(fn: str, impl: str, backend: str | None, chunk_size: int | None) -> None:
    if impl not in IMPLS:
        raise ValueError(f"{fn}: impl must be one of {IMPLS}, got {impl!r}")
    if backend is not None and (impl == "manual" or backend not in BACKENDS):
        raise ValueError(f"{fn}: backend must be None or, with impl 'sdpa' or 'chunked', one of {BACKENDS}")
    if chunk_size is not None:
        if impl != "chunked":
            raise ValueError(f"{fn}: chunk_size applies to impl='chunked' only, got impl={impl!r}")
        check_int(fn, "chunk_size", chunk_size)


_warned: set[tuple] = set()  # (requested, chosen, device type, dtype) that already warned about a fallback


def _takes(name: str, q, k, v, mask, is_causal: bool) -> bool:
    """Whether SDPA backend ``name`` takes these inputs as they are: PyTorch's own choice with only it
    enabled (``torch._fused_sdp_choice``; no launch)."""
    with warnings.catch_warnings(), sdpa_kernel(_SDP_BACKEND[name]):
        warnings.simplefilter("ignore")  # PyTorch warns why it rejects a kernel
        try:
            torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, enable_gqa=q.shape[1] != k.shape[1])
            return True
        except RuntimeError:
            return False


def _runs(name: str, q, k, v, mask, is_causal: bool) -> tuple[bool, bool]:
    """(runs, runs on the grouped-query heads as they are): a backend that does not take GQA heads
    (``enable_gqa``) may take them once the kv heads are repeated."""
    native = _takes(name, q, k, v, mask, is_causal)
    if native or q.shape[1] == k.shape[1]:
        return native, native
    n_rep = q.shape[1] // k.shape[1]
    return _takes(name, q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, is_causal), False


def _plan(q, k, v, requested: str, mask, is_causal: bool) -> tuple[str, bool]:
    """(backend, use enable_gqa): ``requested`` if it runs, else the first of ``BACKENDS`` that does (a
    warning once per kind of input). Under torch.compile, which cannot trace the check, ``requested``."""
    if torch.compiler.is_compiling():
        return requested, True
    for name in (requested, *BACKENDS):  # "math" always runs
        runs, native_gqa = _runs(name, q, k, v, mask, is_causal)
        if runs:
            break
    key = (requested, name, q.device.type, q.dtype)
    if name != requested and key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"attention: SDPA backend {requested!r} cannot run on these inputs (device {q.device}, "
            f"dtype {q.dtype}, head_dim {q.shape[-1]}, mask {'yes' if mask is not None else 'no'}, "
            f"GQA {'yes' if q.shape[1] != k.shape[1] else 'no'}); using {name!r} instead.",
            RuntimeWarning,
            stacklevel=3,
        )
    return name, native_gqa


def available_backends(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, attn_mask: torch.Tensor | None = None
) -> list[str]:
    """The SDPA backends (in ``BACKENDS`` order) that :func:`sdpa_attention` can run on these inputs, by
    PyTorch's own check of each (no launch): on a CPU "flash" (PyTorch's CPU kernel) and "math"."""
    _check("available_backends", q, k, v, attn_mask, causal)
    mask, is_causal = _combined_mask(q, k, causal, attn_mask)
    return [name for name in BACKENDS if _runs(name, q, k, v, mask, is_causal)[0]]


def fused_backends(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, attn_mask: torch.Tensor | None = None
) -> list[str]:
    """The fused backends (``BACKENDS`` less "math") that take these inputs as they are, GQA heads included:
    those ``backend=None`` can pick. None: it runs math, which writes the T x T scores (H200, torch 2.11,
    float32 with 8 query heads on 4 KV heads: notebook 10's SDPA rung)."""
    _check("fused_backends", q, k, v, attn_mask, causal)
    mask, is_causal = _combined_mask(q, k, causal, attn_mask)
    return [name for name in BACKENDS if name != "math" and _runs(name, q, k, v, mask, is_causal)[1]]


def attention_flops(B: int, Hq: int, T: int, S: int, D: int, causal: bool) -> int:
    """Forward FLOPs: two matmuls (q k^T and p v) of 2 T S D per head, 4 B Hq T S D; causal counts only the
    visible part (FlashAttention's convention): 4 B Hq D (T S - T^2 / 2), half for S == T."""
    for name, val in (("B", B), ("Hq", Hq), ("T", T), ("S", S), ("D", D)):
        check_int("attention_flops", name, val)
    _check_causal_lengths("attention_flops", T, S, causal)
    if causal:
        return 2 * B * Hq * D * (2 * T * S - T * T)
    return 4 * B * Hq * T * S * D


def attention_bytes(B: int, Hq: int, Hkv: int, T: int, S: int, D: int, *, dtype: torch.dtype = torch.bfloat16) -> int:
    """Minimum HBM bytes of a fused kernel: q, k, v read once, the output written once,
    (2 B Hq T D + 2 B Hkv S D) * bytes per element (the manual path also moves the (T, S) matrices)."""
    for name, val in (("B", B), ("Hq", Hq), ("Hkv", Hkv), ("T", T), ("S", S), ("D", D)):
        check_int("attention_bytes", name, val)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"attention_bytes: dtype must be a torch.dtype, got {type(dtype).__name__}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    return (2 * B * Hq * T * D + 2 * B * Hkv * S * D) * itemsize


def chunk_blocks(T: int, S: int, chunk_size: int, causal: bool = True) -> list[tuple[int, int]]:
    """(queries, keys) of each block :func:`chunked_attention` runs, in order: chunk c holds queries
    t0 .. t1-1 and, with ``causal``, keys 0 .. t1-1+S-T. For S == T that is T (T + chunk_size) / 2 scores
    when chunk_size divides T: about half of the manual path's T S, more as the chunk grows."""
    for name, val in (("T", T), ("S", S), ("chunk_size", chunk_size)):
        check_int("chunk_blocks", name, val, minimum=1 if name == "chunk_size" else 0)
    _check_causal_lengths("chunk_blocks", T, S, causal)
    blocks = []
    for t0 in range(0, max(T, 1), chunk_size):  # the same loop as chunked_attention
        t1 = min(t0 + chunk_size, T)
        blocks.append((t1 - t0, t1 + S - T if causal else S))
    return blocks


class Attention(nn.Module):
    """Multi-head self-attention with GQA and RoPE: fused qkv projection, attention, output projection.

        q, k, v = split(x @ Wqkv^T);  q, k = rope(q), rope(k);  y = attention(q, k, v) @ Wo^T

    ``impl`` / ``backend`` / ``chunk_size``: the path (:func:`attention`); ``rope_impl``: "eager" or
    "triton". With ``kv_cache`` and ``start_pos`` (a 0-dim int64 device tensor) the new k, v are written
    at start_pos.. and the queries attend over the whole static cache through a mask: no host sync, no
    shape change, so a decode step can be captured in a CUDA graph. ``cos``, ``sin``: the (T, head_dim/2)
    RoPE rows of those positions (``rope_rows`` gathers them from a position tensor).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        impl: str = "sdpa",
        backend: str | None = None,
        chunk_size: int | None = None,
        rope_impl: str = "eager",
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        for name, val in (("dim", dim), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            check_int("Attention", name, val)
        if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
            raise ValueError(
                f"Attention: dim={dim} must be divisible by n_heads={n_heads} into an even head_dim (RoPE), "
                f"and n_heads a multiple of n_kv_heads={n_kv_heads}"
            )
        _check_impl_args("Attention", impl, backend, chunk_size)
        if rope_impl not in ROPE_IMPLS:
            raise ValueError(f"Attention: rope_impl must be one of {ROPE_IMPLS}, got {rope_impl!r}")
        self.dim, self.n_heads, self.n_kv_heads = dim, n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.impl, self.backend, self.chunk_size, self.rope_impl = impl, backend, chunk_size, rope_impl
        qkv_out = (n_heads + 2 * n_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(dim, qkv_out, bias=False)
        self.out_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin, kv_cache: StaticKVCache | None = None, start_pos=None) -> torch.Tensor:
        check_float_tensor("Attention.forward", "x", x, min_dim=3)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"Attention.forward: x must be (B, T, dim={self.dim}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        Hq, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, Hq, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        q, k = apply_rope(q, k, cos, sin, impl=self.rope_impl)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)

        mask = None  # without a cache: causal self-attention over the T tokens
        if kv_cache is not None:
            if start_pos is None:
                raise ValueError("Attention.forward: kv_cache needs start_pos (a 0-dim int64 tensor)")
            k, v = kv_cache.update(start_pos, k, v)  # (B, Hkv, max_len, D)
            mask = decode_mask(start_pos, T, kv_cache.max_len)  # (T, max_len)
        elif start_pos is not None:
            raise ValueError("Attention.forward: start_pos is only meaningful together with kv_cache")
        kw = dict(impl=self.impl, backend=self.backend, chunk_size=self.chunk_size)
        out = attention(q, k, v, causal=mask is None, attn_mask=mask, **kw)
        out = out.transpose(1, 2).reshape(B, T, Hq * D)  # (B, T, Hq*D)
        return self.out_proj(out)
