"""The syncing and the sync-free training loop compute the same updates; only one of them syncs."""

import copy
import json

import pytest
import torch

from mahia.lessons.sync_loops import (
    ResidualMLP,
    count_ops,
    gpu_activity,
    host_issue_ms,
    idle_fraction,
    launch_chain,
    make_batches,
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
