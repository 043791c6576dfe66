"""mahia.lessons.training: loss-curve, precision and memory helpers of notebooks 06 and 07."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mahia.lessons.training import (
    allocator_step_summary,
    allocator_summary,
    block_activation_table,
    fits,
    largest_fitting,
    lost_in_cast,
    matmul_precision,
    op_dtypes,
    peak_bytes,
    peak_composition,
    running_sum,
    saved_tensor_bytes,
    smoothed_rel_dev,
    state_bytes,
    step_peak_estimate,
    tail_rel_diff,
    train_run,
    with_peak,
)
from mahia.measure.timing import Timing
from mahia.model import HybridConfig, HybridModel, SyntheticTokens, apply_checkpointing, make_train_step

pytestmark = pytest.mark.filterwarnings("ignore:mahia.ops.*Triton kernel not used:RuntimeWarning")


@pytest.fixture
def no_triton(monkeypatch):
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")


# ---------------------------------------------------------------------------------------------------
# Loss curves
# ---------------------------------------------------------------------------------------------------


def test_train_run_returns_the_losses_of_a_real_model(no_triton):
    torch.manual_seed(0)
    model = HybridModel(HybridConfig.preset("tiny", n_layers=1, gating=False).optimized())
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = train_run(step, SyntheticTokens(256, 16, seed=0), steps=5, batch_size=3, device="cpu")
    assert losses.shape == (5,) and losses.dtype == torch.float32
    assert torch.equal(losses, torch.stack(step.history))
    assert abs(losses[0].item() - math.log(256)) < 0.3 and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="steps must be a positive int"):
        train_run(step, SyntheticTokens(256, 16), steps=0, batch_size=3, device="cpu")
    with pytest.raises(TypeError, match="data must have batch"):
        train_run(step, [1, 2], steps=1, batch_size=3, device="cpu")


def test_curve_comparisons():
    ref = torch.linspace(5.0, 3.0, 37, dtype=torch.float64)
    assert tail_rel_diff(ref, ref) == 0.0
    # The last 10% of 37 steps is 4 steps; shifting them by 0.03 shifts their mean by 0.03.
    shifted = ref.clone()
    shifted[-4:] += 0.03
    assert tail_rel_diff(shifted, ref) == pytest.approx(0.03 / ref[-4:].mean().item(), rel=1e-9)
    assert tail_rel_diff(ref * 1.01, ref, frac=1.0) == pytest.approx(0.01, rel=1e-9)
    noisy = ref + 0.2 * torch.tensor([(-1.0) ** i for i in range(37)], dtype=torch.float64)
    assert smoothed_rel_dev(noisy, ref, window=2) < 0.2 * 0.01 + 1e-9  # alternating noise averages out
    assert smoothed_rel_dev(noisy, ref, window=1) > 0.03
    bad = ref.clone()
    bad[10] = float("nan")
    assert smoothed_rel_dev(bad, ref, window=4) == math.inf
    bad[-1] = float("inf")
    assert tail_rel_diff(bad, ref) == math.inf
    with pytest.raises(ValueError, match="same length"):
        tail_rel_diff(ref, ref[:-1])
    with pytest.raises(ValueError, match="frac"):
        tail_rel_diff(ref, ref, frac=0)
    with pytest.raises(ValueError, match="1-D float"):
        smoothed_rel_dev(ref.view(1, -1), ref.view(1, -1), window=2)


# ---------------------------------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------------------------------


def test_matmul_precision_sets_and_restores_the_flags():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with matmul_precision(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with matmul_precision(False):
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(TypeError, match="tf32 must be a bool"):
        with matmul_precision(1):
            pass


def test_lost_in_cast_shows_fp16_underflow_and_the_loss_scale():
    g = torch.tensor([1e-9, 2e-8, 1e-6, 0.0, 1e-3, float("nan")], dtype=torch.float64)
    # fp16's smallest subnormal is 2^-24 = 5.96e-8: 1e-9 and 2e-8 (below half of it) flush to zero.
    fp16 = lost_in_cast(g, torch.float16)
    assert fp16 == {"underflow": pytest.approx(2 / 4), "overflow": 0.0, "n": 4}
    assert lost_in_cast(g, torch.bfloat16)["underflow"] == 0.0  # bf16 has float32's exponent range
    assert lost_in_cast(g, torch.float16, scale=2.0**16)["underflow"] == 0.0  # the loss scale rescues them
    big = torch.tensor([1e3, 1e5])
    assert lost_in_cast(big, torch.float16)["overflow"] == 0.5
    assert lost_in_cast(big, torch.float16, scale=2.0**16)["overflow"] == 1.0
    assert lost_in_cast(torch.zeros(3), torch.float16)["n"] == 0
    with pytest.raises(TypeError, match="floating-point tensor"):
        lost_in_cast(torch.arange(3), torch.float16)
    with pytest.raises(ValueError, match="scale"):
        lost_in_cast(g, torch.float16, scale=0.0)


def test_running_sum_stalls_in_bf16():
    ones = torch.ones(600)
    s32 = running_sum(ones, torch.float32)
    assert s32.dtype == torch.float32 and s32[-1].item() == 600.0
    s16 = running_sum(ones, torch.bfloat16)
    # bf16 has 8 significant bits: at 256 the spacing is 2, so 256 + 1 rounds back to 256 (ties to even).
    assert s16[255].item() == 256.0 and s16[-1].item() == 256.0
    with pytest.raises(ValueError, match="1-D floating"):
        running_sum(torch.ones(2, 3), torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        running_sum(ones, torch.int32)


# ---------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------


def test_saved_tensor_bytes_counts_what_autograd_keeps():
    torch.manual_seed(0)
    lin, act = nn.Linear(13, 29), nn.ReLU()
    x = torch.randn(7, 13, requires_grad=True)
    got = saved_tensor_bytes(
        lambda: act(lin(x)).sum(), modules={"lin": lin, "act": act}, exclude=list(lin.parameters())
    )
    # linear keeps its input (7x13), relu its output (7x29); the weight is excluded.
    assert got == {"lin": 7 * 13 * 4, "act": 7 * 29 * 4, "total": 7 * 42 * 4}
    with pytest.raises(TypeError, match="must be an nn.Module"):
        saved_tensor_bytes(lambda: None, modules={"x": 3})


def _meta_model(cfg: HybridConfig) -> HybridModel:
    with torch.device("meta"):
        return HybridModel(cfg)


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("tiny", {}),
        ("tiny", {"attention_impl": "sdpa"}),
        ("small", {}),
        ("dense-350m", {"attention_impl": "sdpa"}),
        ("moe", {"attention_impl": "chunked"}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_table_itemizes_the_models_activation_estimate(preset, overrides, dtype):
    model = _meta_model(HybridConfig.preset(preset, **overrides))
    T = 96
    rows = block_activation_table(model, T, dtype)
    total = sum(r["bytes_per_token"] for r in rows)
    assert total == pytest.approx(model.activation_bytes_per_token(T, dtype)[0], rel=1e-12)
    assert len([r for r in rows if r["part"] == "attention"]) == model.cfg.n_layers
    assert rows[-1]["part"] == "head"


@pytest.mark.parametrize("preset", ["tiny", "small", "dense-350m"])
def test_step_peak_estimate(preset):
    model = _meta_model(HybridConfig.preset(preset).optimized())
    B, T, dt = 3, 128, torch.bfloat16
    est = {m: model.memory_estimate(B, T, dt, checkpoint=m) for m in (None, "full", "selective")}
    peak = {m: step_peak_estimate(model, B, T, dt, checkpoint=m) for m in est}
    assert peak[None] == est[None]["activations"] + est[None]["gradients"]
    assert peak["full"] == est["full"]["activations"] + est["full"]["recompute"] + est["full"]["gradients"]
    recomputed = peak["selective"] - est["selective"]["activations"] - est["selective"]["gradients"]
    # only the pointwise part of a block: less than the whole block full checkpointing recomputes
    assert 0 < recomputed == est["selective"]["recompute"] < est["full"]["recompute"]
    # ... the most that any one block recomputes (blocks differ: MoE, meta-attention, memory)
    rows = model.activation_bytes_per_token(T, dt, itemized=True)
    blocks = [[r for r in rows if r["block"] == i] for i in range(model.cfg.n_layers)]
    most = max(sum(r["full"] - r["selective"] for r in b) for b in blocks)
    assert recomputed == int(B * T * most)
    assert peak["full"] < peak["selective"] < peak[None]
    with pytest.raises(TypeError, match="HybridModel"):
        step_peak_estimate(nn.Linear(2, 2), B, T)
    with pytest.raises(ValueError, match="batch"):
        step_peak_estimate(model, 0, T)


def test_block_table_against_measured_saved_tensors(no_triton):
    """The model counts what fused kernels keep; the eager norms and RoPE keep a little more."""
    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=211, dim=48, n_layers=3, n_heads=4, hidden=80, max_seq_len=64, attention_impl="sdpa")
    model = HybridModel(cfg)
    B, T = 3, 37
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    blocks = {f"block{i}": b for i, b in enumerate(model.blocks)}
    got = saved_tensor_bytes(lambda: model(idx, idx), modules=blocks, exclude=list(model.parameters()))
    rows = block_activation_table(model, T)
    for i in range(cfg.n_layers):
        modelled = B * T * sum(r["bytes_per_token"] for r in rows if r["block"] == i)
        assert 0.6 < modelled / got[f"block{i}"] <= 1.0, (i, modelled, got)
    with pytest.raises(TypeError, match="HybridModel"):
        block_activation_table(nn.Linear(2, 2), T)
    with pytest.raises(ValueError, match="seq_len"):
        block_activation_table(model, 0)


def test_peak_bytes_on_cpu_sees_checkpointing_save_memory(no_triton):
    torch.manual_seed(0)
    model = HybridModel(HybridConfig.preset("tiny", gating=False).optimized())
    idx, targets = SyntheticTokens(256, 48, seed=0).batch(4)

    def step(mode):
        apply_checkpointing(model, mode)
        model.zero_grad(set_to_none=True)
        return lambda: model(idx, targets)[1].backward()

    peaks = {mode: peak_bytes(step(mode), "cpu") for mode in (None, "full", "selective")}
    assert peaks["full"] < peaks["selective"] < peaks[None]
    # The live peak holds at least what autograd saved, and at least all the gradients (alive at the end). Views
    # of the weights (a linear's transposed weight) are not new memory and are not counted.
    apply_checkpointing(model, None)
    saved = saved_tensor_bytes(lambda: model(idx, targets), exclude=list(model.parameters()))["total"]
    grads = sum(p.numel() * 4 for p in model.parameters())
    assert peaks[None] >= saved and peaks[None] >= grads
    assert peaks[None] < saved + grads + 4 * 48 * 256 * 4 * 3  # + the logits, their gradient and a log-softmax
    with pytest.raises(TypeError, match="callable"):
        peak_bytes(3, "cpu")


def test_fits_catches_only_out_of_memory():
    cleaned = []

    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")

    assert fits(lambda: None, cleanup=lambda: cleaned.append(1)) is True
    assert fits(oom, cleanup=lambda: cleaned.append(2)) is False
    assert cleaned == [1, 2]
    with pytest.raises(ValueError, match="not memory"):
        fits(lambda: (_ for _ in ()).throw(ValueError("not memory")))


def test_with_peak_fills_in_only_what_bench_could_not_measure():
    t = Timing(1.0, 0.9, 1.1, 5)
    filled = with_peak(t, lambda: torch.empty(300), "cpu")
    assert filled.peak_mem_bytes == 1200 and filled.median_ms == 1.0
    measured = Timing(1.0, 0.9, 1.1, 5, peak_mem_bytes=7)
    assert with_peak(measured, lambda: torch.empty(300), "cpu") is measured
    with pytest.raises(TypeError, match="Timing"):
        with_peak(1.0, lambda: None, "cpu")


def test_largest_fitting_brackets_the_limit_in_few_probes():
    calls = []

    def under(limit):
        def f(n):
            calls.append(n)
            return n <= limit

        return f

    # Prediction a little low: fits, grows past the limit, then bisects.
    assert largest_fitting(under(37), 35, probes=3) == (37, 40) and calls == [35, 40, 37]
    calls.clear()
    # Prediction too high: shrinks until it fits.
    assert largest_fitting(under(37), 60, probes=4) == (36, 43) and calls == [60, 51, 43, 36]
    assert largest_fitting(under(100), 10, probes=2) == (11, None)  # never failed: no upper bound
    assert largest_fitting(under(0), 3, probes=5) == (0, 1)  # nothing fits: stops at 1
    assert largest_fitting(under(1000), 990, probes=3) == (990, 1064)
    calls.clear()
    assert largest_fitting(under(1000), 1000, probes=3) == (1000, 1075) and calls == [1000, 1150, 1075]
    with pytest.raises(ValueError, match="start"):
        largest_fitting(under(3), 0)
    with pytest.raises(ValueError, match="grow"):
        largest_fitting(under(3), 2, grow=0.5)


def test_peak_composition_itemizes_the_live_peak_by_op_dtype_and_phase():
    w = torch.randn(64, 64)
    x = torch.randn(32, 64)
    n = 32 * 64

    def fn():
        h = x @ w  # float32, alive to the end
        with torch.no_grad():  # grad mode off: counted as the backward/optimizer phase
            g = h + 1
        y = h.double() * 2  # a float64 copy, then its double: both alive when the product is made
        return g, y

    pc = peak_composition(fn)
    assert pc.peak == peak_bytes(fn, "cpu") == 4 * n + 4 * n + 8 * n + 8 * n  # the same peak as LiveTensorMemory
    assert dict((k, v) for k, v, _ in pc.top()) == {
        "forward: mm (float32)": 4 * n,
        "backward/optimizer: add (float32)": 4 * n,
        "forward: _to_copy (float64)": 8 * n,
        "forward: mul (float64)": 8 * n,
    }
    assert pc.phase_bytes() == {"forward": 20 * n, "backward/optimizer": 4 * n}
    assert pc.count["forward: mul (float64)"] == 1
    with pytest.raises(TypeError, match="callable"):
        peak_composition(None)


def test_state_bytes_counts_weights_gradients_and_optimizer_state_once():
    model = nn.Linear(8, 4)  # 32 + 4 floats
    opt = torch.optim.AdamW(model.parameters())
    assert state_bytes(model, opt) == {"weights": 144, "gradients": 0, "optimizer state": 0}
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    got = state_bytes(model, opt)
    assert got["gradients"] == 144 and got["optimizer state"] == 2 * 144 + 2 * 4  # exp_avg, exp_avg_sq, 2 steps
    assert state_bytes(model) == {"weights": 144, "gradients": 144}
    with pytest.raises(TypeError, match="nn.Module"):
        state_bytes("model")


def test_op_dtypes_shows_what_autocast_chose():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen = op_dtypes(lambda: torch.softmax((a @ b).float(), -1))
    assert seen["mm"] == {"bfloat16": 1}  # autocast ran the matmul in bf16 ...
    assert seen["_softmax"] == {"float32": 1}  # ... and the explicit cast gave the softmax float32
    assert "_to_copy" in seen
    with pytest.raises(ValueError, match="CUDA device"):
        allocator_summary("cpu")


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_full_checkpointing_counts_block_inputs_in_the_residual_streams_dtype(no_triton, param_dtype):
    """Under autocast the residual stream keeps the parameters' dtype: what full checkpointing keeps of a block is
    its input at that size, not at the activation dtype's (the H100 review of 07 found the model at half of it)."""
    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, hidden=64, max_seq_len=32, attention_impl="sdpa")
    model = HybridModel(cfg).to(param_dtype)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    seen = []
    hook = model.blocks[1].register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx, idx)
    hook.remove()
    residual = torch.empty((), dtype=seen[0]).element_size()  # what the block was given, measured
    assert residual == param_dtype.itemsize
    kept_full, _ = model.activation_bytes_per_token(16, torch.bfloat16, checkpoint="full")
    head = next(
        r["full"] for r in model.activation_bytes_per_token(16, torch.bfloat16, itemized=True) if r["block"] is None
    )
    assert kept_full - head == cfg.n_layers * cfg.dim * residual


