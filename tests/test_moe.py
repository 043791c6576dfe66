"""MoE layer: the loop and grouped paths against an independent dense float64 reference, every grouped
matmul backend, the absence of host syncs in the grouped path, routing statistics and bad input."""

import pytest
import torch
import torch.nn.functional as F
from helpers import grouped_mm_runs

from mahia.measure.checks import compare_fn, rel_error, tolerance
from mahia.measure.instruments import count_syncs
from mahia.model.moe import MoE, RouterStats, moe_flops
from mahia.ops.grouped_mm import BACKENDS, grouped_mm

# Under the CPU interpreter the grouped path's SwiGLU and combine cost about a second per call at these sizes:
# they fall back to eager (with a warning) except in the tests of the triton backend.
pytestmark = [
    pytest.mark.filterwarnings("ignore:mahia.ops.swiglu:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:mahia.ops.moe_combine:RuntimeWarning"),
]


@pytest.fixture(autouse=True)
def _triton_only_where_tested(request, monkeypatch):
    if not torch.cuda.is_available() and "triton" not in request.node.name:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")


D, H, E = 48, 80, 5  # odd sizes, rows still 16-byte aligned for torch._grouped_mm
LEAD = (3, 37)  # 111 tokens


def dense_reference(x, w_router, w13, w2, top_k, coef):
    """Every expert on every token, weighted by a gate that is zero outside the token's top-k."""
    n_exp = w_router.shape[1]
    x2 = x.reshape(-1, x.shape[-1])  # (N, D)
    probs = torch.softmax(x2 @ w_router, dim=-1)  # (N, E)
    top_p, top_i = probs.topk(top_k, dim=-1)
    gate = torch.zeros_like(probs).scatter(1, top_i, top_p / top_p.sum(-1, keepdim=True))  # (N, E)
    a, b = torch.einsum("nd,edf->enf", x2, w13).chunk(2, dim=-1)  # (E, N, H) each
    ye = (F.silu(a) * b) @ w2  # (E, N, D)
    y = torch.einsum("ne,end->nd", gate, ye)
    f = F.one_hot(top_i, n_exp).sum((0, 1)).to(probs.dtype) / (x2.shape[0] * top_k)
    aux = coef * n_exp * (f * probs.mean(0)).sum()
    return y.view(x.shape), aux


def routed_inputs(moe, lead=LEAD, seed=0, never=(), dtype=torch.float32):
    """Inputs whose routing cannot flip under rounding: the router reads x[..., :E] through an identity,
    and those entries are a per-token permutation of 0..E-1 (exact in bfloat16; gaps of 1). Experts in
    ``never`` always score lowest, so they get no tokens."""
    g = torch.Generator().manual_seed(seed)
    n_exp = moe.n_experts
    x = torch.randn(*lead, moe.dim, generator=g)
    scores = torch.argsort(torch.rand(*lead, n_exp, generator=g), dim=-1).float()
    for j, e in enumerate(never):
        scores[..., e] = -1.0 - j
    x[..., :n_exp] = scores
    w_router = torch.zeros(moe.dim, n_exp)
    w_router[:n_exp] = torch.eye(n_exp)
    return [t.to(dtype) for t in (x, w_router, moe.w13.detach(), moe.w2.detach())]


def test_grouped_mm_bad_input_and_backend_choice():
    a, b = torch.randn(6, 16), torch.randn(2, 16, 16)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    for args, kw, err, match in [
        ((a, b, offs.long()), {}, ValueError, "offs"),
        ((a, b, torch.tensor([6], dtype=torch.int32)), {}, ValueError, "offs"),
        ((a, b[0], offs), {}, ValueError, "b must be"),
        ((a, torch.randn(2, 8, 16), offs), {}, ValueError, "K = a.shape"),
        ((a, b.double(), offs), {}, TypeError, "same dtype"),
        ((a.long(), b, offs), {}, TypeError, "floating-point"),
        ((a, b, offs), {"backend": "cublas"}, ValueError, "backend"),
        ((a.double(), b.double(), offs), {"backend": "torch._grouped_mm"}, ValueError, "cannot run here"),
    ]:
        with pytest.raises(err, match=match):
            grouped_mm(*args, **kw)
    x = torch.randn(4, D)
    assert MoE(D, H, E, impl="loop").backend_for(x) == "loop"
    assert MoE(D, H, E, backend="padded-bmm").backend_for(x) == "padded-bmm"
    # float64 has no torch._grouped_mm and no Triton kernel: the PyTorch fallback runs.
    assert MoE(D, H, E, dtype=torch.float64).backend_for(x.double()) == "padded-bmm"
    # 45 float32 values = 180 bytes per row: not 16-byte aligned, so not torch._grouped_mm.
    assert MoE(45, H, E).backend_for(torch.randn(4, 45)) in ("triton", "padded-bmm")


F32, BF16 = torch.float32, torch.bfloat16


