"""Graph diffusion memory: a bank of memory nodes written by the tokens, smoothed over a learned graph,
then read back by the tokens; causal (language-model) or bidirectional.

Math, for one sample x in R^{T x D} (the batch dimension B is carried along everywhere):

    M in R^{N x D}                      memory nodes (a parameter: the initial state)
    Â = softmax_row(A_logits)           learned adjacency, A_logits in R^{N x N}; every row sums to 1
    P = (1 - alpha) I + alpha Â         one diffusion step; P is row-stochastic as well

    write:   S = (M Wq)(x Wk)^T / sqrt(D)               (N, T)  queries: the nodes' learned addresses M
             W(x) = softmax over tokens (rows) of S  (x Wv)      (N, D)  what the tokens x add
    diffuse: P^k state                                  k = steps; one step is M <- M + alpha (Â M - M)
    read:    R = softmax over nodes of (x Wq')(P^k state Wk')^T / sqrt(D)    (T, N)
             read(x, state) = (R (P^k state Wv')) Wo    (T, D)

Segments and the state. The sequence is cut into segments x_0, x_1, ... of ``segment`` tokens (the last
one may be shorter; ``segment=None``: the whole sequence is one segment). The memory state before
segment j is

    M_0 = state (default: the learned nodes M, the same for every sample)
    M_{j+1} = M_j + W(x_j)                               every segment adds its write

and ``causal`` is the one switch that decides what a segment reads:

* ``causal=False`` (bidirectional): out_j = read(x_j, M_{j+1}): a segment reads a memory that its own
  tokens wrote, through a softmax over ALL of them, so position t sees a summary of later positions.
  With ``segment=None`` and no state this is out = read(x, P^k (M + W(x))): the component as first
  written (the standalone demo). Not usable in a language model.
* ``causal=True``: out_j = read(x_j, M_j): a segment reads only what EARLIER segments wrote, so
  position t never sees a token > t (in segment 0 it reads the initial state). A segment's write takes
  effect at the next segment boundary, which is what makes the write softmax over the segment legal.
  With ``segment=None`` nothing is written during the forward: out = read(x, P^k state), and a caller
  that streams segments carries the state itself::

      out_1 = mem(x_1);   state = mem.write(x_1)
      out_2 = mem(x_2, state);   state = mem.write(x_2, state)   # ... == mem(cat(x_1, x_2)) when
                                                                 # len(x_1) is a multiple of segment

``write(x, state) -> M_0 + sum_j W(x_j)`` returns the state after all of x (B, N, D) in either mode.
The write queries are the learned nodes M, not the current state, so writes add up (a segment's write
does not depend on what earlier segments wrote); that is what lets the batched path compute every
segment's state at once with one cumulative sum, and lets decoding keep a running state.

Projections follow ``torch.nn.functional.linear``: ``x Wk`` means ``F.linear(x, write_k)``, with weights
stored (out_features, in_features) as in ``nn.Linear``; none has a bias. The module returns the read
only; the caller adds the residual.

Why row-softmax rather than a symmetric normalization D^{-1/2} A D^{-1/2}: a row-stochastic P is a
convex combination of nodes, so ||P^k M||_inf <= ||M||_inf for every k and every learned A (no blow-up,
no sign constraint on A), and any real logits are valid. The price is that Â is not symmetric, so P^k
has no cheap eigendecomposition; with N << B*T that does not matter (see below).

Over-smoothing: diffusion shrinks each node's deviation from the (stationary-weighted) node mean by
about (1 - alpha (1 - |lambda_2(Â)|))^k, i.e. exactly (1 - alpha)^k on the uniform graph the module
starts from.
When the nodes have nearly collapsed, the read attention is nearly uniform and the gradients of the
read projections (which depend on the small differences between nodes) lose relative precision
in low precision, in both implementations alike (measured on 7 dense nodes, alpha=1, k=5: ~1e-3
relative error in float32).

Two implementations of the same function (``impl=``), in both modes:

* ``"loop"`` (before): segment by segment; in each, computes each node's write attention row by row,
  then each diffusion step node by node (row n of the next state is M[n] + alpha (Â M - M)).
  O(J N (1 + k)) small kernel launches for J segments (about 6 per node for the write, 5 per node and
  step); the readable definition.
* ``"batched"`` (after): the writes of all segments are two batched matmuls (a segment-wise softmax
  over a (B, N, J, S) view of the scores), the states M_j one cumulative sum over segments; the k-step
  operator P^k (N x N) is built ONCE per forward by repeated squaring (at most 2 log2(k) N x N
  matmuls, in float32 at least, independent of B and T) and applied to every state as one matmul
  (N, N) @ (B, J, N, D); the reads are one batched attention over the (B*J) segments. A last segment
  shorter than ``segment`` is padded (masked in the write; padded reads are dropped).

Neither path makes a host sync; the loop path is slow because of launch count, not syncs.

Decoding (causal only): :meth:`GraphDiffusionMemory.decode` continues a sequence T tokens at a time
from a :class:`MemoryCache`; it computes the same function as the forward over the whole sequence
(see its docstring for how it stays O(T + segment) per call).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mahia.measure.checks import check_float_dtype, check_int
from mahia.model._inputs import check_btd

__all__ = [
    "GraphDiffusionMemory",
    "MemoryCache",
    "graph_diffusion_memory",
    "graph_diffusion_write",
    "diffusion_operator",
    "IMPLS",
]

IMPLS = ("loop", "batched")


def _check_diffusion(steps: int, alpha: float) -> None:
    check_int("GraphDiffusionMemory", "steps", steps, minimum=0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be a float in [0, 1], got {alpha!r}")


def _check_segment(segment: int | None) -> None:
    if segment is not None and (isinstance(segment, bool) or not isinstance(segment, int) or segment < 1):
        raise ValueError(f"segment must be None (one segment) or a positive int, got {segment!r}")


def _check_config(steps: int, alpha: float, impl: str, causal: bool = False, segment: int | None = None) -> None:
    _check_diffusion(steps, alpha)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    _check_segment(segment)


def diffusion_operator(adj_logits: torch.Tensor, steps: int, alpha: float) -> torch.Tensor:
    """P^k with P = (1 - alpha) I + alpha softmax_row(adj_logits), by repeated squaring. (N, N).

    Built in at least float32 and returned in ``adj_logits.dtype``: rounding P to bfloat16 before the
    squarings makes its rows drift away from summing to 1 (a row sum off by d ends about k d off), which shifts every diffused node by a
    fraction of the mean node (measured: ~2-3x the error of the step-by-step loop in bfloat16). The
    operator is N x N, so the float32 work is negligible.
    """
    _check_diffusion(steps, alpha)
    if adj_logits.dim() != 2 or adj_logits.shape[0] != adj_logits.shape[1]:
        raise ValueError(f"adj_logits must be a square (N, N) matrix, got {tuple(adj_logits.shape)}")
    n = adj_logits.shape[0]
    compute_dtype = torch.promote_types(adj_logits.dtype, torch.float32)
    eye = torch.eye(n, device=adj_logits.device, dtype=compute_dtype)
    p = (1.0 - alpha) * eye + alpha * torch.softmax(adj_logits.to(compute_dtype), dim=-1)
    # Autocast off: under it these products would run in its 16-bit dtype, the rounding this avoids. A plain
    # `with torch.autocast(...)`: Dynamo (torch 2.11) broke the graph at `with off or nullcontext()`, five
    # breaks per two-layer model in notebook 04 on the H200.
    if adj_logits.device.type in ("cuda", "cpu"):
        with torch.autocast(adj_logits.device.type, enabled=False):
            result = _power(p, steps)
    else:  # no autocast on other devices
        result = _power(p, steps)
    return (eye if result is None else result).to(adj_logits.dtype)


def _power(p: torch.Tensor, steps: int) -> torch.Tensor | None:
    """P^steps by binary exponentiation (None for steps = 0): the product over the set bits b of steps of
    P^(2^b); powers of one matrix commute, so the order of the products does not matter."""
    result = None
    while steps:
        if steps & 1:
            result = p if result is None else result @ p
        steps >>= 1
        if steps:
            p = p @ p
    return result


# ---------------------------------------------------------------------------------------------------
# Before: segment by segment, node by node, step by step
# ---------------------------------------------------------------------------------------------------


def _write_loop(x, memory, write_q, write_k, write_v):
    """W(x) row by row: node n attends over the tokens of each sample. (B, N, D)."""
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
    """The module's forward, one segment at a time (module docstring). (B, T, D)."""
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


