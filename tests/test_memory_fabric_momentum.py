"""GraphDiffusionMemory, DynamicNeuroFabric and the momentum update: each fast path against a float64 run of
the reference path (outputs, gradients) at its dtype's tolerance, on odd shapes, with no syncing op."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mahia.measure.checks import compare_fn, rel_error, tolerance
from mahia.measure.instruments import count_ops, count_syncs
from mahia.model.fabric import DynamicNeuroFabric, fabric_forward, fabric_gates
from mahia.model.memory import GraphDiffusionMemory, diffusion_operator, graph_diffusion_memory
from mahia.model.momentum import momentum_update_foreach, momentum_update_loop

B, T, D, N, L = 3, 37, 40, 7, 5
SEG = 5  # T = 37: seven whole segments and a short last one of 2 tokens
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- GraphDiffusionMemory ---------------------------------------------------------------------------
def _memory_inputs(seed=0, adj_std=3.0, dtype=torch.float64):
    """x and the nine parameters of graph_diffusion_memory, in float64 then cast."""
    g = _gen(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    memory = torch.randn(N, D, generator=g, dtype=torch.float64)
    adj = torch.randn(N, N, generator=g, dtype=torch.float64) * adj_std
    weights = [torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(7)]
    return [t.to(dtype) for t in (x, memory, adj, *weights)]


def _memory_fn(impl, steps=4, alpha=0.5, causal=False, segment=None):
    return functools.partial(
        graph_diffusion_memory, steps=steps, alpha=alpha, impl=impl, causal=causal, segment=segment
    )


@pytest.mark.parametrize(
    "dtype,impl,causal,segment,steps,alpha",
    [(dt, impl, False, None, 4, 0.5) for dt in DTYPES for impl in ("loop", "batched")]
    + [(torch.float32, "batched", causal, SEG, 4, 0.5) for causal in (True, False)]
    + [(torch.float32, "batched", False, None, k, a) for k, a in ((0, 0.3), (1, 0.3), (5, 1.0), (8, 0.0))],
)
def test_memory_matches_float64_reference(dtype, impl, causal, segment, steps, alpha):
    """Sharp graph (adj_std=3): the nodes stay distinguishable (heavy smoothing: the next test). Segments in
    float32 only: the bf16 loop's own error sits at the tolerance. k=0 or alpha=0: no adjacency gradient."""
    inputs = _memory_inputs(seed=steps, dtype=dtype)
    grad_inputs = [i for i in range(len(inputs)) if i != 2 or (steps and alpha)]
    ref = _memory_fn("loop", steps, alpha, causal, segment)
    cmp = compare_fn(_memory_fn(impl, steps, alpha, causal, segment), ref, inputs, grad_inputs=grad_inputs)
    assert len(cmp.errors) == 1 + len(grad_inputs)


def test_memory_batched_as_accurate_as_loop_when_oversmoothed():
    # Dense graph, alpha=1, k=5: the nodes collapse, the read projections' gradients are ill-conditioned (~1e-3
    # relative error in float32 for both paths): the fast path must be no worse than the reference.
    inputs = _memory_inputs(seed=5, adj_std=1.0, dtype=torch.float32)
    errs = {
        impl: compare_fn(_memory_fn(impl, 5, 1.0), _memory_fn("loop", 5, 1.0), inputs, tol=1.0).max_error
        for impl in ("loop", "batched")
    }
    assert errs["loop"] > tolerance(torch.float32)  # the regime is what this test is about
    assert errs["batched"] <= 2 * errs["loop"]


