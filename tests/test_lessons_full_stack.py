"""Tests of mahia.lessons.full_stack (CPU, small odd shapes)."""

import dataclasses
import math
from types import SimpleNamespace

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import mahia.layers.attention as attention  # noqa: E402
import mahia.lessons.full_stack as fs  # noqa: E402
from mahia.layers import available_backends, fused_backends  # noqa: E402
from mahia.measure.checks import CorrectnessError  # noqa: E402
from mahia.model import HybridConfig, SyntheticTokens  # noqa: E402


@pytest.fixture(autouse=True)
def eager_kernels(monkeypatch):  # the ladder, not the Triton kernels: their eager references, not the slow interpreter
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")


def _cfg():  # every hybrid part on, odd sizes, a few hundred thousand FLOPs per token
    sizes = dict(vocab_size=101, dim=40, n_heads=4, n_kv_heads=2, hidden=56, moe_hidden=28, max_seq_len=32)
    return HybridConfig.preset("tiny", memory_nodes=5, memory_segment=5, **sizes)


def _batch(cfg, B=3, T=13):
    return SyntheticTokens(cfg.vocab_size, T, seed=1).batch(B)


# -- stacks and rungs -------------------------------------------------------------------------------
def test_rungs_accumulate_and_stack_config_applies_them():
    rung = {r.name: r for r in fs.LADDER}
    assert fs.LADDER[0].name == "hybrid_parts"  # the loops go first: the standard rungs start from their absence
    s = rung["sdpa"].on(rung["sync_free"].on(fs.Stack()))  # sync-free, then SDPA
    assert s == fs.Stack(model=("sdpa",), sync_free_logging=True)
    cfg = s.config(HybridConfig.preset("tiny").optimized())  # starts from the baseline impls
    assert cfg.attention_impl == "sdpa" and cfg.moe_impl == "loop" and cfg.gating_impl == "branch"
    assert fs.Stack(amp="bf16").dtype == torch.bfloat16 and fs.Stack().dtype == torch.float32
    with pytest.raises(ValueError, match="unknown optimization"):
        fs.Stack(model=("fastest",)).config(cfg)


def test_climb_is_cumulative_and_alone_is_not():
    steps = fs.climb()
    assert [n for n, _ in steps] == ["baseline"] + [r.name for r in fs.LADDER]
    assert steps[0][1] == fs.Stack()
    last = steps[-1][1]
    assert last.sync_free_logging and last.amp == "bf16" and last.compile == "default" and last.graphs
    assert fs.LADDER[-1].name == "graphs" and not steps[-2][1].graphs  # the graph is the last rung, over compile
    assert "triton" in steps[-3][1].model and "triton" not in last.model  # compiled, Inductor's kernels instead
    fast = HybridConfig.preset("tiny").optimized().replace(kernels="eager").__dict__.items()  # every other fast impl
    assert set(last.config(HybridConfig.preset("tiny")).__dict__.items()) >= set(fast)
    solo = dict(fs.alone())
    assert solo["bf16"] == fs.Stack(amp="bf16") and solo["sdpa"] == fs.Stack(model=("sdpa",))
    base = fs.LADDER[0].on(fs.Stack())  # the loop-free baseline of notebook 10
    solo = dict(fs.alone(fs.LADDER[1:], base=base))
    assert solo["baseline"] == base and solo["sdpa"] == fs.Stack(model=base.model + ("sdpa",))


def test_for_device_drops_and_swaps_cuda_only_rungs():
    kept, why = fs.for_device(fs.LADDER, cuda=False, compile_problem="no compiler here")
    assert not {"triton", "compile"} & {r.name for r in kept}
    assert "CUDA only" in why["triton"] and "no compiler here" in why["compile"] and "CUDA only" in why["graphs"]
    parts = next(r for r in kept if r.name == "hybrid_parts")
    assert parts.model == ("logspace_scan", "batched_memory", "masked_gating")
    kept_gpu, why_gpu = fs.for_device(fs.LADDER, cuda=True)
    assert kept_gpu == list(fs.LADDER) and why_gpu == {}


# -- building and checking --------------------------------------------------------------------------
def test_every_cpu_rung_matches_the_baseline_and_a_wrong_weight_is_caught():
    # Notebook 10's rule: float32 rungs match exactly, a bf16 rung in loss and cross-entropy (top-k routing may send
    # a near-tie token elsewhere once bf16 rounds the router's input; the MoE-free direction check is 10's own gate)
    cfg, (rungs, _) = _cfg(), fs.for_device(fs.LADDER, cuda=False, compile_problem="cpu test")
    batch, ladder = _batch(cfg), fs.climb(rungs)
    assert any(s.amp for _, s in ladder), "the CPU ladder has a bf16 rung"
    torch.manual_seed(0)
    base = fs.build(cfg, ladder[0][1], device="cpu")
    state = {k: v.clone() for k, v in base.model.state_dict().items()}
    ref = fs.step_outputs(base.forward, base.model, batch)
    assert ref.grad.numel() == sum(p.numel() for p in base.model.parameters())
    assert all(p.grad is None for p in base.model.parameters())  # step_outputs leaves the weights and grads alone
    assert all(torch.equal(v, state[k]) for k, v in base.model.state_dict().items())
    for name, stack in ladder[1:]:
        b = fs.build(cfg, stack, device="cpu", state=state)
        out = fs.step_outputs(b.forward, b.model, batch, amp=stack.amp)
        if stack.amp is None:
            assert max(fs.check_step(name, out, ref, 1e-5).values()) < 1e-5
        else:
            fs.check_step(name, out, ref, 2e-2, fields=("loss", "ce"))
    state["norm.weight"] *= 1.01  # a copy: the models built from it hold their own weights
    bad = fs.build(cfg, ladder[-1][1], device="cpu", state=state)
    out = fs.step_outputs(bad.forward, bad.model, batch, amp=ladder[-1][1].amp)
    with pytest.raises(CorrectnessError, match="loss|ce"):
        fs.check_step("bad", out, ref, 1e-5, fields=("loss", "ce"))


