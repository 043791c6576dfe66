"""The MAHIA-X hybrid model: config, presets, reference vs fast paths, training, decoding, counting."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from mahia import ops
from mahia.measure.checks import check_close, rel_error, tolerance
from mahia.model import (
    HybridConfig,
    HybridModel,
    SyntheticTokens,
    apply,
    apply_checkpointing,
    apply_compile,
    make_decoder,
    make_train_step,
    optimize,
)
from mahia.model.hybrid import Block
from mahia.model.optimize import CheckpointedBlock

pytestmark = pytest.mark.filterwarnings("ignore:mahia.ops.*Triton kernel not used:RuntimeWarning")

FP32 = tolerance(torch.float32)
# For tests about the training step and its options, not the hybrid parts: the two slowest parts off.
LIGHT = dict(graph_memory=False, gating=False)


@pytest.fixture
def no_triton(monkeypatch):
    """Run the Triton paths' PyTorch fallbacks: the interpreter is too slow for whole-model tests."""
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")


def _model(cfg: HybridConfig, seed: int = 0) -> HybridModel:
    torch.manual_seed(seed)
    return HybridModel(cfg)


def _tokens(B: int, T: int, V: int = 256, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _diverse_gates(model: HybridModel, idx: torch.Tensor) -> torch.Tensor:
    """Gate weights that switch some (sample, block) pairs off and others on (the default bias switches
    every block on); returns the (B, L) on/off table for ``idx``."""
    with torch.no_grad():
        model.fabric.gate.bias.zero_()
        model.fabric.gate.weight.normal_(0.0, 60.0, generator=torch.Generator().manual_seed(0))
        on = model.fabric.gates(model.tok_emb(idx)) > model.cfg.gate_threshold  # (B, L)
    assert on.any() and not on.all() and (on.any(dim=0) & ~on.all(dim=0)).any(), on
    return on


# ---------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------


def test_presets_build_and_switch_impls():
    for name in ("tiny", "small", "dense-350m", "moe", "hybrid"):
        cfg = HybridConfig.preset(name)
        assert cfg.baseline().attention_impl == "manual" and cfg.baseline().gating_impl == "branch"
        fast = cfg.optimized()
        assert (
            fast.attention_impl,
            fast.kernels,
            fast.moe_impl,
            fast.meta_impl,
            fast.memory_impl,
            fast.gating_impl,
        ) == ("sdpa", "triton", "grouped", "triton", "batched", "masked")
        # Only the implementation fields change.
        assert fast.replace(**{k: getattr(cfg, k) for k in optimize.OPTIMIZATIONS["all"]}) == cfg
    tiny = HybridConfig.preset("tiny")
    assert tiny.meta_attention and tiny.graph_memory and tiny.moe and tiny.gating and tiny.n_experts == 4
    dense = HybridConfig.preset("dense-350m")
    assert not (dense.meta_attention or dense.graph_memory or dense.moe or dense.gating)
    assert HybridConfig.preset("tiny", n_layers=3).n_layers == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dim=66, n_heads=4), "divisible by n_heads"),
        (dict(n_heads=4, n_kv_heads=3), "divisible by n_kv_heads"),
        (dict(moe=True, n_experts=2, top_k=3), "top_k"),
        (dict(attention_impl="flashy"), "('manual', 'sdpa', 'chunked')"),
        (dict(moe_impl="fast"), "('loop', 'grouped')"),
        (dict(attention_backend="flash"), "needs attention_impl='sdpa'"),
        (dict(dim=0), "dim must be a positive int"),
        (dict(memory_alpha=1.5), "memory_alpha"),
        (dict(memory_segment=0), "memory_segment must be a positive int"),
        (dict(dim=60, n_heads=4), "must be even"),
    ],
)
def test_bad_configs_raise_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HybridConfig(**kwargs)


def test_bad_names_raise_clearly():
    with pytest.raises(ValueError, match="valid presets"):
        HybridConfig.preset("huge")
    with pytest.raises(TypeError, match="unknown field"):
        HybridConfig.preset("tiny", dims=3)
    with pytest.raises(ValueError, match="valid names"):
        apply(HybridConfig(), "sdpa", "warp_speed")
    with pytest.raises(TypeError, match="HybridConfig"):
        HybridModel({"dim": 64})


