"""The MAHIA-X hybrid model: config, presets, reference vs fast paths, training, decoding, counting."""

from __future__ import annotations

import functools
import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mahia import ops
from mahia.measure.checks import check_close, rel_error, tolerance
from mahia.measure.instruments import count_syncs
from mahia.model import (
    PRESETS,
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
from mahia.model.fabric import fabric_gates
from mahia.model.hybrid import Block
from mahia.model.moe import MoE
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


def _grads(model, idx, targets):
    model.zero_grad(set_to_none=True)
    model(idx, targets)[1].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _diverse_gates(model: HybridModel, idx: torch.Tensor) -> torch.Tensor:
    """Gate weights that switch some (sample, block) pairs off and others on (the default bias switches
    every block on); returns the (B, L) on/off table for ``idx``."""
    with torch.no_grad():
        model.fabric.gate.bias.zero_()
        model.fabric.gate.weight.normal_(0.0, 60.0, generator=torch.Generator().manual_seed(0))
        on = model.fabric.gates(model.tok_emb(idx)) > model.cfg.gate_threshold  # (B, L)
    assert on.any() and not on.all() and (on.any(dim=0) & ~on.all(dim=0)).any(), on
    return on


# -- config -----------------------------------------------------------------------------------------
def test_presets_and_named_optimizations():
    for name, cfg in PRESETS.items():
        assert cfg.baseline().attention_impl == "manual" and cfg.baseline().gating_impl == "branch"
        fast = cfg.optimized()
        assert apply(cfg, "all") == fast
        impls = (fast.attention_impl, fast.kernels, fast.moe_impl, fast.meta_impl, fast.memory_impl)
        assert impls == ("sdpa", "triton", "grouped", "triton", "batched")
        assert fast.replace(**{k: getattr(cfg, k) for k in optimize.OPTIMIZATIONS["all"]}) == cfg  # impls only
        with torch.device("meta"):
            assert HybridModel(cfg).is_causal, name
    assert not any(getattr(PRESETS["dense-350m"], p) for p in ("meta_attention", "graph_memory", "moe", "gating"))
    assert HybridConfig.preset("tiny", n_layers=3).n_layers == 3
    tiny = HybridConfig.preset("tiny")
    for name, fields in optimize.OPTIMIZATIONS.items():  # one decision per name
        new = apply(tiny, name)
        assert all(getattr(new, f) == v for f, v in fields.items())
        assert any(getattr(tiny, f) != getattr(new, f) for f in fields), f"{name} changed nothing"
    both = apply(tiny, "sdpa", "grouped_moe")
    assert (both.attention_impl, both.moe_impl, both.kernels) == ("sdpa", "grouped", "eager")


def test_bad_configs_names_inputs_and_options_raise_clearly():
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    train = functools.partial(make_train_step, model, torch.optim.SGD(model.parameters()))
    long_ = dict(dtype=torch.long)
    no_block = torch.nn.Module()
    no_block.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    for make, error, message in [
        (lambda: HybridConfig(dim=66, n_heads=4), ValueError, "divisible by n_heads"),
        (lambda: HybridConfig(n_heads=4, n_kv_heads=3), ValueError, "divisible by n_kv_heads"),
        (lambda: HybridConfig(moe=True, n_experts=2, top_k=3), ValueError, "top_k"),
        (lambda: HybridConfig(attention_impl="flashy"), ValueError, r"\('manual', 'sdpa', 'chunked'\)"),
        (lambda: HybridConfig(attention_backend="flash"), ValueError, "needs attention_impl='sdpa'"),
        (lambda: HybridConfig(dim=0), ValueError, "dim must be a positive int"),
        (lambda: HybridConfig(memory_alpha=1.5), ValueError, "memory_alpha"),
        (lambda: HybridConfig(memory_segment=0), ValueError, "memory_segment must be a positive int"),
        (lambda: HybridConfig(dim=60, n_heads=4), ValueError, "must be even"),
        (lambda: HybridConfig.preset("huge"), ValueError, "valid presets"),
        (lambda: HybridConfig.preset("tiny", dims=3), TypeError, "HybridConfig.* 'dims'"),
        (lambda: apply(HybridConfig(), "sdpa", "warp_speed"), ValueError, "valid names"),
        (lambda: HybridModel({"dim": 64}), TypeError, "HybridConfig"),
        (lambda: model(torch.zeros(2, 5)), TypeError, "idx must be int64"),
        (lambda: model(torch.zeros(1, 129, **long_)), ValueError, "exceeds max_seq_len"),
        (lambda: model(torch.zeros(2, 5, **long_), torch.zeros(2, 4, **long_)), ValueError, "targets must be"),
        (lambda: model.memory_estimate(0, 8), ValueError, "memory_estimate: batch"),
        (lambda: make_decoder(model).generate(torch.zeros(1, 2), 2), ValueError, "Decoder.generate: prompt"),
        (lambda: model.setup_cache(1, 1000), ValueError, "HybridModel.setup_cache: max_len"),
        (lambda: train(amp="fp8"), ValueError, "make_train_step: amp must be one of"),
        (lambda: train(checkpoint="half"), ValueError, "make_train_step: checkpoint must be one of"),
        (lambda: train(compile="fast"), ValueError, "make_train_step: compile must be one of"),
        (lambda: train(sync_free_logging=1), TypeError, "make_train_step: sync_free_logging must be a bool"),
        (lambda: make_train_step(model, None), TypeError, "make_train_step: optimizer"),
        (lambda: apply_compile(model, "fast"), ValueError, "apply_compile: mode must be one of"),
        (lambda: apply_checkpointing(model, "some"), ValueError, "apply_checkpointing: policy must be one of"),
        (lambda: apply_checkpointing(no_block.blocks[0], "full"), TypeError, "apply_checkpointing: model must have"),
        (lambda: apply_checkpointing(no_block, "full"), TypeError, "apply_checkpointing: model must have blocks"),
    ]:
        with pytest.raises(error, match=message):
            make()


# -- model: reference vs fast paths -----------------------------------------------------------------
@pytest.mark.parametrize("case", ["blocks", "gated", "triton"])
def test_baseline_and_optimized_agree(monkeypatch, case):
    """The same weights give the same logits, cross entropy, MoE aux loss and gradients (in float64: with
    saturated gates the gate gradient cancels heavily). "triton": the kernels included, else their fallbacks."""
    if case != "triton":
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    elif not ops.triton_available_for(torch.zeros(1)):
        pytest.skip(f"Triton kernels cannot run here: {ops.status()['rms_norm']}")
    gating = case == "gated"
    cfg = HybridConfig.preset("tiny", gating=gating)
    base = _model(cfg.baseline())
    idx, targets = _tokens(3, 13)
    if gating:
        on = _diverse_gates(base, idx)
        moe_block = [i for i, b in enumerate(base.blocks) if b.is_moe][0]
        assert on[:, moe_block].any() and not on[:, moe_block].all()  # the aux loss leaves a sample out
    fast = HybridModel(cfg.optimized())
    chunked = HybridModel(cfg.replace(attention_impl="chunked", attention_chunk_size=4))
    for other in (fast, chunked):
        other.load_state_dict(base.state_dict())
    logits_b, loss_b = base(idx, targets)
    for name, other in (("optimized", fast), ("chunked attention", chunked)):
        logits_f, loss_f = other(idx, targets)
        check_close(f"{name} logits", logits_f, logits_b, FP32)
        check_close(f"{name} cross entropy", _ce(logits_f, targets), _ce(logits_b, targets), FP32)
        aux_b, aux_f = loss_b - _ce(logits_b, targets), loss_f - _ce(logits_f, targets)
        assert aux_b.item() > 0
        check_close(f"{name} MoE aux loss", aux_f, aux_b, FP32)
    base.double(), fast.double()
    grads_b, grads_f = _grads(base, idx, targets), _grads(fast, idx, targets)
    assert grads_b.keys() == grads_f.keys() and ("fabric.gate.weight" in grads_b) == gating
    for name in grads_b:
        check_close(f"grad {name}", grads_f[name], grads_b[name], tolerance(torch.float64))


def test_routing_decisions_stay_float32_under_autocast():
    """The MoE router and the fabric's gates decide discretely (top-k, skip or not): under bf16 autocast
    they run outside it, in x's dtype, so a bf16 rounding of a logit cannot flip a decision."""
    torch.manual_seed(0)
    moe, x = MoE(32, 48, 8, 2), torch.randn(64, 32)
    xs, w, b = torch.randn(2, 16, 32), torch.randn(3, 32) / 8, torch.zeros(3)
    ref = (*moe._route(x), fabric_gates(xs, w, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = (*moe._route(x), fabric_gates(xs, w, b))
    for r, a in zip(ref, amp):
        assert torch.equal(a, r) and a.dtype == r.dtype


# -- training ---------------------------------------------------------------------------------------
def test_tiny_model_learns_the_synthetic_stream(no_triton):
    data = SyntheticTokens(256, 32, seed=0)
    model = _model(HybridConfig.preset("tiny").optimized())
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    for _ in range(20):
        step(data.batch(8))
    losses = torch.stack(step.history).tolist()
    assert abs(losses[0] - math.log(256)) < 0.2
    assert sum(losses[-4:]) / 4 < 0.9 * losses[0], losses
    assert min(losses) > data.entropy()  # nothing beats the source's entropy


@pytest.mark.parametrize("optimized", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("mode", ["full", "selective", "keep_attention"])
def test_checkpointing_gives_the_same_gradients_from_the_first_step(no_triton, monkeypatch, mode, optimized):
    """Regressions: the grouped GEMM's CPU probe ran its backward inside the first checkpointed forward; a
    matmul of a vector on the reference path squeezed its product in place (selective checkpointing keeps it)."""
    grouped_mm = importlib.import_module("mahia.ops.grouped_mm")
    monkeypatch.setattr(grouped_mm, "_cpu_grouped_mm_probe", {})  # the first call comes from the forward
    cfg = HybridConfig.preset("tiny")
    cfg = cfg.optimized() if optimized else cfg
    model, plain = _model(cfg), _model(cfg)
    apply_checkpointing(model, mode)
    idx, targets = _tokens(2, 16)
    for _ in range(2):
        got, ref = _grads(model, idx, targets), _grads(plain, idx, targets)
    assert set(got) == set(ref) == {n for n, p in model.named_parameters()}  # the blocks stay where they were
    for name in ref:
        check_close(f"{mode} grad {name}", got[name], ref[name], FP32)


def test_checkpointing_is_applied_replaced_and_removed_in_place(no_triton, monkeypatch):
    from torch.utils import checkpoint as ckpt

    calls, original = [], ckpt.checkpoint
    monkeypatch.setattr(ckpt, "checkpoint", lambda fn, *a, **kw: calls.append(fn) or original(fn, *a, **kw))
    model = _model(HybridConfig.preset("tiny").optimized())
    idx, targets = _tokens(2, 9)
    keys, blocks, L = list(model.state_dict()), list(model.blocks), model.cfg.n_layers

    def calls_of_one_forward(grad=True):
        calls.clear()
        with torch.set_grad_enabled(grad):
            model(idx, targets)
        return len(calls)

    apply_checkpointing(model, "full")
    assert all(type(b) is CheckpointedBlock and b.checkpoint_policy == "full" for b in model.blocks)
    assert list(model.blocks) == blocks and list(model.state_dict()) == keys  # the same modules, in place
    assert calls_of_one_forward() == L  # one checkpointed call per block (every gate is on by default)
    make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), checkpoint="selective")
    assert all(b.checkpoint_policy == "selective" for b in model.blocks)  # replaced, not wrapped twice
    assert calls_of_one_forward() == L
    assert calls_of_one_forward(grad=False) == 0  # eval and no_grad (decoding) run the plain blocks
    make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1))  # checkpoint=None removes it
    assert all(type(b) is Block and "checkpoint_policy" not in vars(b) for b in model.blocks)
    assert list(model.state_dict()) == keys and calls_of_one_forward() == 0


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_steps_train(no_triton, amp):
    data = SyntheticTokens(256, 16, seed=0)
    model = _model(HybridConfig.preset("tiny").optimized())
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), amp=amp)
    for _ in range(3):
        loss = step(data.batch(4))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_master_adamw_trains_as_autocast_does(no_triton):
    """bf16 copies of exactly the weights autocast casts (not the norms', the embedding, nor what runs with autocast
    off: the router, the fabric's gate), and the losses of AdamW under autocast to the bit."""
    cfg, batch = HybridConfig.preset("tiny").optimized(), _tokens(4, 16)
    ref, model = _model(cfg), _model(cfg)
    opt = optimize.MasterAdamW(model, (batch[0][:1],), lr=1e-2)
    low = {n for n, p in model.named_parameters() if p.dtype == torch.bfloat16}
    assert {"blocks.0.attn.qkv_proj.weight", "blocks.1.mlp.w13", "blocks.1.memory.proj.read_q.weight"} <= low
    assert not low & {"tok_emb.weight", "norm.weight", "blocks.1.mlp.w_router", "fabric.gate.weight"}
    steps = (
        make_train_step(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), amp="bf16"),
        make_train_step(model, opt, amp="bf16"),
    )
    assert [float(steps[0](batch)) for _ in range(3)] == [float(steps[1](batch)) for _ in range(3)]