# ---------------------------------------------------------------------------------------------------
# After: every segment at once
# ---------------------------------------------------------------------------------------------------


def _writes_batched(x, memory, write_q, write_k, write_v, segment):
    """W(x_j) of every segment j, two batched matmuls. (B, J, N, D) with J = ceil(T / segment)."""
    B, T, D = x.shape
    N = memory.shape[0]
    J = -(-T // segment)
    pad = J * segment - T
    scale = 1.0 / math.sqrt(D)
    q = F.linear(memory, write_q)  # (N, D), shared by all samples and segments
    k = F.linear(x, write_k)  # (B, T, D)
    v = F.linear(x, write_v)  # (B, T, D)
    s = torch.matmul(q, k.transpose(1, 2)) * scale  # (B, N, T)
    if pad:  # the short last segment: padding gets weight exp(-inf) = 0
        s = F.pad(s, (0, pad), value=float("-inf"))
        v = F.pad(v, (0, 0, 0, pad))
    w = torch.softmax(s.view(B, N, J, segment), dim=-1)  # (B, N, J, S): softmax over each segment
    return w.transpose(1, 2) @ v.view(B, J, segment, D)  # (B, J, N, S) @ (B, J, S, D) -> (B, J, N, D)


def _memory_batched(x, base, memory, adj_logits, w, steps, alpha, causal, segment):
    """The module's forward, every segment at once (module docstring). (B, T, D)."""
    B, T, D = x.shape
    J = -(-T // segment)
    if causal:
        # Segment j reads M_j = base + W_0 + ... + W_{j-1}: the writes of the first J-1 segments
        # (whole segments: no padding) and an exclusive cumulative sum.
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
    """out = softmax_N((x Wq')(M_k Wk')^T / sqrt(D)) (M_k Wv') Wo. (B, T, D) for x (B, T, D), m (B, N, D)."""
    scale = 1.0 / math.sqrt(x.shape[-1])
    q = F.linear(x, read_q)  # (B, T, D)
    k = F.linear(m, read_k)  # (B, N, D)
    v = F.linear(m, read_v)  # (B, N, D)
    r = torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1)  # (B, T, N): softmax over nodes
    return F.linear(r @ v, out)  # (B, T, D)


# ---------------------------------------------------------------------------------------------------
# Functional forms
# ---------------------------------------------------------------------------------------------------


def _check_params(x: torch.Tensor, memory: torch.Tensor, **params: torch.Tensor) -> None:
    """memory (N, D); adj_logits (N, N) if given; every other entry a (D, D) weight; all like x."""
    d = x.shape[-1]
    if memory.dim() != 2 or memory.shape[1] != d or memory.shape[0] == 0:
        raise ValueError(f"memory must be (N, D={d}) with N >= 1, got {tuple(memory.shape)}")
    n = memory.shape[0]
    for name, p in params.items():
        expected = (n, n) if name == "adj_logits" else (d, d)
        if p.shape != expected:
            label = "(N, N)" if name == "adj_logits" else "(D, D)"
            raise ValueError(f"{name} must be {label} = {expected}, got {tuple(p.shape)}")
    for name, p in dict(memory=memory, **params).items():
        if p.dtype != x.dtype or p.device != x.device:
            raise TypeError(
                f"{name} is {p.dtype} on {p.device} but x is {x.dtype} on {x.device}; convert the module with .to(x)"
            )


def _initial_state(x: torch.Tensor, memory: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
    """The state before the first segment: ``state``, or the learned nodes for every sample. (B, N, D)."""
    B = x.shape[0]
    if state is None:
        return memory.expand(B, *memory.shape)
    expected = (B, *memory.shape)
    if not isinstance(state, torch.Tensor) or tuple(state.shape) != expected:
        raise ValueError(
            f"state must be None or a (B, N, D) = {expected} tensor (from write()), "
            f"got {getattr(state, 'shape', type(state))}"
        )
    if state.dtype != x.dtype or state.device != x.device:
        raise TypeError(f"state is {state.dtype} on {state.device} but x is {x.dtype} on {x.device}")
    return state


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
    state: torch.Tensor | None = None,
) -> torch.Tensor:
    """Functional form of :class:`GraphDiffusionMemory` (module docstring has the math).

    Shapes: x (B, T, D), memory (N, D), adj_logits (N, N), the seven projection weights (D, D) in
    ``nn.Linear`` layout, state None or (B, N, D) (the state before x; default: ``memory`` for every
    sample). Returns (B, T, D). ``causal=False, segment=None, state=None`` is the bidirectional
    component; a language model needs ``causal=True``.
    """
    _check_config(steps, alpha, impl, causal, segment)
    check_btd(x)
    weights = dict(
        write_q=write_q, write_k=write_k, write_v=write_v, read_q=read_q, read_k=read_k, read_v=read_v, out=out
    )
    _check_params(x, memory, adj_logits=adj_logits, **weights)
    base = _initial_state(x, memory, state)  # (B, N, D)
    seg = x.shape[1] if segment is None else min(segment, x.shape[1])
    run = _memory_loop if impl == "loop" else _memory_batched
    return run(x, base, memory, adj_logits, weights, steps, alpha, causal, seg)


def graph_diffusion_write(
    x: torch.Tensor,
    memory: torch.Tensor,
    write_q: torch.Tensor,
    write_k: torch.Tensor,
    write_v: torch.Tensor,
    *,
    impl: str = "batched",
    segment: int | None = None,
    state: torch.Tensor | None = None,
) -> torch.Tensor:
    """The memory state after x: ``state + sum_j W(x_j)`` over the segments x_j of x. (B, N, D).

    ``state`` defaults to ``memory`` for every sample; the same in causal and bidirectional mode.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    _check_segment(segment)
    check_btd(x)
    _check_params(x, memory, write_q=write_q, write_k=write_k, write_v=write_v)
    base = _initial_state(x, memory, state)
    seg = x.shape[1] if segment is None else min(segment, x.shape[1])
    if impl == "loop":
        m = base
        for xs in x.split(seg, dim=1):
            m = m + _write_loop(xs, memory, write_q, write_k, write_v)
        return m
    writes = _writes_batched(x, memory, write_q, write_k, write_v, seg)  # (B, J, N, D)
    # cumsum, not sum: the same order of additions as the loop (and as the forward's states).
    return torch.cat([base.unsqueeze(1), writes], dim=1).cumsum(dim=1)[:, -1]


# ---------------------------------------------------------------------------------------------------
# The module, and its decoding cache
# ---------------------------------------------------------------------------------------------------


class MemoryCache(nn.Module):
    """What :meth:`GraphDiffusionMemory.decode` keeps between calls, for ``batch`` sequences of at most
    ``max_len`` tokens (buffers; shapes never change, so a decode step can be captured in a CUDA graph).

    * ``keys``, ``values`` (B, N, D): the read keys and values of the diffused state before the segment
      of the next position, (P^k M_j) Wk' and (P^k M_j) Wv';
    * per position p (only with a ``segment``): ``scores`` (B, N, max_len), node n's write score
      (M Wq)_n . (x_p Wk) / sqrt(D); ``u``, ``z`` (B, max_len, D), the written value x_p Wv projected
      by the read key and value weights, (x_p Wv) Wk' and (x_p Wv) Wv'.

    Create it with :meth:`GraphDiffusionMemory.new_cache`; :meth:`GraphDiffusionMemory.reset_cache`
    starts a new sequence (in place).
    """

    def __init__(
        self,
        batch: int,
        max_len: int,
        n_nodes: int,
        dim: int,
        *,
        positions: bool,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        for name, v in (("batch", batch), ("max_len", max_len)):
            check_int("MemoryCache", name, v)
        check_float_dtype("MemoryCache", dtype)
        self.batch, self.max_len = batch, max_len
        kw = dict(device=device, dtype=dtype)
        length = max_len if positions else 0  # without segments nothing is written while decoding
        for name, shape in (
            ("keys", (batch, n_nodes, dim)),
            ("values", (batch, n_nodes, dim)),
            ("scores", (batch, n_nodes, length)),
            ("u", (batch, length, dim)),
            ("z", (batch, length, dim)),
        ):
            self.register_buffer(name, torch.zeros(shape, **kw), persistent=False)


class GraphDiffusionMemory(nn.Module):
    """N memory nodes written by the tokens, diffused k steps over a learned graph, read by the tokens.

    ``forward(x, state=None)`` maps (B, T, D) -> (B, T, D); ``write(x, state=None)`` returns the state
    after x, (B, N, D), to pass to the next call. See the module docstring for the math, the segments,
    the two modes (``causal``) and the two ``impl`` choices ("loop" = readable reference, "batched" =
    the fast path; same function). Without a ``state`` every call starts from the learned nodes.

    ``causal=False`` (default: the standalone, bidirectional component) lets every position see a
    summary of its whole segment, later tokens included; ``causal=True`` makes each segment read only
    the memory written by earlier segments (what a language model needs). ``segment`` is the number of
    tokens per segment (None: the whole input is one segment).
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
        _check_config(steps, alpha, impl, causal, segment)
        self.dim, self.n_nodes, self.steps, self.alpha, self.impl = dim, n_nodes, steps, float(alpha), impl
        self.causal, self.segment = causal, segment
        # Unit-variance nodes, like normalized token activations, so write scores start O(1).
        self.memory = nn.Parameter(torch.randn(n_nodes, dim))
        # Zero logits: uniform graph at init (Â = 1/N), learned from there.
        self.adj_logits = nn.Parameter(torch.zeros(n_nodes, n_nodes))
        names = ("write_q", "write_k", "write_v", "read_q", "read_k", "read_v", "out")
        self.proj = nn.ModuleDict({k: nn.Linear(dim, dim, bias=False) for k in names})

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        p = self.proj
        return graph_diffusion_memory(
            x,
            self.memory,
            self.adj_logits,
            p["write_q"].weight,
            p["write_k"].weight,
            p["write_v"].weight,
            p["read_q"].weight,
            p["read_k"].weight,
            p["read_v"].weight,
            p["out"].weight,
            steps=self.steps,
            alpha=self.alpha,
            impl=self.impl,
            causal=self.causal,
            segment=self.segment,
            state=state,
        )

    def write(self, x: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """The state after x (B, N, D): ``state`` (default: the learned nodes) plus every segment's write."""
        p = self.proj
        return graph_diffusion_write(
            x,
            self.memory,
            p["write_q"].weight,
            p["write_k"].weight,
            p["write_v"].weight,
            impl=self.impl,
            segment=self.segment,
            state=state,
        )

    # -- decoding ------------------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None) -> MemoryCache:
        """A :class:`MemoryCache` on the module's device, in ``dtype`` (default: the parameters'), reset."""
        if not self.causal:
            raise ValueError(
                "GraphDiffusionMemory.new_cache: decoding needs causal=True (a bidirectional "
                "memory reads tokens that have not been generated yet)"
            )
        cache = MemoryCache(
            batch,
            max_len,
            self.n_nodes,
            self.dim,
            positions=self.segment is not None,
            device=self.memory.device,
            dtype=self.memory.dtype if dtype is None else dtype,
        )
        self.reset_cache(cache)
        return cache

    @torch.no_grad()
    def reset_cache(self, cache: MemoryCache) -> None:
        """Start a new sequence: the state is the learned nodes again (in place)."""
        if not isinstance(cache, MemoryCache):
            raise TypeError(
                f"GraphDiffusionMemory.reset_cache: cache must be a MemoryCache, got {type(cache).__name__}"
            )
        m = self.memory
        if self.steps > 0:
            m = diffusion_operator(self.adj_logits, self.steps, self.alpha) @ m  # (N, D)
        cache.keys.copy_(F.linear(m, self.proj["read_k"].weight).expand_as(cache.keys))
        cache.values.copy_(F.linear(m, self.proj["read_v"].weight).expand_as(cache.values))
        for buf in (cache.scores, cache.u, cache.z):
            buf.zero_()

    def decode(self, x: torch.Tensor, cache: MemoryCache, start_pos: torch.Tensor) -> torch.Tensor:
        """``forward`` for T new tokens x (B, T, D) at positions start_pos .. start_pos+T-1, continuing
        the sequence held in ``cache`` (updated in place). (B, T, D). Causal mode only.

        The same function as the forward over the whole sequence, computed differently: every map after
        the write softmax is linear, so the cache holds each position's write score and its written
        value already projected by the read key and value weights (``MemoryCache``), and the diffused,
        projected state itself. A call then costs O(T D^2) for the new tokens' projections plus
        O(N (T + segment) D) for the segments it touches, never O(N D^2) or O(sequence length):

            keys of M_{j+1} = keys of M_j + P^k softmax(scores of segment j) u_j   (values: z_j)

        A segment's write is added when its last token arrives. The state read by a token is fixed
        while its segment is decoded; with ``segment=None`` it is fixed for the whole sequence.
        ``start_pos`` is a 0-dim int64 tensor on the module's device (no host sync: every shape
        depends on T and ``segment`` only). That start_pos + T <= max_len is the caller's to ensure.
        For inference: call it under ``torch.no_grad()``.
        """
        fn = "GraphDiffusionMemory.decode"
        if not self.causal:
            raise ValueError(f"{fn}: decoding needs causal=True")
        if not isinstance(cache, MemoryCache):
            raise TypeError(f"{fn}: cache must be a MemoryCache (from new_cache), got {type(cache).__name__}")
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
            # The K segments that T consecutive tokens can touch (a bound from T and S alone), from the
            # segment of start_pos on. Rows past max_len are clamped: they belong to segments that
            # cannot be complete yet, whose writes are masked out below.
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

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, n_nodes={self.n_nodes}, steps={self.steps}, alpha={self.alpha}, "
            f"impl={self.impl!r}, causal={self.causal}, segment={self.segment}"
        )
