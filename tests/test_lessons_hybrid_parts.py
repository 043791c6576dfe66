"""Tests of mahia.lessons.hybrid_parts (CPU, small odd shapes)."""

import pytest
import torch

import mahia.lessons.hybrid_parts as hp
from mahia.measure.checks import rel_error
from mahia.measure.timing import Timing
from mahia.model.moe import MoE
from mahia.ops.gla_scan import gla_loop


@pytest.fixture(autouse=True)
def eager_kernels(monkeypatch):  # the helpers, not the Triton kernels: the MoE's eager SwiGLU, not the interpreter
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")


def test_launch_model_overlap_and_syncs():
    # launches hide under longer device work; syncs add on top
    assert hp.launch_model_ms(100, 0, 5.0, 20.0) == pytest.approx(0.5)
    assert hp.launch_model_ms(100, 0, 5.0, 20.0, work_ms=2.0) == pytest.approx(2.0)
    assert hp.launch_model_ms(100, 3, 5.0, 20.0, work_ms=2.0) == pytest.approx(2.06)
    # on a CPU the same cores dispatch and compute: launches and work add up
    assert hp.launch_model_ms(100, 3, 5.0, 20.0, work_ms=2.0, overlap=False) == pytest.approx(2.56)


def test_launch_costs_on_cpu():
    # the synced chain is timed second: 1 ms slower than the chain, over 50 kernels
    fake = iter([Timing(1.0, 1.0, 1.0, 1), Timing(2.0, 2.0, 2.0, 1)])
    c = hp.launch_costs("cpu", n_kernels=50, bench=lambda fn, memory: (fn(), next(fake))[1])
    assert c.launch_us == pytest.approx(1e3 / 50) and c.sync_us == pytest.approx(1e3 / 50)
    real = hp.launch_costs("cpu", n_kernels=20, bench=lambda fn, **kw: Timing(0.1, 0.1, 0.1, 1))
    assert real.sync_us == 0.0 and real.launch_us > 0


def test_count_ops_and_syncs_sees_both():
    x = torch.randn(37)
    ops, syncs = hp.count_ops_and_syncs(lambda: ((x > 0).nonzero(), (x * 2 + 1).sum().item()))
    assert ops.total >= 4 and syncs.count == 2  # nonzero and .item()


def test_moe_bytes():
    # x and y: 2*N*D; weights: E*(D*2H + H*D); router: D*E
    assert hp.moe_bytes(7, 5, 3, 2, element_size=2) == (2 * 7 * 5 + 2 * 3 * 5 * 3 + 5 * 2) * 2


def test_moe_fwd_bwd_gradients_match_backward():
    torch.manual_seed(0)
    ref = MoE(20, 28, 3, 2, impl="loop")
    x, dy = torch.randn(11, 20), torch.randn(11, 20)
    y, aux, dx, dwr, dw13, dw2 = hp.moe_fwd_bwd(ref, x, dy)()
    assert ref.w13.grad is None  # autograd.grad: .grad stays untouched
    xl = x.clone().requires_grad_()
    y2, aux2 = ref(xl)
    ((y2 * dy).sum() + aux2).backward()
    assert rel_error(dx, xl.grad) < 1e-6 and rel_error(dw13, ref.w13.grad) < 1e-6
    assert rel_error(dwr, ref.w_router.grad) < 1e-6


def test_train_routing_aux_loss_balances():
    gen = torch.Generator().manual_seed(3)
    dim = 24
    u = torch.randn(dim, generator=gen)
    x = torch.randn(301, dim, generator=gen) + 3 * u / u.norm()  # a shared direction skews the router
    target = torch.tanh(x @ (torch.randn(dim, dim, generator=gen) / dim**0.5))
    cvs = {}
    for coef in (0.0, 1.0):
        torch.manual_seed(0)
        m = MoE(dim, 20, 6, 2, impl="grouped", backend="padded-bmm", aux_loss_coef=coef)
        rows = hp.train_routing(m, x, target, steps=25, lr=1e-2)
        assert len(rows) == 26 and rows[0]["step"] == 0
        cvs[coef] = (rows[0]["cv"], rows[-1]["cv"])
    assert cvs[0.0][0] == pytest.approx(cvs[1.0][0])  # same start
    assert cvs[1.0][1] < 0.5 * cvs[1.0][0]  # the aux loss spreads the tokens
    assert cvs[1.0][1] < cvs[0.0][1]


