"""A plain GPT: the peer that notebook 10's dense model has to beat.

nanoGPT-style and deliberately ordinary: ``nn.Linear``, ``nn.RMSNorm``, rotary
embeddings in four lines of PyTorch, ``F.scaled_dot_product_attention`` with ``is_causal=True`` and
PyTorch's own backend choice, a SwiGLU MLP, and an LM head tied to the embedding. Nothing from
:mod:`mahia.layers` or :mod:`mahia.ops`: what it runs is what a researcher gets from PyTorch alone, so
that ``torch.compile`` + bf16 autocast + fused AdamW on this model is the fair baseline for "every
optimization" on :class:`mahia.model.HybridModel`.

It takes its sizes from a :class:`~mahia.model.config.HybridConfig` without hybrid parts (the
``dense-350m`` preset), so both models have the same parameters, the same shapes and the same FLOPs
per token::

    x      = E[idx]                                          (B, T, D)
    block  x = x + W_o  SDPA(rope(W_q n), rope(W_k n), W_v n),   n = rmsnorm(x)
           x = x + W_3 (silu(n W_1) * (n W_2)),                   n = rmsnorm(x)
    logits = rmsnorm(x) E^T,   loss = cross_entropy(logits, targets)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mahia.model.config import HybridConfig

__all__ = ["PlainGPT", "from_hybrid_state_dict"]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by the position's angles. x (B, H, T, d); cos, sin (T, d/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class _Block(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.out = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.w12 = nn.Linear(cfg.dim, 2 * cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], dim=-1
        )
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, d)
        k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, d)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.n_kv != self.n_heads:  # grouped-query attention: each kv head serves n_heads / n_kv queries
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d)
        x = x + self.out(a.transpose(1, 2).reshape(B, T, -1))
        gate, up = self.w12(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w3(F.silu(gate) * up)


class PlainGPT(nn.Module):
    """``forward(idx, targets=None) -> (logits (B, T, V), loss or None)``, like HybridModel's.

    ``cfg`` gives the sizes (vocab, dim, layers, heads, kv heads, hidden, max_seq_len, rope base, norm
    eps, init std); it must have no hybrid parts (meta-attention, graph memory, MoE, gating), which a
    plain GPT does not have. Its implementation fields are ignored: this model has one implementation.
    """

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        if not isinstance(cfg, HybridConfig):
            raise TypeError(f"PlainGPT: cfg must be a HybridConfig, got {type(cfg).__name__}")
        hybrid = [n for n in ("meta_attention", "graph_memory", "moe", "gating") if getattr(cfg, n)]
        if hybrid:
            raise ValueError(f"PlainGPT: cfg has hybrid parts {hybrid}; use a dense config such as 'dense-350m'")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        inv_freq = cfg.rope_base ** -(torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)  # (T, d/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        # GPT-2 initialisation, the residual projections scaled by 1/sqrt(2 L) (as HybridModel does).
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        nn.init.normal_(self.tok_emb.weight, 0.0, cfg.init_std)
        for b in self.blocks:
            for lin, std in ((b.qkv, cfg.init_std), (b.out, out_std), (b.w12, cfg.init_std), (b.w3, out_std)):
                nn.init.normal_(lin.weight, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            got = f"{idx.dtype} {tuple(idx.shape)}" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"PlainGPT.forward: idx must be (B, T) int64 token ids, got {got}")
        B, T = idx.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"PlainGPT.forward: sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}")
        x = self.tok_emb(idx)  # (B, T, D)
        cos, sin = self.cos[:T], self.sin[:T]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = F.linear(self.norm(x), self.tok_emb.weight)  # (B, T, V), tied head
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T), ignore_index=-1)

    def param_count(self) -> int:
        """Number of parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())


_RENAMES = (("attn.qkv_proj.", "qkv."), ("attn.out_proj.", "out."), ("mlp.w12.", "w12."), ("mlp.w3.", "w3."))


def from_hybrid_state_dict(state: dict) -> dict:
    """A dense :class:`~mahia.model.HybridModel`'s ``state_dict`` under PlainGPT's parameter names (the same
    tensors), so that both models can be run on the same weights and checked against each other."""
    if not isinstance(state, dict):
        raise TypeError(f"from_hybrid_state_dict: state must be a dict, got {type(state).__name__}")
    out = {}
    for name, value in state.items():
        for old, new in _RENAMES:
            name = name.replace(old, new)
        out[name] = value
    return out