def test_compile_falls_back_to_eager(no_triton, monkeypatch):
    model = _model(HybridConfig.preset("tiny", **LIGHT))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert apply_compile(model, None) is model
    monkeypatch.setattr(optimize, "compile_problem", lambda device: "no compiler here (test)")
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert apply_compile(model, "default") is model
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        step = make_train_step(model, opt, compile="default")
    assert torch.isfinite(step(_tokens(2, 8)))


# -- host syncs -------------------------------------------------------------------------------------
def _syncs_of_one_step(cfg: HybridConfig, **options):
    data = SyntheticTokens(256, 16, seed=0)
    model = _model(cfg)
    # fused AdamW keeps its step counter on the device; the default one reads it on the host.
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True), **options)
    step(data.batch(2))  # warm-up: lazy state creation
    with count_syncs(keep_stack=False) as r:
        step(data.batch(2))
    return r, step


def test_train_step_host_syncs(no_triton):
    r, _ = _syncs_of_one_step(HybridConfig.preset("tiny").optimized())
    assert r.count == 0, str(r)
    r, _ = _syncs_of_one_step(HybridConfig.preset("tiny").baseline())  # the loop MoE and the branch fabric
    assert r.ops["aten.nonzero"] and r.ops["aten._local_scalar_dense"], str(r)
    r, step = _syncs_of_one_step(HybridConfig.preset("tiny", **LIGHT).optimized(), sync_free_logging=False)
    assert isinstance(step.history[0], float) and r.ops["aten._local_scalar_dense"] == 1, str(r)


