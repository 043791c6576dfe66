"""MoE layer: the loop and grouped paths against an independent dense float64 reference, every grouped
matmul backend, the absence of host syncs in the grouped path, routing statistics and bad input."""

import pytest
import torch
import torch.nn.functional as F

from mahia.measure.checks import compare_fn, rel_error, tolerance
from mahia.measure.instruments import count_syncs
from mahia.model.moe import MoE, RouterStats, moe_flops
from mahia.ops.grouped_mm import BACKENDS, grouped_mm, grouped_mm_backend

# The grouped path's SwiGLU is mahia.ops.swiglu (tested in its own file); under the CPU interpreter
# it costs about a second per call at these sizes, so it falls back to eager (with a warning) except in
# the tests of the triton backend.
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


def _runs(backend: str, dtype: torch.dtype) -> bool:
    """Whether grouped_mm(backend=...) can run on this machine (CPU) for dtype."""
    try:
        grouped_mm(
            torch.zeros(2, 16, dtype=dtype),
            torch.zeros(1, 16, 16, dtype=dtype),
            torch.tensor([2], dtype=torch.int32),
            backend=backend,
        )
        return True
    except ValueError:
        return False


def backends(dtype=torch.float32, *, impls=False):
    """pytest params: each grouped matmul backend (skipped where it cannot run); with ``impls``, as
    (impl, backend) pairs led by the loop path."""
    params = [
        pytest.param(
            *(("grouped", b) if impls else (b,)),
            marks=pytest.mark.skipif(not _runs(b, dtype), reason=f"{b} cannot run here"),
            id=b,
        )
        for b in BACKENDS
    ]
    return ([pytest.param("loop", "auto", id="loop")] + params) if impls else params


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


def functional(moe):
    """moe as a function of (x, w_router, w13, w2), so compare_fn can upcast and differentiate all four."""

    def f(x, w_router, w13, w2):
        return torch.func.functional_call(moe, {"w_router": w_router, "w13": w13, "w2": w2}, (x,))

    return f


def random_inputs(moe, lead=LEAD, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, moe.dim, generator=g)
    return [x, moe.w_router.detach(), moe.w13.detach(), moe.w2.detach()]


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


def check_against_dense(moe, inputs):
    """compare_fn of the module (inputs' dtype) against the dense reference in float64."""
    ref = lambda *t: dense_reference(*t, moe.top_k, moe.aux_loss_coef)  # noqa: E731
    return compare_fn(functional(moe), ref, inputs, name=f"MoE impl={moe.impl} backend={moe.backend}")


# ---------------------------------------------------------------------------------------------------
# grouped_mm
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", backends())
def test_grouped_mm_matches_per_group_matmuls(backend):
    counts = [7, 0, 30, 1, 19]  # an empty group and a one-row group
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(sum(counts), 48, generator=g)
    b = torch.randn(len(counts), 48, 40, generator=g)

    def ref(a, b, offs):
        rows = torch.arange(a.shape[0])
        group = torch.searchsorted(offs.long(), rows, right=True)
        return torch.einsum("mk,mkn->mn", a, b[group])

    cmp = compare_fn(
        lambda a, b, offs: grouped_mm(a, b, offs, backend=backend),
        ref,
        [a, b, offs],
        grad_inputs=(0, 1),
        name=f"grouped_mm[{backend}]",
    )
    assert set(cmp.errors) == {"out0", "grad0", "grad1"}


def test_grouped_mm_rejects_bad_input():
    a, b = torch.randn(6, 16), torch.randn(2, 16, 16)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="offs"):
        grouped_mm(a, b, offs.long())
    with pytest.raises(ValueError, match="offs"):
        grouped_mm(a, b, torch.tensor([6], dtype=torch.int32))
    with pytest.raises(ValueError, match="b must be"):
        grouped_mm(a, b[0], offs)
    with pytest.raises(ValueError, match="K = a.shape"):
        grouped_mm(a, torch.randn(2, 8, 16), offs)
    with pytest.raises(TypeError, match="same dtype"):
        grouped_mm(a, b.double(), offs)
    with pytest.raises(TypeError, match="floating-point"):
        grouped_mm(a.long(), b, offs)
    with pytest.raises(ValueError, match="backend"):
        grouped_mm(a, b, offs, backend="cublas")
    with pytest.raises(ValueError, match="cannot run here"):  # float64 has no torch._grouped_mm kernel
        grouped_mm(a.double(), b.double(), offs, backend="torch._grouped_mm")


