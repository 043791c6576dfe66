"""mahia.lessons.training: the memory instruments of notebooks 06 and 07, and the memory model they check."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mahia.lessons.training import fits, peak_bytes, peak_composition, saved_tensor_bytes, with_peak
from mahia.measure.timing import Timing
from mahia.model import HybridConfig, HybridModel, SyntheticTokens, apply_checkpointing

pytestmark = pytest.mark.filterwarnings("ignore:mahia.ops.*Triton kernel not used:RuntimeWarning")


@pytest.fixture(autouse=True)
def no_triton(monkeypatch):  # the memory instruments, not the Triton kernels
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")


def test_saved_tensor_bytes_counts_what_autograd_keeps():
    torch.manual_seed(0)
    lin, act = nn.Linear(13, 29), nn.ReLU()
    x = torch.randn(7, 13, requires_grad=True)
    got = saved_tensor_bytes(
        lambda: act(lin(x)).sum(), modules={"lin": lin, "act": act}, exclude=list(lin.parameters())
    )
    # linear keeps its input (7x13), relu its output (7x29); the weight is excluded.
    assert got == {"lin": 7 * 13 * 4, "act": 7 * 29 * 4, "total": 7 * 42 * 4}


def test_block_table_against_measured_saved_tensors():
    # the model counts what fused kernels keep; the eager norms and RoPE keep a little more
    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=211, dim=48, n_layers=3, n_heads=4, hidden=80, max_seq_len=64, attention_impl="sdpa")
    model = HybridModel(cfg)
    B, T = 3, 37
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    blocks = {f"block{i}": b for i, b in enumerate(model.blocks)}
    got = saved_tensor_bytes(lambda: model(idx, idx), modules=blocks, exclude=list(model.parameters()))
    rows = model.activation_bytes_per_token(T, itemized=True)  # notebook 07's table
    for i in range(cfg.n_layers):
        modelled = B * T * sum(r["full"] for r in rows if r["block"] == i)
        assert 0.6 < modelled / got[f"block{i}"] <= 1.0, (i, modelled, got)


def test_peak_bytes_on_cpu_sees_checkpointing_save_memory():
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


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_full_checkpointing_counts_block_inputs_in_the_residual_streams_dtype(param_dtype):
    # under autocast the residual stream keeps the parameters' dtype, and full checkpointing keeps block inputs in it
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
