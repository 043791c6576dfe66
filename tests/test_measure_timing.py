"""mahia.measure.timing.capture_graph, the one CUDA-graph capture (argument checks run on a CPU)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mahia.measure.timing import Timing, bench, capture_graph


def test_capture_graph_checks_its_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        capture_graph("f")
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        capture_graph(lambda: None, warmup=-1)
    with pytest.raises(ValueError, match="warmup"):
        capture_graph(lambda: None, warmup=1.5)


def test_capture_graph_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    calls = []
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        capture_graph(lambda: calls.append(1))
    assert calls == []  # refused before any warm-up call


@pytest.mark.gpu
def test_capture_graph_replays_into_its_outputs():
    x = torch.randn(64, 32, device="cuda")
    w = torch.randn(32, 16, device="cuda")
    calls = []

    def fn():
        calls.append(1)
        return torch.relu(x @ w) + 1

    graph, out = capture_graph(fn, warmup=2)
    assert len(calls) == 3  # two warm-up calls and the captured one; replays do not call fn
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(out, torch.relu(x @ w) + 1)
    assert len(calls) == 3
    # a second graph sharing the first one's memory pool
    graph2, out2 = capture_graph(lambda: out * 2, warmup=1, pool=graph.pool())
    graph.replay()
    graph2.replay()
    torch.testing.assert_close(out2, out * 2)


@pytest.mark.gpu
def test_bench_cuda_graph_times_replays_and_names_what_cannot_be_captured():
    x = torch.randn(256, 256, device="cuda")
    t = bench(lambda: x @ x, cuda_graph=True, rep_ms=5, warmup_ms=1)
    assert t.median_ms > 0
    # A failed capture can leave CUDA's random generator in capture mode for the rest of the process:
    # fail one in a process of its own.
    code = (
        "import torch; from mahia.measure.timing import bench; x = torch.randn(8, device='cuda')\n"
        "try:\n    bench(lambda: x.sum().item(), cuda_graph=True, rep_ms=5, warmup_ms=1)\n"
        "except RuntimeError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert "cannot be captured in a CUDA graph" in out.stdout, out.stdout + out.stderr


def test_timing_from_samples_uses_the_benchmark_statistics():
    t = Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0], first_call_ms=9.0, device="cuda")
    assert (t.median_ms, t.n, t.first_call_ms, t.device) == (3.0, 5, 9.0, "cuda")
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)  # inclusive deciles, as bench's
    one = Timing.from_samples([7.0])
    assert (one.median_ms, one.p20_ms, one.p80_ms) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError, match="at least one"):
        Timing.from_samples([])
