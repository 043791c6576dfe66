"""The full stack (notebook 10): one training step of the hybrid model, from the naive baseline to every
optimization at once, one rung at a time.

A **stack** says which optimizations are on: the model's implementation choices (names of
:data:`mahia.model.optimize.OPTIMIZATIONS`) and the runtime ones of
:func:`mahia.model.optimize.make_train_step` (sync-free loss logging, bf16 autocast, ``torch.compile``).
A **rung** adds one optimization; :data:`LADDER` is the default order and :func:`climb` turns it into
the cumulative stacks ``baseline, baseline + rung 1, baseline + rungs 1..2, ...``, :func:`alone` into
``baseline + one rung`` each (the individual effect). :func:`for_device` drops (or swaps for their
PyTorch equivalent) the rungs a device cannot run, and says why.

The cost model the notebook predicts every rung with, built from the mechanisms of the earlier
notebooks (launches and syncs: 01, 05, 09; bytes over bandwidth and FLOPs over the matmul rate: 00, 03,
06; fusion: 04)::

    t = max(n_ops * t_launch, t_work) + n_syncs * t_sync      on a GPU (the host queues work ahead)
    t = n_ops * t_launch + t_work + n_syncs * t_sync          on a CPU (the same cores dispatch and compute)

with ``n_ops`` and ``n_syncs`` counted on one step (:func:`profile_step`) and ``t_work`` the device time
of the kernels (per kernel the larger of matmul FLOPs / matmul rate and bytes / bandwidth): the cost
model of :mod:`mahia.measure.cost` (:func:`predict_ms`). Throughput and model FLOPs utilization::

    tokens/s = B T / t_step,        MFU = flops_per_token * tokens/s / peak matmul rate

(:func:`tokens_per_s`, :func:`mfu`). :func:`waterfall` draws the ladder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mahia.measure.checks import CorrectnessError, check_close, check_int, rel_error
from mahia.measure.cost import Machine, step_time
from mahia.measure.instruments import LiveTensorMemory, count_ops, count_syncs
from mahia.measure.timing import Timing

__all__ = [
    "Stack",
    "Rung",
    "LADDER",
    "climb",
    "alone",
    "for_device",
    "Built",
    "build",
    "StepOutputs",
    "step_outputs",
    "STEP_FIELDS",
    "cosine",
    "check_step",
    "greedy_gap",
    "StepProfile",
    "profile_step",
    "predict_ms",
    "tokens_per_s",
    "mfu",
    "optimizations_in_use",
    "peer_scope_note",
    "waterfall",
]

AMP = (None, "bf16")
# Compile modes whose compiled module can be called like the eager one. The CUDA-graph modes
# ("reduce-overhead", "max-autotune") need a step marker per call: use make_train_step(compile=...) for those.
COMPILE = (None, "default", "max-autotune-no-cudagraphs")


def _names(fn: str, names) -> tuple[str, ...]:
    from mahia.model.optimize import OPTIMIZATIONS

    if isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise TypeError(f"{fn}: model must be a tuple of optimization names, got {names!r}")
    unknown = [n for n in names if n not in OPTIMIZATIONS]
    if unknown:
        raise ValueError(f"{fn}: unknown model optimization(s) {unknown}; valid: {sorted(OPTIMIZATIONS)}")
    return tuple(names)


def _check_runtime(fn: str, sync_free_logging, amp, compile) -> None:
    if not isinstance(sync_free_logging, bool):
        raise TypeError(f"{fn}: sync_free_logging must be a bool, got {sync_free_logging!r}")
    if amp not in AMP:
        raise ValueError(f"{fn}: amp must be one of {AMP}, got {amp!r}")
    if compile not in COMPILE:
        raise ValueError(f"{fn}: compile must be one of {COMPILE}, got {compile!r}")


@dataclass(frozen=True)
class Stack:
    """Which optimizations are on. ``model``: names for :func:`mahia.model.optimize.apply`, applied on
    top of the config's baseline impls; the rest are :func:`~mahia.model.optimize.make_train_step`
    options. ``Stack()`` is the naive baseline: reference impls, float32, ``.item()`` every step, eager."""

    model: tuple[str, ...] = ()
    sync_free_logging: bool = False
    amp: str | None = None
    compile: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", _names("Stack", self.model))
        _check_runtime("Stack", self.sync_free_logging, self.amp, self.compile)

    def config(self, cfg):
        """``cfg`` with every impl on its reference path, then this stack's model optimizations."""
        from mahia.model.config import HybridConfig
        from mahia.model.optimize import apply

        if not isinstance(cfg, HybridConfig):
            raise TypeError(f"Stack.config: cfg must be a HybridConfig, got {type(cfg).__name__}")
        return apply(cfg.baseline(), *self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the matmuls run in."""
        return torch.bfloat16 if self.amp == "bf16" else torch.float32

    def describe(self) -> str:
        parts = list(self.model)
        parts += ["sync-free logging"] if self.sync_free_logging else []
        parts += [f"amp={self.amp}"] if self.amp else []
        parts += [f"compile={self.compile}"] if self.compile else []
        return ", ".join(parts) if parts else "baseline"


@dataclass(frozen=True)
class Rung:
    """One optimization added on top of a stack. ``mechanism`` says what it acts on (for tables)."""

    name: str
    label: str
    mechanism: str
    model: tuple[str, ...] = ()
    sync_free_logging: bool = False
    amp: str | None = None
    compile: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise ValueError(f"Rung: name must be an identifier-like string, got {self.name!r}")
        object.__setattr__(self, "model", _names("Rung", self.model))
        _check_runtime("Rung", self.sync_free_logging, self.amp, self.compile)

    def on(self, stack: Stack) -> Stack:
        """``stack`` with this rung's optimization added (model names appended, runtime options set)."""
        if not isinstance(stack, Stack):
            raise TypeError(f"Rung.on: stack must be a Stack, got {type(stack).__name__}")
        return Stack(
            model=stack.model + tuple(n for n in self.model if n not in stack.model),
            sync_free_logging=stack.sync_free_logging or self.sync_free_logging,
            amp=self.amp or stack.amp,
            compile=self.compile or stack.compile,
        )


# The default ladder. The hybrid parts' Python loops go first: until they do, they are nearly all of a
# step's time at a real size (per-token and per-node loops, B x L syncs) and hide every other rung. The
# step without them is the baseline the standard rungs are measured from (notebook 10); the loops' own
# before/after is notebook 09's subject. Then the cheapest change first, the compiler last (it needs the
# loops gone to pay).
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
    Rung("bf16", "bf16 autocast", "the matmul rate (bf16) and half the activation bytes", amp="bf16"),
    Rung("compile", "torch.compile", "launches and bytes of unfused pointwise ops", compile="default"),
)