def test_apply_switches_one_decision_per_name():
    cfg = HybridConfig.preset("tiny")
    for name, fields in optimize.OPTIMIZATIONS.items():
        new = apply(cfg, name)
        for field, value in fields.items():
            assert getattr(new, field) == value
        changed = {f for f in fields if getattr(cfg, f) != getattr(new, f)}
        assert changed, f"{name} changed nothing"
    both = apply(cfg, "sdpa", "grouped_moe")
    assert (both.attention_impl, both.moe_impl, both.kernels) == ("sdpa", "grouped", "eager")
    assert apply(cfg, "all") == cfg.optimized()


# ---------------------------------------------------------------------------------------------------
# Model: shapes, reference vs fast paths
# ---------------------------------------------------------------------------------------------------


def test_forward_shapes_and_gradients(no_triton):
    model = _model(HybridConfig.preset("tiny"))
    idx, targets = _tokens(3, 13)
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 13, 256) and loss.dim() == 0 and torch.isfinite(loss)
    assert model(idx)[1] is None
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"parameters without gradient: {missing}"
    # Initial loss near ln V (tied embeddings at std 0.02 give near-uniform logits).
    assert abs(_ce(logits, targets).item() - math.log(256)) < 0.1


def test_bad_inputs_raise(no_triton):
    model = _model(HybridConfig.preset("tiny"))
    with pytest.raises(TypeError, match="idx must be int64"):
        model(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must be"):
        model(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))


def test_baseline_and_optimized_agree_without_gating(no_triton):
    """No gating: the same weights give the same logits and the same loss (MoE aux included)."""
    cfg = HybridConfig.preset("tiny", gating=False)
    base = _model(cfg.baseline())
    fast = HybridModel(cfg.optimized())
    fast.load_state_dict(base.state_dict())
    idx, targets = _tokens(3, 13)
    logits_b, loss_b = base(idx, targets)
    logits_f, loss_f = fast(idx, targets)
    check_close("logits", logits_f, logits_b, FP32)
    check_close("loss", loss_f, loss_b, FP32)
    assert (loss_b - _ce(logits_b, targets)).item() > 0  # the aux loss is in


def test_baseline_and_optimized_agree_gated_model(no_triton):
    """With gating the fabric's branch path runs the blocks one sample at a time, the masked path on the
    whole batch: logits, cross entropy, the MoE aux loss (pooled over the samples that run the block)
    and every gradient agree."""
    cfg = HybridConfig.preset("tiny")
    base = _model(cfg.baseline())
    idx, targets = _tokens(3, 13)
    on = _diverse_gates(base, idx)
    moe_block = [i for i, b in enumerate(base.blocks) if b.is_moe][0]
    assert on[:, moe_block].any() and not on[:, moe_block].all()  # the aux loss leaves a sample out
    fast = HybridModel(cfg.optimized())
    fast.load_state_dict(base.state_dict())
    logits_b, loss_b = base(idx, targets)
    logits_f, loss_f = fast(idx, targets)
    check_close("logits", logits_f, logits_b, FP32)
    check_close("cross entropy", _ce(logits_f, targets), _ce(logits_b, targets), FP32)
    aux_b, aux_f = loss_b - _ce(logits_b, targets), loss_f - _ce(logits_f, targets)
    assert aux_b.item() > 0
    check_close("MoE aux loss", aux_f, aux_b, FP32)
    # Gradients in float64: with these saturated gates the gate gradient is a small sum with heavy
    # cancellation (~2e-5 relative rounding in float32 in either path); float64 shows the paths agree.
    base.double(), fast.double()
    grads_b, grads_f = _grads(base, idx, targets), _grads(fast, idx, targets)
    assert grads_b.keys() == grads_f.keys() and "fabric.gate.weight" in grads_b
    for name in grads_b:
        check_close(f"grad {name}", grads_f[name], grads_b[name], tolerance(torch.float64))