def test_check_step_direction_and_cosine():
    g = torch.randn(50)
    ref = fs.StepOutputs(torch.tensor(1.0), torch.tensor(1.0), torch.randn(2, 3), g)
    flipped = dataclasses.replace(ref, grad=-g)
    errs = fs.check_step("same", ref, ref, 1e-6, fields=("loss",), direction_fields=("grad",))
    assert errs["cos grad"] == pytest.approx(1.0)
    with pytest.raises(CorrectnessError, match="points another way"):
        fs.check_step("flipped", flipped, ref, 1e-6, fields=("loss",), direction_fields=("grad",))
    with pytest.raises(CorrectnessError, match="grad"):
        fs.check_step("flipped", flipped, ref, 1e-6)
    a = torch.tensor([1.0, 2.0, 3.0])
    assert fs.cosine(a, 2 * a) == pytest.approx(1.0) and fs.cosine(a, -a) == pytest.approx(-1.0)
    assert math.isnan(fs.cosine(a, torch.tensor([1.0, float("nan"), 0.0])))  # fails check_step's `cos >= min_cosine`


def test_the_graph_is_captured_on_copies_in_the_batch_strides(monkeypatch):
    # A compiled forward guards on its inputs' strides: contiguous clones of a sliced batch recompiled the model
    x, seen = torch.arange(16).view(2, 8), []
    step = lambda b: seen.append([t.stride() for t in b]) or b[0].sum()  # noqa: E731
    step.history = []
    monkeypatch.setattr(fs, "capture_graph", lambda fn, warmup: (SimpleNamespace(replay=lambda: None), fn()))
    fs.graphed(step)((x[:, :-1], x[:, 1:]))  # (idx, targets) as SyntheticTokens gives them: slices of one tensor
    assert seen == [[(8, 1), (8, 1)]]  # contiguous clones have (7, 1)


# -- the cost model ---------------------------------------------------------------------------------
def test_sync_free_logging_removes_exactly_one_sync_per_step():
    cfg = _cfg()
    batch = _batch(cfg, B=2, T=7)
    naive = fs.build(cfg, fs.Stack(), device="cpu")
    free = fs.build(cfg, fs.Stack(sync_free_logging=True), device="cpu")
    p_naive = fs.profile_step(lambda: naive.step(batch))
    p_free = fs.profile_step(lambda: free.step(batch), peak=True)
    assert p_naive.syncs - p_free.syncs == 1
    assert p_naive.ops > 100 and p_naive.peak_bytes is None and p_free.peak_bytes > 0


def test_waterfall():
    names, ms = ["base", "+a", "+b"], [10.0, 40.0, 30.0]
    ax = fs.waterfall(names, ms, title="t", device_note="CPU run")
    assert len(ax.patches) == 4  # three rungs and the total
    texts = [t.get_text() for t in ax.texts]
    assert "x4" in texts and "x0.75" in texts and any("x3" in t for t in texts) and ax.get_yscale() == "log"
    plt.close(ax.figure)
    # spread draws one error bar per level; a rung whose range overlaps the one below is marked n.s.
    ax = fs.waterfall(names, ms, title="t", spread=[(9, 11), (30, 50), (28, 31)], significant=[True, True, False])
    texts = [t.get_text() for t in ax.texts]
    assert "x4" in texts and "x0.75\nn.s." in texts and len(ax.collections) == 1
    plt.close(ax.figure)


def test_fused_backends_are_those_that_take_gqa_heads_as_they_are(monkeypatch):
    # A backend that runs only once the KV heads are repeated is not PyTorch's choice for sdpa_attention(backend=None)
    q = torch.randn(1, 8, 16, 32, requires_grad=True)
    k, v = torch.randn(1, 4, 16, 32), torch.randn(1, 4, 16, 32)
    assert "math" not in fused_backends(q, k, v)
    assert set(fused_backends(q, k, v)) <= set(available_backends(q, k, v))
    verdicts = {"flash": (False, False), "cudnn": (True, False), "efficient": (True, True), "math": (True, True)}
    monkeypatch.setattr(attention, "_runs", lambda name, *a: verdicts[name])
    assert fused_backends(q, k, v) == ["efficient"]
    assert available_backends(q, k, v) == ["cudnn", "efficient", "math"]
    with pytest.raises(ValueError):
        fused_backends(q, k[..., :16], v)
