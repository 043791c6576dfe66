"""GraphDiffusionMemory, DynamicNeuroFabric and the momentum memory update: before == after.

Every fast path is compared with a float64 run of the reference path (outputs and gradients) at the
tolerance of its dtype (``mahia.measure.checks``), on odd shapes; the fast paths must make no syncing op.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mahia.measure.checks import compare_fn, rel_error, tolerance
from mahia.measure.instruments import count_syncs
from mahia.model.fabric import DynamicNeuroFabric, FabricPlan, fabric_forward, fabric_gates, fabric_plan
from mahia.model.memory import (
    GraphDiffusionMemory,
    MemoryCache,
    diffusion_operator,
    graph_diffusion_memory,
    graph_diffusion_write,
)
from mahia.model.momentum import MomentumMemory, momentum_update_foreach, momentum_update_loop

B, T, D, N, L = 3, 37, 40, 7, 5
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _OpCounter(TorchDispatchMode):
    """Counts ATen ops (a proxy for kernel launches)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


# -- GraphDiffusionMemory ---------------------------------------------------------------------------
def _memory_inputs(seed=0, adj_std=3.0, dtype=torch.float64):
    """x and the ten parameters of graph_diffusion_memory, in float64 then cast."""
    g = _gen(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    memory = torch.randn(N, D, generator=g, dtype=torch.float64)
    adj = torch.randn(N, N, generator=g, dtype=torch.float64) * adj_std
    weights = [torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(7)]
    return [t.to(dtype) for t in (x, memory, adj, *weights)]


def _memory_fn(impl, steps, alpha):
    return functools.partial(graph_diffusion_memory, steps=steps, alpha=alpha, impl=impl)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", ["loop", "batched"])
def test_memory_matches_float64_reference(dtype, impl):
    # Sharp graph (adj_std=3) and alpha=0.5, k=4: the nodes stay distinguishable after diffusion. (With
    # heavy smoothing the read-projection gradients depend on tiny differences between nearly equal
    # nodes and lose their relative precision in bfloat16, in both paths alike.)
    inputs = _memory_inputs(dtype=dtype)
    cmp = compare_fn(_memory_fn(impl, 4, 0.5), _memory_fn("loop", 4, 0.5), inputs, name=f"memory {impl}")
    assert len(cmp.errors) == 1 + len(inputs)  # output and every input's gradient were compared


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_memory_batched_equals_loop_across_steps(steps, alpha):
    inputs = _memory_inputs(seed=steps, adj_std=3.0, dtype=torch.float32)
    # With k=0 or alpha=0 the graph is not used, so the adjacency gets no gradient in either path.
    grad_inputs = [i for i in range(len(inputs)) if i != 2 or (steps and alpha)]
    compare_fn(
        _memory_fn("batched", steps, alpha),
        _memory_fn("loop", steps, alpha),
        inputs,
        grad_inputs=grad_inputs,
        name=f"memory batched k={steps} alpha={alpha}",
    )


def test_memory_batched_as_accurate_as_loop_when_oversmoothed():
    # Dense graph, alpha=1, k=5: the nodes collapse towards their mean, the read attention becomes
    # nearly uniform and its projections' gradients are ill-conditioned (~1e-3 relative error in
    # float32 for BOTH paths). Then the fast path must simply be no worse than the reference path.
    inputs = _memory_inputs(seed=5, adj_std=1.0, dtype=torch.float32)
    errs = {
        impl: compare_fn(_memory_fn(impl, 5, 1.0), _memory_fn("loop", 5, 1.0), inputs, tol=1.0).max_error
        for impl in ("loop", "batched")
    }
    assert errs["loop"] > tolerance(torch.float32)  # the regime is what this test is about
    assert errs["batched"] <= 2 * errs["loop"]


def test_diffusion_operator_is_k_steps():
    g = _gen(1)
    adj = torch.randn(N, N, generator=g, dtype=torch.float64)
    m = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    a_hat = torch.softmax(adj, dim=-1)
    for steps in range(0, 10):
        ref = m
        for _ in range(steps):
            ref = ref + 0.4 * (a_hat @ ref - ref)
        pk = diffusion_operator(adj, steps, 0.4)
        assert rel_error(pk @ m, ref) < 1e-13, steps
        torch.testing.assert_close(pk.sum(-1), torch.ones(N, dtype=torch.float64))  # row-stochastic
    # Built in float32 for a bfloat16 graph, returned in bfloat16.
    assert diffusion_operator(adj.bfloat16(), 4, 0.4).dtype == torch.bfloat16


def test_diffusion_operator_compiles_in_one_graph_under_autocast():
    # Its float32 region is a plain `with torch.autocast(..., enabled=False)`. Written as
    # `with off or contextlib.nullcontext()` it broke Dynamo's graph on torch 2.11 (the GPU machine's: five
    # breaks in notebook 04's two-layer model, `git show a106036:tools/probes/compile_breaks.py`), though not on the torch CI
    # installs; so the pattern itself is looked for too: no context manager of the model's code (what
    # torch.compile traces) is chosen by an `or`/`and` or a conditional expression in its `with`.
    import ast
    from pathlib import Path

    torch._dynamo.reset()
    adj = torch.randn(N, N, generator=_gen(2)).bfloat16()
    fn = torch.compile(diffusion_operator, fullgraph=True, backend="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(adj, 5, 0.4)
    torch.testing.assert_close(out, diffusion_operator(adj, 5, 0.4))
    root = Path(__file__).resolve().parents[1] / "mahia"
    chosen = [
        f"{path.relative_to(root.parent)}:{item.context_expr.lineno}"
        for path in sorted(p for sub in ("model", "layers", "ops") for p in (root / sub).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.With, ast.AsyncWith))
        for item in node.items
        if isinstance(item.context_expr, (ast.BoolOp, ast.IfExp))
    ]
    assert not chosen, f"a context manager chosen inside `with` (Dynamo may break the graph there): {chosen}"


def test_memory_module_paths_agree_with_gradients():
    torch.manual_seed(0)
    fast = GraphDiffusionMemory(D, N, 3, 0.4, impl="batched")
    with torch.no_grad():
        fast.adj_logits.normal_(std=2.0)
    slow = copy.deepcopy(fast)
    slow.impl = "loop"
    x = torch.randn(B, T, D, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out_fast, out_slow = fast(x), slow(x2)
    assert out_fast.shape == (B, T, D)
    assert rel_error(out_fast, out_slow) < tolerance(torch.float32)
    gy = torch.randn_like(out_fast)
    (out_fast * gy).sum().backward()
    (out_slow * gy).sum().backward()
    assert rel_error(x.grad, x2.grad) < tolerance(torch.float32)
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        assert rel_error(p.grad, q.grad) < tolerance(torch.float32), name


def test_memory_no_syncs_and_batched_launches_do_not_grow_with_nodes():
    inputs = _memory_inputs(dtype=torch.float32)
    for impl in ("loop", "batched"):  # neither path reads device values on the host
        with count_syncs() as r:
            graph_diffusion_memory(*inputs, steps=4, alpha=0.5, impl=impl)
        assert r.count == 0, (impl, str(r))

    def n_ops(impl, n_nodes):
        g = _gen(2)
        x = torch.randn(2, 5, 8, generator=g)
        params = [
            torch.randn(n_nodes, 8, generator=g),
            torch.randn(n_nodes, n_nodes, generator=g),
            *[torch.randn(8, 8, generator=g) for _ in range(7)],
        ]
        with _OpCounter() as c:
            graph_diffusion_memory(x, *params, steps=4, alpha=0.5, impl=impl)
        return c.n

    # The loop's launches grow with N (per-node write and per-node, per-step diffusion); batched's don't.
    assert n_ops("batched", 4) == n_ops("batched", 16)
    assert n_ops("loop", 16) - n_ops("loop", 4) >= 12 * (1 + 4)


# -- GraphDiffusionMemory, causal mode and state ----------------------------------------------------
SEG = 5  # T = 37: seven whole segments and a short last one of 2 tokens


def _causal_fn(impl, causal=True, segment=SEG):
    """graph_diffusion_memory with the initial state as the last input (so compare_fn differentiates it)."""

    def fn(*inputs):
        return graph_diffusion_memory(
            *inputs[:-1], steps=3, alpha=0.5, impl=impl, causal=causal, segment=segment, state=inputs[-1]
        )

    return fn


def _with_state(inputs, seed=7):
    g = _gen(seed)
    return inputs + [torch.randn(B, N, D, generator=g, dtype=torch.float64).to(inputs[0].dtype)]


@pytest.mark.parametrize("causal", [True, False])
def test_memory_segments_match_float64_reference(causal):
    """Segments and a carried state, both modes: the batched path against the float64 loop, with
    gradients (of x, the nodes, the graph, the seven projections and the state). float32: the bfloat16
    rounding of the shared write/diffuse/read code is covered above; here the loop reference's own
    bfloat16 error (~2e-2 on the read-query gradient, summed over 8 segments) sits at the tolerance."""
    inputs = _with_state(_memory_inputs(dtype=torch.float32))
    cmp = compare_fn(
        _causal_fn("batched", causal), _causal_fn("loop", causal), inputs, name=f"memory batched causal={causal}"
    )
    assert len(cmp.errors) == 1 + len(inputs)


@pytest.mark.parametrize("impl", ["loop", "batched"])
@pytest.mark.parametrize("segment", [None, SEG])
def test_memory_causal_mode_sees_no_future(impl, segment):
    """Perturbing tokens t+1.. leaves the outputs at <= t unchanged in causal mode (and changes them in
    bidirectional mode, so the check can fail)."""
    inputs = _memory_inputs()
    x = inputs[0]
    for t in (0, 4, 5, 11, 35):
        x2 = x.clone()
        x2[:, t + 1 :] += torch.randn(x2[:, t + 1 :].shape, generator=_gen(t), dtype=x.dtype)
        out, out2 = (_causal_fn(impl, True, segment)(xx, *inputs[1:], None) for xx in (x, x2))
        assert rel_error(out2[:, : t + 1], out[:, : t + 1]) < 1e-13, t
        assert rel_error(out2[:, t + 1 :], out[:, t + 1 :]) > 1e-3, t
    x2 = x.clone()
    x2[:, -1] += 1.0  # bidirectional: the last token changes the first output
    leaky = [_causal_fn(impl, False, None)(xx, *inputs[1:], None)[:, 0] for xx in (x, x2)]
    assert rel_error(leaky[1], leaky[0]) > 1e-6


@pytest.mark.parametrize("impl", ["loop", "batched"])
def test_memory_state_carries_across_calls(impl):
    """forward over [x1, x2] == forward(x1) then forward(x2, state=write(x1)) when x1 ends on a segment
    boundary; write is the same in both paths; segment=None reads only the given state."""
    torch.manual_seed(0)
    mem = GraphDiffusionMemory(D, N, 3, 0.4, impl=impl, causal=True, segment=SEG).double()
    with torch.no_grad():
        mem.adj_logits.normal_(std=2.0)
    x = torch.randn(B, T, D, generator=_gen(3), dtype=torch.float64)
    cut = 3 * SEG
    streamed = torch.cat([mem(x[:, :cut]), mem(x[:, cut:], mem.write(x[:, :cut]))], dim=1)
    assert rel_error(streamed, mem(x)) < 1e-13
    other = copy.deepcopy(mem)
    other.impl = "batched" if impl == "loop" else "loop"
    state = torch.randn(B, N, D, generator=_gen(4), dtype=torch.float64)
    assert rel_error(mem.write(x, state), other.write(x, state)) < 1e-13
    whole = copy.deepcopy(mem)
    whole.segment = None  # causal, one segment: out = read(x, P^k state), the state never changes
    assert rel_error(whole(x[:, :4], state), whole(x, state)[:, :4]) < 1e-13
    assert rel_error(whole(x, state), whole(x, state + 1.0)) > 1e-3  # the state is read
    assert (
        rel_error(
            whole.write(x, state) - state,
            graph_diffusion_write(
                x, mem.memory, *(mem.proj[k].weight for k in ("write_q", "write_k", "write_v")), impl=impl
            )
            - mem.memory,
        )
        < 1e-13
    )  # W(x) does not depend on the state


@pytest.mark.parametrize("impl", ["loop", "batched"])
@pytest.mark.parametrize("segment", [None, SEG])
def test_memory_decode_matches_forward(impl, segment):
    """decode() over a prefill and single tokens (crossing segment boundaries) == one forward."""
    torch.manual_seed(1)
    mem = GraphDiffusionMemory(D, N, 3, 0.4, impl=impl, causal=True, segment=segment)
    with torch.no_grad():
        mem.adj_logits.normal_(std=2.0)
    x = torch.randn(B, 23, D, generator=_gen(5))
    with torch.no_grad():
        ref = mem(x)
        cache = mem.new_cache(B, 30)
        assert isinstance(cache, MemoryCache)
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
    bad = [
        (dict(steps=-1), "steps"),
        (dict(steps=1.5), "steps"),
        (dict(steps=True), "steps"),
        (dict(alpha=-0.1), "alpha"),
        (dict(alpha=1.5), "alpha"),
        (dict(alpha="0.5"), "alpha"),
        (dict(impl="fast"), "impl"),
        (dict(n_nodes=0), "n_nodes"),
        (dict(dim=0), "dim"),
    ]
    for kwargs, match in bad:
        args = {"dim": D, "n_nodes": N, **kwargs}
        with pytest.raises(ValueError, match=match):
            GraphDiffusionMemory(args.pop("dim"), **args)
    mod = GraphDiffusionMemory(D, N)
    with pytest.raises(ValueError, match="x must be a \\(B, T, D\\)"):
        mod(torch.randn(T, D))
    with pytest.raises(ValueError, match="memory must be"):
        mod(torch.randn(B, T, D + 1))
    with pytest.raises(ValueError, match="at least one"):
        mod(torch.randn(B, 0, D))
    with pytest.raises(TypeError, match="floating"):
        mod(torch.ones(B, T, D, dtype=torch.long))
    with pytest.raises(TypeError, match="convert the module"):
        mod(torch.randn(B, T, D, dtype=torch.float64))
    inputs = _memory_inputs()
    inputs[2] = inputs[2][:, :-1]
    with pytest.raises(ValueError, match="adj_logits"):
        graph_diffusion_memory(*inputs)
    inputs = _memory_inputs()
    inputs[5] = inputs[5][:-1]
    with pytest.raises(ValueError, match="write_v"):
        graph_diffusion_memory(*inputs)
    with pytest.raises(ValueError, match="square"):
        diffusion_operator(torch.zeros(3, 4), 2, 0.5)
    with pytest.raises(TypeError, match="causal must be a bool"):
        GraphDiffusionMemory(D, N, causal=1)
    for segment in (0, 2.5, True):
        with pytest.raises(ValueError, match="segment"):
            GraphDiffusionMemory(D, N, segment=segment)
    causal = GraphDiffusionMemory(D, N, causal=True, segment=4)
    with pytest.raises(ValueError, match="state must be"):
        causal(torch.randn(B, T, D), torch.randn(N, D))
    with pytest.raises(TypeError, match="state is"):
        causal(torch.randn(B, T, D), torch.randn(B, N, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="causal=True"):
        mod.new_cache(B, 8)  # bidirectional: cannot decode
    cache = causal.new_cache(B, 8)
    with pytest.raises(ValueError, match="batch=3"):
        causal.decode(torch.randn(B + 1, 1, D), cache, torch.zeros((), dtype=torch.long))
    with pytest.raises(TypeError, match="start_pos"):
        causal.decode(torch.randn(B, 1, D), cache, 0)


# -- DynamicNeuroFabric -----------------------------------------------------------------------------
def _fabric_inputs(seed=0, dtype=torch.float64):
    """x, gate weight, gate bias and L layer weights; a per-sample offset makes the gates differ."""
    g = _gen(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64) + torch.randn(B, 1, D, generator=g, dtype=torch.float64)
    gate_w = torch.randn(L, D, generator=g, dtype=torch.float64) / D**0.5
    gate_b = torch.randn(L, generator=g, dtype=torch.float64) * 0.5
    layer_ws = [torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(L)]
    return [t.to(dtype) for t in (x, gate_w, gate_b, *layer_ws)]


def _fabric_fn(impl, threshold, plan=None):
    def fn(x, gate_w, gate_b, *layer_ws):
        layers = [functools.partial(lambda h, w: torch.tanh(F.linear(h, w)), w=w) for w in layer_ws]
        return fabric_forward(x, gate_w, gate_b, layers, threshold=threshold, impl=impl, plan=plan)

    return fn


def _thresholds(gates: torch.Tensor, margin: float = 0.01) -> list[float]:
    """The 3 thresholds in the widest gaps between gate values that split some layer between samples
    (on for some, off for others); no gate lies within ``margin`` of them, so every dtype switches
    the same (sample, layer) pairs."""
    vals = gates.flatten().sort().values
    cands = []
    for j in range(len(vals) - 1):
        t = float(vals[j] + vals[j + 1]) / 2
        on = gates > t
        if vals[j + 1] - vals[j] > 2 * margin and (on.any(0) & ~on.all(0)).any():
            cands.append((float(vals[j + 1] - vals[j]), t))
    assert len(cands) >= 3, "test data has too few clean gaps"
    return sorted(t for _, t in sorted(cands, reverse=True)[:3])


def _fabric_gates64():
    x, gw, gb, *_ = _fabric_inputs()
    return fabric_gates(x, gw, gb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_fabric_matches_float64_reference(dtype, which):
    gates = _fabric_gates64()
    threshold = _thresholds(gates)[which]
    # Layers that are off for every sample never run in the branch path (no gradient at all there).
    used = (gates > threshold).any(0)
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
            # The gate gradient is a dot product over T*D of the upstream gradient with f_l(x): with
            # cancellation it carries ~1e-2 relative error in bfloat16 in both paths. The fast path
            # must be as accurate as the reference path there.
            assert err <= max(tol, 1.5 * errs["branch"][key]), (key, err, errs["branch"][key])
        else:
            assert err <= tol, (key, err)
            assert errs["branch"][key] <= tol, ("branch", key, errs["branch"][key])


def test_fabric_gate_gradient_only_where_active():
    x, gw, gb, *ws = _fabric_inputs()
    gb = gb.clone()
    gb[1] = -20.0  # layer 1 off for every sample
    threshold = 0.5
    g = fabric_gates(x, gw, gb)
    assert ((g - threshold).abs() > 1e-3).all()
    grads = []
    for impl in ("branch", "masked"):
        gw_, gb_ = gw.clone().requires_grad_(True), gb.clone().requires_grad_(True)
        layers = [functools.partial(lambda h, w: torch.tanh(h @ w), w=w) for w in ws]
        fabric_forward(x, gw_, gb_, layers, threshold=threshold, impl=impl).sum().backward()
        grads.append((gw_.grad, gb_.grad))
    used = (g > threshold).any(0)
    assert not used[1] and used.sum() >= 3
    for gw_grad, gb_grad in grads:
        # The step function passes no gradient: a layer off for every sample gets none; the others do.
        assert torch.all(gb_grad[~used] == 0) and torch.all(gw_grad[~used] == 0)
        assert torch.all(gb_grad[used] != 0)
    assert rel_error(grads[1][0], grads[0][0]) < 1e-12 and rel_error(grads[1][1], grads[0][1]) < 1e-12


@pytest.mark.parametrize("threshold", [0.0, 1.0])
def test_fabric_extreme_thresholds(threshold):
    x, gw, gb, *ws = _fabric_inputs()
    outs = [_fabric_fn(impl, threshold)(x, gw, gb, *ws) for impl in ("branch", "masked")]
    assert rel_error(outs[1], outs[0]) < 1e-12
    if threshold == 1.0:  # no gate exceeds 1: every layer skipped
        assert torch.equal(outs[0], x) and torch.equal(outs[1], x)


def test_fabric_syncs():
    inputs = _fabric_inputs(dtype=torch.float32)
    threshold = _thresholds(_fabric_gates64())[1]
    with count_syncs() as r:
        _fabric_fn("branch", threshold)(*inputs)
    assert r.ops["aten._local_scalar_dense"] == B * L  # one `if` per (sample, layer)
    with count_syncs() as r:
        _fabric_fn("masked", threshold)(*inputs)
    assert r.count == 0, str(r)


def test_fabric_plan_skips_layers_off_for_the_whole_batch():
    x, gw, gb, *ws = _fabric_inputs(dtype=torch.float32)
    gb = gb.clone()
    gb[1] = gb[3] = -20.0  # layers 1 and 3 off for every sample
    plan = fabric_plan(x, gw, gb, threshold=0.5)
    assert plan == FabricPlan(tuple((fabric_gates(x, gw, gb) > 0.5).any(0).tolist()))
    assert not plan.active[1] and not plan.active[3] and plan.n_skipped >= 2
    calls = [0] * L

    def layer(h, l):
        calls[l] += 1
        return torch.tanh(h @ ws[l])

    layers = [functools.partial(layer, l=l) for l in range(L)]
    ref = fabric_forward(x, gw, gb, layers, threshold=0.5, impl="masked")
    calls[:] = [0] * L
    with count_syncs() as r:
        out = fabric_forward(x, gw, gb, layers, threshold=0.5, impl="masked", plan=plan)
    assert r.count == 0
    assert torch.equal(out, ref)
    assert [c > 0 for c in calls] == list(plan.active)  # skipped layers were never called
    out_branch = fabric_forward(x, gw, gb, layers, threshold=0.5, impl="branch", plan=plan)
    assert rel_error(out_branch, ref) < tolerance(torch.float32)


def test_fabric_module_with_modulelist():
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(D, D) for _ in range(L))
    fast = DynamicNeuroFabric(D, L, threshold=0.6, impl="masked")
    with torch.no_grad():
        fast.gate.bias.copy_(torch.linspace(-1, 1, L))  # default bias +2 would switch every layer on
    slow = copy.deepcopy(fast)
    slow.impl = "branch"
    x = torch.randn(B, T, D) + torch.randn(B, 1, D)
    assert rel_error(fast(x, layers), slow(x, layers)) < tolerance(torch.float32)
    assert fast(x, layers, plan=fast.plan(x)).shape == (B, T, D)
    assert torch.all(DynamicNeuroFabric(D, L).gates(x) > 0.5)  # default init: every layer starts on


@pytest.mark.parametrize("impl", ["branch", "masked"])
def test_fabric_first_token_gates_are_causal(impl):
    """gate_source="first": gates from x[:, 0] only; with per-token layers, perturbing tokens t+1..
    leaves the outputs at <= t unchanged. The mean gates do leak (so the check can fail)."""
    x, gw, gb, *ws = _fabric_inputs()
    g = fabric_gates(x, gw, gb, source="first")
    assert rel_error(g, torch.sigmoid(F.linear(x[:, 0], gw, gb))) < 1e-15
    threshold = float(g.flatten().sort().values[g.numel() // 2 - 1 : g.numel() // 2 + 1].mean())  # half on
    layers = [functools.partial(lambda h, w: torch.tanh(F.linear(h, w)), w=w) for w in ws]  # per token

    def run(xx, source):
        return fabric_forward(xx, gw, gb, layers, threshold=threshold, impl=impl, gate_source=source)

    for t in (0, 9):
        x2 = x.clone()
        x2[:, t + 1 :] += 3.0
        assert torch.equal(run(x2, "first")[:, : t + 1], run(x, "first")[:, : t + 1])
        assert not torch.equal(run(x2, "mean")[:, : t + 1], run(x, "mean")[:, : t + 1])


def test_fabric_explicit_gates():
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(D, D) for _ in range(L))
    x = torch.randn(B, T, D) + torch.randn(B, 1, D)
    for impl in ("branch", "masked"):
        fab = DynamicNeuroFabric(D, L, threshold=0.6, impl=impl, gate_source="first")
        with torch.no_grad():
            fab.gate.bias.copy_(torch.linspace(-1, 1, L))
        assert torch.equal(fab(x, layers, gates=fab.gates(x)), fab(x, layers))
        # Other gates, other result: all off is the identity, all on at 1 is the plain residual stack.
        assert torch.equal(fab(x, layers, gates=torch.zeros(B, L)), x)
        ref = x
        for layer in layers:
            ref = ref + layer(ref)
        assert rel_error(fab(x, layers, gates=torch.ones(B, L)), ref) < tolerance(torch.float32)
    with pytest.raises(ValueError, match="gates must be \\(B, L\\)"):
        fab(x, layers, gates=torch.ones(B, L - 1))
    with pytest.raises(TypeError, match="gates must be a floating"):
        fab(x, layers, gates=torch.ones(B, L, dtype=torch.long))
    with pytest.raises(ValueError, match="gate_source"):
        DynamicNeuroFabric(D, L, gate_source="last")
    with pytest.raises(ValueError, match="gate_source"):
        fabric_gates(x, fab.gate.weight, fab.gate.bias, source="max")


def test_fabric_rejects_bad_config_and_inputs():
    with pytest.raises(ValueError, match="threshold"):
        DynamicNeuroFabric(D, L, threshold=1.5)
    with pytest.raises(ValueError, match="impl"):
        DynamicNeuroFabric(D, L, impl="if")
    with pytest.raises(ValueError, match="n_layers"):
        DynamicNeuroFabric(D, 0)
    fab = DynamicNeuroFabric(D, L)
    layers = [nn.Identity()] * L
    with pytest.raises(ValueError, match="layers has 4 entries"):
        fab(torch.randn(B, T, D), layers[:4])
    with pytest.raises(TypeError, match="callable"):
        fab(torch.randn(B, T, D), [1] * L)
    with pytest.raises(TypeError, match="sequence of callables"):
        fab(torch.randn(B, T, D), torch.randn(L))
    with pytest.raises(ValueError, match="gate_weight"):
        fab(torch.randn(B, T, D + 1), layers)
    with pytest.raises(ValueError, match="x must be"):
        fab(torch.randn(T, D), layers)
    with pytest.raises(TypeError, match="floating"):
        fab(torch.ones(B, T, D, dtype=torch.int32), layers)
    with pytest.raises(TypeError, match="plan"):
        fab(torch.randn(B, T, D), layers, plan=[True] * L)
    with pytest.raises(ValueError, match="plan covers"):
        fab(torch.randn(B, T, D), layers, plan=FabricPlan((True,) * (L - 1)))


# -- momentum memory update -------------------------------------------------------------------------
SHAPES = [(D, 37), (7,), (3, 5, 11), (D, D), (1,)]


def _hyper(kind: str, seed: int = 0):
    g = _gen(seed)
    if kind == "float":
        return 0.9, 0.05, 0.01
    if kind == "0-dim":
        return torch.tensor(0.9), torch.tensor(0.05), torch.tensor(0.01)
    return (
        torch.rand(len(SHAPES), generator=g),
        torch.rand(len(SHAPES), generator=g) * 0.1,
        torch.rand(len(SHAPES), generator=g) * 0.1,
    )


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
    assert update(w, m, g, *hyper) is None
    assert [t.data_ptr() for t in w + m] == ptrs  # in place
    assert all(torch.equal(a, b) for a, b in zip(g, g_before))  # gradients only read
    tol = tolerance(dtype)
    assert rel_error(_flat(m), _flat(ref_m)) <= tol
    assert rel_error(_flat(w), _flat(ref_w)) <= tol
    # Hand-written check of the formula on one layer (float64 only: exact).
    if dtype == torch.float64:
        w0, m0, g0 = _state(torch.float64)
        eta, theta, alpha = (h[1].item() if torch.is_tensor(h) and h.dim() else float(h) for h in hyper)
        m1 = eta * m0[1] - theta * g0[1]
        torch.testing.assert_close(m[1], m1)
        torch.testing.assert_close(w[1], (1 - alpha) * w0[1] + m1)


def test_momentum_syncs():
    hyper = _hyper("0-dim")
    w, m, g = _state(torch.float32)
    with count_syncs() as r:
        momentum_update_loop(w, m, g, *hyper)
    assert r.ops["aten._local_scalar_dense"] == 3 * len(SHAPES)  # .item() of eta, theta, alpha per layer
    for kind in ("0-dim", "per-layer", "float"):
        with count_syncs() as r:
            momentum_update_foreach(w, m, g, *_hyper(kind))
        assert r.count == 0, (kind, str(r))
    with count_syncs() as r:  # with Python floats the loop has nothing to read back either
        momentum_update_loop(w, m, g, *_hyper("float"))
    assert r.count == 0


def test_momentum_memory_module():
    torch.manual_seed(0)
    shapes = [(D, D), (D, 13), (13,)]
    mems = {impl: MomentumMemory(shapes, eta=0.8, theta=0.1, alpha=0.02, impl=impl) for impl in ("loop", "foreach")}
    mems["foreach"].load_state_dict(mems["loop"].state_dict())
    assert {f"mom_{i}" for i in range(3)} <= set(mems["loop"].state_dict())
    x = torch.randn(B, D)
    for step in range(3):
        for mem in mems.values():
            mem.zero_grad()
            w0, w1, w2 = mem.weights
            loss = ((x @ w0 @ w1 + w2) ** 2).mean()  # any loss that makes .grad
            loss.backward()
            # A data-dependent step size on the last step, as a 0-dim tensor.
            mem.step(theta=torch.tensor(0.05) if step == 2 else None)
    loop, fast = mems["loop"], mems["foreach"]
    for a, b in zip([*loop.weights, *loop.moms], [*fast.weights, *fast.moms]):
        assert rel_error(b, a) < tolerance(torch.float32)
    assert any(m.abs().sum() > 0 for m in mems["loop"].moms)
    mems["loop"].reset_momentum()
    assert all(torch.count_nonzero(m) == 0 for m in mems["loop"].moms)
    with pytest.raises(ValueError, match="no .grad"):
        MomentumMemory([(3, 3)]).step()


def test_momentum_rejects_bad_inputs():
    w, m, g = _state(torch.float32)
    with pytest.raises(ValueError, match="same length"):
        momentum_update_foreach(w, m[:-1], g, 0.9, 0.1, 0.01)
    with pytest.raises(ValueError, match="same shape"):
        momentum_update_loop(w, [m[1]] + m[1:], g, 0.9, 0.1, 0.01)
    with pytest.raises(TypeError, match="share a dtype"):
        momentum_update_foreach(w, m, [t.double() for t in g], 0.9, 0.1, 0.01)
    with pytest.raises(TypeError, match="list or tuple"):
        momentum_update_foreach(w[0], m, g, 0.9, 0.1, 0.01)
    with pytest.raises(ValueError, match="empty"):
        momentum_update_foreach([], [], [], 0.9, 0.1, 0.01)
    with pytest.raises(ValueError, match="alpha must be in"):
        momentum_update_foreach(w, m, g, 0.9, 0.1, 1.5)
    with pytest.raises(ValueError, match="theta must be in"):
        momentum_update_loop(w, m, g, 0.9, -0.1, 0.01)
    with pytest.raises(ValueError, match=r"eta must be a 0-dim tensor or a \(5,\) tensor"):
        momentum_update_foreach(w, m, g, torch.rand(4), 0.1, 0.01)
    with pytest.raises(TypeError, match="eta must be a floating-point tensor"):
        momentum_update_foreach(w, m, g, torch.tensor(1), 0.1, 0.01)
    with pytest.raises(TypeError, match="theta must be a float or a tensor"):
        momentum_update_foreach(w, m, g, 0.9, "0.1", 0.01)
    with pytest.raises(ValueError, match="impl"):
        MomentumMemory([(3, 3)], impl="vectorized")
    with pytest.raises(ValueError, match="shapes\\[0\\]"):
        MomentumMemory([(3, 0)])


# -- benchmark suite (smoke) ------------------------------------------------------------------------
def test_hybrid_bench_quick(tmp_path):
    from mahia.bench import hybrid_parts
    from mahia.measure.results import Recorder

    rec = Recorder("bench_hybrid", "cpu", results_dir=tmp_path)
    hybrid_parts.run(rec, None, quick=True)
    df = rec.frame()
    got = set(zip(df["experiment"], df["variant"], df["role"]))
    assert got == {
        ("graph_memory_fwd", "loop", "baseline"),
        ("graph_memory_fwd", "batched", "optimized"),
        ("fabric_fwd", "branch", "baseline"),
        ("fabric_fwd", "masked", "optimized"),
        ("momentum_update", "loop", "baseline"),
        ("momentum_update", "foreach", "optimized"),
    }
    assert (df["rel_err"] <= tolerance(torch.float32)).all()
    assert (df["median_ms"] > 0).all()


def test_diffusion_operator_stays_in_float32_under_autocast():
    # its docstring: built in at least float32; under bf16 autocast the squarings would round to bf16
    torch.manual_seed(0)
    adj = torch.randn(16, 16)
    want = diffusion_operator(adj, 5, 0.4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = diffusion_operator(adj, 5, 0.4)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