def test_triton_paths_agree_with_reference():
    """Every fast path, the Triton kernels included (interpreted on a CPU), on a small input."""
    if not ops.triton_available_for(torch.zeros(1)):
        pytest.skip(f"Triton kernels cannot run here: {ops.status()['rms_norm']}")
    cfg = HybridConfig.preset("tiny", gating=False)
    base = _model(cfg.baseline())
    fast = HybridModel(cfg.optimized())
    fast.load_state_dict(base.state_dict())
    idx, targets = _tokens(2, 9)
    with torch.no_grad():
        logits_b, loss_b = base(idx, targets)
        logits_f, loss_f = fast(idx, targets)
    # Triton float32 dots may use TF32-like precision on a GPU; the interpreter is exact.
    tol = tolerance(torch.float32, tf32=torch.cuda.is_available())
    check_close("logits", logits_f, logits_b, tol)
    check_close("loss", loss_f, loss_b, tol)


@pytest.mark.parametrize("impl", ["sdpa", "chunked"])
def test_attention_impls_agree(no_triton, impl):
    cfg = HybridConfig(vocab_size=97, dim=48, n_layers=2, n_heads=4, n_kv_heads=2, hidden=80, max_seq_len=64)
    base = _model(cfg)
    other = HybridModel(cfg.replace(attention_impl=impl, attention_chunk_size=8 if impl == "chunked" else None))
    other.load_state_dict(base.state_dict())
    idx, _ = _tokens(2, 21, V=97)
    check_close(impl, other(idx)[0], base(idx)[0], FP32)


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def test_tiny_model_learns_the_synthetic_stream(no_triton):
    data = SyntheticTokens(256, 32, seed=0)
    model = _model(HybridConfig.preset("tiny").optimized())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = make_train_step(model, opt)
    for _ in range(20):
        step(data.batch(8))
    losses = torch.stack(step.history).tolist()
    assert abs(losses[0] - math.log(256)) < 0.2
    assert sum(losses[-4:]) / 4 < 0.9 * losses[0], losses
    assert min(losses) > data.entropy()  # nothing beats the source's entropy


def _grads(model, idx, targets):
    model.zero_grad(set_to_none=True)
    model(idx, targets)[1].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("gating", [False, True], ids=["blocks", "gated"])
@pytest.mark.parametrize("mode", ["full", "selective", "keep_attention"])
def test_checkpointing_gives_the_same_gradients(no_triton, mode, gating):
    model = _model(HybridConfig.preset("tiny", gating=gating).optimized())
    idx, targets = _tokens(2, 11)
    ref = _grads(model, idx, targets)
    apply_checkpointing(model, mode)
    got = _grads(model, idx, targets)
    assert set(got) == set(ref)  # same parameter names: the blocks stay where they were
    for name in ref:
        check_close(f"{mode} grad {name}", got[name], ref[name], FP32)
    with pytest.raises(ValueError, match="policy must be one of"):
        apply_checkpointing(model, "some")