def test_diffusion_operator_compiles_in_one_graph_in_float32_under_autocast():
    # Regression: its float32 region written as `with off or contextlib.nullcontext()` broke Dynamo's graph on
    # torch 2.11 (five breaks in notebook 04's model, `git show a106036:tools/probes/compile_breaks.py`).
    torch._dynamo.reset()
    adj = torch.randn(16, 16, generator=_gen(2))
    fn = torch.compile(diffusion_operator, fullgraph=True, backend="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, eager = fn(adj, 5, 0.4), diffusion_operator(adj, 5, 0.4)
    assert out.dtype == eager.dtype == torch.float32  # not rounded to the autocast dtype
    torch.testing.assert_close(eager, diffusion_operator(adj, 5, 0.4), rtol=0, atol=0)
    torch.testing.assert_close(out, eager)


def test_memory_no_syncs_and_batched_launches_do_not_grow_with_nodes():
    inputs = _memory_inputs(dtype=torch.float32)
    for impl in ("loop", "batched"):  # neither path reads device values on the host
        with count_syncs() as r:
            graph_diffusion_memory(*inputs, steps=4, alpha=0.5, impl=impl)
        assert r.count == 0, (impl, str(r))

    def n_ops(impl, n_nodes):
        g = _gen(2)
        x = torch.randn(2, 5, 8, generator=g)
        params = [torch.randn(n_nodes, 8, generator=g), torch.randn(n_nodes, n_nodes, generator=g)]
        params += [torch.randn(8, 8, generator=g) for _ in range(7)]
        with count_ops() as c:
            graph_diffusion_memory(x, *params, steps=4, alpha=0.5, impl=impl)
        return c.total

    # The loop's launches grow with N (per-node write and per-node, per-step diffusion); batched's don't.
    assert n_ops("batched", 4) == n_ops("batched", 16) and n_ops("loop", 16) - n_ops("loop", 4) >= 12 * (1 + 4)


@pytest.mark.parametrize("impl", ["loop", "batched"])
@pytest.mark.parametrize("segment", [None, SEG])
def test_memory_causal_mode_sees_no_future_and_decodes(impl, segment):
    """Causal: tokens t+1.. leave the outputs at <= t alone (bidirectional: they do not). decode() over a
    prefill and single tokens, across segment boundaries, == one forward, with no sync."""
    x, *params = _memory_inputs()
    causal = _memory_fn(impl, 3, 0.5, True, segment)
    for t in (0, 4, 5, 11, 35):
        x2 = x.clone()
        x2[:, t + 1 :] += torch.randn(x2[:, t + 1 :].shape, generator=_gen(t), dtype=x.dtype)
        out, out2 = causal(x, *params), causal(x2, *params)
        assert rel_error(out2[:, : t + 1], out[:, : t + 1]) < 1e-13, t
        assert rel_error(out2[:, t + 1 :], out[:, t + 1 :]) > 1e-3, t
    x2 = x.clone()
    x2[:, -1] += 1.0  # bidirectional: the last token changes the first output
    leaky = [_memory_fn(impl, 3, 0.5)(xx, *params)[:, 0] for xx in (x, x2)]
    assert rel_error(leaky[1], leaky[0]) > 1e-6
    torch.manual_seed(1)
    mem = GraphDiffusionMemory(D, N, 3, 0.4, impl=impl, causal=True, segment=segment)
    with torch.no_grad():
        mem.adj_logits.normal_(std=2.0)
    x = torch.randn(B, 23, D, generator=_gen(5))
    with torch.no_grad():
        ref = mem(x)
        cache = mem.new_cache(B, 30)
        pos = torch.zeros((), dtype=torch.long)
        parts = [mem.decode(x[:, :7], cache, pos)]  # 7 tokens: one whole segment and part of the next
        for t in range(7, 17):
            parts.append(mem.decode(x[:, t : t + 1], cache, pos.fill_(t)))
        parts.append(mem.decode(x[:, 17:], cache, pos.fill_(17)))  # 6 tokens across a boundary
        assert rel_error(torch.cat(parts, dim=1), ref) < tolerance(torch.float32)
        mem.reset_cache(cache)  # a new sequence starts from the learned nodes again
        assert rel_error(mem.decode(x[:, :3], cache, pos.zero_()), ref[:, :3]) < tolerance(torch.float32)
    with count_syncs() as r, torch.no_grad():
        mem.decode(x[:, 20:21], cache, pos.fill_(20))
    assert r.count == 0, str(r)


def test_memory_rejects_bad_config_and_inputs():
    mod, causal = GraphDiffusionMemory(D, N), GraphDiffusionMemory(D, N, causal=True, segment=4)
    cache = causal.new_cache(B, 8)
    bad_adj = _memory_inputs()
    bad_adj[2] = bad_adj[2][:, :-1]
    for call, err, match in [
        (lambda: GraphDiffusionMemory(D, steps=-1), ValueError, "GraphDiffusionMemory: steps"),
        (lambda: GraphDiffusionMemory(D, alpha=1.5), ValueError, "GraphDiffusionMemory: alpha"),
        (lambda: GraphDiffusionMemory(D, impl="fast"), ValueError, "GraphDiffusionMemory: impl"),
        (lambda: GraphDiffusionMemory(D, n_nodes=0), ValueError, "GraphDiffusionMemory: n_nodes"),
        (lambda: GraphDiffusionMemory(D, segment=0), ValueError, "GraphDiffusionMemory: segment"),
        (lambda: mod(torch.randn(T, D)), ValueError, "x must be a \\(B, T, D\\)"),
        (lambda: mod(torch.ones(B, T, D, dtype=torch.long)), TypeError, "floating"),
        (lambda: mod(torch.randn(B, T, D + 1)), ValueError, "graph_diffusion_memory: memory must be"),
        (lambda: mod(torch.randn(B, T, D, dtype=torch.float64)), ValueError, "convert the module"),
        (lambda: graph_diffusion_memory(*bad_adj), ValueError, "adj_logits must be"),
        (lambda: diffusion_operator(torch.zeros(3, 4), 2, 0.5), ValueError, "square"),
        (lambda: mod.new_cache(B, 8), ValueError, "causal=True"),  # bidirectional: cannot decode
        (lambda: causal.decode(torch.randn(B + 1, 1, D), cache, torch.tensor(0)), ValueError, "batch=3"),
        (lambda: causal.decode(torch.randn(B, 1, D), cache, 0), TypeError, "start_pos"),
    ]:
        with pytest.raises(err, match=match):
            call()


# -- DynamicNeuroFabric -----------------------------------------------------------------------------
def _fabric_inputs(seed=0, dtype=torch.float64):
    """x, gate weight, gate bias and L layer weights; a per-sample offset makes the gates differ."""
    g = _gen(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64) + torch.randn(B, 1, D, generator=g, dtype=torch.float64)
    gate_w = torch.randn(L, D, generator=g, dtype=torch.float64) / D**0.5
    gate_b = torch.randn(L, generator=g, dtype=torch.float64) * 0.5
    layer_ws = [torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(L)]
    return [t.to(dtype) for t in (x, gate_w, gate_b, *layer_ws)]


def _layers(ws):
    return [functools.partial(lambda h, w: torch.tanh(F.linear(h, w)), w=w) for w in ws]  # per token


def _fabric_fn(impl, threshold, **kw):
    def fn(x, gate_w, gate_b, *layer_ws):
        return fabric_forward(x, gate_w, gate_b, _layers(layer_ws), threshold=threshold, impl=impl, **kw)

    return fn


def _thresholds(margin: float = 0.01) -> list[float]:
    """The 3 thresholds in the widest gaps between the float64 gate values that split some layer between
    samples; no gate lies within ``margin`` of them, so every dtype switches the same pairs."""
    gates = fabric_gates(*_fabric_inputs()[:3])
    vals = gates.flatten().sort().values
    cands = []
    for j in range(len(vals) - 1):
        t = float(vals[j] + vals[j + 1]) / 2
        on = gates > t
        if vals[j + 1] - vals[j] > 2 * margin and (on.any(0) & ~on.all(0)).any():
            cands.append((float(vals[j + 1] - vals[j]), t))
    assert len(cands) >= 3, "test data has too few clean gaps"
    return sorted(t for _, t in sorted(cands, reverse=True)[:3])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_fabric_matches_float64_reference(dtype, which):
    threshold = _thresholds()[which]
    # Layers that are off for every sample never run in the branch path (no gradient at all there).
    used = (fabric_gates(*_fabric_inputs()[:3]) > threshold).any(0)
    grad_inputs = [0, 1, 2] + [3 + l for l in range(L) if used[l]]
    inputs = _fabric_inputs(dtype=dtype)
    ref = _fabric_fn("branch", threshold)
    errs = {
        impl: compare_fn(_fabric_fn(impl, threshold), ref, inputs, grad_inputs=grad_inputs, tol=1.0).errors
        for impl in ("branch", "masked")
    }
    tol = tolerance(dtype)
    for key, err in errs["masked"].items():
        if key in ("grad1", "grad2") and dtype == torch.bfloat16:
            # The gate gradient cancels over T*D: ~1e-2 error in bf16 on both paths; be as accurate as the reference.
            assert err <= max(tol, 1.5 * errs["branch"][key]), (key, err, errs["branch"][key])
        else:
            assert err <= tol, (key, err)
            assert errs["branch"][key] <= tol, ("branch", key, errs["branch"][key])


@pytest.mark.parametrize("impl", ["branch", "masked"])
def test_fabric_gates_gradients_extreme_thresholds_and_first_token_gates(impl):
    """Only active layers get a gate gradient; thresholds 1 and 0 skip and run every layer. gate_source=
    "first": gates from x[:, 0], so tokens t+1.. leave the outputs at <= t alone (the mean gates leak)."""
    x, gw, gb, *ws = _fabric_inputs()
    gb = gb.clone()
    gb[1] = -20.0  # layer 1 off for every sample
    g = fabric_gates(x, gw, gb)
    assert ((g - 0.5).abs() > 1e-3).all()
    gw_, gb_ = gw.clone().requires_grad_(True), gb.clone().requires_grad_(True)
    fabric_forward(x, gw_, gb_, _layers(ws), threshold=0.5, impl=impl).sum().backward()
    used = (g > 0.5).any(0)
    assert not used[1] and used.sum() >= 3
    # The step function passes no gradient: a layer off for every sample gets none; the others do.
    assert torch.all(gb_.grad[~used] == 0) and torch.all(gw_.grad[~used] == 0)
    assert torch.all(gb_.grad[used] != 0)
    assert torch.equal(_fabric_fn(impl, 1.0)(x, gw, gb, *ws), x)  # no gate exceeds 1: all skipped
    ref = x
    for f, gl in zip(_layers(ws), fabric_gates(x, gw, gb).T):
        ref = ref + gl[:, None, None] * f(ref)
    assert rel_error(_fabric_fn(impl, 0.0)(x, gw, gb, *ws), ref) < 1e-13  # all on
    gb = _fabric_inputs()[2]  # layer 1 back on
    g = fabric_gates(x, gw, gb, source="first")
    assert rel_error(g, torch.sigmoid(F.linear(x[:, 0], gw, gb))) < 1e-15
    threshold = float(g.flatten().sort().values[g.numel() // 2 - 1 : g.numel() // 2 + 1].mean())  # half on

    def run(xx, source, **kw):
        return fabric_forward(xx, gw, gb, _layers(ws), threshold=threshold, impl=impl, gate_source=source, **kw)

    for t in (0, 9):
        x2 = x.clone()
        x2[:, t + 1 :] += 3.0
        assert torch.equal(run(x2, "first")[:, : t + 1], run(x, "first")[:, : t + 1])
        assert not torch.equal(run(x2, "mean")[:, : t + 1], run(x, "mean")[:, : t + 1])
    assert torch.equal(run(x, "mean", gates=g), run(x, "first"))  # given gates replace the computed ones
    assert torch.equal(run(x, "first", gates=torch.zeros(B, L, dtype=x.dtype)), x)


def test_fabric_syncs_and_plan():
    x, gw, gb, *ws = _fabric_inputs(dtype=torch.float32)
    branch = _fabric_fn("branch", _thresholds()[1])
    with count_syncs() as r:
        branch(x, gw, gb, *ws)
    assert r.ops["aten._local_scalar_dense"] == B * L  # one `if` per (sample, layer)
    fab = DynamicNeuroFabric(D, L)
    assert torch.all(fab.gates(x) > 0.5)  # default init: every layer starts on
    with torch.no_grad():
        fab.gate.weight.copy_(gw)
        fab.gate.bias.copy_(gb)
        fab.gate.bias[1] = fab.gate.bias[3] = -20.0  # layers 1 and 3 off for every sample
    plan = fab.plan(x)
    assert plan.active == tuple((fab.gates(x) > 0.5).any(0).tolist()) and plan.n_skipped >= 2
    calls = []
    layers = [functools.partial(lambda h, l: calls.append(l) or torch.tanh(h @ ws[l]), l=l) for l in range(L)]
    with count_syncs() as r:  # the masked path, with or without a plan, makes no sync
        ref = fab(x, layers)
        calls.clear()
        out = fab(x, layers, plan=plan)
    assert r.count == 0 and torch.equal(out, ref)
    assert [l in calls for l in range(L)] == list(plan.active)  # skipped layers never ran
    fab.impl = "branch"
    assert rel_error(fab(x, layers, plan=plan), ref) < tolerance(torch.float32)


def test_fabric_rejects_bad_config_and_inputs():
    fab, layers, x = DynamicNeuroFabric(D, L), [nn.Identity()] * L, torch.randn(B, T, D)
    for call, err, match in [
        (lambda: DynamicNeuroFabric(D, L, threshold=1.5), ValueError, "DynamicNeuroFabric: threshold"),
        (lambda: DynamicNeuroFabric(D, L, impl="if"), ValueError, "DynamicNeuroFabric: impl"),
        (lambda: DynamicNeuroFabric(D, L, gate_source="last"), ValueError, "DynamicNeuroFabric: gate_source"),
        (lambda: DynamicNeuroFabric(D, 0), ValueError, "n_layers"),
        (lambda: fab(x, layers[:4]), ValueError, "layers must be 5 callables"),
        (lambda: fab(x, [1] * L), ValueError, "layers must be 5 callables"),
        (lambda: fab(torch.randn(B, T, D + 1), layers), ValueError, "gate_weight must be"),
        (lambda: fab(torch.randn(T, D), layers), ValueError, "x must be"),
        (lambda: fab(x, layers, plan=[True] * L), ValueError, "plan must be"),
        (lambda: fab(x, layers, gates=torch.ones(B, L - 1)), ValueError, "gates must be a floating"),
        (lambda: fab(torch.ones(B, T, D, dtype=torch.int32), layers), TypeError, "floating"),
    ]:
        with pytest.raises(err, match=match):
            call()


# -- momentum memory update -------------------------------------------------------------------------
SHAPES = [(D, 37), (7,), (3, 5, 11), (D, D), (1,)]


def _hyper(kind: str, seed: int = 0):
    g = _gen(seed)
    if kind == "float":
        return 0.9, 0.05, 0.01
    if kind == "0-dim":
        return torch.tensor(0.9), torch.tensor(0.05), torch.tensor(0.01)
    n = len(SHAPES)
    return torch.rand(n, generator=g), torch.rand(n, generator=g) * 0.1, torch.rand(n, generator=g) * 0.1


def _state(dtype, seed=0):
    g = _gen(seed)
    return [[torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in SHAPES] for _ in range(3)]


def _flat(ts):
    return torch.cat([t.flatten().double() for t in ts])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["float", "0-dim", "per-layer"])
@pytest.mark.parametrize("update", [momentum_update_loop, momentum_update_foreach])
def test_momentum_matches_float64_reference(dtype, kind, update):
    hyper = _hyper(kind)
    ref_w, ref_m, ref_g = _state(torch.float64)
    momentum_update_loop(ref_w, ref_m, ref_g, *(h.double() if torch.is_tensor(h) else h for h in hyper))
    w, m, g = _state(dtype)
    ptrs, g_before = [t.data_ptr() for t in w + m], [t.clone() for t in g]
    with count_syncs() as r:
        assert update(w, m, g, *hyper) is None
    # the loop reads eta, theta and alpha of every layer on the host (.item()); foreach reads nothing
    assert r.count == (3 * len(SHAPES) if update is momentum_update_loop and kind != "float" else 0), str(r)
    assert [t.data_ptr() for t in w + m] == ptrs  # in place
    assert all(torch.equal(a, b) for a, b in zip(g, g_before))  # gradients only read
    assert rel_error(_flat(m), _flat(ref_m)) <= tolerance(dtype)
    assert rel_error(_flat(w), _flat(ref_w)) <= tolerance(dtype)
    if dtype == torch.float64:  # the formula by hand on one layer
        w0, m0, g0 = _state(torch.float64)
        eta, theta, alpha = (h[1].item() if torch.is_tensor(h) and h.dim() else float(h) for h in hyper)
        m1 = eta * m0[1] - theta * g0[1]
        torch.testing.assert_close(m[1], m1)
        torch.testing.assert_close(w[1], (1 - alpha) * w0[1] + m1)


def test_momentum_rejects_bad_inputs():
    w, m, g = _state(torch.float32)
    for args, match in [
        ((w, m[:-1], g, 0.9, 0.1, 0.01), "weights, moms and grads must be lists"),
        (([], [], [], 0.9, 0.1, 0.01), "weights, moms and grads must be lists"),
        ((w, [m[1]] + m[1:], g, 0.9, 0.1, 0.01), "layer 0: weights, moms and grads must share"),
        ((w, m, [t.double() for t in g], 0.9, 0.1, 0.01), "layer 0"),
        ((w, m, g, 0.9, 0.1, 1.5), "alpha must be a float in"),
        ((w, m, g, 0.9, -0.1, 0.01), "theta must be a float in"),
        ((w, m, g, torch.rand(4), 0.1, 0.01), r"eta must be a floating 0-dim or \(5,\) tensor"),
        ((w, m, g, torch.tensor(1), 0.1, 0.01), "eta must be a floating"),
    ]:
        for update in (momentum_update_loop, momentum_update_foreach):
            with pytest.raises(ValueError, match=f"{update.__name__}: {match}"):
                update(*args)


# -- benchmark suite (smoke) ------------------------------------------------------------------------
def test_hybrid_bench_quick(tmp_path):
    from mahia.bench import hybrid_parts
    from mahia.measure.results import Recorder

    rec = Recorder("bench_hybrid", "cpu", results_dir=tmp_path)
    hybrid_parts.run(rec, None, quick=True)
    df = rec.frame()
    assert set(zip(df["experiment"], df["variant"], df["role"])) == {
        ("graph_memory_fwd", "loop", "baseline"),
        ("graph_memory_fwd", "batched", "optimized"),
        ("fabric_fwd", "branch", "baseline"),
        ("fabric_fwd", "masked", "optimized"),
        ("momentum_update", "loop", "baseline"),
        ("momentum_update", "foreach", "optimized"),
    }
    assert (df["rel_err"] <= tolerance(torch.float32)).all() and (df["median_ms"] > 0).all()
