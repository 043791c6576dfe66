"""mahia.measure.timing: Timing's statistics, verdict and compare, host_time (the host's issue time of a call) and
capture_graph, the one CUDA-graph capture (bench itself is tested in test_foundation.py)."""

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mahia.measure import timing
from mahia.measure.timing import Timing, bench, capture_graph, compare, gain_range, host_time, verdict

NO_GPU = not torch.cuda.is_available()


def test_timing_from_samples_uses_the_benchmark_statistics():
    t = Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0], first_call_ms=9.0, device="cuda")
    assert (t.median_ms, t.n, t.first_call_ms, t.device) == (3.0, 5, 9.0, "cuda")
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)  # inclusive deciles, as bench's
    one = Timing.from_samples([7.0])
    assert (one.median_ms, one.p20_ms, one.p80_ms) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError, match="at least one"):
        Timing.from_samples([])


def test_verdict_gain_range_and_compare_read_the_spreads():
    base, fast, same = Timing(3.0, 2.0, 4.0, 10), Timing(0.75, 0.5, 1.0, 10), Timing(3.5, 2.5, 4.5, 10)
    assert gain_range(base, fast) == (2.0, 8.0)  # p20/p80 and p80/p20
    assert (verdict(base, fast), verdict(fast, base), verdict(base, same)) == ("faster", "slower", "within noise")
    t = compare({"eager": base, "fused": fast, "again": same})
    assert list(t["verdict"]) == ["baseline", "faster", "within noise"]
    assert t.loc["fused", "gain"] == 4.0 and t.loc["eager", "p80 ms"] == 4.0
    assert compare({"eager": base, "fused": fast}, baseline="fused").loc["eager", "verdict"] == "slower"
    with pytest.raises(ValueError, match="no timings"):
        compare({})
    with pytest.raises(TypeError, match="two Timing objects"):
        gain_range(3.0, fast)


def test_host_time_measures_a_known_sleep_times_the_first_call_apart_and_leaves_the_sync_out(monkeypatch):
    t = host_time(lambda: time.sleep(0.004), device="cpu", warmup_ms=0, rep_ms=0, min_reps=5)
    assert t.n == 5 and t.device == "cpu"
    assert 4.0 <= t.p20_ms <= t.median_ms <= t.p80_ms < 12.0  # sleep() never returns early; a loaded machine is late
    events = []

    def slow_sync(device=None):  # a device that takes 20 ms to catch up after every call
        events.append("sync")
        time.sleep(0.02)

    monkeypatch.setattr(timing, "synchronize", slow_sync)
    t = host_time(lambda: events.append("call") or time.sleep(0.002), device="cpu", warmup_ms=0, rep_ms=0, min_reps=3)
    assert 2.0 <= t.median_ms < 15.0  # the call's 2 ms, not the 20 ms catch-up that follows it
    assert events == ["sync", "call", "sync"] * (2 + 3)  # first call, budget estimate, 3 repetitions
    monkeypatch.undo()
    calls = []  # the first call is timed apart, and the repetitions keep to their budget

    def fn():
        calls.append(1)
        time.sleep(0.03 if len(calls) == 1 else 0.001)  # a slow first call, as compilation makes one

    t = host_time(fn, device="cpu", warmup_ms=5, rep_ms=20, min_reps=3, max_reps=8)
    assert t.first_call_ms >= 30.0 and t.median_ms < 10.0
    assert 3 <= t.n <= 8 and len(calls) <= 2 + 8 + 8  # first, estimate, warm-up and repetitions within max_reps
    assert host_time(lambda: None, device="cpu", rep_ms=1000, max_reps=7).n == 7
    assert bench(lambda: time.sleep(0.002), device="cpu", rep_ms=0, min_reps=9).n == 9  # a floor above the budget


def test_bad_arguments_are_refused_before_any_call():
    calls = []
    f = lambda: calls.append(1)  # noqa: E731
    with pytest.raises(TypeError, match="host_time: fn must be callable"):
        host_time(3.0)
    for bad in (dict(warmup_ms=-1), dict(rep_ms="50"), dict(rep_ms=math.inf), dict(warmup_ms=True)):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            host_time(f, device="cpu", **bad)
    with pytest.raises(ValueError, match="min_reps must be a positive int"):
        host_time(f, device="cpu", min_reps=0)
    with pytest.raises(ValueError, match="max_reps must be an int >= 5"):
        host_time(f, device="cpu", max_reps=2)
    with pytest.raises(ValueError, match="host_time: device must be"):
        host_time(f, device="no-such-device")
    with pytest.raises(TypeError, match="capture_graph: fn must be callable"):
        capture_graph("f")
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        capture_graph(f, warmup=-1)
    if NO_GPU:
        with pytest.raises(RuntimeError, match="host_time.*CUDA is not available"):
            host_time(f, device="cuda")
        with pytest.raises(RuntimeError, match="bench.*CUDA is not available"):
            bench(f, device="cuda")
        with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
            capture_graph(f)
    assert calls == []


@pytest.mark.gpu
def test_capture_graph_replays_into_its_outputs_and_bench_times_replays():
    x, w = torch.randn(64, 32, device="cuda"), torch.randn(32, 16, device="cuda")
    calls = []
    graph, out = capture_graph(lambda: calls.append(1) or torch.relu(x @ w) + 1, warmup=2)
    assert len(calls) == 3  # two warm-up calls and the captured one; replays do not call fn
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(out, torch.relu(x @ w) + 1)
    graph2, out2 = capture_graph(lambda: out * 2, warmup=1, pool=graph.pool())  # sharing the first one's pool
    graph.replay()
    graph2.replay()
    torch.testing.assert_close(out2, out * 2)
    assert bench(lambda: x @ w, cuda_graph=True, rep_ms=5, warmup_ms=1).median_ms > 0
    # A failed capture can leave CUDA's random generator in capture mode: fail one in a process of its own.
    code = (
        "import torch; from mahia.measure.timing import bench; x = torch.randn(8, device='cuda')\n"
        "try:\n    bench(lambda: x.sum().item(), cuda_graph=True, rep_ms=5, warmup_ms=1)\n"
        "except RuntimeError as e:\n    print(e)\n"
    )
    cwd = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert "cannot be captured in a CUDA graph" in out.stdout, out.stdout + out.stderr


@pytest.mark.gpu
def test_host_time_on_a_gpu_is_the_issue_time_not_the_kernels():
    x = torch.randn(4096, 4096, device="cuda")
    wall = bench(lambda: x @ x @ x @ x, rep_ms=20, warmup_ms=5)
    assert host_time(lambda: x @ x @ x @ x, device="cuda").median_ms < wall.median_ms  # queued in µs, run in ms
