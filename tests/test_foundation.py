"""Measurement helpers: timing, correctness, syncs, hardware, argument checks."""

from pathlib import Path

import pytest
import torch

from mahia.measure import checks, hardware
from mahia.measure.instruments import count_syncs
from mahia.measure.timing import bench

ROOT = Path(__file__).resolve().parent.parent


# -- timing ------------------------------------------------------------------------------------------
def test_bench_orders_percentiles_reports_first_call_and_sees_more_work():
    small, big = torch.randn(32, 32), torch.randn(1024, 1024)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine, spinning worker threads swamp a tiny matmul
    try:
        t_small = bench(lambda: small @ small, device="cpu", rep_ms=20)
        t_big = bench(lambda: big @ big, device="cpu", rep_ms=20)
    finally:
        torch.set_num_threads(threads)
    assert t_small.n >= 5 and t_small.device == "cpu" and 0 < t_small.p20_ms <= t_small.median_ms <= t_small.p80_ms
    assert t_small.first_call_ms > 0 and t_small.peak_mem_bytes is None  # no allocator peak on the CPU
    assert t_big.median_ms > 5 * t_small.median_ms  # 32768 times the FLOPs


# -- correctness -------------------------------------------------------------------------------------
def test_rel_error_and_tolerance_per_dtype():
    a = torch.randn(100, dtype=torch.float64)
    assert checks.rel_error(a, a) == 0.0
    assert checks.rel_error(a * (1 + 1e-3), a) == pytest.approx(1e-3, rel=1e-6)
    assert checks.rel_error(torch.full((3,), float("nan")), torch.ones(3)) == float("inf")
    with pytest.raises(ValueError, match="shape mismatch"):
        checks.rel_error(torch.ones(3), torch.ones(4))
    assert checks.tolerance(torch.float32) < checks.tolerance(torch.float16) < checks.tolerance(torch.bfloat16)
    with pytest.raises(ValueError, match="no tolerance"):
        checks.tolerance(torch.int32)


def test_compare_fn_passes_a_correct_path_and_stops_a_wrong_one():
    x = torch.randn(7, 33)
    good = checks.compare_fn(lambda t: torch.tanh(t) * 2, lambda t: 2 * torch.tanh(t), [x])
    assert good.max_error < 1e-6 and {"out0", "grad0"} <= set(good.errors)
    with pytest.raises(checks.CorrectnessError, match="output 0"):
        checks.compare_fn(lambda t: torch.tanh(t) * 2.01, lambda t: 2 * torch.tanh(t), [x])
    # right output, wrong gradient: only the backward check can see it
    wrong_grad = lambda t: t.detach() * 3 + (t - t.detach()) * 2  # noqa: E731
    with pytest.raises(checks.CorrectnessError, match="gradient of input 0"):
        checks.compare_fn(wrong_grad, lambda t: t * 3, [x])


# -- syncs -------------------------------------------------------------------------------------------
def test_count_syncs_sees_the_usual_suspects_and_not_sync_free_code():
    x = torch.randn(100)
    with count_syncs() as r:
        x.sum().item()  # 1
        if x.max() > 0:  # 2
            pass
        x[x > 0]  # 3 boolean-mask index
        torch.nonzero(x > 1)  # 4
    assert r.count == 4, str(r)
    assert r.ops["aten.nonzero"] == 1 and r.ops["boolean-mask index"] == 1
    assert str(r).startswith("4 sync(s) — ") and "aten.nonzero ×1" in str(r)
    assert any("test_foundation.py" in w for w in r.where)
    with count_syncs() as r:
        torch.where(x > 0, x, torch.zeros_like(x)).sum()
        torch.topk(x, 5)
    assert r.count == 0, str(r)


# -- hardware ----------------------------------------------------------------------------------------
def test_resolve_device_device_report_and_slug():
    assert hardware.resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="device must be"):
        hardware.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            hardware.resolve_device("cuda")
    rep = hardware.device_report("cpu")
    assert rep["torch"] == torch.__version__
    assert rep["device_slug"].startswith("cpu-") and " " not in rep["device_slug"]
