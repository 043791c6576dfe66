"""Mixture-of-experts feed-forward layer: a per-expert loop ("before") and a sync-free grouped path ("after").

For N tokens x (N, D), E experts, top-k routing:

    router     p = softmax(x W_r) in float32          W_r (D, E): the logits in x.dtype, also under autocast
               (v, i) = topk(p, k),  g = v / sum(v)   per token: k experts and gates summing to 1
    expert e   y_e(x) = (silu(x W1_e) * (x W3_e)) W2_e    SwiGLU; w13[e] = [W1_e | W3_e] (D, 2H), w2[e] (H, D)
    output     y_n = sum_{j<k} g_nj y_{i_nj}(x_n)
    aux loss   coef * E * sum_e f_e P_e               Switch / GShard load balancing: f_e = share of the N k
                                                      assignments routed to e (no gradient), P_e = mean p_e

aux is coef when routing is uniform and grows as the load concentrates. Over weighted tokens
(``token_weight=w``, e.g. 0 for the samples a gated model skips) both averages are weighted; their
numerators and sum w are a :class:`RouterStats`, and the stats of disjoint token sets add up, so a batch
processed one sample at a time gets the loss of the whole batch (``RouterStats.pool``, ``aux_loss_from``).
Under autocast the experts run in the autocast dtype; y keeps x's dtype (the loop accumulates in it, the
grouped path's combine in float32).

* ``impl="loop"``: per expert, ``nonzero`` finds its tokens (a data-dependent size, so the CPU waits for
  the GPU E times per forward), two small matmuls, ``index_add_`` of the gated result.
* ``impl="grouped"``: no host sync. The N k assignments are sorted by expert once (a stable ``argsort``),
  the tokens gathered in that order; ``scatter_add_`` counts (``bincount`` would sync) and
  ``offs = cumsum(counts)`` mark each expert's group. Then

      h   = grouped_mm(x_sorted, w13, offs)            (N*k, 2H)   row r of group e times w13[e]
      a   = silu(h[:, :H]) * h[:, H:]                  (N*k, H)    mahia.ops.swiglu
      out = grouped_mm(a, w2, offs)                    (N*k, D)    (mahia.ops.grouped_mm: three backends)
      y   = sum_k g * out[inverse permutation]         (N, D)      mahia.ops.moe_combine, one fused pass

  Every shape is known from N, k, D, H alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mahia.measure.checks import check_int
from mahia.ops.grouped_mm import BACKENDS, choose_backend, grouped_mm
from mahia.ops.moe_combine import moe_combine
from mahia.ops.swiglu import swiglu

__all__ = ["MoE", "RouterStats", "IMPLS", "BACKENDS", "moe_flops"]

IMPLS = ("grouped", "loop")


def moe_flops(n_tokens: int, dim: int, hidden: int, top_k: int, n_experts: int, *, router: bool = True) -> int:
    """Forward FLOPs of one MoE layer: expert matmuls 2 N k D 2H + 2 N k H D, plus the router 2 N D E
    (``router=False``: the expert matmuls alone, what ``MoE.expert_gemms`` runs). SwiGLU, softmax, top-k
    and the permutation move bytes, not FLOPs. Forward plus backward is 3x this."""
    for name, v in dict(n_tokens=n_tokens, dim=dim, hidden=hidden, top_k=top_k, n_experts=n_experts).items():
        check_int("moe_flops", name, v, minimum=0)
    assignments = n_tokens * top_k
    experts = 2 * assignments * dim * 2 * hidden + 2 * assignments * hidden * dim
    return experts + (2 * n_tokens * dim * n_experts if router else 0)


class RouterStats(NamedTuple):
    """What the load-balancing loss needs from a (weighted) set of tokens, in float32 (float64 for float64
    x): counts (E,) = sum_n w_n [e in top-k(n)] (no gradient), prob_sum (E,) = sum_n w_n p_ne, n_tokens ()
    = sum_n w_n. Disjoint sets pool by adding."""

    counts: torch.Tensor
    prob_sum: torch.Tensor
    n_tokens: torch.Tensor

    @staticmethod
    def pool(stats: Sequence[RouterStats]) -> RouterStats:
        """The statistics of the union of disjoint token sets: the element-wise sum."""
        return RouterStats(*(sum(parts[1:], parts[0]) for parts in zip(*stats)))


class MoE(nn.Module):
    """Top-k routed mixture of SwiGLU experts (module docstring): ``forward(x) -> (y, aux_loss)`` for x
    (..., dim); y has x's shape and dtype, aux_loss (float32, already times ``aux_loss_coef``) is over the
    tokens weighted by ``token_weight`` (x.shape[:-1]) if given; ``return_stats=True`` appends the
    :class:`RouterStats`. ``impl``: "loop" or "grouped"; ``backend``: the grouped matmul ("auto" or one
    of ``BACKENDS``; ``backend_for(x)`` says which runs). Parameters: ``w_router`` (dim, E), ``w13``
    (E, dim, 2 hidden) = [W1 | W3], ``w2`` (E, hidden, dim).
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        n_experts: int,
        top_k: int = 2,
        *,
        impl: str = "grouped",
        aux_loss_coef: float = 0.01,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        for name, v in dict(dim=dim, hidden=hidden, n_experts=n_experts, top_k=top_k).items():
            check_int("MoE", name, v)
        for name, value, ok, want in (
            ("top_k", top_k, top_k <= n_experts, f"at most n_experts = {n_experts}"),
            ("impl", impl, impl in IMPLS, f"one of {IMPLS}"),
            ("backend", backend, backend == "auto" or backend in BACKENDS, f"'auto' or one of {BACKENDS}"),
            ("aux_loss_coef", aux_loss_coef, isinstance(aux_loss_coef, (int, float)) and aux_loss_coef >= 0, ">= 0"),
        ):
            if not ok:
                raise ValueError(f"MoE: {name} must be {want}, got {value!r}")
        self.dim, self.hidden, self.n_experts, self.top_k = dim, hidden, n_experts, top_k
        self.impl, self.backend, self.aux_loss_coef = impl, backend, float(aux_loss_coef)
        kw = dict(device=device, dtype=dtype)
        self.w_router = nn.Parameter(torch.empty(dim, n_experts, **kw))
        self.w13 = nn.Parameter(torch.empty(n_experts, dim, 2 * hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, dim, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Unit-variance inputs give unit-variance logits and hidden activations.
        nn.init.normal_(self.w_router, std=self.dim**-0.5)
        nn.init.normal_(self.w13, std=self.dim**-0.5)
        nn.init.normal_(self.w2, std=self.hidden**-0.5)

    # -- shared pieces ---------------------------------------------------------------------------
    def _flatten_input(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w13
        if not (isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == self.dim and x.numel() > 0):
            raise ValueError(f"MoE: x must be a (..., dim={self.dim}) tensor with tokens, got {getattr(x, 'shape', x)}")
        if (x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type)) or x.device != w.device:
            raise TypeError(
                f"MoE: x is {x.dtype} on {x.device} but the parameters are {w.dtype} on {w.device}; "
                "convert one of them (e.g. moe.to(x))"
            )
        return x.reshape(-1, self.dim)  # (N, D)

    def _route(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probs (N, E), experts (N, k) int64, gates (N, k)); probs and gates in float32 or float64."""
        # The decision must not hinge on the rounding of a logit: under autocast the router matmul would run
        # in bf16, so it runs outside it, in x's dtype (float32 in mixed precision; Switch Transformer's
        # "selective precision"). It is small: N x D x E.
        with torch.autocast(x2.device.type, enabled=False):
            logits = x2 @ self.w_router  # (N, E) in x.dtype
        probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        # sorted=False: the k picks in any order (the gated sum does not care), without the extra sort
        # kernel a sorted top-k runs after its selection
        top_p, experts = probs.topk(self.top_k, dim=-1, sorted=False)  # (N, k)
        if self.top_k == 1:
            # v / v = 1 with a zero gradient; computing it would only add rounding noise to the router's
            # gradient (which then comes from the aux loss alone).
            gates = torch.ones_like(top_p)
        else:
            gates = top_p / top_p.sum(dim=-1, keepdim=True)
        return probs, experts, gates

    def _stats(self, probs: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor | None) -> RouterStats:
        """RouterStats of the N routed tokens; weight (N,) or None (every token counts once)."""
        N = probs.shape[0]
        w = probs.new_ones(N) if weight is None else weight.to(probs.dtype)  # (N,)
        counts = probs.new_zeros(self.n_experts).scatter_add_(  # sync-free bincount
            0, experts.reshape(-1), w.detach().repeat_interleave(self.top_k)
        )  # (E,)
        prob_sum = (probs if weight is None else probs * w[:, None]).sum(dim=0)  # (E,)
        return RouterStats(counts, prob_sum, w.sum())

    def aux_loss_from(self, stats: RouterStats) -> torch.Tensor:
        """coef * E * sum_e f_e P_e with f_e = counts_e / (k n), P_e = prob_sum_e / n; 0 when n = 0."""
        if not isinstance(stats, RouterStats):
            raise TypeError(f"MoE.aux_loss_from: stats must be a RouterStats, got {type(stats).__name__}")
        n = stats.n_tokens.clamp(min=1e-12)  # n = 0 means no token: counts and prob_sum are 0 too
        return self.aux_loss_coef * self.n_experts * (stats.counts * stats.prob_sum).sum() / (self.top_k * n * n)

    def _check_weight(self, token_weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
        if token_weight is None:
            return None
        if getattr(token_weight, "shape", None) != x.shape[:-1] or token_weight.device != x.device:
            raise ValueError(
                f"MoE: token_weight must be a tensor of x's leading shape {tuple(x.shape[:-1])} on x's device"
            )
        return token_weight.reshape(-1)  # (N,)

    def backend_for(self, x: torch.Tensor) -> str:
        """What runs the experts for input ``x``: "loop", or the grouped matmul backend of the grouped path."""
        if self.impl == "loop":
            return "loop"
        if self.backend != "auto":
            return self.backend
        return choose_backend(x, [(self.dim, 2 * self.hidden), (self.hidden, self.dim)])

    # -- forward ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, *, token_weight: torch.Tensor | None = None, return_stats: bool = False):
        """``(y, aux_loss)``, or ``(y, aux_loss, RouterStats)`` with ``return_stats`` (class docstring)."""
        x2 = self._flatten_input(x)
        weight = self._check_weight(token_weight, x)
        if self.impl == "loop":
            y, probs, experts = self._forward_loop(x2)
        else:
            y, probs, experts = self._forward_grouped(x2)
        stats = self._stats(probs, experts, weight)
        aux = self.aux_loss_from(stats)
        return (y.view(x.shape), aux, stats) if return_stats else (y.view(x.shape), aux)

    def _forward_loop(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Before: one expert at a time. Each nonzero() is a host sync; two small matmuls per expert.
        Returns (y (N, D), probs, experts) for the aux loss."""
        probs, experts, gates = self._route(x2)
        y = torch.zeros_like(x2)  # (N, D), the accumulator: x's dtype
        for e in range(self.n_experts):
            mask = experts == e  # (N, k)
            token, slot = mask.nonzero(as_tuple=True)  # (n_e,) each: the CPU waits here
            if token.numel() == 0:
                continue
            h = x2[token] @ self.w13[e]  # (n_e, 2H), autocast dtype if any
            a, b = h.chunk(2, dim=-1)
            out = (F.silu(a) * b) @ self.w2[e]  # (n_e, D)
            gated = out * gates[token, slot].unsqueeze(-1).to(out.dtype)
            y.index_add_(0, token, gated.to(y.dtype))  # under autocast out is 16-bit
        return y, probs, experts

    def _dispatch(self, x2: torch.Tensor):
        """Route and sort, without a host sync: (probs, experts, gates, order (N*k,) assignments grouped by
        expert, offs (E,) int32 group ends, xs (N*k, D) the tokens in that order)."""
        E, k = self.n_experts, self.top_k
        probs, experts, gates = self._route(x2)
        flat = experts.reshape(-1)  # (N*k,) expert of assignment n*k + j
        # A radix sort makes one pass per key byte: sorting expert ids as uint8 (E <= 256) takes one pass
        # instead of the eight of int64 ids.
        keys = flat.to(torch.uint8 if E <= 256 else torch.int32)
        order = torch.argsort(keys, stable=True)  # (N*k,) assignments grouped by expert
        counts = torch.zeros(E, dtype=torch.int32, device=x2.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32)
        )  # (E,) sync-free bincount
        offs = counts.cumsum(0, dtype=torch.int32)  # (E,) end row of each expert's group
        xs = x2.index_select(0, order // k)  # (N*k, D) tokens in expert order
        return probs, experts, gates, order, offs, xs

    def _expert_weights(self, xs: torch.Tensor):
        """(xs, w13, w2, backend) in the dtype the expert matmuls run in: autocast does not know
        grouped_mm, so cast as it would for a matmul, like the loop's F.linear."""
        w13, w2 = self.w13, self.w2
        dev_type = xs.device.type
        if torch.is_autocast_enabled(dev_type):
            amp = torch.get_autocast_dtype(dev_type)
            xs, w13, w2 = xs.to(amp), w13.to(amp), w2.to(amp)
        return xs, w13, w2, self.backend_for(xs)

    def _forward_grouped(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """After: sort assignments by expert once, two grouped matmuls, then one fused combine kernel that
        un-permutes, gates and sums each token's k results. No host sync.
        Returns (y (N, D), probs, experts) for the aux loss."""
        N, k = x2.shape[0], self.top_k
        probs, experts, gates, order, offs, xs = self._dispatch(x2)
        xs, w13, w2, backend = self._expert_weights(xs)
        h = grouped_mm(xs, w13, offs, backend=backend)  # (N*k, 2H)
        a = swiglu(h)  # (N*k, H): h packs [h1 | h3]; one gradient tensor back
        out = grouped_mm(a, w2, offs, backend=backend)  # (N*k, D)
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(N * k, device=x2.device))  # (N*k,)
        # y[n] = sum_j g[n, j] * out[inverse[n*k + j]]: gather, gate and k-sum in one pass (float32 math),
        # y in x's dtype like the loop. Eager version: moe_combine_eager.
        y = moe_combine(out, inverse, gates, x2.dtype, check=False)  # (N, D); inverse: a permutation by construction
        return y, probs, experts

    def expert_gemms(self, x: torch.Tensor):
        """A closure running only the grouped path's two grouped matmuls, ``xs w13`` then ``a w2``, on the
        rows and groups the router makes of ``x`` (routed, sorted and activated once, here), under
        ``torch.no_grad()``: the part of the forward that is FLOPs, to time the rest of the layer against."""
        with torch.no_grad():
            x2 = self._flatten_input(x)
            *_, offs, xs = self._dispatch(x2)
            xs, w13, w2, backend = self._expert_weights(xs)
            a = swiglu(grouped_mm(xs, w13, offs, backend=backend))

        def gemms():
            with torch.no_grad():
                grouped_mm(xs, w13, offs, backend=backend)
                return grouped_mm(a, w2, offs, backend=backend)

        return gemms

    # -- statistics (outside forward) ------------------------------------------------------------
    @torch.no_grad()
    def routing_stats(self, x: torch.Tensor) -> dict:
        """How the router spreads the tokens of ``x`` over the experts (for plots; syncs, by design).

        Returns tokens_per_expert (E,) int64 on the CPU, cv (std / mean of those counts: 0 is perfect
        balance), max_over_mean (load of the busiest expert relative to the mean), empty_experts,
        n_assignments (N*k) and aux_loss (the loss forward returns for this x).
        """
        x2 = self._flatten_input(x)
        probs, experts, _ = self._route(x2)
        aux = self.aux_loss_from(self._stats(probs, experts, None))
        counts = torch.bincount(experts.reshape(-1), minlength=self.n_experts).cpu()
        c = counts.double()
        mean = c.mean()
        return {
            "tokens_per_expert": counts,
            "cv": float(c.std(correction=0) / mean),
            "max_over_mean": float(c.max() / mean),
            "empty_experts": int((counts == 0).sum()),
            "n_assignments": int(counts.sum()),
            "aux_loss": float(aux),
        }