def test_backend_choice_is_visible():
    x = torch.randn(4, D)
    b = torch.randn(E, D, 2 * H)
    assert grouped_mm_backend(x, b) in BACKENDS
    assert MoE(D, H, E, impl="loop").backend_for(x) == "loop"
    assert MoE(D, H, E, backend="padded-bmm").backend_for(x) == "padded-bmm"
    # float64 has no torch._grouped_mm and no Triton kernel: the PyTorch fallback runs.
    assert MoE(D, H, E, dtype=torch.float64).backend_for(x.double()) == "padded-bmm"
    # 45 float32 values = 180 bytes per row: not 16-byte aligned, so not torch._grouped_mm.
    assert MoE(45, H, E).backend_for(torch.randn(4, 45)) in ("triton", "padded-bmm")


# ---------------------------------------------------------------------------------------------------
# The layer: loop and grouped against the dense reference
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [2, 1])
@pytest.mark.parametrize("impl,backend", backends(impls=True))
def test_fp32_matches_dense_reference(impl, backend, top_k):
    torch.manual_seed(0)
    moe = MoE(D, H, E, top_k, impl=impl, backend=backend, aux_loss_coef=0.3)
    cmp = check_against_dense(moe, random_inputs(moe))
    assert len(cmp.errors) == 2 + 4  # y, aux and the gradients of x and the three weights


@pytest.mark.parametrize("impl,backend", backends(impls=True))
def test_experts_without_tokens(impl, backend):
    torch.manual_seed(1)
    moe = MoE(D, H, E, 2, impl=impl, backend=backend)
    inputs = routed_inputs(moe, never=(3, 4))
    x, w_router = inputs[:2]
    assert set(torch.topk(x.reshape(-1, D) @ w_router, 2).indices.unique().tolist()) == {0, 1, 2}
    cmp = check_against_dense(moe, inputs)
    assert cmp.max_error <= tolerance(torch.float32)


@pytest.mark.parametrize("impl,backend", backends(torch.bfloat16, impls=True))
def test_bf16_matches_dense_reference(impl, backend):
    # Under the CPU interpreter (triton 3.9) float32 -> bfloat16 conversions truncate instead of
    # rounding, which about doubles the triton backend's error here (~1.3e-2); still within tolerance.
    torch.manual_seed(2)
    moe = MoE(D, H, E, 2, impl=impl, backend=backend, aux_loss_coef=0.3).to(torch.bfloat16)
    cmp = check_against_dense(moe, routed_inputs(moe, dtype=torch.bfloat16))
    assert cmp.tol == tolerance(torch.bfloat16)


def test_bf16_random_routing_loop_and_grouped_agree():
    """With routing left to chance, both bf16 paths still make the same choices (shared router code)."""
    torch.manual_seed(3)
    loop = MoE(D, H, E, 2, impl="loop").to(torch.bfloat16)
    grouped = MoE(D, H, E, 2, impl="grouped").to(torch.bfloat16)
    grouped.load_state_dict(loop.state_dict())
    x = torch.randn(*LEAD, D, dtype=torch.bfloat16)
    (y_l, aux_l), (y_g, aux_g) = loop(x), grouped(x)
    assert rel_error(y_g, y_l) <= tolerance(torch.bfloat16)
    assert rel_error(aux_g, aux_l) <= 1e-6  # same routing, same float32 statistics


@pytest.mark.parametrize("lead", [(), (2, 3, 5)])
def test_any_leading_dims(lead):
    torch.manual_seed(4)
    loop = MoE(D, H, E, 2, impl="loop")
    grouped = MoE(D, H, E, 2, impl="grouped")
    grouped.load_state_dict(loop.state_dict())
    x = torch.randn(*lead, D)
    (y_l, aux_l), (y_g, aux_g) = loop(x), grouped(x)
    assert y_g.shape == x.shape and aux_g.shape == ()
    assert rel_error(y_g, y_l) <= tolerance(torch.float32)
    assert rel_error(aux_g, aux_l) <= tolerance(torch.float32)


