"""The syncing and the sync-free training loop compute the same updates; only one of them syncs."""

import copy
import json
import math

import pytest
import torch

from mahia.lessons.sync_loops import (
    ResidualMLP,
    balance_order,
    count_ops,
    device_step_ms,
    gpu_activity,
    host_issue_ms,
    host_step_ms,
    idle_fraction,
    launch_chain,
    make_batches,
    ops_per_step,
    overlap_columns,
    plot_gain_vs_balance,
    train_sync_free,
    train_syncing,
)
from mahia.measure import instruments
from mahia.measure.checks import check_close, tolerance
from mahia.measure.instruments import count_syncs

IN, WIDTH, DEPTH, CLASSES, BATCH = 19, 37, 2, 5, 29


def _pair(seed=0, **opt_kw):
    torch.manual_seed(seed)
    a = ResidualMLP(IN, WIDTH, DEPTH, CLASSES)
    b = copy.deepcopy(a)
    kw = dict(lr=0.2, momentum=0.9) | opt_kw
    return (a, torch.optim.SGD(a.parameters(), **kw)), (b, torch.optim.SGD(b.parameters(), **kw))


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("max_norm", [0.05, 100.0])  # always clipped / never clipped
def test_both_loops_make_the_same_updates(max_norm):
    (m1, o1), (m2, o2) = _pair()
    batches = make_batches(13, BATCH, IN, CLASSES, seed=3)
    r1 = train_syncing(m1, o1, batches, max_norm=max_norm)
    r2 = train_sync_free(m2, o2, batches, max_norm=max_norm).cpu()
    tol = tolerance(torch.float32)
    check_close("parameters", _flat(m2), _flat(m1), tol)
    check_close("losses", r2.losses, r1.losses, tol)
    assert torch.equal(r2.accuracy, r1.accuracy)
    assert r2.best_step.item() == r1.best_step.item() and r1.best_step.item() >= 0
    check_close("best loss", r2.best_loss, r1.best_loss, tol)
    assert r2.n_clipped.item() == r1.n_clipped.item() == (13 if max_norm < 1 else 0)
    assert len(r1.log) == 13 and r2.log == []
    # the parameters really moved (the comparison above is not between two untouched models)
    fresh, _ = _pair()[0]
    assert (_flat(m1) - _flat(fresh)).abs().max() > 1e-3


def test_sync_free_log_every_reads_all_losses_in_chunks():
    (m1, o1), (m2, o2) = _pair()
    batches = make_batches(7, BATCH, IN, CLASSES)
    r1 = train_syncing(m1, o1, batches)
    r2 = train_sync_free(m2, o2, batches, log_every=3)  # reads after steps 3, 6 and the tail 7
    assert [s for s, _ in r2.log] == list(range(7))
    assert torch.allclose(torch.tensor([v for _, v in r2.log]), r1.losses, rtol=1e-5)


def test_sync_counts():
    (m1, o1), (m2, o2) = _pair()
    batches = make_batches(3, BATCH, IN, CLASSES)
    with count_syncs() as syncing:
        train_syncing(m1, o1, batches)
    with count_syncs() as free:
        train_sync_free(m2, o2, batches)
    # per step at least: mask index, if norm, item, if loss (the .cpu() is invisible on a CPU)
    assert syncing.count >= 4 * len(batches)
    assert syncing.ops["boolean-mask index"] >= len(batches)
    assert free.count == 0, str(free) + "\n" + "\n".join(free.where)


def test_launch_chain_counts_reads():
    x = torch.zeros(3)
    with count_syncs() as r:
        launch_chain(x, 10, read_every=4)
    assert r.count == 2 and torch.equal(x, torch.full((3,), 10.0))
    with count_syncs() as r:
        launch_chain(x, 5)
    assert r.count == 0


def test_count_ops_is_the_measure_instrument():
    # notebook 01 imports count_ops from here; it is tested in test_measure_instruments.py
    assert count_ops is instruments.count_ops


def test_idle_fraction():
    assert idle_fraction([(0, 1), (3, 4)]) == pytest.approx(0.5)
    assert idle_fraction([(0, 2), (1, 3), (3, 4)]) == 0.0  # overlapping and touching
    with pytest.raises(ValueError, match="no intervals"):
        idle_fraction([])
    with pytest.raises(ValueError, match="end >= start"):
        idle_fraction([(2, 1)])


def _trace():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "a", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "b", "ts": 20, "dur": 10},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 1, "args": {"correlation": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 21, "dur": 1, "args": {"correlation": 3}},
        # kernel 2 was launched inside "a" but runs after "a" ended on the host: it still belongs to "a"
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 3, "dur": 2, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 12, "dur": 3, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "k3", "ts": 24, "dur": 1, "args": {"correlation": 3}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "m", "ts": 26, "dur": 1},  # no launch: by its own time
        {"ph": "X", "cat": "kernel", "name": "outside", "ts": 50, "dur": 1},
    ]
    return {"traceEvents": ev}