@pytest.mark.parametrize("optimized", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("mode", ["full", "selective", "keep_attention"])
def test_checkpointing_from_the_first_step(no_triton, monkeypatch, mode, optimized):
    """Checkpointing applied before any forward, on both paths. Two bugs broke this: the grouped GEMM's
    CPU capability probe ran its backward inside the first checkpointed forward, and a matmul of a
    vector on the reference path squeezed its product in place (selective checkpointing keeps it)."""
    import importlib

    grouped_mm = importlib.import_module("mahia.ops.grouped_mm")
    monkeypatch.setattr(grouped_mm, "_cpu_grouped_mm_probe", {})  # the first call comes from the forward
    cfg = HybridConfig.preset("tiny")
    model = _model(cfg.optimized() if optimized else cfg)
    apply_checkpointing(model, mode)
    idx, targets = _tokens(2, 16)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        loss = model(idx, targets)[1]
        loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.fixture
def checkpoint_calls(monkeypatch):
    """Counts the calls of torch.utils.checkpoint.checkpoint (run_checkpointed's only way to checkpoint)."""
    from torch.utils import checkpoint as ckpt

    calls = []
    original = ckpt.checkpoint

    def counted(fn, *args, **kwargs):
        calls.append(fn)
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(ckpt, "checkpoint", counted)
    return calls


@pytest.mark.parametrize("gating", [False, True], ids=["blocks", "gated"])
def test_apply_checkpointing_is_replaced_and_removed_in_place(no_triton, checkpoint_calls, gating):
    model = _model(HybridConfig.preset("tiny", gating=gating).optimized())
    idx, targets = _tokens(2, 9)
    keys = list(model.state_dict())
    blocks = list(model.blocks)
    L = model.cfg.n_layers

    def calls_of_one_forward(grad=True):
        checkpoint_calls.clear()
        with torch.set_grad_enabled(grad):
            model(idx, targets)
        return len(checkpoint_calls)

    apply_checkpointing(model, "full")
    assert all(type(b) is CheckpointedBlock and b.checkpoint_policy == "full" for b in model.blocks)
    assert list(model.blocks) == blocks and list(model.state_dict()) == keys  # the same modules, in place
    assert calls_of_one_forward() == L  # one checkpointed call per block (every gate is on by default)
    apply_checkpointing(model, "selective")  # replaces the policy, does not wrap twice
    assert all(b.checkpoint_policy == "selective" for b in model.blocks)
    assert calls_of_one_forward() == L
    # Only in training with grad enabled: eval and no_grad (decoding) run the plain blocks.
    assert calls_of_one_forward(grad=False) == 0
    model.eval()
    assert calls_of_one_forward() == 0
    model.train()
    apply_checkpointing(model, None)
    assert all(type(b) is Block and "checkpoint_policy" not in vars(b) for b in model.blocks)
    assert list(model.blocks) == blocks and list(model.state_dict()) == keys
    assert calls_of_one_forward() == 0


def test_checkpointed_model_decodes_and_loads_weights(no_triton):
    model = _model(HybridConfig.preset("tiny").optimized())
    plain = _model(HybridConfig.preset("tiny").optimized(), seed=1)
    apply_checkpointing(model, "full")
    plain.load_state_dict(model.state_dict())  # the same keys as a model never checkpointed
    prompt = _tokens(2, 4)[0]
    assert model.training  # generate switches to eval under no_grad: the plain blocks decode
    assert torch.equal(make_decoder(model).generate(prompt, 3), make_decoder(plain).generate(prompt, 3))


def test_apply_checkpointing_rejects_models_without_blocks():
    with pytest.raises(TypeError, match="blocks"):
        apply_checkpointing(torch.nn.Linear(2, 2), "full")
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="Block modules"):
        apply_checkpointing(model, "full")


def test_make_train_step_applies_and_removes_checkpointing(no_triton, checkpoint_calls):
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = make_train_step(model, opt, checkpoint="selective")
    assert all(type(b) is CheckpointedBlock and b.checkpoint_policy == "selective" for b in model.blocks)
    step(_tokens(2, 8))
    assert len(checkpoint_calls) == model.cfg.n_layers
    make_train_step(model, opt)  # checkpoint=None: the step runs the plain blocks
    assert all(type(b) is Block for b in model.blocks)
    with pytest.raises(TypeError, match="blocks"):
        make_train_step(torch.nn.Linear(2, 2), opt, checkpoint="full")


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_steps_train(no_triton, amp):
    data = SyntheticTokens(256, 16, seed=0)
    model = _model(HybridConfig.preset("tiny").optimized())
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), amp=amp)
    for _ in range(3):
        loss = step(data.batch(4))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_compile_falls_back_to_eager_with_a_warning(no_triton, monkeypatch):
    monkeypatch.setattr(optimize, "compile_problem", lambda device: "no compiler here (test)")
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), compile="default")
    assert torch.isfinite(step(_tokens(2, 8)))


def test_apply_compile_without_a_mode_is_the_model(no_triton, monkeypatch):
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    assert apply_compile(model, None) is model
    with pytest.raises(ValueError, match="mode must be one of"):
        apply_compile(model, "fast")
    monkeypatch.setattr(optimize, "compile_problem", lambda device: "no compiler here (test)")
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert apply_compile(model, "default") is model