def test_gla_inputs_and_fwd_bwd():
    q, k, v, g, do = hp.gla_inputs(1, 2, 13, 5, 7, dtype=torch.float64)
    assert q.shape == k.shape == g.shape == (1, 2, 13, 5) and v.shape == do.shape == (1, 2, 13, 7)
    assert (g <= 0).all() and q.dtype == torch.float64
    again = hp.gla_inputs(1, 2, 13, 5, 7, dtype=torch.float64)
    assert torch.equal(again[3], g)  # seeded
    fn = hp.fwd_bwd(gla_loop, (q, k, v, g), do)
    out, dq, dk, dv, dg = fn()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g)]
    (gla_loop(*leaves) * do).sum().backward()
    for got, leaf in zip((dq, dk, dv, dg), leaves):
        assert rel_error(got, leaf.grad) < 1e-12


def test_threshold_in_gap():
    g = torch.tensor([[0.1, 0.35, 0.41], [0.62, 0.9, 0.36]])
    # values in [0.3, 0.7]: 0.3 | 0.35 0.36 0.41 | 0.62 | 0.7 -> widest gap 0.41..0.62
    assert hp.threshold_in_gap(g) == pytest.approx(0.515)
    assert hp.threshold_in_gap(torch.tensor([0.95])) == pytest.approx(0.5)  # nothing inside: the middle


# -- the host's measured cost per op ----------------------------------------------------------------
def _adds(n: int):
    """A call of n one-element adds (n ops that launch a kernel) and one read-back (a sync on a GPU)."""
    x = torch.zeros(1)

    def fn():
        for _ in range(n):
            x.add_(1)
        return x.sum().item() if n % 2 else None  # odd n: one .item(), a sync on a GPU

    return fn


def test_host_cost_divides_the_host_time_by_the_ops_and_takes_t_sync_out_of_a_call_that_fits_the_queue():
    fake = lambda fn: Timing.from_samples([2.0, 2.0, 2.0])  # ms: the host time of every call
    hc = hp.host_cost(_adds, 40, device="cpu", timer=fake)
    assert (hc.n_ops, hc.n_syncs, hc.size) == (40, 0, 40) and hc.us_per_op == pytest.approx(2000 / 40)
    odd = hp.host_cost(_adds, 25, device="cpu", sync_us=500.0, timer=fake)
    assert (odd.n_ops, odd.n_syncs) == (26, 1)  # 25 adds and the sum read back
    assert odd.us_per_op == pytest.approx((2000 - 500) / 26)
    never_negative = hp.HostCost(Timing.from_samples([0.1]), 4, n_syncs=3, sync_us=100.0)
    assert never_negative.us_per_op == 0.0
    # with a launch queue of `limit` kernels, the size is halved until the call fits
    hc = hp.host_cost(_adds, 40, device="cpu", limit=12, timer=fake)
    assert (hc.size, hc.n_ops) == (10, 10)  # 40 and 20 adds overfill a queue of 12
    # a sync drains the queue: 26 ops in two runs between syncs, 13 each, fit a queue of 13
    assert hp.host_cost(_adds, 25, device="cpu", limit=13, timer=fake).size == 25
    assert hp.host_cost(_adds, 8, device="cpu", counts=hp.count_ops_and_syncs(_adds(8)), timer=fake).n_ops == 8
    real = hp.host_cost(_adds, 50, device="cpu")  # host_time itself: a CPU op costs well under a millisecond
    assert 0 < real.us_per_op < 1000 and real.timing.n >= 5