# -- decoding ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["baseline", "optimized"])
def test_decode_steps_match_the_full_forward_and_see_no_future(no_triton, which):
    """Every hybrid part on (memory segments of 4 tokens, gates that skip some blocks): a prefill across a
    segment boundary, then single tokens, equal one forward; tokens t+1.. leave the logits at <= t alone."""
    cfg = getattr(HybridConfig.preset("tiny"), which)()
    assert cfg.graph_memory and cfg.gating and cfg.memory_segment == 4
    model = _model(cfg).eval()
    idx, _ = _tokens(3, 13)
    _diverse_gates(model, idx)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        full, loss = model(idx)
        assert loss is None and full.shape == (3, 13, 256)
        for t in (0, 3, 9):  # memory segments are [0, 4), [4, 8), [8, 12), [12, 13)
            other = idx.clone()
            other[:, t + 1 :] = torch.randint(0, 256, other[:, t + 1 :].shape, generator=g)
            logits, _ = model(other)
            check_close(f"logits at positions <= {t}", logits[:, : t + 1], full[:, : t + 1], FP32)
            assert rel_error(logits[:, t + 1 :], full[:, t + 1 :]) > 0.1, t
        model.setup_cache(3, 20)
        model.reset_cache()
        pos = torch.zeros((), dtype=torch.long)
        parts = [model.decode_step(idx[:, :5], pos)]  # prefill 5 tokens
        for t in range(5, 13):
            parts.append(model.decode_step(idx[:, t : t + 1], pos.fill_(t)))
    check_close("decoded logits", torch.cat(parts, dim=1), full, FP32)
    if which == "optimized":  # a CUDA-graph-capturable step: no host sync (memory and gates included)
        with count_syncs(keep_stack=False) as r, torch.no_grad():
            model.decode_step(idx[:, 12:13], pos.fill_(13))
        assert r.count == 0, str(r)