def climb(rungs: Sequence[Rung] = LADDER) -> list[tuple[str, Stack]]:
    """``[("baseline", Stack()), (rung_1.name, baseline + rung_1), (rung_2.name, + rung_2), ...]``."""
    out, stack = [("baseline", Stack())], Stack()
    for r in _rungs("climb", rungs):
        stack = r.on(stack)
        out.append((r.name, stack))
    return out


def alone(rungs: Sequence[Rung] = LADDER, *, base: Stack | None = None) -> list[tuple[str, Stack]]:
    """``[("baseline", base), (rung.name, base + that rung only), ...]``; ``base`` defaults to ``Stack()``."""
    base = Stack() if base is None else base
    if not isinstance(base, Stack):
        raise TypeError(f"alone: base must be a Stack, got {type(base).__name__}")
    return [("baseline", base)] + [(r.name, r.on(base)) for r in _rungs("alone", rungs)]


def _rungs(fn: str, rungs) -> list[Rung]:
    rungs = list(rungs)
    for r in rungs:
        if not isinstance(r, Rung):
            raise TypeError(f"{fn}: rungs must be Rung objects, got {type(r).__name__}")
    names = [r.name for r in rungs]
    if len(set(names)) != len(names):
        raise ValueError(f"{fn}: rung names must be unique, got {names}")
    return rungs


# CUDA-only model optimizations and their PyTorch equivalent on a CPU (None: no equivalent, drop it).
_CPU_SWAP = {"triton": None, "triton_scan": "logspace_scan", "flash": "sdpa", "cudnn_attention": "sdpa"}


