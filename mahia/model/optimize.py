"""Named optimizations of the hybrid model, each usable alone.

* **Model optimizations** pick a layer's implementation; they live in the config, and :func:`apply`
  switches them on by name: ``cfg = apply(HybridConfig.preset("small"), "sdpa", "grouped_moe")``.
* **Runtime optimizations** change how a built model runs, not what it computes. As torchtitan's
  ``apply_*`` functions, they act from outside, so the model stays a plain PyTorch module:
  :func:`apply_checkpointing` (in place), :func:`apply_compile` (a compiled callable to use instead),
  :func:`make_decoder` (static KV cache, a decode step as a CUDA graph), and :func:`make_train_step`
  (mixed precision, checkpointing, ``torch.compile``, sync-free loss logging). :class:`MasterAdamW` keeps the
  weights bf16 autocast would cast in bf16, and float32 copies for the update.
"""

from __future__ import annotations

import functools
import shutil
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mahia.measure.checks import check_int
from mahia.model.config import CHECKPOINT_POLICIES, OPTIMIZED_IMPLS, HybridConfig
from mahia.model.hybrid import Block

__all__ = [
    "OPTIMIZATIONS",
    "apply",
    "apply_checkpointing",
    "apply_compile",
    "CheckpointedBlock",
    "make_train_step",
    "MasterAdamW",
    "make_decoder",
    "Decoder",
    "run_checkpointed",
    "selective_checkpoint_policy",
    "keep_attention_policy",
    "compile_problem",
]

# name -> the config fields it sets. Each one is a single decision; "all" is every fast path at once.
OPTIMIZATIONS: dict[str, dict[str, Any]] = {
    "sdpa": {"attention_impl": "sdpa"},
    "flash": {"attention_impl": "sdpa", "attention_backend": "flash"},
    "cudnn_attention": {"attention_impl": "sdpa", "attention_backend": "cudnn"},
    "chunked_attention": {"attention_impl": "chunked"},
    "triton": {"kernels": "triton"},
    "grouped_moe": {"moe_impl": "grouped"},
    "logspace_scan": {"meta_impl": "logspace"},
    "triton_scan": {"meta_impl": "triton"},
    "batched_memory": {"memory_impl": "batched"},
    "masked_gating": {"gating_impl": "masked"},
    "all": dict(OPTIMIZED_IMPLS),
}

AMP = (None, "bf16", "fp16")
COMPILE = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def apply(cfg: HybridConfig, *names: str) -> HybridConfig:
    """A copy of ``cfg`` with the named model optimizations switched on (see ``OPTIMIZATIONS``).

    Later names win where two set the same field (``apply(cfg, "sdpa", "chunked_attention")`` is chunked).
    """
    if not isinstance(cfg, HybridConfig):
        raise TypeError(f"apply: cfg must be a HybridConfig, got {type(cfg).__name__}")
    changes: dict[str, Any] = {}
    for name in names:
        if name not in OPTIMIZATIONS:
            raise ValueError(
                f"apply: unknown optimization {name!r}; valid names: {sorted(OPTIMIZATIONS)} "
                f"(runtime ones are arguments of make_train_step / make_decoder)"
            )
        changes.update(OPTIMIZATIONS[name])
    return cfg.replace(**changes)


def _save_ops() -> set:
    """aten ops whose outputs selective checkpointing keeps: matrix products and fused attention."""
    names = "mm addmm bmm baddbmm _grouped_mm _scaled_dot_product_flash_attention_for_cpu".split()
    names += [f"_scaled_dot_product_{kind}_attention" for kind in ("flash", "efficient", "cudnn")]
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


_SAVE_OPS = _save_ops()
_ATTENTION_OPS = {op for op in _SAVE_OPS if "attention" in str(op)}