def test_decoder_generates_the_greedy_continuation_and_refuses_a_non_causal_model(no_triton):
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
    model.setup_cache(1, 8)
    one, pos = torch.zeros(1, 1, dtype=torch.long), torch.zeros((), dtype=torch.long)
    for part, attr, value in ((model.blocks[1].memory, "causal", False), (model.fabric, "gate_source", "mean")):
        setattr(part, attr, value)  # switched to the bidirectional component after the fact
        assert not model.is_causal
        with pytest.raises(ValueError, match="decode_step: a part of the model reads later positions"):
            model.decode_step(one, pos)
        setattr(part, attr, not value if attr == "causal" else "first")
    assert model.is_causal


# -- counting ---------------------------------------------------------------------------------------
def test_dense_350m_parameter_count_and_flops():
    cfg = HybridConfig.preset("dense-350m")
    with torch.device("meta"):
        model = HybridModel(cfg)
    n = model.param_count()
    D, F_, L = cfg.dim, cfg.hidden, cfg.n_layers
    assert 300e6 <= n <= 400e6 and n == L * (4 * D**2 + 3 * D * F_ + 2 * D) + cfg.vocab_size * D + D  # tied
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
    """The formula against torch's count of one forward (manual attention: all T x T scores). Inexact: the
    formula counts the chunked scan where the loop runs the recurrence, and per-sequence node projections."""
    cfg = HybridConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden=96, max_seq_len=64, **kwargs)
    model = _model(cfg)
    B, T = 3, 37
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(_tokens(B, T)[0])
    measured, predicted = counter.get_total_flops() / (B * T), model.flops_per_token(T, training=False)
    assert measured == predicted if exact else abs(measured / predicted - 1) < 0.1


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_memory_estimate_is_sane(no_triton, impl):
    cfg = HybridConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, hidden=96, max_seq_len=64, attention_impl=impl)
    model = _model(cfg)
    B, T = 4, 64
    est = model.memory_estimate(B, T)
    n = model.param_count()
    assert est["parameters"] == est["gradients"] == 4 * n and est["optimizer"] == 8 * n
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    params, kept = {p.untyped_storage().data_ptr() for p in model.parameters()}, {}

    def pack(t):  # the distinct storages autograd keeps for backward
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*_tokens(B, T))
    ratio = est["activations"] / sum(v for k, v in kept.items() if k not in params)
    assert 0.6 < ratio <= 1.0, ratio  # the model counts what fused kernels keep; eager norms, RoPE keep more
    full = model.memory_estimate(B, T, checkpoint="full")
    sel = model.memory_estimate(B, T, checkpoint="selective")
    assert full["activations"] < sel["activations"] < est["activations"]
    assert full["recompute"] > 0 and est["recompute"] == 0
    keep = model.memory_estimate(B, T, checkpoint="keep_attention")  # input + attention output per block
    attn = (cfg.dim * 4 + 4 * cfg.n_heads) * B * T if impl == "sdpa" else 0
    assert keep["activations"] - full["activations"] == cfg.n_layers * attn
    assert keep["recompute"] == full["recompute"] - attn
    assert model.memory_estimate(B, T, torch.bfloat16)["activations"] < est["activations"]


# -- synthetic data ---------------------------------------------------------------------------------
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
    same = [SyntheticTokens(97, 33, seed=3, copy_prob=0.6).batch(4)[0] for _ in range(2)]
    assert torch.equal(*same) and not torch.equal(SyntheticTokens(97, 33, seed=4).succ, data.succ)
    for make, match in [
        (lambda: SyntheticTokens(1, 8), "vocab_size"),
        (lambda: SyntheticTokens(10, 8, copy_prob=1.0), "copy_prob"),
        (lambda: SyntheticTokens(10, 8).batch(0), "batch_size"),
    ]:
        with pytest.raises(ValueError, match=f"SyntheticTokens.*{match}"):
            make()