def for_device(
    rungs: Sequence[Rung] = LADDER, *, cuda: bool, compile_problem: str | None = None
) -> tuple[list[Rung], dict[str, str]]:
    """The rungs that run here, and ``{rung name: why it was changed or dropped}``.

    Without CUDA, Triton kernels would run in Triton's CPU interpreter (exact but orders of magnitude
    slower): the Triton scan is swapped for the same chunked algorithm in PyTorch ("logspace_scan"), the
    Triton norm/SwiGLU/RoPE kernels (which have no separate PyTorch fast path) are dropped, and so is a
    rung left with nothing to do. ``compile_problem`` (e.g. from
    :func:`mahia.model.optimize.compile_problem`, or a reason of the caller's) drops the compile rung.
    """
    if not isinstance(cuda, bool):
        raise TypeError(f"for_device: cuda must be a bool, got {cuda!r}")
    if compile_problem is not None and not isinstance(compile_problem, str):
        raise TypeError(f"for_device: compile_problem must be None or a string, got {compile_problem!r}")
    kept, why = [], {}
    for r in _rungs("for_device", rungs):
        if r.compile is not None and compile_problem is not None:
            why[r.name] = f"dropped: {compile_problem}"
            continue
        if cuda:
            kept.append(r)
            continue
        swapped = [_CPU_SWAP.get(n, n) for n in r.model]
        model = tuple(n for n in swapped if n is not None)
        if model != r.model:
            gone = [n for n, s in zip(r.model, swapped) if s != n]
            detail = ", ".join(f"{n} -> {_CPU_SWAP[n]}" if _CPU_SWAP[n] else f"{n} dropped" for n in gone)
            if not model and not (r.sync_free_logging or r.amp or r.compile):
                why[r.name] = f"dropped: CUDA only ({detail}; Triton would run in its slow CPU interpreter)"
                continue
            why[r.name] = f"changed for the CPU: {detail}"
            r = dataclasses.replace(r, model=model)
        kept.append(r)
    return kept, why


# ---------------------------------------------------------------------------------------------------
# Building a stack and checking it against the baseline
# ---------------------------------------------------------------------------------------------------


@dataclass
class Built:
    """A model of one stack: ``forward`` is the model or its ``torch.compile``; ``step`` one training step."""

    stack: Stack
    model: nn.Module
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable


def build(
    cfg,
    stack: Stack,
    *,
    device: torch.device | str,
    state: dict | None = None,
    lr: float = 1e-3,
    model_class: type[nn.Module] | None = None,
) -> Built:
    """A :class:`~mahia.model.HybridModel` of ``stack.config(cfg)`` on ``device`` with weights ``state``
    (a ``state_dict``; every impl has the same parameters), a fused AdamW (no host sync in its step) and
    its training step. With ``stack.compile`` the forward is ``torch.compile(model, mode=...)``: compiled
    lazily, at the first call, and reused by the step (same guards: training mode, grad on, autocast).
    ``model_class`` builds another model from the same config instead (e.g. the peer
    :class:`mahia.model.plain_gpt.PlainGPT`), with the same optimizer and step."""
    from mahia.model import HybridModel, make_train_step

    if not isinstance(stack, Stack):
        raise TypeError(f"build: stack must be a Stack, got {type(stack).__name__}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"build: lr must be a positive number, got {lr!r}")
    device = torch.device(device)
    with device:  # parameters are created (and initialised) on the device: no host copy of big models
        model = (model_class or HybridModel)(stack.config(cfg))
    if state is not None:
        model.load_state_dict(state)
    # fused=True: one kernel set per step and no .item() of the step counter (supported on CUDA and CPU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    forward = torch.compile(model, mode=stack.compile) if stack.compile else model
    step = make_train_step(forward, optimizer, amp=stack.amp, sync_free_logging=stack.sync_free_logging)
    return Built(stack, model, forward, optimizer, step)


@dataclass
class StepOutputs:
    """What one forward + backward computes: total loss, cross entropy, logits and all parameter
    gradients (flattened, concatenated in ``model.parameters()`` order), as float32 tensors."""

    loss: torch.Tensor
    ce: torch.Tensor
    logits: torch.Tensor
    grad: torch.Tensor


def step_outputs(
    forward: Callable, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], *, amp: str | None = None
) -> StepOutputs:
    """Forward ``forward(idx, targets) -> (logits, loss)`` (under bf16 autocast with ``amp="bf16"``) and
    backward of the loss; the gradients are read and cleared again, the weights are not updated."""
    if amp not in AMP:
        raise ValueError(f"step_outputs: amp must be one of {AMP}, got {amp!r}")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ValueError("step_outputs: batch must be a pair (idx, targets)")
    idx, targets = batch
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("step_outputs: the model has no trainable parameters")
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
        logits, loss = forward(idx, targets)
    if loss is None:
        raise ValueError("step_outputs: forward returned no loss (pass targets)")
    ce = F.cross_entropy(logits.detach().float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    grad = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten() for p in params]
    )
    model.zero_grad(set_to_none=True)
    return StepOutputs(loss.detach().float(), ce, logits.detach().float(), grad)