def test_make_train_step_rejects_bad_options():
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for kwargs, message in (
        (dict(amp="fp8"), "amp must be one of"),
        (dict(checkpoint="half"), "checkpoint"),
        (dict(compile="fast"), "compile must be one of"),
        (dict(sync_free_logging=1), "must be a bool"),
    ):
        with pytest.raises((ValueError, TypeError), match=message):
            make_train_step(model, opt, **kwargs)
    with pytest.raises(TypeError, match="optimizer"):
        make_train_step(model, None)


# ---------------------------------------------------------------------------------------------------
# Host syncs
# ---------------------------------------------------------------------------------------------------


class SyncDetector(TorchDispatchMode):
    """Records the aten ops that make the host wait for the device (reading a value, or a shape that
    depends on the data). ``ignore`` holds storages whose reads are host-side by design."""

    OPS = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.masked_select.default,
        torch.ops.aten._unique2.default,
    }

    def __init__(self, ignore=()):
        super().__init__()
        self.ignore = set(ignore)
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            first = args[0] if args else None
            if not (isinstance(first, torch.Tensor) and first.untyped_storage().data_ptr() in self.ignore):
                self.syncs.append(str(func))
        if func is torch.ops.aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        ):
            self.syncs.append("aten.index with a boolean mask")
        return func(*args, **(kwargs or {}))


def _syncs_of_one_step(cfg: HybridConfig) -> list[str]:
    data = SyntheticTokens(256, 16, seed=0)
    model = _model(cfg)
    # fused AdamW keeps its step counter on the device; the default one reads it on the host.
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    step(data.batch(2))  # warm-up: lazy state creation
    with SyncDetector() as detector:
        step(data.batch(2))
    return detector.syncs


def test_optimized_train_step_makes_no_host_sync(no_triton):
    assert _syncs_of_one_step(HybridConfig.preset("tiny").optimized()) == []


def test_baseline_train_step_syncs(no_triton):
    """The detector works: the loop MoE (nonzero) and the branch fabric (if on a tensor) sync."""
    syncs = _syncs_of_one_step(HybridConfig.preset("tiny").baseline())
    assert any("nonzero" in s for s in syncs) and any("_local_scalar_dense" in s for s in syncs)


def test_sync_free_logging_switch(no_triton):
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_free_logging=False)
    batch = _tokens(2, 8)
    with SyncDetector() as detector:
        step(batch)
    assert isinstance(step.history[0], float) and "aten._local_scalar_dense.default" in detector.syncs


# ---------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["baseline", "optimized"])
def test_decode_steps_match_the_full_forward(no_triton, which):
    """Every hybrid part on (memory segments of 4 tokens, gates that skip some blocks for some samples):
    a prefill crossing a memory segment boundary, then single tokens, equal one forward."""
    cfg = getattr(HybridConfig.preset("tiny"), which)()
    assert cfg.graph_memory and cfg.gating and cfg.memory_segment == 4
    model = _model(cfg).eval()
    idx, _ = _tokens(3, 13)
    _diverse_gates(model, idx)
    with torch.no_grad():
        full, _ = model(idx)
        model.setup_cache(3, 20)
        model.reset_cache()
        pos = torch.zeros((), dtype=torch.long)
        parts = [model.decode_step(idx[:, :5], pos)]  # prefill 5 tokens
        for t in range(5, 13):
            parts.append(model.decode_step(idx[:, t : t + 1], pos.fill_(t)))
    check_close("decoded logits", torch.cat(parts, dim=1), full, FP32)
    if which == "optimized":  # a CUDA-graph-capturable step: no host sync (memory and gates included)
        with SyncDetector() as detector, torch.no_grad():
            model.decode_step(idx[:, 12:13], pos.fill_(13))
        assert detector.syncs == []


def test_every_preset_is_causal():
    for name in ("tiny", "small", "dense-350m", "moe", "hybrid"):
        with torch.device("meta"):
            assert HybridModel(HybridConfig.preset(name)).is_causal, name