def test_gpu_activity_assigns_events_to_their_launching_range(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace()))
    df = gpu_activity(path, ["a", "b"])
    assert list(df["name"]) == ["k1", "k2", "k3", "m"]
    assert list(df["range"]) == ["a", "a", "b", "b"]
    a = df[df["range"] == "a"]
    assert list(a["start_us"]) == [0.0, 9.0] and list(a["end_us"]) == [2.0, 12.0]
    assert idle_fraction(zip(a["start_us"], a["end_us"])) == pytest.approx(7 / 12)
    with pytest.raises(ValueError, match="no record_function range"):
        gpu_activity(_trace(), ["a", "zzz"])
    with pytest.raises(ValueError, match="Chrome trace"):
        gpu_activity({"events": []}, ["a"])


def test_bad_inputs_raise():
    (m, o), _ = _pair()
    good = make_batches(2, BATCH, IN, CLASSES)
    for fn in (train_syncing, train_sync_free):
        with pytest.raises(ValueError, match="batches must be a non-empty"):
            fn(m, o, [])
        with pytest.raises(TypeError, match="model must be"):
            fn(lambda x: x, o, good)
        with pytest.raises(TypeError, match="opt must be"):
            fn(m, "sgd", good)
        with pytest.raises(ValueError, match="opt does not optimize"):
            fn(m, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), good)
        with pytest.raises(ValueError, match="max_norm"):
            fn(m, o, good, max_norm=0.0)
        with pytest.raises(ValueError, match="max_norm"):
            fn(m, o, good, max_norm=float("nan"))
        x, y = good[0]
        with pytest.raises(ValueError, match=r"batches\[0\] x must be a 2-d"):
            fn(m, o, [(x[None], y)])
        with pytest.raises(ValueError, match=r"batches\[0\] y must be a 1-d int64"):
            fn(m, o, [(x, y.float())])
        with pytest.raises(ValueError, match="same, non-zero number"):
            fn(m, o, [(x, y[:-1])])
        with pytest.raises(TypeError, match="model's dtype"):
            fn(m, o, [(x.double(), y)])
        with pytest.raises(TypeError, match=r"batches\[1\] must be an \(x, y\) pair"):
            fn(m, o, [good[0], x])
    with pytest.raises(ValueError, match="log_every"):
        train_sync_free(m, o, good, log_every=-1)
    with pytest.raises(ValueError, match="width"):
        ResidualMLP(IN, 0, 1, CLASSES)
    with pytest.raises(ValueError, match="n_steps"):
        make_batches(0, 2, 3, 4)
    with pytest.raises(TypeError, match="dtype"):
        make_batches(1, 2, 3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="n_kernels"):
        launch_chain(torch.zeros(1), 0)
    with pytest.raises(ValueError, match="read_every"):
        launch_chain(torch.zeros(1), 3, read_every=-2)


def test_host_issue_ms_is_the_median_call_and_checks_its_arguments():
    calls = []
    ms = host_issue_ms(lambda: calls.append(1), "cpu", repeats=3)
    assert len(calls) == 3 and 0 <= ms < 1000
    with pytest.raises(TypeError, match="callable"):
        host_issue_ms(1, "cpu")
    with pytest.raises(ValueError, match="repeats"):
        host_issue_ms(lambda: None, "cpu", repeats=0)


class _FakeClock:
    """A clock (seconds) that only moves when a fake loop "runs": run(n) costs once + per_step * n."""

    def __init__(self, once: float, per_step: float):
        self.t, self.once, self.per_step, self.calls = 0.0, once, per_step, []

    def __call__(self) -> float:
        return self.t

    def run(self, n: int) -> None:
        self.calls.append(n)
        self.t += self.once + self.per_step * n


def test_host_issue_ms_reads_the_clock_around_the_call():
    clock = _FakeClock(once=0.002, per_step=0.001)
    assert host_issue_ms(lambda: clock.run(3), "cpu", repeats=3, clock=clock) == pytest.approx(5.0)
    assert clock.calls == [3, 3, 3]


def test_host_step_ms_cancels_what_a_call_pays_once():
    # 7 ms once per call + 4 ms per step: a one-step call would say 11 ms per step, the difference says 4
    clock = _FakeClock(once=0.007, per_step=0.004)
    assert host_step_ms(clock.run, "cpu", steps=4, repeats=3, clock=clock) == pytest.approx(4.0)
    assert sorted(set(clock.calls)) == [1, 4]
    with pytest.raises(RuntimeError, match="did not grow"):
        host_step_ms(lambda n: None, "cpu", clock=_FakeClock(0.0, 0.0))
    with pytest.raises(ValueError, match="steps"):
        host_step_ms(clock.run, "cpu", steps=1)
    with pytest.raises(TypeError, match="callable"):
        host_step_ms(3, "cpu")