def test_allocator_step_summary_counts_one_call_only(monkeypatch):
    """The review of 07's H100 run found '877 segments from 1,305 cudaMalloc calls' for one step: the counter ran
    from the process's start, since resetting the peaks leaves it alone. The step's summary resets the
    accumulated counters too, before the call, and says what was alive when it began."""
    events = []
    stats = {"num_device_alloc": 1305, "num_alloc_retries": 2, "allocated_bytes.all.peak": 900}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: events.append("reset peak"))

    def reset_accumulated(d=None):
        events.append("reset counters")
        stats.update(num_device_alloc=0, num_alloc_retries=0)

    monkeypatch.setattr(torch.cuda, "reset_accumulated_memory_stats", reset_accumulated)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 300)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda d=None: dict(stats))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: [])

    def step():
        events.append("step")
        stats["num_device_alloc"] += 7

    got = allocator_step_summary(step, "cuda:0")
    assert events == ["reset peak", "reset counters", "step"]
    assert got["cudaMalloc calls"] == 7 and got["alloc retries"] == 0
    assert got["allocated before"] == 300 and got["allocated peak"] - got["allocated before"] == 600
    with pytest.raises(ValueError, match="CUDA device"):
        allocator_step_summary(step, "cpu")


def test_matmul_precision_says_mahias_triton_kernels_stay_fp32():
    # Review 06-2: the docstring (shown in notebook 06) said tl.dot defaults to TF32 for float32 inputs, which
    # would make the "true fp32" baseline TF32 in Triton; mahia's kernels take float32 products in full precision.
    import importlib

    gla_kernels = importlib.import_module("mahia.ops.gla_scan.kernels")
    grouped_mm = importlib.import_module("mahia.ops.grouped_mm")

    doc = matmul_precision.__doc__
    assert "defaults to TF32" not in doc and 'input_precision="ieee"' in doc
    q = torch.zeros(1, 1, 16, 16)
    assert gla_kernels._config(q, 16)[3] == "ieee"
    assert grouped_mm._ieee_dot(q)