def selective_checkpoint_policy(ctx, op, *args, **kwargs):
    """Save matmul and attention outputs (expensive to recompute); recompute everything pointwise."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def keep_attention_policy(ctx, op, *args, **kwargs):
    """Save only the fused attention's outputs (output and log-sum-exp): per byte kept, attention is the
    costliest op to rerun (FLOPs grow with T, output D per token), so this keeps nearly all of full
    checkpointing's saving for less of its recompute."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


_OP_POLICIES = {"selective": selective_checkpoint_policy, "keep_attention": keep_attention_policy}


def run_checkpointed(fn: Callable, *args: Any, mode: str | None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with its activations recomputed in backward per ``mode``: None; "full" keeps
    only the inputs and reruns ``fn``; "selective" keeps the outputs of matrix products and attention and
    reruns the pointwise ops between them; "keep_attention" keeps only the fused attention's outputs."""
    if mode is None:
        return fn(*args, **kwargs)
    from torch.utils import checkpoint as ckpt

    if mode in _OP_POLICIES:
        context_fn = functools.partial(ckpt.create_selective_checkpoint_contexts, _OP_POLICIES[mode])
        return ckpt.checkpoint(fn, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    if mode != "full":
        raise ValueError(f"run_checkpointed: mode must be one of {CHECKPOINT_POLICIES}, got {mode!r}")
    return ckpt.checkpoint(fn, *args, use_reentrant=False, **kwargs)


class CheckpointedBlock(Block):
    """A :class:`~mahia.model.hybrid.Block` whose ``forward`` and ``delta`` (the gated fabric's call) run
    through :func:`run_checkpointed` while it trains with grad enabled (not in eval or under no_grad).

    :func:`apply_checkpointing` switches a model's blocks to this class in place, as
    ``torch.nn.utils.parametrize`` does: each block stays the same object, with the same parameters,
    ``state_dict`` keys and module names, so optimizers, saved weights and per-module tools work unchanged.
    """

    checkpoint_policy: str = "full"

    def _run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            return run_checkpointed(fn, *args, mode=self.checkpoint_policy, **kwargs)
        return fn(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any):
        return self._run(super().forward, *args, **kwargs)

    def delta(self, *args: Any, **kwargs: Any):
        return self._run(super().delta, *args, **kwargs)


def apply_checkpointing(model: nn.Module, policy: str | None) -> None:
    """Activation checkpointing of every block of ``model`` (``model.blocks``, as in
    :class:`~mahia.model.HybridModel`), in place: each becomes a :class:`CheckpointedBlock` with ``policy``
    (one of ``CHECKPOINT_POLICIES``); ``None`` turns them back into plain Blocks. The head and the
    embedding are never checkpointed."""
    if policy not in CHECKPOINT_POLICIES:
        raise ValueError(f"apply_checkpointing: policy must be one of {CHECKPOINT_POLICIES}, got {policy!r}")
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or any(type(b) not in (Block, CheckpointedBlock) for b in blocks):
        raise TypeError("apply_checkpointing: model must have blocks, an nn.ModuleList of Block as HybridModel has")
    for block in blocks:
        if policy is None:
            block.__class__ = Block
            block.__dict__.pop("checkpoint_policy", None)
        else:
            block.__class__ = CheckpointedBlock
            block.checkpoint_policy = policy


def compile_problem(device: torch.device | str) -> str | None:
    """None if ``torch.compile`` (inductor) can run on ``device`` here; else why not."""
    from torch import _dynamo

    device = torch.device(device)
    if not _dynamo.is_dynamo_supported():
        return (
            f"torch.compile is not supported on Python {sys.version_info.major}.{sys.version_info.minor} "
            f"with torch {torch.__version__}"
        )
    if device.type == "cpu":
        from torch._inductor import config as inductor_config

        candidates = [c for c in inductor_config.cpp.cxx if isinstance(c, str)] + ["g++", "c++", "clang++"]
        if not any(shutil.which(c) for c in candidates):
            return "no C++ compiler found (inductor needs one for CPU code)"
    elif device.type == "cuda":
        try:
            import triton  # noqa: F401
        except Exception as exc:  # inductor generates Triton kernels for CUDA
            return f"triton is not importable ({type(exc).__name__}: {exc})"
    return None


def apply_compile(model: nn.Module, mode: str | None) -> Callable:
    """``torch.compile(model, mode=mode)`` as a callable to use instead of ``model``; ``model`` itself for
    ``mode`` None, or (with a warning) where compile cannot run here (:func:`compile_problem`) or from the
    first call that fails to compile. ``model`` stays usable eagerly (evaluation, decoding, ``state_dict``)
    next to the compiled forward, which shares its parameters. Apply checkpointing first."""
    from torch import _dynamo

    if mode not in COMPILE:
        raise ValueError(f"apply_compile: mode must be one of {COMPILE}, got {mode!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_compile: model must be an nn.Module, got {type(model).__name__}")
    if mode is None:
        return model
    problem = compile_problem(next(model.parameters()).device)
    if problem is not None:
        warnings.warn(
            f"apply_compile: compile={mode!r} skipped, running eager: {problem}", RuntimeWarning, stacklevel=2
        )
        return model
    compiled = torch.compile(model, mode=mode)
    state = {"fn": compiled}

    def forward(*args, **kwargs):
        try:
            return state["fn"](*args, **kwargs)
        except _dynamo.exc.BackendCompilerFailed as exc:
            # A missing toolchain surfaces only at the first call; a broken model raises something else.
            if state["fn"] is model:
                raise
            warnings.warn(
                f"apply_compile: compile={mode!r} failed, running eager from now on: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            state["fn"] = model
            return model(*args, **kwargs)

    return forward


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    amp: str | None = None,
    checkpoint: str | None = None,
    compile: str | None = None,
    sync_free_logging: bool = True,
) -> Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """A function ``step((idx, targets)) -> loss`` doing forward, backward and one optimizer step.

    ``model(idx, targets)`` must return ``(logits, loss)``. Options, each usable alone:

    * ``amp``: None, ``"bf16"`` or ``"fp16"`` autocast; fp16 scales the loss with a ``GradScaler``, whose
      ``step`` reads ``found_inf`` on the host (one sync) unless the optimizer scales itself (fused AdamW).
    * ``checkpoint``: one of ``CHECKPOINT_POLICIES``, by :func:`apply_checkpointing` (None removes an
      earlier policy).
    * ``compile``: None or a ``torch.compile`` mode, by :func:`apply_compile` (warns and runs eager where
      compile cannot run).
    * ``sync_free_logging``: each loss goes to ``step.history``; True keeps the detached device tensor
      (``torch.stack(step.history)`` once at the end), False calls ``loss.item()``, which waits for the GPU.

    With ``sync_free_logging=True`` the step reads no device value on the host (if the model does not).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_train_step: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"make_train_step: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    options = (("amp", amp, AMP), ("checkpoint", checkpoint, CHECKPOINT_POLICIES), ("compile", compile, COMPILE))
    for name, value, valid in options:
        if value not in valid:
            raise ValueError(f"make_train_step: {name} must be one of {valid}, got {value!r}")
    if not isinstance(sync_free_logging, bool):
        raise TypeError(f"make_train_step: sync_free_logging must be a bool, got {sync_free_logging!r}")

    earlier = any(isinstance(b, CheckpointedBlock) for b in getattr(model, "blocks", ()) or ())
    if checkpoint is not None or earlier:  # None removes an earlier policy; other models are left alone
        apply_checkpointing(model, checkpoint)
    forward = apply_compile(model, compile)

    device = next(model.parameters()).device
    amp_dtype = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None

    # CUDA-graph modes reuse their output buffers on every replay: mark each step as a new one.
    mark_step = compile in ("reduce-overhead", "max-autotune") and forward is not model

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        idx, targets = batch
        model.train()
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            _, loss = forward(idx, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # A copy: a compiled model's output may live in a buffer that the next step overwrites.
        loss = loss.detach().clone()
        step.history.append(loss if sync_free_logging else loss.item())
        return loss

    step.history = []
    return step


class _CastUses(TorchDispatchMode):
    """Per tensor of ``watched`` (by address): whether every op that read it was a cast to bf16."""

    def __init__(self, watched: dict):
        super().__init__()
        self.watched, self.only_cast = watched, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        cast = func is torch.ops.aten._to_copy.default and (kwargs or {}).get("dtype") == torch.bfloat16
        for a in tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor) and a.data_ptr() in self.watched:
                self.only_cast[a.data_ptr()] = self.only_cast.get(a.data_ptr(), True) and cast
        return func(*args, **(kwargs or {}))


class MasterAdamW(torch.optim.AdamW):
    """AdamW on float32 masters of the weights that bf16 autocast casts at every use; the model holds them in bf16.

    Autocast on a float32 model costs, every step, a cast kernel per matmul weight in the forward and one per weight
    gradient in the backward (160 in the small hybrid's compiled step, Inductor's code, 2026-12-04). Here the step
    copies the bf16 gradients to the masters in one multi-tensor kernel, updates them, and copies them back rounded
    in another: autocast's roundings of the same values, so the same losses to the bit. Which weights: those one
    forward on ``example`` under bf16 autocast reads only through casts to bf16. The rest (norm weights, whatever
    runs with autocast off) stay float32 here, as in AdamW. ``kwargs``: AdamW's. Load the weights before: they are
    copied here. The model's ``state_dict`` then holds the bf16 weights, this optimizer's ``param_groups`` the float32.
    """

    def __init__(self, model: nn.Module, example: tuple, **kwargs: Any):
        watched = {p.data_ptr(): p for p in model.parameters() if p.dtype == torch.float32}
        with torch.no_grad(), torch.autocast(example[0].device.type, dtype=torch.bfloat16), _CastUses(watched) as u:
            model(*example)
        self._pairs = [(watched[k], watched[k].detach().clone()) for k, only in u.only_cast.items() if only]
        self._grads = [torch.empty_like(m) for _, m in self._pairs]  # the masters' gradients, reused every step
        for p, _ in self._pairs:
            p.data = p.data.to(torch.bfloat16)
        masters = {id(p): m for p, m in self._pairs}
        super().__init__([masters.get(id(p), p) for p in model.parameters()], **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MasterAdamW.step: no closure (it would compute gradients after they are copied)")
        for (p, m), g in zip(self._pairs, self._grads):  # AdamW skips a master without a gradient
            m.grad = None if p.grad is None else g
        if have := [(p.grad, m.grad) for p, m in self._pairs if p.grad is not None]:
            torch._foreach_copy_([mg for _, mg in have], [pg for pg, _ in have])
        super().step()
        if self._pairs:
            torch._foreach_copy_([p for p, _ in self._pairs], [m for _, m in self._pairs])

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p, _ in self._pairs:  # the bf16 weights are the model's, not this optimizer's parameters
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()


class Decoder:
    """Token-by-token generation with the model's static KV cache, optionally through a CUDA graph.

    The model provides ``setup_cache(batch, max_len)``, ``reset_cache()`` and ``decode_step(idx,
    start_pos) -> logits``, as :class:`~mahia.model.HybridModel` does. One eager ``decode_step`` prefills
    the prompt; every further token is one ``decode_step`` on a (B, 1) input, which with ``cuda_graphs``
    is captured once per cache shape (static buffers, warm-up on a side stream) and replayed.
    """

    def __init__(self, model: nn.Module, *, cuda_graphs: bool = False):
        if not all(hasattr(model, attr) for attr in ("setup_cache", "reset_cache", "decode_step")):
            raise TypeError("make_decoder: model must have setup_cache, reset_cache and decode_step, as HybridModel")
        self.model = model
        self.cuda_graphs = cuda_graphs
        self._shape: tuple[int, int] | None = None  # (batch, max_len) the cache and graph were built for
        self._graph = None

    @property
    def uses_graph(self) -> bool:
        """Whether steps replay a captured CUDA graph (asked for, and the model is on a CUDA device)."""
        return self._graph is not None

    def _prepare(self, batch: int, max_len: int, device: torch.device) -> None:
        if self._shape != (batch, max_len):
            self.model.setup_cache(batch, max_len)
            self._shape = (batch, max_len)
            self._graph = None
            self._idx = torch.zeros(batch, 1, dtype=torch.long, device=device)
            self._pos = torch.zeros((), dtype=torch.long, device=device)
            if self.cuda_graphs and device.type == "cuda":
                self._capture()
        self.model.reset_cache()

    def _capture(self) -> None:
        from mahia.measure.timing import capture_graph

        # 3 warm-up calls on a side stream (lazy inits, autotuning, allocator growth), then one captured call;
        # its logits (B, 1, V) live in the graph's private pool and are overwritten by each replay.
        self._graph, self._logits = capture_graph(lambda: self.model.decode_step(self._idx, self._pos), warmup=3)

    def _step(self, token: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits (B, V) after feeding ``token`` (B, 1) at position ``pos``."""
        self._idx.copy_(token)
        self._pos.fill_(pos)  # a device-side fill: no host sync
        if self._graph is not None:
            self._graph.replay()
            return self._logits[:, -1]
        return self.model.decode_step(self._idx, self._pos)[:, -1]

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``prompt`` (B, T0) int64 followed by ``max_new_tokens`` generated tokens: (B, T0 + max_new_tokens).

        ``temperature=0`` is greedy (argmax); otherwise tokens are sampled from softmax(logits / temperature)
        by the Gumbel-max trick (argmax of logits / temperature + Gumbel noise), which needs no host sync.
        """
        if (
            not (isinstance(prompt, torch.Tensor) and prompt.dim() == 2 and prompt.dtype == torch.long)
            or not prompt.numel()
        ):
            raise ValueError(f"Decoder.generate: prompt must be a (B, T >= 1) int64 tensor, got {prompt!r:.80}")
        check_int("Decoder.generate", "max_new_tokens", max_new_tokens, minimum=0)
        if not temperature >= 0.0:
            raise ValueError(f"Decoder.generate: temperature must be >= 0, got {temperature!r}")
        model = self.model
        was_training = model.training
        model.eval()
        try:
            batch, t0 = prompt.shape
            total = t0 + max_new_tokens
            self._prepare(batch, total, prompt.device)
            out = torch.empty(batch, total, dtype=torch.long, device=prompt.device)
            out[:, :t0] = prompt
            if max_new_tokens == 0:
                return out
            logits = model.decode_step(prompt, self._pos.zero_())[:, -1]  # prefill: (B, V)
            for i in range(max_new_tokens):
                nxt = self._sample(logits, temperature, generator)  # (B,)
                out[:, t0 + i] = nxt
                if i + 1 < max_new_tokens:
                    logits = self._step(nxt[:, None], t0 + i)
            return out
        finally:
            model.train(was_training)

    @staticmethod
    def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
        if temperature == 0.0:
            return logits.argmax(dim=-1)
        u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
        gumbel = -torch.log(-torch.log(u.clamp_(min=1e-20)))
        return (logits.float() / temperature + gumbel).argmax(dim=-1)


def make_decoder(model: nn.Module, *, cuda_graphs: bool = False) -> Decoder:
    """A :class:`Decoder` for ``model``; ``cuda_graphs=True`` replays one captured decode step per token
    (only when the model is on a CUDA device; on a CPU it runs the same steps eagerly)."""
    return Decoder(model, cuda_graphs=cuda_graphs)