def test_inference_mode():
    moe = MoE(D, H, E, 2)
    x = torch.randn(*LEAD, D)
    with torch.inference_mode():
        y, aux = moe(x)
    ref, _ = dense_reference(
        x.double(), *(p.detach().double() for p in (moe.w_router, moe.w13, moe.w2)), 2, moe.aux_loss_coef
    )
    assert rel_error(y, ref) <= tolerance(torch.float32)


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


def test_compiled_fp32_matches_eager():
    """torch.compile traces the grouped path in float32 (no torch._grouped_mm there: its meta kernel
    takes bf16 only), without graph breaks, and computes what eager computes."""
    torch.manual_seed(7)
    moe = MoE(D, H, E, 2, impl="grouped")
    x = torch.randn(2, 9, D)
    torch._dynamo.reset()
    y_c, aux_c = torch.compile(moe, backend="aot_eager", fullgraph=True)(x)
    y_e, aux_e = moe(x)
    assert rel_error(y_c, y_e) <= tolerance(torch.float32)
    assert rel_error(aux_c, aux_e) <= tolerance(torch.float32)


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
    with pytest.raises(ValueError, match="token_weight must have"):
        moe(x, token_weight=keep)
    with pytest.raises(ValueError, match="at least one"):
        RouterStats.pool([])
    with pytest.raises(TypeError, match="RouterStats"):
        moe.aux_loss_from((stats.counts, stats.prob_sum, stats.n_tokens))


# ---------------------------------------------------------------------------------------------------
# Host syncs
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", backends())
def test_grouped_path_has_no_host_syncs(backend):
    moe = MoE(D, H, E, 2, impl="grouped", backend=backend)
    x = torch.randn(*LEAD, D, requires_grad=True)
    with count_syncs() as r:
        y, aux = moe(x)
        torch.autograd.backward([y, aux], [torch.randn_like(y), torch.ones_like(aux)])
    assert r.syncing_ops == 0, f"{r}: {r.where}"
    assert x.grad is not None and moe.w13.grad is not None


def test_loop_path_syncs_once_per_expert():
    moe = MoE(D, H, E, 2, impl="loop")
    with count_syncs() as r:
        moe(torch.randn(*LEAD, D))
    assert r.ops["aten.nonzero"] == E, str(r)


# ---------------------------------------------------------------------------------------------------
# Statistics, FLOPs, bad configurations
# ---------------------------------------------------------------------------------------------------


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
    from torch.utils.flop_counter import FlopCounterMode

    moe = MoE(D, H, E, 2, impl="loop")
    x = torch.randn(*LEAD, D)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        moe(x)
    assert fc.get_total_flops() == moe_flops(x.numel() // D, D, H, 2, E)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(top_k=6), ValueError, "top_k"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(top_k=2.0), TypeError, "top_k"),
        (dict(impl="fast"), ValueError, "impl"),
        (dict(backend="cublas"), ValueError, "backend"),
        (dict(aux_loss_coef=-1.0), ValueError, "aux_loss_coef"),
        (dict(n_experts=0, top_k=1), ValueError, "n_experts"),
    ],
)
def test_bad_config_raises(kwargs, exc, match):
    args = dict(dim=D, hidden=H, n_experts=E, top_k=2)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        MoE(**args)


def test_bad_input_raises():
    moe = MoE(D, H, E, 2)
    with pytest.raises(ValueError, match="dim=48"):
        moe(torch.randn(4, D - 1))
    with pytest.raises(TypeError, match="floating-point"):
        moe(torch.ones(4, D, dtype=torch.int64))
    with pytest.raises(TypeError, match="dtype"):
        moe(torch.randn(4, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="no tokens"):
        moe(torch.randn(0, D))
    with pytest.raises(ValueError, match="cannot run here"):  # 45 floats per row: not 16-byte aligned
        MoE(45, H, E, backend="torch._grouped_mm")(torch.randn(4, 45))