@pytest.mark.parametrize(
    "dtype,top_k,never",
    [(F32, 2, ()), (F32, 1, ()), (F32, 2, (3, 4)), (BF16, 2, ())],
    ids=["top2", "top1", "empty-experts", "bf16"],
)
@pytest.mark.parametrize(
    "impl,backend", [("loop", "auto")] + [("grouped", b) for b in BACKENDS], ids=["loop", *BACKENDS]
)
def test_matches_dense_reference(impl, backend, dtype, top_k, never):
    """y, aux and the gradients of x and the three weights against the float64 dense reference, also with
    experts that get no token."""
    if impl == "grouped" and not grouped_mm_runs(backend, dtype):
        pytest.skip(f"{backend} cannot run here")
    torch.manual_seed(0)
    moe = MoE(D, H, E, top_k, impl=impl, backend=backend, aux_loss_coef=0.3).to(dtype)
    if never or dtype == BF16:  # routing that rounding cannot flip
        inputs = routed_inputs(moe, never=never, dtype=dtype)
    else:
        x = torch.randn(*LEAD, D, generator=torch.Generator().manual_seed(0))
        inputs = [x, moe.w_router.detach(), moe.w13.detach(), moe.w2.detach()]
    if never:
        x, w_router = inputs[:2]
        assert set(torch.topk(x.reshape(-1, D) @ w_router, 2).indices.unique().tolist()) == {0, 1, 2}

    def f(x, w_router, w13, w2):
        return torch.func.functional_call(moe, {"w_router": w_router, "w13": w13, "w2": w2}, (x,))

    ref = lambda *t: dense_reference(*t, moe.top_k, moe.aux_loss_coef)  # noqa: E731
    cmp = compare_fn(f, ref, inputs, name=f"MoE impl={impl} backend={backend}")
    assert len(cmp.errors) == 2 + 4


@pytest.mark.parametrize("dtype,lead", [(torch.bfloat16, LEAD), (torch.float32, ()), (torch.float32, (2, 3, 5))])
def test_loop_grouped_and_compiled_agree_on_random_routing_and_any_leading_dims(dtype, lead):
    """With routing left to chance, both paths make the same choices. torch.compile traces the grouped path
    in float32 without graph breaks, as eager computes."""
    torch.manual_seed(3)
    loop, grouped = MoE(D, H, E, 2, impl="loop").to(dtype), MoE(D, H, E, 2, impl="grouped").to(dtype)
    grouped.load_state_dict(loop.state_dict())
    x = torch.randn(*lead, D, dtype=dtype)
    (y_l, aux_l), (y_g, aux_g) = loop(x), grouped(x)
    assert y_g.shape == x.shape and aux_g.shape == () and rel_error(y_g, y_l) <= tolerance(dtype)
    assert rel_error(aux_g, aux_l) <= 1e-6  # same routing, same float32 statistics
    with torch.inference_mode():
        assert torch.equal(grouped(x)[0], y_g)
    if dtype == torch.float32 and lead:
        torch._dynamo.reset()
        y_c, aux_c = torch.compile(grouped, backend="aot_eager", fullgraph=True)(x)
        assert rel_error(y_c, y_g) <= tolerance(dtype) and rel_error(aux_c, aux_g) <= tolerance(dtype)


@pytest.mark.parametrize("impl", ["loop", "grouped"])
def test_autocast_bf16(impl):
    """Under CPU bf16 autocast: the experts' matmuls may run in bf16, the gated sum accumulates in x's
    dtype, y keeps x's dtype (float32); forward and backward work and match the float64 reference."""
    torch.manual_seed(6)
    moe = MoE(D, H, E, 2, impl=impl, aux_loss_coef=0.3)
    x, w_router, _, _ = routed_inputs(moe)  # routing that bf16 rounding cannot flip
    with torch.no_grad():
        moe.w_router.copy_(w_router)
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, aux = moe(x)
    assert y.dtype == torch.float32 and aux.dtype == torch.float32
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(0))).sum().add(aux).backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(moe.w13.grad).all()
    params = (t.detach().double() for t in (moe.w_router, moe.w13, moe.w2))
    ref_y, ref_aux = dense_reference(x.detach().double(), *params, 2, moe.aux_loss_coef)
    assert rel_error(y, ref_y) <= tolerance(torch.bfloat16)
    assert rel_error(aux, ref_aux) <= tolerance(torch.float32)  # routing statistics stay float32