@pytest.mark.parametrize("which", ["baseline", "optimized"])
def test_model_sees_no_future_tokens(no_triton, which):
    """Every hybrid part on (gates that differ between samples): changing tokens t+1.. leaves the logits
    at positions <= t unchanged, across memory segment boundaries; the later logits do change."""
    model = _model(getattr(HybridConfig.preset("tiny"), which)()).eval()
    idx, _ = _tokens(3, 13)
    _diverse_gates(model, idx)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        ref, _ = model(idx)
        for t in (0, 3, 9):  # memory segments are [0, 4), [4, 8), [8, 12), [12, 13)
            other = idx.clone()
            other[:, t + 1 :] = torch.randint(0, 256, other[:, t + 1 :].shape, generator=g)
            logits, _ = model(other)
            check_close(f"logits at positions <= {t}", logits[:, : t + 1], ref[:, : t + 1], FP32)
            assert rel_error(logits[:, t + 1 :], ref[:, t + 1 :]) > 0.1, t


def test_decode_refuses_a_bidirectional_part(no_triton):
    model = _model(HybridConfig.preset("tiny"))
    assert model.is_causal
    model.setup_cache(1, 8)
    one, pos = torch.zeros(1, 1, dtype=torch.long), torch.zeros((), dtype=torch.long)
    model.blocks[1].memory.causal = False  # switched to the bidirectional component after the fact
    assert not model.is_causal
    with pytest.raises(ValueError, match=r"blocks\[1\]\.memory"):
        model.decode_step(one, pos)
    model.blocks[1].memory.causal = True
    model.fabric.gate_source = "mean"
    with pytest.raises(ValueError, match="fabric"):
        model.decode_step(one, pos)
    with pytest.raises(ValueError, match="max_len"):
        model.setup_cache(1, 1000)


def test_decoder_generates_the_greedy_continuation(no_triton):
    model = _model(HybridConfig.preset("tiny").optimized()).eval()
    prompt, _ = _tokens(2, 4)
    out = make_decoder(model, cuda_graphs=True).generate(prompt, 6)  # CPU: graphs quietly off
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)
    sampled = make_decoder(model).generate(prompt, 3, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (2, 7) and torch.equal(sampled[:, :4], prompt)
    with pytest.raises(ValueError, match="prompt"):
        make_decoder(model).generate(prompt.float(), 2)


# ---------------------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------------------


def test_dense_350m_parameter_count_and_flops():
    cfg = HybridConfig.preset("dense-350m")
    with torch.device("meta"):
        model = HybridModel(cfg)
    n = model.param_count()
    assert 300e6 <= n <= 400e6, n
    # 12 D^2 per block + V D (tied) + norms
    assert (
        n
        == cfg.n_layers * (4 * cfg.dim**2 + 3 * cfg.dim * cfg.hidden + 2 * cfg.dim) + cfg.vocab_size * cfg.dim + cfg.dim
    )
    ratio = model.flops_per_token(256) / (6 * n)
    assert 0.95 < ratio < 1.3, ratio  # 6N plus attention; the embedding lookup costs no FLOPs
    assert model.flops_per_token(256, training=False) * 3 == model.flops_per_token(256)
    assert model.flops_per_token(4096) > model.flops_per_token(256, causal=True)


@pytest.mark.parametrize(
    "kwargs, exact",
    [
        (dict(), True),
        (dict(moe=True, n_experts=4, moe_hidden=48, moe_every=2), True),
        (dict(gating=True, gating_impl="masked"), True),
        (dict(meta_attention=True, meta_impl="loop"), False),
        (dict(graph_memory=True, memory_nodes=8, memory_impl="batched"), False),
        (dict(graph_memory=True, memory_nodes=8, memory_segment=8, memory_impl="batched"), False),
    ],
)
def test_flops_match_the_flop_counter(no_triton, kwargs, exact):
    """The formula against what torch counts for one forward (manual attention: all T x T scores)."""
    cfg = HybridConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden=96, max_seq_len=64, **kwargs)
    model = _model(cfg)
    B, T = 3, 37
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(_tokens(B, T)[0])
    measured = counter.get_total_flops() / (B * T)
    predicted = model.flops_per_token(T, training=False)
    # Meta-attention: the formula counts the chunked scan, the loop runs the recurrence. Memory: the
    # formula counts node projections per sequence, the code shares some across the batch, and reads
    # the padding of a short last segment.
    assert measured == predicted if exact else abs(measured / predicted - 1) < 0.1


