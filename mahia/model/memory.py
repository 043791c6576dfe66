"""Graph diffusion memory: N memory nodes written by the tokens, smoothed over a learned graph, read back.

For one sample x (T, D) (the batch dimension rides along):

    M (N, D)                 memory nodes (a parameter: the initial state)
    P = (1 - alpha) I + alpha softmax_row(A_logits)        one diffusion step, row-stochastic
    write  W(x) = softmax over tokens of ((M Wq)(x Wk)^T / sqrt(D)) (x Wv)        (N, D)
    read   read(x, S) = softmax over nodes of ((x Wq')(P^k S Wk')^T / sqrt(D)) (P^k S Wv') Wo   (T, D)

The sequence is cut into segments x_0, x_1, ... of ``segment`` tokens (None: one segment). The state
before segment j is M_j = M + W(x_0) + ... + W(x_{j-1}). ``causal=False`` (the standalone component):
segment j reads M_{j+1}, a summary of its own tokens, later ones included. ``causal=True`` (the language
model): segment j reads M_j, written by EARLIER segments only, so a segment's write takes effect at the
next boundary. The write queries are the learned nodes, not the state, so writes add up: one cumulative
sum gives every segment's state. Projections are ``F.linear`` weights (out, in), no bias.

Why row-softmax: a row-stochastic P is a convex combination of nodes, so ||P^k M||_inf <= ||M||_inf for
any learned logits. Diffusion shrinks each node's deviation from the mean by about (1 - alpha)^k on the
uniform starting graph; collapsed nodes make the read gradients lose relative precision in low precision
(measured on 7 nodes, alpha=1, k=5: ~1e-3 relative error in float32), in both paths alike.

``impl="loop"`` (before): segment by segment, node by node, diffusion step by step: O(J N (1 + k)) small
launches. ``impl="batched"`` (after): every segment's write in two batched matmuls (a segment-wise softmax
over a (B, N, J, S) view), the states one cumsum, P^k built once by repeated squaring (N x N, float32)
and applied as one matmul, the reads one batched attention over B*J segments (a short last segment is
padded). Neither path syncs. :meth:`GraphDiffusionMemory.decode` continues a causal sequence from a
:class:`MemoryCache`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mahia.measure.checks import check_int
from mahia.model._inputs import check_btd

__all__ = ["GraphDiffusionMemory", "MemoryCache", "graph_diffusion_memory", "diffusion_operator", "IMPLS"]

IMPLS = ("loop", "batched")


def _check(fn: str, steps: int, alpha: float, impl: str = "batched", segment: int | None = None) -> None:
    check_int(fn, "steps", steps, minimum=0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{fn}: alpha must be a float in [0, 1], got {alpha!r}")
    if impl not in IMPLS:
        raise ValueError(f"{fn}: impl must be one of {IMPLS}, got {impl!r}")
    if segment is not None:
        check_int(fn, "segment", segment)


def diffusion_operator(adj_logits: torch.Tensor, steps: int, alpha: float) -> torch.Tensor:
    """P^k with P = (1 - alpha) I + alpha softmax_row(adj_logits), by repeated squaring. (N, N).

    Built in at least float32, autocast off, and returned in ``adj_logits.dtype``: P rounded to bfloat16
    has rows that drift from summing to 1 (k d off after k steps), which shifts every diffused node
    (measured: 2-3x the error of the step-by-step loop in bfloat16).
    """
    _check("diffusion_operator", steps, alpha)
    if adj_logits.dim() != 2 or adj_logits.shape[0] != adj_logits.shape[1]:
        raise ValueError(
            f"diffusion_operator: adj_logits must be a square (N, N) matrix, got {tuple(adj_logits.shape)}"
        )
    dt = torch.promote_types(adj_logits.dtype, torch.float32)
    eye = torch.eye(adj_logits.shape[0], device=adj_logits.device, dtype=dt)
    p = (1.0 - alpha) * eye + alpha * torch.softmax(adj_logits.to(dt), dim=-1)
    # A plain `with`: Dynamo (torch 2.11) broke the graph at `with off or nullcontext()` (notebook 04, H200).
    with torch.autocast(adj_logits.device.type, enabled=False):
        result = eye
        while steps:  # binary exponentiation: powers of one matrix commute
            if steps & 1:
                result = p if result is eye else result @ p
            steps >>= 1
            if steps:
                p = p @ p
    return result.to(adj_logits.dtype)


# -- before: segment by segment, node by node, step by step -------------------------------------------


def _write_loop(x, memory, write_q, write_k, write_v):
    """W(x), node n's attention over the tokens one row at a time. (B, N, D)."""
    scale = 1.0 / math.sqrt(x.shape[-1])
    k = F.linear(x, write_k)  # (B, T, D)
    v = F.linear(x, write_v)  # (B, T, D)
    rows = []
    for n in range(memory.shape[0]):
        # W v rather than F.linear on a vector, whose matmul squeezes its product in place (which
        # selective checkpointing refuses: it keeps that product and sees it mutated)
        q_n = write_q @ memory[n]  # (D,)
        w_n = torch.softmax((k @ q_n) * scale, dim=-1)  # (B, T): softmax over tokens
        rows.append(torch.einsum("bt,btd->bd", w_n, v))  # (B, D)
    return torch.stack(rows, dim=1)  # (B, N, D)