@pytest.mark.parametrize("impl", ["loop", "grouped"])
def test_aux_loss_over_weighted_tokens_and_pooled_stats(impl):
    """token_weight = 0/1 per sample gives the aux loss of the chosen samples' tokens; the RouterStats of
    one call per chosen sample pool to the same loss (what the gated model relies on)."""
    torch.manual_seed(8)
    moe = MoE(D, H, E, 2, impl=impl, aux_loss_coef=0.3)
    x = torch.randn(4, 11, D)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0])
    y, aux, stats = moe(x, token_weight=keep[:, None].expand(4, 11), return_stats=True)
    y_all, aux_all = moe(x)
    assert torch.equal(y, y_all)  # the weights touch only the loss
    _, aux_kept = moe(x[keep.bool()])
    assert rel_error(aux, aux_kept) <= tolerance(torch.float32)
    assert rel_error(aux, aux_all) > 1e-4  # leaving a sample out changes the loss
    pooled = RouterStats.pool([moe(x[i : i + 1], return_stats=True)[2] for i in (0, 2, 3)])
    assert rel_error(moe.aux_loss_from(pooled), aux_kept) <= tolerance(torch.float32)
    assert float(stats.n_tokens) == 33 and float(stats.counts.sum()) == 33 * 2
    _, aux_none = moe(x, token_weight=torch.zeros(4, 11))
    assert aux_none.item() == 0.0  # no token: no loss (not 0/0)
    with pytest.raises(ValueError, match="MoE: token_weight must be"):
        moe(x, token_weight=keep)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_path_has_no_host_syncs(backend):
    if not grouped_mm_runs(backend):
        pytest.skip(f"{backend} cannot run here")
    moe = MoE(D, H, E, 2, impl="grouped", backend=backend)
    x = torch.randn(*LEAD, D, requires_grad=True)
    with count_syncs() as r:
        y, aux = moe(x)
        torch.autograd.backward([y, aux], [torch.randn_like(y), torch.ones_like(aux)])
    assert r.syncing_ops == 0, f"{r}: {r.where}"
    assert x.grad is not None and moe.w13.grad is not None
    moe.impl = "loop"
    with count_syncs() as r:
        moe(torch.randn(*LEAD, D))
    assert r.ops["aten.nonzero"] == E, str(r)  # the loop path syncs once per expert


def test_routing_stats():
    torch.manual_seed(5)
    moe = MoE(D, H, E, 2)
    x, w_router, _, _ = routed_inputs(moe, never=(4,))
    with torch.no_grad():
        moe.w_router.copy_(w_router)
    s = moe.routing_stats(x)
    counts = s["tokens_per_expert"]
    n = x.numel() // D
    assert counts.shape == (E,) and int(counts.sum()) == s["n_assignments"] == n * 2
    assert counts[4] == 0 and s["empty_experts"] == 1
    c = counts.double()
    assert s["cv"] == pytest.approx(float(c.std(correction=0) / c.mean()))
    assert s["max_over_mean"] == pytest.approx(float(c.max() / c.mean()))
    _, aux = moe(x)
    assert s["aux_loss"] == pytest.approx(aux.item(), rel=1e-6)


def test_moe_flops_counts_every_matmul():
    assert moe_flops(3, 4, 5, 2, 6) == 2 * 6 * 4 * 10 + 2 * 6 * 5 * 4 + 2 * 3 * 4 * 6
    assert moe_flops(3, 4, 5, 2, 6, router=False) == 2 * 6 * 4 * 10 + 2 * 6 * 5 * 4  # the expert matmuls alone
    # test_model's test_flops_match_the_flop_counter checks moe_flops against torch's FLOP counter.


def test_bad_config_and_input_raise():
    moe = MoE(D, H, E, 2)
    for call, err, match in [
        (lambda: MoE(D, H, E, top_k=6), ValueError, "MoE: top_k must be at most"),
        (lambda: MoE(D, H, E, top_k=0), ValueError, "MoE: top_k must be a positive int"),
        (lambda: MoE(D, H, E, top_k=2.0), ValueError, "MoE: top_k must be a positive int"),
        (lambda: MoE(D, H, E, top_k=True), ValueError, "MoE: top_k must be a positive int"),
        (lambda: MoE(D, H, E, impl="fast"), ValueError, "MoE: impl"),
        (lambda: MoE(D, H, E, backend="cublas"), ValueError, "MoE: backend"),
        (lambda: MoE(D, H, E, aux_loss_coef=-1.0), ValueError, "MoE: aux_loss_coef"),
        (lambda: MoE(D, H, 0, top_k=1), ValueError, "MoE: n_experts"),
        (lambda: moe(torch.randn(4, D - 1)), ValueError, "MoE: x .*dim=48"),
        (lambda: moe(torch.randn(0, D)), ValueError, "MoE: x .*with tokens"),
        (lambda: moe(torch.ones(4, D, dtype=torch.int64)), TypeError, "MoE: x .*parameters are torch.float32"),
        (lambda: moe(torch.randn(4, D, dtype=torch.float64)), TypeError, "MoE: x .*parameters are torch.float32"),
        # 45 floats per row: not 16-byte aligned
        (lambda: MoE(45, H, E, backend="torch._grouped_mm")(torch.randn(4, 45)), ValueError, "cannot run here"),
    ]:
        with pytest.raises(err, match=match):
            call()
