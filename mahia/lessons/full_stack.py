"""The full stack (notebook 10): one training step of the hybrid model, from the naive baseline to every
optimization at once, one rung at a time.

A :class:`Stack` says which optimizations are on: model ones (names of :data:`mahia.model.optimize.OPTIMIZATIONS`)
and the runtime options of :func:`mahia.model.optimize.make_train_step`. A :class:`Rung` adds one; :func:`climb`
stacks the rungs of :data:`LADDER` cumulatively, :func:`alone` each on its own. :func:`build` makes a stack's
model, optimizer and step; :func:`step_outputs` and :func:`check_step` check it against the baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mahia.measure.checks import CorrectnessError, check_close, rel_error
from mahia.measure.instruments import LiveTensorMemory, count_ops, count_syncs
from mahia.measure.timing import capture_graph


@dataclass(frozen=True)
class Stack:
    """Which optimizations are on: ``model`` names for :func:`mahia.model.optimize.apply` (on top of the
    config's reference impls), the rest :func:`~mahia.model.optimize.make_train_step` options. ``Stack()`` is
    the naive baseline: reference impls, float32, ``.item()`` every step, eager."""

    model: tuple[str, ...] = ()
    sync_free_logging: bool = False
    amp: str | None = None
    compile: str | None = None
    graphs: bool = False  # the whole step captured in one CUDA graph and replayed (notebook 05)

    def config(self, cfg):
        from mahia.model.optimize import apply

        return apply(cfg.baseline(), *self.model)

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.amp == "bf16" else torch.float32

    def describe(self) -> str:
        parts = [*self.model, *(["sync-free logging"] if self.sync_free_logging else [])]
        parts += [f"amp={self.amp}"] * bool(self.amp) + [f"compile={self.compile}"] * bool(self.compile)
        parts += ["CUDA graph"] * self.graphs
        return ", ".join(parts) or "baseline"


@dataclass(frozen=True)
class Rung:
    """One optimization added on top of a stack; ``mechanism`` says what it acts on."""

    name: str
    label: str
    mechanism: str
    model: tuple[str, ...] = ()
    sync_free_logging: bool = False
    amp: str | None = None
    compile: str | None = None
    graphs: bool = False
    replaces: tuple[str, ...] = ()  # model optimizations this rung turns off again

    def on(self, stack: Stack) -> Stack:
        model = stack.model + tuple(n for n in self.model if n not in stack.model)
        return Stack(
            model=tuple(n for n in model if n not in self.replaces),
            sync_free_logging=stack.sync_free_logging or self.sync_free_logging,
            amp=self.amp or stack.amp,
            compile=self.compile or stack.compile,
            graphs=stack.graphs or self.graphs,
        )


# The hybrid parts' Python loops go first: until they are gone they are nearly all of a step's time (per-token
# and per-node loops, B x L syncs) and hide every other rung. Then the cheapest change first, the compiler last.
LADDER: tuple[Rung, ...] = (
    Rung(
        "hybrid_parts",
        "scan + memory + gating",
        "Python loops over steps, nodes, samples; B x L syncs",
        model=("triton_scan", "batched_memory", "masked_gating"),
    ),
    Rung("sync_free", "sync-free logging", "one host sync per step", sync_free_logging=True),
    Rung("sdpa", "SDPA attention", "launches; the T x T scores' bytes where a fused kernel runs", model=("sdpa",)),
    Rung("triton", "Triton kernels", "launches and bytes of norms, SwiGLU, RoPE", model=("triton",)),
    Rung("grouped_moe", "grouped MoE", "E host syncs and 2E small matmuls per MoE block", model=("grouped_moe",)),
    Rung("bf16", "bf16 autocast", "the matmul rate (bf16), half the activation bytes, bf16 weights", amp="bf16"),
    # Compiled, Inductor's norm/SwiGLU/RoPE replace the hand-written kernels, custom ops it can neither fuse nor call
    # without a Python dispatch each (H100, 2026-12-06, 4 runs: 0.6-0.8 ms less kernel time, 4-21 ms less wall a step)
    Rung("compile", "torch.compile", "launches, bytes of unfused ops", compile="default", replaces=("triton",)),
    Rung("graphs", "CUDA graph", "host time: the whole step (optimizer too) replayed as one graph", graphs=True),
)


def climb(rungs: Sequence[Rung] = LADDER) -> list[tuple[str, Stack]]:
    """``[("baseline", Stack()), (rung_1.name, baseline + rung_1), (rung_2.name, + rung_2), ...]``."""
    out = [("baseline", Stack())]
    for r in rungs:
        out.append((r.name, r.on(out[-1][1])))
    return out


def alone(rungs: Sequence[Rung] = LADDER, *, base: Stack = Stack()) -> list[tuple[str, Stack]]:
    """``[("baseline", base), (rung.name, base + that rung only), ...]``."""
    return [("baseline", base)] + [(r.name, r.on(base)) for r in rungs]


# CUDA-only model optimizations and their PyTorch equivalent on a CPU (None: no equivalent, drop it).
_CPU_SWAP = {"triton": None, "triton_scan": "logspace_scan", "flash": "sdpa", "cudnn_attention": "sdpa"}


def for_device(
    rungs: Sequence[Rung] = LADDER, *, cuda: bool, compile_problem: str | None = None
) -> tuple[list[Rung], dict[str, str]]:
    """The rungs that run here, and ``{rung name: why it was changed or dropped}``. ``compile_problem`` drops the
    compile rung. Without CUDA, Triton would run in its CPU interpreter (exact, but orders of magnitude slower):
    the Triton scan becomes the same chunked algorithm in PyTorch, the Triton norm/SwiGLU/RoPE kernels go."""
    kept, why = [], {}
    for r in rungs:
        if r.compile and compile_problem:
            why[r.name] = f"dropped: {compile_problem}"
            continue
        if r.graphs and not cuda:
            why[r.name] = "dropped: CUDA only (a CPU has no device queue to replay a graph on)"
            continue
        model = tuple(_CPU_SWAP.get(n, n) for n in r.model) if not cuda else r.model
        if model != r.model:
            detail = ", ".join(f"{n} -> {s or 'dropped'}" for n, s in zip(r.model, model) if s != n)
            model = tuple(n for n in model if n)
            if not model and not (r.sync_free_logging or r.amp or r.compile):
                why[r.name] = f"dropped: CUDA only ({detail}; Triton would run in its slow CPU interpreter)"
                continue
            why[r.name] = f"changed for the CPU: {detail}"
            r = dataclasses.replace(r, model=model)
        kept.append(r)
    return kept, why


@dataclass
class Built:
    """A model of one stack: ``forward`` is the model or its ``torch.compile``; ``step`` one training step."""

    stack: Stack
    model: nn.Module
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable


def build(cfg, stack: Stack, *, device, state: dict | None = None, lr: float = 1e-3, model_class=None) -> Built:
    """A :class:`~mahia.model.HybridModel` (or ``model_class``, e.g. the peer PlainGPT) of ``stack.config(cfg)`` on
    ``device`` with weights ``state``, a fused AdamW (no host sync in its step; under bf16 a
    :class:`~mahia.model.optimize.MasterAdamW`) and its training step. With
    ``stack.compile`` the forward is ``torch.compile(model, mode=...)``, compiled at its first call."""
    from mahia.model import HybridModel, MasterAdamW, make_train_step

    with torch.device(device):  # parameters created on the device: no host copy of big models
        model = (model_class or HybridModel)(stack.config(cfg))
    if state is not None:
        model.load_state_dict(state)
    # capturable: the step count and the bias corrections stay on the device, so a graph can hold the update
    kw = dict(lr=lr, fused=True, capturable=stack.graphs)
    if stack.amp == "bf16":  # bf16 weights, float32 copies in the optimizer: no cast kernel per weight and step
        tokens = torch.zeros(1, min(model.cfg.max_seq_len, 256), dtype=torch.long, device=device)  # reads every weight
        optimizer = MasterAdamW(model, (tokens,), **kw)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), **kw)
    forward = torch.compile(model, mode=stack.compile) if stack.compile else model
    step = make_train_step(forward, optimizer, amp=stack.amp, sync_free_logging=stack.sync_free_logging)
    return Built(stack, model, forward, optimizer, graphed(step) if stack.graphs else step)


def graphed(step: Callable, warmup: int = 3) -> Callable:
    """``step(batch)`` replayed from one CUDA graph per batch shape (notebook 05's idiom, here the whole
    training step: forward, backward, AdamW). The first call of a shape captures ``step`` on a copy of the batch
    (:func:`~mahia.measure.timing.capture_graph`: ``warmup`` real steps on a side stream first, for compilation,
    autotuning and the optimizer's state); every call copies the batch into it and replays. ``.history``: the
    loss of every real step and replay, in order; ``.pool_bytes``: the memory the graphs hold between steps, their
    private pools' reserved segments (notebook 05, section 9: ``memory_allocated`` counts only the live outputs)."""
    graphs: dict = {}

    def replay(batch):
        key = tuple(t.shape for t in batch)
        if key not in graphs:
            # the batch's strides: a compiled forward guards on them (a clone of a sliced batch recompiled the model)
            static, marks = tuple(t.new_empty_strided(t.shape, t.stride()).copy_(t) for t in batch), []

            def once():  # notes the memory reserved before each call: the last note is the capture's
                marks.append(torch.cuda.memory_reserved())
                return step(static)

            graph, loss = capture_graph(once, warmup=warmup)  # recorded, not run: the weights are as warm-up left them
            replay.pool_bytes += torch.cuda.memory_reserved() - marks[-1]  # the pool's new segments
            replay.history += step.history[-warmup - 1 : -1]  # the warm-up steps' losses (the last is the capture's)
            graphs[key] = graph, static, loss
        graph, static, loss = graphs[key]
        for s, x in zip(static, batch):
            s.copy_(x)
        graph.replay()
        replay.history.append(loss.clone())
        return replay.history[-1]

    replay.history, replay.pool_bytes = [], 0
    return replay


@dataclass
class StepOutputs:
    """One forward + backward: total loss, cross entropy, logits and all parameter gradients (flattened,
    concatenated in ``model.parameters()`` order), as float32."""

    loss: torch.Tensor
    ce: torch.Tensor
    logits: torch.Tensor
    grad: torch.Tensor


def step_outputs(forward: Callable, model: nn.Module, batch, *, amp: str | None = None) -> StepOutputs:
    """Forward ``forward(idx, targets) -> (logits, loss)`` (bf16 autocast with ``amp="bf16"``) and backward of
    the loss; the gradients are read and cleared again, the weights are not updated."""
    idx, targets = batch
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
        logits, loss = forward(idx, targets)
    ce = F.cross_entropy(logits.detach().float().flatten(0, -2), targets.flatten(), ignore_index=-1)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).float().flatten() for p in params])
    model.zero_grad(set_to_none=True)
    return StepOutputs(loss.detach().float(), ce, logits.detach().float(), grad)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors as flat vectors, in float64 (NaN where either is not finite)."""
    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def check_step(
    name: str,
    out: StepOutputs,
    ref: StepOutputs,
    tol: float,
    *,
    fields: Sequence[str] = ("loss", "ce", "logits", "grad"),
    direction_fields: Sequence[str] = (),
    min_cosine: float = 0.99,
) -> dict[str, float]:
    """Raise :class:`~mahia.measure.checks.CorrectnessError` (naming ``name`` and the tensor) unless ``fields`` are
    within ``tol`` in norm-wise relative error and ``direction_fields`` point the same way (cosine >= ``min_cosine``:
    the check where a discrete decision makes a quantity discontinuous, e.g. top-k routing under bf16, where a
    near-tie may route a token differently). Returns the errors, and ``"cos <field>"`` of the direction fields."""
    errors = {k: check_close(f"{name}: {k}", getattr(out, k), getattr(ref, k), tol) for k in fields}
    for k in direction_fields:
        errors[k] = rel_error(getattr(out, k), getattr(ref, k))
        errors[f"cos {k}"] = cos = cosine(getattr(out, k), getattr(ref, k))
        if not cos >= min_cosine:
            raise CorrectnessError(f"{name}: {k} points another way: cosine {cos:.5f} < {min_cosine}")
    return errors


@dataclass(frozen=True)
class StepProfile:
    """One call: ops that launch a kernel, host syncs (as on a GPU) and, where asked, the peak bytes of the live
    tensors it allocated (:mod:`mahia.measure.instruments`)."""

    ops: int
    syncs: int
    peak_bytes: int | None = None


def profile_step(fn: Callable[[], object], *, peak: bool = False) -> StepProfile:
    """Run ``fn()`` once under the counters. Eager code only: compiled kernels bypass the dispatcher."""
    mem = LiveTensorMemory()
    with count_syncs(keep_stack=False) as syncs, count_ops() as ops:
        if peak:
            with mem:
                fn()
        else:
            fn()
    return StepProfile(ops.total, syncs.count, mem.peak if peak else None)


def waterfall(labels, values, *, title: str, spread=None, significant=None, device_note=None, ax=None):
    """Tokens/s along a ladder, on a log axis: the first bar from the axis, each later one floating from the
    previous value to its own (green up, red down) with its factor (``n.s.`` where ``significant`` is False), a
    last bar for the whole stack. ``spread``: a (low, high) range per value, drawn as an error bar."""
    import matplotlib.pyplot as plt
    import numpy as np

    from mahia.measure.plotting import ROLE_COLORS

    v, x = np.asarray(values, dtype=float), np.arange(len(values) + 1)
    ax = ax or plt.subplots(figsize=(max(7.0, len(x)), 4.6))[1]
    floor = v.min() / 3
    lows = np.r_[floor, np.minimum(v[:-1], v[1:]), floor]
    highs = np.r_[v[0], np.maximum(v[:-1], v[1:]), v[-1]]
    steps = ["#55a868" if b >= a else "#c44e52" for a, b in zip(v, v[1:])]
    colors = [ROLE_COLORS["baseline"], *steps, ROLE_COLORS["optimized"]]
    ax.bar(x, highs - lows, bottom=lows, color=colors, width=0.7, edgecolor="black", linewidth=0.5)
    if spread is not None:
        lo, hi = np.asarray(spread, dtype=float).T
        ax.errorbar(x[:-1], v, yerr=np.clip([v - lo, hi - v], 0, None), fmt="none", ecolor="black", capsize=3)
    for i in range(1, len(v)):
        ns = "\nn.s." if significant is not None and not significant[i] else ""
        ax.annotate(f"x{v[i] / v[i - 1]:.3g}{ns}", (i, max(v[i], v[i - 1])), ha="center", va="bottom", fontsize=9)
    ax.annotate(f"{v[0]:,.0f}", (0, v[0]), ha="center", va="bottom", fontsize=9)
    ax.annotate(f"{v[-1]:,.0f}\n(x{v[-1] / v[0]:.3g})", (x[-1], v[-1]), ha="center", va="bottom", weight="bold")
    ax.set_xticks(x, [*labels, "full stack"], rotation=30, ha="right")
    ax.set(yscale="log", ylim=(floor, v.max() * 3), ylabel="tokens / s")
    ax.set_title(f"{title}\n{device_note}" if device_note else title)
    return ax