STEP_FIELDS = ("loss", "ce", "logits", "grad")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors taken as flat vectors, in float64 (NaN/Inf give -1; 1 for two zeros)."""
    if a.shape != b.shape:
        raise ValueError(f"cosine: shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    x, y = a.detach().double().flatten(), b.detach().double().flatten()
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return -1.0
    nx, ny = x.norm(), y.norm()
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(x @ y / (nx * ny))


def check_step(
    name: str,
    out: StepOutputs,
    ref: StepOutputs,
    tol: float,
    *,
    fields: Sequence[str] = STEP_FIELDS,
    direction_fields: Sequence[str] = (),
    min_cosine: float = 0.99,
) -> dict[str, float]:
    """Compare one step's outputs with the reference's; raise :class:`~mahia.measure.checks.CorrectnessError`
    (naming ``name`` and the tensor) at the first failure.

    ``fields`` must be within ``tol`` in norm-wise relative error. ``direction_fields`` must point the same
    way, ``cosine(out, ref) >= min_cosine``: the check for quantities that a discrete decision makes
    discontinuous, e.g. logits and gradients of a top-k MoE under bf16, where a token whose best experts
    nearly tie may be routed differently once its activations are rounded. Returns the relative error of
    every field checked and ``"cos <field>"`` for the direction fields.
    """
    for arg, v in (("out", out), ("ref", ref)):
        if not isinstance(v, StepOutputs):
            raise TypeError(f"check_step: {arg} must be StepOutputs (from step_outputs), got {type(v).__name__}")
    for arg, v in (("tol", tol), ("min_cosine", min_cosine)):
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"check_step: {arg} must be a positive number, got {v!r}")
    if min_cosine > 1:
        raise ValueError(f"check_step: min_cosine must be <= 1, got {min_cosine!r}")
    for arg, fs in (("fields", fields), ("direction_fields", direction_fields)):
        if isinstance(fs, str) or any(f not in STEP_FIELDS for f in fs):
            raise ValueError(f"check_step: {arg} must be a sequence of names from {STEP_FIELDS}, got {fs!r}")
    if not fields and not direction_fields:
        raise ValueError("check_step: nothing to check (fields and direction_fields are both empty)")
    errors = {k: check_close(f"{name}: {k}", getattr(out, k), getattr(ref, k), tol) for k in fields}
    for k in direction_fields:
        errors[k] = rel_error(getattr(out, k), getattr(ref, k))
        cos = cosine(getattr(out, k), getattr(ref, k))
        if not cos >= min_cosine:
            raise CorrectnessError(
                f"{name}: {k} points another way: cosine {cos:.5f} < {min_cosine} (relative error {errors[k]:.2e})"
            )
        errors[f"cos {k}"] = cos
    return errors


def greedy_gap(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    """How far ``tokens`` are from being the argmax of ``logits``, the worst position:

        max over positions of  (max_v logits[v] - logits[token]) / max_v |logits[v]|      (float64)

    0 when every token is an argmax, as a greedy decoder's output checked against another path's logits
    should be; a value of the order of the logits' rounding error is a near-tie that rounding may flip
    either way; more than that is a wrong token. ``logits`` (..., V) float, ``tokens`` (...) integer."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise TypeError(
            f"greedy_gap: logits must be a float tensor (..., V), got {getattr(logits, 'dtype', type(logits))}"
        )
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"greedy_gap: tokens must be an integer tensor, got {getattr(tokens, 'dtype', type(tokens))}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(
            f"greedy_gap: tokens must have shape {tuple(logits.shape[:-1])} (logits without the "
            f"last dim), got {tuple(tokens.shape)}"
        )
    if tokens.numel() == 0:
        raise ValueError("greedy_gap: no positions to check")
    lg = logits.detach().double()
    if not torch.isfinite(lg).all():
        return float("inf")
    chosen = lg.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    scale = lg.abs().amax(dim=-1).clamp(min=torch.finfo(torch.float64).tiny)
    return float(((lg.amax(dim=-1) - chosen) / scale).max())


# ---------------------------------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepProfile:
    """One call of a step: ops that launch a kernel (:func:`mahia.measure.instruments.count_ops`), host
    syncs (counted as on a GPU; see :mod:`mahia.measure.instruments`) and, where asked, the peak bytes of
    live tensors it allocated (:class:`mahia.measure.instruments.LiveTensorMemory`)."""

    ops: int
    syncs: int
    peak_bytes: int | None = None


