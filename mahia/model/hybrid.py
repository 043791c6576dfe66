"""MAHIA-X: a Llama-style decoder with optional hybrid parts, every part with a reference and a fast path.

    x_0   = E[idx]                                                    token embedding (B, T, D)
    block l (pre-norm, parallel mixers):
        n     = RMSNorm_1(x)
        mix   = Attention(n)  [+ a_l * MetaAttention(n)]  [+ GraphDiffusionMemory(n)]   (all causal)
        m, h  = RMSNorm_2(mix, residual=x)                            fused: h = x + mix, m = RMSNorm_2(h)
        x'    = h + FFN(m)                                            FFN = SwiGLU, or MoE in MoE blocks
    logits = RMSNorm_f(x_L) @ E^T                                     LM head tied to the embedding
    loss   = cross_entropy(logits, targets) + sum over MoE blocks of the (already scaled) aux loss

``a_l`` is a learned scalar per block (1 at init). With ``gating`` the blocks run inside a
:class:`~mahia.model.fabric.DynamicNeuroFabric` as residual deltas, ``x <- x + g_{b,l} (x' - x)`` for
the samples b whose gate g_{b,l} (from x_0) passes the threshold.

Causal for every preset: the graph memory reads only what EARLIER segments of ``memory_segment`` tokens
wrote (while decoding, a segment's write is added when its last token arrives), and the fabric's gates
come from the first token (computed in the decode call that holds position 0, then kept). An MoE
block's aux loss is one statistic over the tokens of the samples that run the block: the branch fabric
(one sample at a time) and the masked one (skipped samples weighted 0) pool the same
:class:`~mahia.model.moe.RouterStats`, so both give the same loss. Every implementation field of
:class:`~mahia.model.config.HybridConfig` computes the same function: weights load across them.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from mahia.layers.attention import Attention, attention_flops
from mahia.layers.kv_cache import StaticKVCache, rope_rows
from mahia.layers.mlp import SwiGLU
from mahia.layers.norm import RMSNorm
from mahia.layers.rope import RotaryCache
from mahia.measure.checks import check_int
from mahia.model.config import CHECKPOINT_POLICIES, HybridConfig
from mahia.model.fabric import DynamicNeuroFabric, fabric_forward
from mahia.model.memory import GraphDiffusionMemory, MemoryCache
from mahia.model.meta_attention import MetaAttention
from mahia.model.moe import MoE, RouterStats, moe_flops
from mahia.ops.gla_scan import gla_flops

__all__ = ["Block", "HybridModel"]


class Block(nn.Module):
    """One pre-norm block (module docstring). ``forward`` returns ``(x', aux)``; ``aux`` is None unless MoE.

    The cache arguments are for decoding only: ``kv_cache`` with ``start_pos``, ``meta_state`` (the
    meta-attention's float32 state) and ``memory_cache`` (the graph memory's :class:`MemoryCache`),
    all updated in place.
    """

    def __init__(self, cfg: HybridConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, impl=cfg.kernels)
        self.attn = Attention(
            cfg.dim,
            cfg.n_heads,
            cfg.n_kv_heads,
            impl=cfg.attention_impl,
            backend=cfg.attention_backend,
            chunk_size=cfg.attention_chunk_size if cfg.attention_impl == "chunked" else None,
            rope_impl=cfg.kernels,
        )
        self.meta = MetaAttention(cfg.dim, cfg.meta_heads, impl=cfg.meta_impl) if cfg.meta_attention else None
        self.meta_gain = nn.Parameter(torch.ones(())) if cfg.meta_attention else None
        memory_kw = dict(impl=cfg.memory_impl, causal=True, segment=cfg.memory_segment)
        self.memory = (
            GraphDiffusionMemory(cfg.dim, cfg.memory_nodes, cfg.memory_steps, cfg.memory_alpha, **memory_kw)
            if cfg.is_memory_block(layer)
            else None
        )
        # the dense MLP's norm feeds only its first matmul; the MoE router reads float32 (moe.py)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps, impl=cfg.kernels, autocast_out=not cfg.is_moe_block(layer))
        if cfg.is_moe_block(layer):
            self.mlp = MoE(
                cfg.dim, cfg.moe_hidden, cfg.n_experts, cfg.top_k, impl=cfg.moe_impl, aux_loss_coef=cfg.aux_loss_coef
            )
        else:
            self.mlp = SwiGLU(cfg.dim, cfg.hidden, impl=cfg.kernels)
        self.is_moe = cfg.is_moe_block(layer)

    def _mix(self, x, cos, sin, kv_cache, start_pos, meta_state, memory_cache):
        n = self.attn_norm(x)  # (B, T, D)
        mix = self.attn(n, cos, sin, kv_cache, start_pos)
        if self.meta is not None:
            meta = self.meta(n) if meta_state is None else self.meta.decode(n, meta_state)
            mix = mix + self.meta_gain * meta
        if self.memory is not None:
            mix = mix + (self.memory(n) if memory_cache is None else self.memory.decode(n, memory_cache, start_pos))
        return mix

    def _ffn(self, m, token_weight=None, return_stats=False):
        """(y, aux) or, with return_stats, (y, aux, RouterStats); aux and stats are None without MoE."""
        if self.is_moe:
            return self.mlp(m, token_weight=token_weight, return_stats=return_stats)
        return (self.mlp(m), None, None) if return_stats else (self.mlp(m), None)

    def forward(self, x, cos, sin, kv_cache=None, start_pos=None, meta_state=None, memory_cache=None):
        """``(x', aux)``. The caches are for decoding (class docstring)."""
        mix = self._mix(x, cos, sin, kv_cache, start_pos, meta_state, memory_cache)
        # Under autocast the mixers return the autocast dtype while the residual stream keeps the
        # parameters' dtype; the fused add+norm wants one dtype (a no-op cast otherwise).
        m, h = self.mlp_norm(mix.to(x.dtype), residual=x)
        y, aux = self._ffn(m)
        return h + y, aux

    def delta(self, x, cos, sin, kv_cache=None, start_pos=None, meta_state=None, memory_cache=None, **moe_kw):
        """``(x' - x, aux)`` computed without the subtraction: ``mix + FFN(m)`` (for the gated fabric).

        ``moe_kw``: ``token_weight`` (B, T) weights the tokens in an MoE block's aux loss; ``return_stats``
        appends the MoE's :class:`RouterStats` (None without MoE): ``(x' - x, aux, stats)``.
        """
        mix = self._mix(x, cos, sin, kv_cache, start_pos, meta_state, memory_cache).to(x.dtype)
        m, _ = self.mlp_norm(mix, residual=x)
        y, *rest = self._ffn(m, **moe_kw)
        return (mix + y, *rest)


class HybridModel(nn.Module):
    """The MAHIA-X decoder (module docstring). ``forward(idx, targets=None) -> (logits, loss)``."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        if not isinstance(cfg, HybridConfig):
            raise TypeError(f"HybridModel: cfg must be a HybridConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.rope = RotaryCache(cfg.head_dim, cfg.max_seq_len, cfg.rope_base)  # one table for all layers
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        gate_kw = dict(threshold=cfg.gate_threshold, impl=cfg.gating_impl, gate_source="first")  # causal gates
        self.fabric = DynamicNeuroFabric(cfg.dim, cfg.n_layers, **gate_kw) if cfg.gating else None
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, impl=cfg.kernels, autocast_out=True)  # feeds the head only
        self.kv_caches: list[StaticKVCache] | None = None
        self.meta_states: list[torch.Tensor | None] | None = None
        self.memory_caches: list[MemoryCache | None] | None = None
        self.gate_state: torch.Tensor | None = None  # (B, L) decode: the gates of the current sequences
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 style: N(0, init_std) for the embedding and the attention / SwiGLU matrices, the two
        residual output projections per block scaled by 1/sqrt(2 n_layers). The hybrid parts (MoE,
        meta-attention, memory, fabric) keep the initialisation their modules chose."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.tok_emb.weight, 0.0, std)
        for block in self.blocks:
            nn.init.normal_(block.attn.qkv_proj.weight, 0.0, std)
            nn.init.normal_(block.attn.out_proj.weight, 0.0, out_std)
            if not block.is_moe:
                nn.init.normal_(block.mlp.w12.weight, 0.0, std)
                nn.init.normal_(block.mlp.w3.weight, 0.0, out_std)

    @property
    def is_causal(self) -> bool:
        """Whether position t sees only tokens 0..t: True as built from any config (module docstring);
        False only if the memory or the fabric was switched to its bidirectional mode afterwards."""
        memories_causal = all(b.memory.causal for b in self.blocks if b.memory is not None)
        return memories_causal and (self.fabric is None or self.fabric.gate_source == "first")

    def _check_idx(self, fn: str, idx: torch.Tensor) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"{fn}: idx must be a torch.Tensor of token ids, got {type(idx).__name__}")
        if idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{fn}: idx must be int64 (or int32) token ids, got dtype {idx.dtype}")
        if idx.dim() != 2 or idx.shape[0] < 1 or idx.shape[1] < 1:
            raise ValueError(f"{fn}: idx must be (B, T) with B, T >= 1, got shape {tuple(idx.shape)}")
        if idx.shape[1] > self.cfg.max_seq_len:
            raise ValueError(f"{fn}: sequence length {idx.shape[1]} exceeds max_seq_len={self.cfg.max_seq_len}")
        if idx.device != self.tok_emb.weight.device:
            raise ValueError(f"{fn}: idx is on {idx.device} but the model is on {self.tok_emb.weight.device}")

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """``idx`` (B, T) token ids -> ``(logits (B, T, V), loss or None)``.

        ``loss`` = mean cross entropy over the targets (ids < 0 are ignored) + the MoE aux losses.
        """
        self._check_idx("HybridModel.forward", idx)
        if targets is not None and (not isinstance(targets, torch.Tensor) or targets.shape != idx.shape):
            got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise ValueError(
                f"HybridModel.forward: targets must be a tensor of the shape of idx {tuple(idx.shape)}, got {got}"
            )
        B, T = idx.shape
        cos, sin = self.rope.get(T)  # (T, head_dim/2) each
        x = self.tok_emb(idx)  # (B, T, D)
        auxes: list[torch.Tensor] = []
        if self.fabric is None:
            for block in self.blocks:
                x, aux = block(x, cos, sin)
                if aux is not None:
                    auxes.append(aux)
        else:
            gates = self.fabric.gates(x)  # (B, L), from x_0[:, 0]
            # The masked fabric runs every block on the whole batch: weight the skipped samples 0 in the
            # MoE aux loss, so that it covers the same tokens as the branch fabric's per-sample calls.
            active = (gates > self.fabric.threshold).to(x.dtype) if self.fabric.impl == "masked" else None
            stats: list[list[RouterStats]] = [[] for _ in self.blocks]
            layers = [
                self._gated(block, cos, sin, stats[l], None if active is None else active[:, l])
                for l, block in enumerate(self.blocks)
            ]
            x = self.fabric(x, layers, gates=gates)
            auxes += [block.mlp.aux_loss_from(RouterStats.pool(st)) for block, st in zip(self.blocks, stats) if st]
        logits = F.linear(self.norm(x), self.tok_emb.weight)  # (B, T, V), tied head
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        for aux in auxes:
            loss = loss + aux
        return logits, loss

    @staticmethod
    def _gated(block: Block, cos, sin, stats: list, active: torch.Tensor | None):
        """Block as the fabric calls it, ``x -> x' - x``, its MoE statistics appended to ``stats``: once per
        running sample (branch, ``active`` None) or once on the batch with ``active`` (B,) = 1 for the
        running samples (masked). Either way the pooled stats cover the tokens of the running samples."""

        def f(x: torch.Tensor) -> torch.Tensor:
            weight = None if active is None else active[:, None].expand(x.shape[0], x.shape[1])  # (B, T)
            delta, _, st = block.delta(x, cos, sin, token_weight=weight, return_stats=True)
            if st is not None:
                stats.append(st)
            return delta

        return f

    def setup_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None) -> None:
        """Allocate the decoding state in ``dtype`` (default: the parameters') on the model's device: per block
        a :class:`StaticKVCache`, the meta-attention's float32 state, the memory's cache; the fabric's gates."""
        check_int("HybridModel.setup_cache", "batch", batch)
        if max_len not in range(1, self.cfg.max_seq_len + 1):
            raise ValueError(f"HybridModel.setup_cache: max_len must be in 1..max_seq_len={self.cfg.max_seq_len}")
        dev, w_dtype = self.tok_emb.weight.device, self.tok_emb.weight.dtype
        dtype = w_dtype if dtype is None else dtype
        cfg = self.cfg
        self.kv_caches, self.meta_states, self.memory_caches = [], [], []
        for b in self.blocks:
            self.kv_caches.append(StaticKVCache(batch, max_len, cfg.n_kv_heads, cfg.head_dim, device=dev, dtype=dtype))
            m = b.meta
            self.meta_states.append(
                None if m is None else torch.zeros(batch, m.n_heads, m.key_dim, m.value_dim, device=dev)
            )
            self.memory_caches.append(None if b.memory is None else b.memory.new_cache(batch, max_len, dtype=dtype))
        self.gate_state = torch.zeros(
            batch, cfg.n_layers, device=dev, dtype=torch.promote_types(w_dtype, torch.float32)
        )

    def reset_cache(self) -> None:
        """Zero the caches in place (their storage stays, so a captured CUDA graph stays valid)."""
        if self.kv_caches is None:
            raise RuntimeError("HybridModel.reset_cache: call setup_cache(batch, max_len) first")
        for cache in self.kv_caches:
            cache.reset()
        for state in self.meta_states:
            if state is not None:
                state.zero_()
        for block, cache in zip(self.blocks, self.memory_caches):
            if cache is not None:
                block.memory.reset_cache(cache)  # the learned nodes, as they are now
        self.gate_state.zero_()

    def decode_step(self, idx: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for tokens ``idx`` (B, T) at positions start_pos .. start_pos+T-1, advancing the
        caches. The call holding position 0 sets the fabric's gates; gated blocks always run masked (the
        same function, no per-sample syncs). ``start_pos``: a 0-dim int64 device tensor, so the step has
        static shapes and (with the sync-free impls) no host sync: a CUDA graph can capture it. Call under
        ``torch.no_grad()``; only a causal model decodes (``is_causal``).
        """
        fn = "HybridModel.decode_step"
        if not self.is_causal:
            raise ValueError(f"{fn}: a part of the model reads later positions (is_causal is False)")
        if self.kv_caches is None:
            raise RuntimeError(f"{fn}: call setup_cache(batch, max_len) first")
        self._check_idx(fn, idx)
        if idx.shape[0] != self.kv_caches[0].batch:
            raise ValueError(
                f"{fn}: idx has batch {idx.shape[0]} but the cache was set up for {self.kv_caches[0].batch}"
            )
        T = idx.shape[1]
        positions = start_pos + torch.arange(T, device=idx.device)  # (T,), on the device
        cos, sin = rope_rows(self.rope, positions)  # (T, head_dim/2) each
        x = self.tok_emb(idx)
        caches = list(zip(self.blocks, self.kv_caches, self.meta_states, self.memory_caches))
        if self.fabric is None:
            for block, cache, state, memory in caches:
                x, _ = block(x, cos, sin, cache, start_pos, state, memory)
        else:
            # The call holding position 0 sets the sequence's gates (from its first token); no host sync.
            self.gate_state.copy_(torch.where(start_pos == 0, self.fabric.gates(x), self.gate_state))
            layers = [
                functools.partial(self._decode_delta, block, cos, sin, cache, start_pos, state, memory)
                for block, cache, state, memory in caches
            ]
            fab = self.fabric
            x = fabric_forward(
                x, fab.gate.weight, fab.gate.bias, layers, threshold=fab.threshold, gates=self.gate_state
            )
        return F.linear(self.norm(x), self.tok_emb.weight)  # (B, T, V)

    @staticmethod
    def _decode_delta(block: Block, cos, sin, kv_cache, start_pos, meta_state, memory_cache, x):
        """``x' - x`` of one block while decoding, as the fabric calls it: ``f(x)``."""
        return block.delta(x, cos, sin, kv_cache, start_pos, meta_state, memory_cache)[0]

    def param_count(self, *, exclude_embedding: bool = False) -> int:
        """Number of parameters (the tied embedding / LM head matrix counted once)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_emb.weight.numel() if exclude_embedding else n

    def flops_breakdown(self, seq_len: int, *, causal: bool = False) -> dict[str, float]:
        """Forward FLOPs per token by part, for sequences of T = ``seq_len`` tokens (a multiply-add is 2).

        With D = dim, Hq / Hkv heads of size hd, F = hidden, E experts of width Fe, top-k, V = vocab,
        meta heads Hm of sizes K, V and gate rank r, N memory nodes, per block:

            attention      2 D (Hq + 2 Hkv) hd + 2 D^2  +  4 T D scores (causal=True: the visible 2 T D)
            SwiGLU / MoE   6 D F  /  2 D E + 6 k D Fe
            meta           2 D (2 Hm K + Hm V + r) + 2 r Hm K + 2 Hm V D + gla_flops(1, Hm, T, K, V) / T
            memory         4 D^2 + 4 N D per token read; the same per token written (Tw = (J - 1) S of
                           the J = ceil(T / S) segments, S = min(memory_segment, T): the last is never
                           read); 2 N D^2 per sequence (write queries) and 4 N D^2 + 2 N^2 D per segment

        and the LM head 2 D V and the gates 2 D L / T. Norms, activations, softmax, RoPE and residual adds
        move bytes, not FLOPs. Counted as the model defines them (k experts, every gated block runs), not
        as an implementation executes them (the masked fabric also computes blocks it discards).
        """
        check_int("flops_per_token", "seq_len", seq_len)
        cfg, T = self.cfg, seq_len
        D, hd, L = cfg.dim, cfg.head_dim, cfg.n_layers
        parts = dict.fromkeys(
            ("attention_proj", "attention_scores", "mlp", "moe", "meta_attention", "graph_memory", "gating", "lm_head"),
            0.0,
        )
        for block in self.blocks:
            parts["attention_proj"] += 2 * D * (cfg.n_heads + 2 * cfg.n_kv_heads) * hd + 2 * D * D
            parts["attention_scores"] += attention_flops(1, cfg.n_heads, T, T, hd, causal) / T
            if block.is_moe:
                parts["moe"] += moe_flops(1, D, cfg.moe_hidden, cfg.top_k, cfg.n_experts)
            else:
                parts["mlp"] += 6 * D * cfg.hidden
            if block.meta is not None:
                m = block.meta
                H, K, V = m.n_heads, m.key_dim, m.value_dim
                r = m.gate_rank
                proj = 2 * D * (2 * H * K + H * V + r) + 2 * r * H * K + 2 * H * V * D
                parts["meta_attention"] += proj + gla_flops(1, H, T, K, V, backward=False) / T
            if block.memory is not None:
                N, S = block.memory.n_nodes, min(cfg.memory_segment or T, T)
                J = -(-T // S)
                T_write = (J - 1) * S
                per_segment = 4 * N * D * D + (2 * N * N * D if block.memory.steps > 0 else 0)
                parts["graph_memory"] += (
                    4 * D * D
                    + 4 * N * D
                    + (4 * D * D + 4 * N * D) * T_write / T
                    + ((2 * N * D * D if T_write else 0) + J * per_segment) / T
                )
        if self.fabric is not None:
            parts["gating"] = 2 * D * L / T
        parts["lm_head"] = 2 * D * cfg.vocab_size
        return parts

    def flops_per_token(self, seq_len: int, *, training: bool = True, causal: bool = False) -> float:
        """The sum of :meth:`flops_breakdown`, times 3 when ``training`` (each matmul has two gradient
        matmuls of its size). Dense: PaLM's ``6 N + 12 L T D`` (attention over all T keys unless causal)."""
        total = sum(self.flops_breakdown(seq_len, causal=causal).values())
        return 3 * total if training else total

    def activation_bytes_per_token(
        self, seq_len: int, dtype: torch.dtype = torch.float32, *, checkpoint: str | None = None, itemized: bool = False
    ) -> tuple[float, float] | list[dict]:
        """(bytes kept for backward at the end of the forward, bytes alive again while one block is
        recomputed), per token (the model: :meth:`memory_estimate`; the checkpointing arithmetic:
        :func:`mahia.measure.cost.activation_bytes`). ``itemized=True``: the table instead, one row per
        part of every block and one for the head, ``{"block": index or None, "part", "full": bytes per
        token kept without checkpointing, "selective": kept with selective checkpointing}``."""
        if checkpoint not in CHECKPOINT_POLICIES:
            raise ValueError(f"memory_estimate: checkpoint must be one of {CHECKPOINT_POLICIES}, got {checkpoint!r}")
        cfg, T = self.cfg, seq_len
        D, Dkv, Hq = cfg.dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_heads
        s = torch.empty((), dtype=dtype).element_size()
        r = self.tok_emb.weight.element_size()  # the residual stream keeps the parameters' dtype
        probs_bytes = 4 + (s if s < 4 else 0)  # float32 softmax, plus its cast to the input dtype
        rows = []

        def row(i, part, full, selective):
            rows.append({"block": i, "part": part, "full": full, "selective": selective})

        # Notation of flops_breakdown. Attention: norm input (the block input, D r) and output, q, k, v, its
        # output; sdpa: the float32 log-sum-exp; manual/chunked: the float32 probabilities (and their cast),
        # the O(T^2) term. Meta: the projection (q, k, v, the gate's code), the gate's logits, output, the gain's
        # input (the scan scales q and takes logsigmoid itself: nothing elementwise to drop when selective).
        # Memory: write k, v, read q, output, write and read weights; per segment its state, diffused state,
        # read keys and values. MoE: norm; per assignment input, up projection, activation, output; router
        # probabilities. SwiGLU: norm, up (2F), activation. Head: final norm; nll_loss's float32
        # log-probabilities, under autocast also the log-softmax output in the activation dtype.
        for i, block in enumerate(self.blocks):
            core = 4 * Hq if cfg.attention_impl == "sdpa" else Hq * T * probs_bytes
            row(i, "attention", D * r + (3 * D + 2 * Dkv) * s + core, D * r + (2 * D + 2 * Dkv) * s + core)
            if block.meta is not None:
                H, K, V = block.meta.n_heads, block.meta.key_dim, block.meta.value_dim
                meta = H * (3 * K + 2 * V) + block.meta.gate_rank + D  # q, k, v, r are views into the projection
                row(i, "meta-attention", meta * s, meta * s)
            if block.memory is not None:
                N, S = block.memory.n_nodes, min(cfg.memory_segment or T, T)
                mem = (4 * D + 2 * N) * s + 4 * N * D * s / S
                row(i, "graph memory", mem, mem)
            if block.is_moe:
                k, Fe, E = cfg.top_k, cfg.moe_hidden, cfg.n_experts
                row(i, "MoE", D * (r + s) + k * (2 * D + 3 * Fe) * s + 4 * E, k * (2 * D + 2 * Fe) * s + 4 * E)
            else:
                row(i, "SwiGLU", D * r + (D + 3 * cfg.hidden) * s, (2 * cfg.hidden + D) * s)
        head = D * (r + s) + (4 + (s if s < 4 else 0)) * cfg.vocab_size
        row(None, "head", head, head)
        if itemized:
            return rows
        from mahia.measure.cost import activation_bytes

        per_block = [
            tuple(sum(r[k] for r in rows if r["block"] == i) for k in ("full", "selective"))
            for i in range(len(self.blocks))
        ]
        # keep_attention keeps the fused kernel's output (D) and float32 log-sum-exp (Hq); the manual and
        # chunked paths have no such kernel, so there it keeps what full checkpointing keeps
        attn = D * s + 4 * Hq if cfg.attention_impl == "sdpa" else 0.0
        return activation_bytes(per_block, block_input=D * r, head=head, attention=attn, checkpoint=checkpoint)

    def memory_estimate(
        self, batch: int, seq_len: int, dtype: torch.dtype = torch.float32, *, checkpoint: str | None = None
    ) -> dict[str, int]:
        """Training memory in bytes: parameters, gradients, AdamW states (8 bytes per parameter),
        ``activations`` (what autograd keeps for backward), ``recompute`` (one checkpointed block's
        activations, alive while it is recomputed) and their ``total`` (the peak falls early in backward).

        Per token, with s = bytes per element of ``dtype`` and r = of the parameters (the residual stream
        keeps their dtype under autocast), the fused paths keep what :meth:`activation_bytes_per_token`
        lists part by part; the eager paths keep more (eager RMSNorm its normalized input, eager RoPE both
        versions of q and k, the scans their decays or states), so for them this is a lower bound.
        ``checkpoint="full"`` keeps each block's input (D r); ``"selective"`` also the outputs of matmuls
        and attention; ``"keep_attention"`` the input and the fused attention's output and log-sum-exp
        (D r + D s + 4 Hq). Allocator slack, workspaces and temporaries are not included:
        ``torch.cuda.max_memory_allocated`` is the real peak.
        """
        for name, v in (("batch", batch), ("seq_len", seq_len)):
            check_int("memory_estimate", name, v)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"memory_estimate: dtype must be a torch.dtype, got {type(dtype).__name__}")
        n = self.param_count()
        p_bytes = self.tok_emb.weight.element_size()
        kept, recompute = self.activation_bytes_per_token(seq_len, dtype, checkpoint=checkpoint)
        out = {
            "parameters": n * p_bytes,
            "gradients": n * p_bytes,
            "optimizer": n * 8,
            "activations": int(batch * seq_len * kept),
            "recompute": int(batch * seq_len * recompute),
        }
        out["total"] = sum(out.values())
        return out