def _saved_bytes(model: HybridModel, idx: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for backward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    return sum(v for k, v in kept.items() if k not in params)


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_memory_estimate_is_sane(no_triton, impl):
    cfg = HybridConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, hidden=96, max_seq_len=64, attention_impl=impl)
    model = _model(cfg)
    B, T = 4, 64
    est = model.memory_estimate(B, T)
    n = model.param_count()
    assert est["parameters"] == est["gradients"] == 4 * n and est["optimizer"] == 8 * n
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    # The model counts what fused kernels keep; the eager norms and RoPE keep a bit more.
    ratio = est["activations"] / _saved_bytes(model, _tokens(B, T)[0])
    assert 0.6 < ratio <= 1.0, ratio
    full = model.memory_estimate(B, T, checkpoint="full")
    sel = model.memory_estimate(B, T, checkpoint="selective")
    assert full["activations"] < sel["activations"] < est["activations"]
    assert full["recompute"] > 0 and est["recompute"] == 0
    keep = model.memory_estimate(B, T, checkpoint="keep_attention")  # input + attention output per block
    attn = (model.cfg.dim * 4 + 4 * model.cfg.n_heads) * B * T if model.cfg.attention_impl == "sdpa" else 0
    assert keep["activations"] - full["activations"] == model.cfg.n_layers * attn
    assert keep["recompute"] == full["recompute"] - attn
    assert model.memory_estimate(B, T, torch.bfloat16)["activations"] < est["activations"]
    with pytest.raises(ValueError, match="batch"):
        model.memory_estimate(0, T)


# ---------------------------------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------------------------------


def test_synthetic_tokens_are_the_described_markov_chain():
    data = SyntheticTokens(97, 33, seed=3, copy_prob=0.6)
    idx, targets = data.batch(512)
    assert idx.shape == targets.shape == (512, 33) and idx.dtype == torch.int64
    assert torch.equal(idx[:, 1:], targets[:, :-1]) and int(idx.max()) < 97 and int(idx.min()) >= 0
    # The average log-loss of the true transition probabilities is the entropy (a Monte Carlo check).
    p = data.copy_prob
    prob = (1 - p) * data.unigram[targets] + p * (data.succ[idx] == targets).double()
    nll = -prob.log().mean().item()
    assert abs(nll - data.entropy()) < 0.02 * data.entropy(), (nll, data.entropy())
    assert 0 < data.entropy() < data.unigram_entropy() < data.uniform_entropy()
    # Same seed, same stream; another seed, another source.
    assert torch.equal(
        SyntheticTokens(97, 33, seed=3, copy_prob=0.6).batch(4)[0],
        SyntheticTokens(97, 33, seed=3, copy_prob=0.6).batch(4)[0],
    )
    assert not torch.equal(SyntheticTokens(97, 33, seed=4).succ, data.succ)


def test_synthetic_tokens_reject_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        SyntheticTokens(1, 8)
    with pytest.raises(ValueError, match="copy_prob"):
        SyntheticTokens(10, 8, copy_prob=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        SyntheticTokens(10, 8).batch(0)


def test_routing_decisions_stay_float32_under_autocast():
    """The MoE router and the fabric's gates decide discretely (top-k, skip or not): under bf16 autocast
    they run outside it, in x's dtype, so a bf16 rounding of a logit cannot flip a decision."""
    from mahia.model.fabric import fabric_gates
    from mahia.model.moe import MoE

    torch.manual_seed(0)
    moe = MoE(32, 48, 8, 2)
    x = torch.randn(64, 32)
    probs, experts, gates = moe._route(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probs_amp, experts_amp, gates_amp = moe._route(x)
    assert probs_amp.dtype == torch.float32
    assert torch.equal(probs_amp, probs) and torch.equal(experts_amp, experts) and torch.equal(gates_amp, gates)

    xs = torch.randn(2, 16, 32)
    w, b = torch.randn(3, 32) / 8, torch.zeros(3)
    g = fabric_gates(xs, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g_amp = fabric_gates(xs, w, b)
    assert g_amp.dtype == torch.float32 and torch.equal(g_amp, g)