def test_device_step_ms_is_nan_without_a_device():
    assert math.isnan(device_step_ms(lambda n: None, "cpu"))
    with pytest.raises(ValueError, match="steps"):
        device_step_ms(lambda n: None, "cpu", steps=0)


def test_ops_per_step_leaves_out_what_a_call_does_once():
    x = torch.zeros(4)
    first = []

    def run(n):
        if not first:  # the first call does extra work once (like SGD allocating its momentum)
            first.append(1)
            for _ in range(10):
                x.mul_(1)
        x.add_(1)  # once per call
        for _ in range(n):
            x.add_(1)
            x.mul_(2)  # 2 ops per step

    assert ops_per_step(run, steps=3) == 2.0
    # the real loops: the sync-free step runs more ops than the syncing one (masked mean, torch.where)
    (m1, o1), (m2, o2) = _pair()
    data = make_batches(3, BATCH, IN, CLASSES)
    before = ops_per_step(lambda n: train_syncing(m1, o1, data[:n]))
    after = ops_per_step(lambda n: train_sync_free(m2, o2, data[:n]))
    assert 0 < before < after


def test_overlap_columns():
    df = overlap_columns([4.0, 2.0, 1.0], [1.0, 2.0, float("nan")], [4.4, 2.2, 1.5])
    assert list(df["host/device"][:2]) == [4.0, 1.0] and math.isnan(df["host/device"][2])
    assert list(df["bound"][:2]) == ["host", "host"] and df["bound"].isna()[2]  # host = device: host-bound
    assert list(df["overlap bound"][:2]) == [pytest.approx(1.25), pytest.approx(2.0)]
    assert list(df["step / max"][:2]) == [pytest.approx(1.1), pytest.approx(1.1)]
    assert math.isnan(df["overlap bound"][2]) and math.isnan(df["step / max"][2])
    assert overlap_columns([1.0], [3.0], [3.0])["bound"][0] == "device"
    with pytest.raises(ValueError, match="same length"):
        overlap_columns([1.0], [1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        overlap_columns([0.0], [1.0], [1.0])


def test_balance_order_counts_pairs_by_distance_from_balance():
    # distances |log r|: 0 (r=1), log 2 (r=2 and r=1/2), log 8 (r=8)
    ratio = [1.0, 2.0, 0.5, 8.0]
    gain = [1.4, 1.1, 1.3, 0.9]
    lo = [1.3, 1.0, 1.2, 0.85]
    hi = [1.5, 1.25, 1.4, 0.95]
    o = balance_order(ratio, gain, lo, hi)
    # pairs with different distances: (0,1) (0,2) (0,3) (1,3) (2,3) all agree; (1,2) tie in distance, skipped
    assert (o.agree, o.against, o.pairs) == (5, 0, 5)
    assert o.agree_apart == 4  # (0,1): spreads 1.3-1.5 and 1.0-1.25 apart; (0,2): 1.3-1.5, 1.2-1.4 overlap
    assert (o.top, o.nearest) == (0, 0)
    flipped = balance_order(ratio, [0.9, 1.1, 1.3, 1.4], [0.85, 1.0, 1.2, 1.35], [0.95, 1.25, 1.4, 1.5])
    assert (flipped.agree, flipped.against, flipped.against_apart) == (0, 5, 4)
    assert (flipped.top, flipped.nearest) == (3, 0)
    with pytest.raises(ValueError, match="same, non-zero length"):
        balance_order([], [], [], [])
    with pytest.raises(ValueError, match="positive and finite"):
        balance_order([0.0], [1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="inside its spread"):
        balance_order([1.0], [2.0], [1.0], [1.5])


def test_plot_gain_vs_balance_draws_every_measured_size():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(
        {"host/device": [4.0, 1.0, float("nan")], "measured": [1.1, 1.4, 1.0], "lo": [1.0, 1.3, 0.9],
         "hi": [1.2, 1.5, 1.1], "overlap bound": [1.25, 2.0, float("nan")]}
    )  # fmt: skip
    ax = plot_gain_vs_balance(df, title="t", device_note="dev")
    bound = [ln for ln in ax.get_lines() if ln.get_label().startswith("overlap bound")][0]
    assert list(bound.get_xdata()) == [1.0, 4.0]  # sorted by host/device, the NaN size left out
    assert ax.get_xscale() == "log" and ax.get_title() == "t\ndev"
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="needs columns"):
        plot_gain_vs_balance(df.drop(columns="lo"))
    with pytest.raises(ValueError, match="no size"):
        plot_gain_vs_balance(df.iloc[2:])