def _diffuse_loop(m, adj_logits, steps, alpha):
    """k steps of M <- M + alpha (Â M - M), one node (row) at a time. (B, N, D)."""
    a_hat = torch.softmax(adj_logits, dim=-1)  # (N, N), rows sum to 1
    for _ in range(steps):
        rows = []
        for n in range(m.shape[1]):
            neighbours = torch.einsum("m,bmd->bd", a_hat[n], m)  # (B, D): sum_m Â[n, m] M[m]
            rows.append(m[:, n] + alpha * (neighbours - m[:, n]))
        m = torch.stack(rows, dim=1)  # (B, N, D)
    return m


def _memory_loop(x, base, memory, adj_logits, w, steps, alpha, causal, segment):
    m, outs = base, []  # m: the state before the current segment, (B, N, D)
    segments = x.split(segment, dim=1)
    for j, xs in enumerate(segments):  # xs: (B, S, D)
        if causal:
            read_m = m
            if j + 1 < len(segments):  # the last segment's write is read by nobody
                m = m + _write_loop(xs, memory, w["write_q"], w["write_k"], w["write_v"])
        else:
            m = m + _write_loop(xs, memory, w["write_q"], w["write_k"], w["write_v"])
            read_m = m
        outs.append(
            _read(xs, _diffuse_loop(read_m, adj_logits, steps, alpha), w["read_q"], w["read_k"], w["read_v"], w["out"])
        )
    return torch.cat(outs, dim=1)


# -- after: every segment at once ---------------------------------------------------------------------


def _writes_batched(x, memory, write_q, write_k, write_v, segment):
    """W(x_j) of every segment j, two batched matmuls. (B, J, N, D) with J = ceil(T / segment)."""
    B, T, D = x.shape
    N = memory.shape[0]
    J = -(-T // segment)
    pad = J * segment - T
    q = F.linear(memory, write_q)  # (N, D), shared by all samples and segments
    k = F.linear(x, write_k)  # (B, T, D)
    v = F.linear(x, write_v)  # (B, T, D)
    s = torch.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(D))  # (B, N, T)
    if pad:  # the short last segment: padding gets weight exp(-inf) = 0
        s = F.pad(s, (0, pad), value=float("-inf"))
        v = F.pad(v, (0, 0, 0, pad))
    w = torch.softmax(s.view(B, N, J, segment), dim=-1)  # (B, N, J, S): softmax over each segment
    return w.transpose(1, 2) @ v.view(B, J, segment, D)  # (B, J, N, S) @ (B, J, S, D) -> (B, J, N, D)


