"""The configuration of the MAHIA-X hybrid model, in the style of nanoGPT's ``GPTConfig``: sizes, hybrid
switches (each with its sizes) and implementation choices, one field per real decision. Every choice
computes the same function; ``baseline()`` picks the readable reference paths, ``optimized()`` the fast
ones. ``HybridConfig.preset("small", n_layers=4)`` gives a named size, overrides validated like any field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mahia.measure.checks import check_int

__all__ = ["HybridConfig", "IMPL_CHOICES", "BASELINE_IMPLS", "OPTIMIZED_IMPLS", "PRESETS", "CHECKPOINT_POLICIES"]

# The activation-checkpointing policies: not a config field (checkpointing changes how a model runs, not
# what it computes; mahia.model.optimize applies it), here so the memory estimate can name them.
CHECKPOINT_POLICIES: tuple[str | None, ...] = (None, "full", "selective", "keep_attention")

# The valid values of every implementation field.
IMPL_CHOICES: dict[str, tuple[Any, ...]] = {
    "attention_impl": ("manual", "sdpa", "chunked"),
    # None lets SDPA choose; the others pin one torch.nn.attention.SDPBackend (sdpa impl only).
    "attention_backend": (None, "math", "flash", "efficient", "cudnn"),
    "kernels": ("eager", "triton"),  # RMSNorm, SwiGLU activation, RoPE
    "moe_impl": ("loop", "grouped"),
    "meta_impl": ("loop", "logspace", "triton"),
    "memory_impl": ("loop", "batched"),
    "gating_impl": ("branch", "masked"),
}

# The readable reference path and the fast path of every decision (see baseline() / optimized()).
BASELINE_IMPLS: dict[str, Any] = {
    "attention_impl": "manual",
    "attention_backend": None,
    "kernels": "eager",
    "moe_impl": "loop",
    "meta_impl": "loop",
    "memory_impl": "loop",
    "gating_impl": "branch",
}
OPTIMIZED_IMPLS: dict[str, Any] = {
    "attention_impl": "sdpa",
    "attention_backend": None,
    "kernels": "triton",
    "moe_impl": "grouped",
    "meta_impl": "triton",
    "memory_impl": "batched",
    "gating_impl": "masked",
}


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass(frozen=True)
class HybridConfig:
    """Sizes, hybrid switches and implementation choices of :class:`mahia.model.HybridModel`.

    ``n_kv_heads=None``: ``n_heads`` (fewer is grouped-query attention); ``hidden=None``: the Llama rule,
    ``8/3 * dim`` rounded up to a multiple of 256; ``moe_hidden=None``: ``hidden``. Block ``i`` has an MoE
    when ``moe`` and ``i % moe_every == moe_every - 1``, the graph memory likewise with ``memory_every``;
    the memory is written in segments of ``memory_segment`` tokens (None: one, so only read).
    """

    # --- sizes --------------------------------------------------------------------------------------
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    hidden: int | None = None
    max_seq_len: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02

    # --- hybrid switches ----------------------------------------------------------------------------
    meta_attention: bool = False  # a gated-linear-attention branch in parallel with softmax attention
    meta_heads: int | None = None  # None: n_heads
    graph_memory: bool = False
    memory_nodes: int = 64
    memory_steps: int = 4
    memory_alpha: float = 0.5
    memory_every: int = 1
    memory_segment: int | None = 64  # tokens per memory segment; None: the whole sequence is one
    moe: bool = False
    n_experts: int = 8
    top_k: int = 2
    aux_loss_coef: float = 0.01
    moe_every: int = 1
    moe_hidden: int | None = None
    gating: bool = False  # DynamicNeuroFabric: learned per-block gates that can skip whole blocks
    gate_threshold: float = 0.5

    # --- implementation choices (one per real decision) ---------------------------------------------
    attention_impl: str = "manual"
    attention_backend: str | None = None
    attention_chunk_size: int | None = None  # chunked impl only; None lets Attention choose
    kernels: str = "eager"
    moe_impl: str = "loop"
    meta_impl: str = "loop"
    memory_impl: str = "loop"
    gating_impl: str = "branch"

    def __post_init__(self) -> None:
        # Fill the derived defaults first (frozen dataclass: object.__setattr__).
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.hidden is None and isinstance(self.dim, int):
            object.__setattr__(self, "hidden", _find_multiple(int(8 * self.dim / 3), 256))
        if self.moe_hidden is None:
            object.__setattr__(self, "moe_hidden", self.hidden)
        if self.meta_heads is None:
            object.__setattr__(self, "meta_heads", self.n_heads)
        self._validate()

    def _validate(self) -> None:
        sizes = "vocab_size dim n_layers n_heads n_kv_heads hidden max_seq_len meta_heads memory_nodes".split()
        sizes += "memory_steps memory_every n_experts top_k moe_every moe_hidden".split()
        sizes += [n for n in ("memory_segment", "attention_chunk_size") if getattr(self, n) is not None]
        for name in sizes:
            check_int("HybridConfig", name, getattr(self, name))
        for name in ("rope_base", "norm_eps", "init_std"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"HybridConfig: {name} must be a positive number, got {v!r}")
        for name in ("meta_attention", "graph_memory", "moe", "gating"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"HybridConfig: {name} must be a bool, got {getattr(self, name)!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"HybridConfig: dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(
                f"HybridConfig: the head dim dim/n_heads = {self.dim // self.n_heads} must be even "
                "for rotary embeddings"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"HybridConfig: n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})"
            )
        if self.meta_attention and self.dim % self.meta_heads:
            raise ValueError(f"HybridConfig: dim ({self.dim}) must be divisible by meta_heads ({self.meta_heads})")
        if self.top_k > self.n_experts:
            raise ValueError(f"HybridConfig: top_k ({self.top_k}) must be <= n_experts ({self.n_experts})")
        if not 0.0 <= self.memory_alpha <= 1.0:
            raise ValueError(f"HybridConfig: memory_alpha must be in [0, 1], got {self.memory_alpha!r}")
        if not (isinstance(self.aux_loss_coef, (int, float)) and self.aux_loss_coef >= 0):
            raise ValueError(f"HybridConfig: aux_loss_coef must be >= 0, got {self.aux_loss_coef!r}")
        if not (isinstance(self.gate_threshold, (int, float)) and 0.0 <= self.gate_threshold < 1.0):
            raise ValueError(f"HybridConfig: gate_threshold must be in [0, 1), got {self.gate_threshold!r}")

        for name, valid in IMPL_CHOICES.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"HybridConfig: {name} must be one of {valid}, got {getattr(self, name)!r}")
        if self.attention_backend is not None and self.attention_impl != "sdpa":
            raise ValueError(
                f"HybridConfig: attention_backend={self.attention_backend!r} needs "
                f"attention_impl='sdpa', got attention_impl={self.attention_impl!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def is_moe_block(self, i: int) -> bool:
        """Whether block ``i`` uses an MoE instead of the dense SwiGLU MLP."""
        return self.moe and i % self.moe_every == self.moe_every - 1

    def is_memory_block(self, i: int) -> bool:
        """Whether block ``i`` reads and writes the graph-diffusion memory."""
        return self.graph_memory and i % self.memory_every == self.memory_every - 1

    def replace(self, **changes: Any) -> HybridConfig:
        """A validated copy with ``changes`` applied (unknown field names raise TypeError)."""
        return dataclasses.replace(self, **changes)  # every other field keeps its value, derived ones too

    def baseline(self) -> HybridConfig:
        """This model with every implementation choice on the readable reference path."""
        return self.replace(**BASELINE_IMPLS)

    def optimized(self) -> HybridConfig:
        """This model with every implementation choice on the fast path (same function, same weights)."""
        return self.replace(**OPTIMIZED_IMPLS)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> HybridConfig:
        """A named configuration (see ``PRESETS``) with ``overrides`` applied and validated."""
        if name not in PRESETS:
            raise ValueError(f"HybridConfig.preset: unknown preset {name!r}; valid presets: {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


# Named sizes. Implementation fields stay at the baseline defaults; call .optimized() for the fast path.
PRESETS: dict[str, HybridConfig] = {  # one line per part: sizes, attention, graph memory, MoE
    # Every hybrid part on, small enough for CPU tests in seconds. Odd-ish hidden sizes on purpose.
    "tiny": HybridConfig(
        vocab_size=256, dim=64, n_layers=2, hidden=96, max_seq_len=128,
        n_heads=4, n_kv_heads=2, meta_attention=True, gating=True,
        graph_memory=True, memory_nodes=8, memory_steps=2, memory_every=2, memory_segment=4,
        moe=True, n_experts=4, top_k=2, moe_every=2, moe_hidden=48,
    ),
    # The GPU notebooks' working size: every hybrid part on, fits any recent GPU with room to spare.
    "small": HybridConfig(
        vocab_size=8192, dim=512, n_layers=8, hidden=1408, max_seq_len=1024,
        n_heads=8, n_kv_heads=4, meta_attention=True, gating=True,
        graph_memory=True, memory_nodes=64, memory_steps=4, memory_every=4, memory_segment=64,
        moe=True, n_experts=8, top_k=2, moe_every=2, moe_hidden=704,
    ),
    # A plain Llama-style decoder (attention + SwiGLU only) of about 340M parameters.
    "dense-350m": HybridConfig(
        vocab_size=32000, dim=1024, n_layers=24, hidden=2816, max_seq_len=2048, n_heads=16, n_kv_heads=16,
    ),
    # The full MAHIA-X hybrid at a size where the GPU, not the launch overhead, is the bottleneck.
    "hybrid": HybridConfig(
        vocab_size=32000, dim=1024, n_layers=16, hidden=2816, max_seq_len=2048,
        n_heads=16, n_kv_heads=4, meta_attention=True, gating=True,
        graph_memory=True, memory_nodes=64, memory_steps=4, memory_every=4, memory_segment=128,
        moe=True, n_experts=8, top_k=2, moe_every=2, moe_hidden=1408,
    ),
}  # fmt: skip