def profile_step(fn: Callable[[], object], *, peak: bool = False) -> StepProfile:
    """Run ``fn()`` once under the op and sync counters (and the live-memory tracker with ``peak``).
    Eager code only: a compiled region's kernels do not pass through the dispatcher."""
    if not callable(fn):
        raise TypeError(f"profile_step: fn must be callable, got {type(fn).__name__}")
    mem = LiveTensorMemory() if peak else None
    with count_syncs(keep_stack=False) as syncs, count_ops() as ops:
        if mem is not None:
            with mem:
                fn()
        else:
            fn()
    return StepProfile(ops.total, syncs.count, mem.peak if mem is not None else None)


def predict_ms(ops: float, syncs: float, work_ms: float, *, launch_us: float, sync_us: float, overlap: bool) -> float:
    """Predicted step time in ms (module docstring; :func:`mahia.measure.cost.step_time`): ``max`` of launch
    and device time when the host runs ahead of the device (``overlap``, a GPU), their sum otherwise (a
    CPU); each sync adds ``t_sync``."""
    for name, v in (
        ("ops", ops),
        ("syncs", syncs),
        ("work_ms", work_ms),
        ("launch_us", launch_us),
        ("sync_us", sync_us),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
            raise ValueError(f"predict_ms: {name} must be a finite number >= 0, got {v!r}")
    if not isinstance(overlap, bool):
        raise TypeError(f"predict_ms: overlap must be a bool, got {overlap!r}")
    machine = Machine(launch_us=launch_us, sync_us=sync_us, overlap=overlap)
    return step_time(machine, launches=ops, work_ms=work_ms, syncs=syncs).ms


def tokens_per_s(tokens: int, timing: Timing | float) -> float:
    """Tokens per second of a step over ``tokens`` tokens taking ``timing`` (a Timing, or ms)."""
    check_int("tokens_per_s", "tokens", tokens)
    ms = timing.median_ms if isinstance(timing, Timing) else timing
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0:
        raise ValueError(f"tokens_per_s: the step time must be a positive number of ms, got {ms!r}")
    return tokens / (ms * 1e-3)


def mfu(flops_per_token: float, tokens_per_second: float, peak_tflops: float) -> float:
    """Model FLOPs utilization: ``flops_per_token * tokens_per_second / (peak_tflops * 1e12)``."""
    for name, v in (
        ("flops_per_token", flops_per_token),
        ("tokens_per_second", tokens_per_second),
        ("peak_tflops", peak_tflops),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
            raise ValueError(f"mfu: {name} must be a finite positive number, got {v!r}")
    return flops_per_token * tokens_per_second / (peak_tflops * 1e12)


# The config switch whose part each model optimization changes; the others (attention, kernels) act on every model.
_PART_OF = {
    "grouped_moe": "moe",
    "logspace_scan": "meta_attention",
    "triton_scan": "meta_attention",
    "batched_memory": "graph_memory",
    "masked_gating": "gating",
}


def optimizations_in_use(cfg, names: Sequence[str]) -> tuple[str, ...]:
    """The model optimizations among ``names`` (:data:`mahia.model.optimize.OPTIMIZATIONS`) that change a part
    ``cfg`` has: ``grouped_moe`` only where it has MoE blocks, the scans only with meta-attention,
    ``batched_memory`` only with graph memory, ``masked_gating`` only with gating; the rest on every model."""
    from mahia.model.config import HybridConfig

    if not isinstance(cfg, HybridConfig):
        raise TypeError(f"optimizations_in_use: cfg must be a HybridConfig, got {type(cfg).__name__}")
    return tuple(n for n in _names("optimizations_in_use", tuple(names)) if getattr(cfg, _PART_OF.get(n, ""), True))


def peer_scope_note(cfg, names: Sequence[str], *, peer: Sequence[str] = ("sdpa",)) -> str:
    """What a run of ``cfg`` with the model optimizations ``names`` measures against a peer that shares its
    recipe (precision, compile, optimizer, logging) and uses the optimizations ``peer`` (PlainGPT: SDPA). Where
    every optimization that acts on ``cfg`` is the peer's too, the two differ only in the model's code: the
    comparison measures that code, not the stack's optimizations."""
    used = optimizations_in_use(cfg, names)
    idle = [n for n in names if n not in used]
    if set(used) <= set(peer):
        return (
            f"Of the stack's model optimizations ({', '.join(names)}), the only one that acts on this model is "
            f"{', '.join(used) or 'none'}"
            + (", which the peer uses too" if used else "")
            + ": both runs share the recipe, so this compares mahia's model code with plain PyTorch modules, not "
            "the stack" + (f" ({', '.join(idle)} act on parts this model does not have)" if idle else "") + ". "
        )
    extra = [n for n in used if n not in peer]
    return f"Beyond the peer's recipe, the stack gives this model {', '.join(extra)}. "


# ---------------------------------------------------------------------------------------------------
# The waterfall chart
# ---------------------------------------------------------------------------------------------------


def _factor(f: float) -> str:
    return f"x{f:.2f}" if f < 10 else f"x{f:,.0f}"


def _number(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def waterfall(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    ylabel: str = "tokens / s",
    device_note: str | None = None,
    log: bool = True,
    total_label: str = "full stack",
    spread: Sequence[tuple[float, float]] | None = None,
    significant: Sequence[bool] | None = None,
    ax=None,
):
    """A waterfall of a quantity along a ladder: the first bar from the axis to ``values[0]``, each
    later one floating from the previous value to its own (green up, red down) with its factor
    ``values[i] / values[i-1]`` written on it, and a last bar (``total_label``) from the axis to the
    final value with the overall factor. ``log`` puts the axis on a log scale (factors multiply).
    ``spread``: a (low, high) range per value (e.g. from the p80 and p20 step times), drawn as an error
    bar at each level; ``significant``: per rung (index 1 on), False marks its factor "n.s." (its range
    overlaps the previous one's)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from mahia.measure.plotting import ROLE_COLORS

    labels, values = list(labels), [float(v) for v in values]
    if len(labels) != len(values) or len(values) < 2:
        raise ValueError(f"waterfall: need as many labels as values, at least 2; got {len(labels)} and {len(values)}")
    if not all(v > 0 and v != float("inf") for v in values):
        raise ValueError(f"waterfall: values must be finite and positive, got {values}")
    n = len(values)
    if spread is not None and len(spread) != n:
        raise ValueError(f"waterfall: spread needs one (low, high) pair per value, got {len(spread)} for {n}")
    if significant is not None and len(significant) != n:
        raise ValueError(f"waterfall: significant needs one flag per value, got {len(significant)} for {n}")
    ax = ax or plt.subplots(figsize=(max(7.0, 1.0 * (n + 1)), 4.6))[1]
    floor = min(values) / 3 if log else 0.0
    x = np.arange(n + 1)
    lows = [floor] + [min(a, b) for a, b in zip(values[:-1], values[1:])] + [floor]
    highs = [values[0]] + [max(a, b) for a, b in zip(values[:-1], values[1:])] + [values[-1]]
    colors = (
        [ROLE_COLORS["baseline"]]
        + ["#55a868" if b >= a else "#c44e52" for a, b in zip(values[:-1], values[1:])]
        + [ROLE_COLORS["optimized"]]
    )
    alphas = [1.0] + [0.55] * (n - 1) + [1.0]
    for xi, lo, hi, c, a in zip(x, lows, highs, colors, alphas):
        ax.bar(xi, hi - lo, bottom=lo, color=c, alpha=a, width=0.7, edgecolor="black", linewidth=0.5)
    for i in range(n):  # connectors at each level
        ax.plot([x[i] + 0.35, x[i + 1] - 0.35], [values[i]] * 2, color="black", lw=0.7, ls=":")
    if spread is not None:
        lo_hi = np.array([[v - lo, hi - v] for v, (lo, hi) in zip(values, spread)]).clip(min=0).T
        ax.errorbar(x[:n], values, yerr=lo_hi, fmt="none", ecolor="black", capsize=3, lw=1)
    for i in range(1, n):
        ns = significant is not None and not significant[i]
        ax.annotate(
            _factor(values[i] / values[i - 1]) + ("\nn.s." if ns else ""),  # own line: neighbours' labels stay apart
            (x[i], max(values[i], values[i - 1])),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.annotate(_number(values[0]), (x[0], values[0]), ha="center", va="bottom", fontsize=9)
    ax.annotate(
        f"{_number(values[-1])}\n({_factor(values[-1] / values[0])})",
        (x[n], values[-1]),
        ha="center",
        va="bottom",
        fontsize=9,
        fontweight="bold",
    )
    ax.set_xticks(x, labels + [total_label], rotation=30, ha="right")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(floor, max(values) * 3)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n{device_note}" if device_note else title)
    return ax