def _memory_batched(x, base, memory, adj_logits, w, steps, alpha, causal, segment):
    B, T, D = x.shape
    J = -(-T // segment)
    if causal:
        # Segment j reads M_j = base + W_0 + ... + W_{j-1}: the writes of the first J-1 (whole) segments
        # and an exclusive cumulative sum.
        if J > 1:
            writes = _writes_batched(
                x[:, : (J - 1) * segment], memory, w["write_q"], w["write_k"], w["write_v"], segment
            )  # (B, J-1, N, D)
            states = torch.cat([base.unsqueeze(1), writes], dim=1).cumsum(dim=1)  # (B, J, N, D)
        else:
            states = base.unsqueeze(1)  # (B, 1, N, D)
    else:
        writes = _writes_batched(x, memory, w["write_q"], w["write_k"], w["write_v"], segment)
        states = torch.cat([base.unsqueeze(1), writes], dim=1).cumsum(dim=1)[:, 1:]  # (B, J, N, D)
    if steps > 0:
        states = diffusion_operator(adj_logits, steps, alpha) @ states  # (N, N) @ (B, J, N, D)
    xp = F.pad(x, (0, 0, 0, J * segment - T))  # (B, J*S, D); padded rows are read, then dropped
    out = _read(
        xp.reshape(B * J, segment, D), states.reshape(B * J, -1, D), w["read_q"], w["read_k"], w["read_v"], w["out"]
    )  # (B*J, S, D)
    return out.view(B, J * segment, D)[:, :T]


def _read(x, m, read_q, read_k, read_v, out):
    """softmax_N((x Wq')(m Wk')^T / sqrt(D)) (m Wv') Wo: (B, T, D) for x (B, T, D), m (B, N, D)."""
    q = F.linear(x, read_q)  # (B, T, D)
    k = F.linear(m, read_k)  # (B, N, D)
    v = F.linear(m, read_v)  # (B, N, D)
    r = torch.softmax(q @ k.transpose(1, 2) * (1.0 / math.sqrt(x.shape[-1])), dim=-1)  # (B, T, N)
    return F.linear(r @ v, out)  # (B, T, D)


def graph_diffusion_memory(
    x: torch.Tensor,
    memory: torch.Tensor,
    adj_logits: torch.Tensor,
    write_q: torch.Tensor,
    write_k: torch.Tensor,
    write_v: torch.Tensor,
    read_q: torch.Tensor,
    read_k: torch.Tensor,
    read_v: torch.Tensor,
    out: torch.Tensor,
    *,
    steps: int = 4,
    alpha: float = 0.5,
    impl: str = "batched",
    causal: bool = False,
    segment: int | None = None,
) -> torch.Tensor:
    """Functional :class:`GraphDiffusionMemory`: x (B, T, D), memory (N, D), adj_logits (N, N), seven (D, D)
    weights -> (B, T, D)."""
    fn = "graph_diffusion_memory"
    _check(fn, steps, alpha, impl, segment)
    check_btd(x)
    w = dict(write_q=write_q, write_k=write_k, write_v=write_v, read_q=read_q, read_k=read_k, read_v=read_v, out=out)
    D, N = x.shape[-1], memory.shape[0]
    autocast = torch.is_autocast_enabled(x.device.type)  # it casts the matmul weights: they may differ from x's dtype
    for name, p in dict(memory=memory, adj_logits=adj_logits, **w).items():
        shape = (N, D) if name == "memory" else (N, N) if name == "adj_logits" else (D, D)
        if p.shape != shape or (p.dtype != x.dtype and not (autocast and name in w)) or p.device != x.device:
            raise ValueError(
                f"{fn}: {name} must be {shape} in {x.dtype} on {x.device} (like x; convert the module with .to(x)), "
                f"got {tuple(p.shape)} {p.dtype} on {p.device}"
            )
    base = memory.expand(x.shape[0], N, D)  # (B, N, D): the learned nodes for every sample
    seg = x.shape[1] if segment is None else min(segment, x.shape[1])
    run = _memory_loop if impl == "loop" else _memory_batched
    return run(x, base, memory, adj_logits, w, steps, alpha, causal, seg)


class MemoryCache:
    """What :meth:`GraphDiffusionMemory.decode` keeps between calls (tensors of fixed shapes, so a decode
    step can be captured in a CUDA graph): ``keys``, ``values`` (B, N, D), the read keys and values of the
    diffused state before the next position's segment; with a ``segment``, per position p ``scores``
    (B, N, max_len), node n's write score, and ``u``, ``z`` (B, max_len, D), the written value x_p Wv
    projected by Wk' and Wv' (without segments nothing is written while decoding: length 0)."""

    def __init__(self, batch: int, max_len: int, n_nodes: int, dim: int, length: int, **device_dtype):
        self.batch, self.max_len = batch, max_len
        self.keys, self.values = (torch.zeros(batch, n_nodes, dim, **device_dtype) for _ in range(2))
        self.scores = torch.zeros(batch, n_nodes, length, **device_dtype)
        self.u, self.z = (torch.zeros(batch, length, dim, **device_dtype) for _ in range(2))


class GraphDiffusionMemory(nn.Module):
    """(B, T, D) -> (B, T, D): the module docstring's memory with learned nodes, graph and projections.

    ``causal=False`` (default) is the standalone, bidirectional component; ``causal=True`` what a language
    model needs. ``segment``: tokens per segment (None: one). ``impl``: "loop" or "batched", same function.
    """

    def __init__(
        self,
        dim: int,
        n_nodes: int = 64,
        steps: int = 4,
        alpha: float = 0.5,
        *,
        impl: str = "batched",
        causal: bool = False,
        segment: int | None = None,
    ):
        super().__init__()
        check_int("GraphDiffusionMemory", "dim", dim)
        check_int("GraphDiffusionMemory", "n_nodes", n_nodes)
        _check("GraphDiffusionMemory", steps, alpha, impl, segment)
        self.dim, self.n_nodes, self.steps, self.alpha, self.impl = dim, n_nodes, steps, float(alpha), impl
        self.causal, self.segment = bool(causal), segment
        self.memory = nn.Parameter(torch.randn(n_nodes, dim))  # unit variance, so write scores start O(1)
        self.adj_logits = nn.Parameter(torch.zeros(n_nodes, n_nodes))  # the uniform graph at init
        names = ("write_q", "write_k", "write_v", "read_q", "read_k", "read_v", "out")
        self.proj = nn.ModuleDict({k: nn.Linear(dim, dim, bias=False) for k in names})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kw = dict(steps=self.steps, alpha=self.alpha, impl=self.impl, causal=self.causal, segment=self.segment)
        return graph_diffusion_memory(x, self.memory, self.adj_logits, *(p.weight for p in self.proj.values()), **kw)

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None) -> MemoryCache:
        """A reset :class:`MemoryCache` on the module's device, in ``dtype`` (default: the parameters')."""
        if not self.causal:
            raise ValueError("GraphDiffusionMemory.new_cache: decoding needs causal=True")
        kw = dict(device=self.memory.device, dtype=self.memory.dtype if dtype is None else dtype)
        cache = MemoryCache(batch, max_len, self.n_nodes, self.dim, max_len if self.segment else 0, **kw)
        self.reset_cache(cache)
        return cache

    @torch.no_grad()
    def reset_cache(self, cache: MemoryCache) -> None:
        """Start a new sequence: the state is the learned nodes again (in place)."""
        m = self.memory
        if self.steps > 0:
            m = diffusion_operator(self.adj_logits, self.steps, self.alpha) @ m  # (N, D)
        cache.keys.copy_(F.linear(m, self.proj["read_k"].weight).expand_as(cache.keys))
        cache.values.copy_(F.linear(m, self.proj["read_v"].weight).expand_as(cache.values))
        for buf in (cache.scores, cache.u, cache.z):
            buf.zero_()

    def decode(self, x: torch.Tensor, cache: MemoryCache, start_pos: torch.Tensor) -> torch.Tensor:
        """The forward for T new tokens x (B, T, D) at positions start_pos.., continuing ``cache`` (in place).

        Every map after the write softmax is linear, so the cache holds each position's write score and its
        value already projected by Wk' and Wv', and the projected diffused state; a call costs O(T D^2 +
        N (T + segment) D), never O(sequence length):

            keys of M_{j+1} = keys of M_j + P^k softmax(scores of segment j) u_j      (values: z_j)

        A segment's write is added when its last token arrives. ``start_pos``: a 0-dim int64 device tensor
        (no host sync); start_pos + T <= max_len is the caller's to ensure. Call under ``torch.no_grad()``.
        """
        fn = "GraphDiffusionMemory.decode"
        check_btd(x)
        B, T, D = x.shape
        if D != self.dim or B != cache.batch:
            raise ValueError(f"{fn}: x must be (batch={cache.batch}, T, dim={self.dim}), got {tuple(x.shape)}")
        if not (isinstance(start_pos, torch.Tensor) and start_pos.dim() == 0 and not start_pos.is_floating_point()):
            raise TypeError(f"{fn}: start_pos must be a 0-dim integer tensor, got {start_pos!r}")
        p = self.proj
        scale = 1.0 / math.sqrt(D)
        keys, values = cache.keys.to(x.dtype).unsqueeze(1), cache.values.to(x.dtype).unsqueeze(1)  # (B, 1, N, D)
        token_window = torch.zeros(T, dtype=torch.long, device=x.device)  # which state each token reads
        if self.segment is not None:
            S, N = self.segment, self.n_nodes
            positions = start_pos + torch.arange(T, device=x.device)  # (T,)
            k = F.linear(x, p["write_k"].weight)  # (B, T, D)
            # (M Wq) k^T as M (Wq^T k): O(D^2 + N D) per token instead of O(N D^2) for M Wq per call.
            scores = F.linear(F.linear(k, p["write_q"].weight.t()), self.memory) * scale  # (B, T, N)
            v = F.linear(x, p["write_v"].weight)  # (B, T, D)
            cache.scores.index_copy_(2, positions, scores.transpose(1, 2).to(cache.scores.dtype))
            cache.u.index_copy_(1, positions, F.linear(v, p["read_k"].weight).to(cache.u.dtype))
            cache.z.index_copy_(1, positions, F.linear(v, p["read_v"].weight).to(cache.z.dtype))
            # The K segments T consecutive tokens can touch, from start_pos's on. Rows past max_len are
            # clamped: they belong to segments that cannot be complete yet, masked out below.
            K = (T + S - 2) // S + 1
            first = (start_pos // S) * S
            rows = (first + torch.arange(K * S, device=x.device)).clamp(max=cache.max_len - 1)  # (K*S,)
            w = torch.softmax(cache.scores.index_select(2, rows).to(x.dtype).view(B, N, K, S), dim=-1)
            w = w.transpose(1, 2)  # (B, K, N, S)
            du = w @ cache.u.index_select(1, rows).to(x.dtype).view(B, K, S, D)  # (B, K, N, D)
            dz = w @ cache.z.index_select(1, rows).to(x.dtype).view(B, K, S, D)
            complete = first + (torch.arange(K, device=x.device) + 1) * S <= start_pos + T  # (K,)
            du = torch.where(complete[:, None, None], du, 0.0)
            dz = torch.where(complete[:, None, None], dz, 0.0)
            if self.steps > 0:
                pk = diffusion_operator(self.adj_logits, self.steps, self.alpha).to(x.dtype)
                du, dz = pk @ du, pk @ dz
            keys = torch.cat([keys, du], dim=1).cumsum(dim=1)  # (B, K+1, N, D): before window 0, 1, ..
            values = torch.cat([values, dz], dim=1).cumsum(dim=1)
            token_window = (positions - first) // S  # (T,)
            cache.keys.copy_(keys[:, -1])
            cache.values.copy_(values[:, -1])
        q = F.linear(x, p["read_q"].weight)  # (B, T, D)
        kt = keys.index_select(1, token_window)  # (B, T, N, D): the state each token reads
        vt = values.index_select(1, token_window)
        r = torch.softmax(torch.einsum("btd,btnd->btn", q, kt) * scale, dim=-1)  # (B, T, N)
        return F.linear(torch.einsum("btn,btnd->btd", r, vt), p["out"].weight)
