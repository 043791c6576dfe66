"""The step prediction, compile bookkeeping, CUDA-graph wrapper and bucketing helpers of notebooks 04 and 05.

The op traces themselves (trace_ops, re-exported here) are tested in test_measure_instruments.py."""

import math

import pytest
import torch

from mahia.lessons.graphs_and_compile import (
    BucketedGraphs,
    CaptureAttempt,
    CompileCounter,
    GraphedStep,
    GraphedTrainStep,
    _first_and_last_error,
    break_even_range,
    break_even_steps,
    clip_by_norm,
    clip_by_norm_logged,
    cuda_memory,
    generated_kernels,
    library_calls,
    next_bucket,
    pad_to,
    predict_step,
    timed_call,
    trace_ops,
    try_capture,
    try_compile,
)
from mahia.measure import instruments
from mahia.measure.checks import check_close, tolerance
from mahia.measure.instruments import OpTrace

N, K, M = 37, 19, 11


def test_predict_step_is_max_or_sum_of_host_and_device():
    x, w = torch.randn(N, K), torch.randn(K, M)
    tr = trace_ops(lambda x, w: (x * 2 + 1).relu() @ w, x, w)
    p = predict_step(tr, launch_us=10.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0)
    assert p.kernels == 4 and math.isclose(p.cpu_ms, 0.04)
    assert math.isclose(p.gpu_ms, 4 * 2e-3)  # every kernel at the floor
    assert p.ms == max(p.cpu_ms, p.gpu_ms) and p.launch_bound
    f = predict_step(tr, launch_us=10.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0, fused=True)
    assert f.kernels == 2 and math.isclose(f.cpu_ms, 0.02)
    g = predict_step(tr, launch_us=10.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0, graphed=True)
    assert math.isclose(g.cpu_ms, 0.01) and g.ms == max(g.cpu_ms, p.gpu_ms)  # one launch, same kernels
    c = predict_step(tr, launch_us=10.0, bandwidth_gbps=1.0, matmul_tflops=1e-3, overlap=False)
    assert math.isclose(c.ms, c.cpu_ms + c.gpu_ms)
    with pytest.raises(ValueError, match="launch_us"):
        predict_step(tr, launch_us=-1, bandwidth_gbps=1.0, matmul_tflops=1.0)
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        predict_step(tr, launch_us=1, bandwidth_gbps=0, matmul_tflops=1.0)
    with pytest.raises(TypeError, match="OpTrace"):
        predict_step("trace", launch_us=1, bandwidth_gbps=1.0, matmul_tflops=1.0)
    assert isinstance(tr, OpTrace)


def test_trace_ops_is_the_measure_instrument():
    # notebooks 04, 05 and 10 import trace_ops from here; it is tested in test_measure_instruments.py
    assert trace_ops is instruments.trace_ops


def test_clip_by_norm_matches_the_logged_version(capsys):
    tol = tolerance(torch.float32)
    for scale in (10.0, 1e-3):  # clipped, untouched
        x = torch.randn(N, K) * scale / (N * K) ** 0.5
        check_close("clip_by_norm", clip_by_norm(x), clip_by_norm_logged(x), tol)
    assert torch.equal(clip_by_norm(torch.zeros(3, 5)), torch.zeros(3, 5))
    small = torch.randn(5) * 1e-3
    assert torch.equal(clip_by_norm(small), small)  # factor exactly 1: the input comes back unchanged
    assert "clip_by_norm_logged: norm" in capsys.readouterr().out


def test_compile_counter_sees_graph_breaks_and_recompiles(capsys):
    torch._dynamo.reset()
    x = torch.randn(N, K) * 10
    broken, clean = CompileCounter(), CompileCounter()
    torch.compile(clip_by_norm_logged, backend=broken)(x)
    torch.compile(clip_by_norm, backend=clean)(x)
    assert clean.graphs == 1 and broken.graphs >= 2
    static = CompileCounter()
    f = torch.compile(clip_by_norm, backend=static, dynamic=False)
    for n in (5, 6, 7):
        f(torch.randn(n, K))
    assert static.graphs == 3  # one compilation per new shape
    dyn = CompileCounter()
    g = torch.compile(clip_by_norm, backend=dyn, dynamic=True)
    for n in (5, 6, 7):
        g(torch.randn(n, K))
    assert dyn.graphs == 1
    torch._dynamo.reset()


def test_timed_call_and_break_even():
    out, ms = timed_call(lambda: torch.ones(3).sum(), "cpu")
    assert out.item() == 3.0 and ms >= 0
    assert break_even_steps(1000.0, 3.0, 1.0) == 500.0
    assert break_even_steps(1000.0, 1.0, 1.0) == math.inf
    assert break_even_steps(1000.0, 1.0, 2.0) == math.inf
    with pytest.raises(ValueError, match="compile_ms"):
        break_even_steps(-1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="eager_ms"):
        break_even_steps(1.0, float("nan"), 0.5)


def test_break_even_range_spans_the_spreads():
    from types import SimpleNamespace as T

    eager, compiled = T(p20_ms=2.5, p80_ms=3.5), T(p20_ms=0.5, p80_ms=1.5)
    assert break_even_range(1000.0, eager, compiled) == (1000.0 / 3.0, 1000.0)  # savings 3 ms and 1 ms
    assert break_even_range(1000.0, T(p20_ms=1.0, p80_ms=2.0), T(p20_ms=0.5, p80_ms=1.5))[1] == math.inf
    with pytest.raises(TypeError, match="compiled must be a timing"):
        break_even_range(1000.0, eager, 1.0)


def test_next_bucket_and_pad_to():
    assert next_bucket(1, [8, 2, 4]) == 2 and next_bucket(3, [2, 4, 8]) == 4 and next_bucket(8, [2, 4, 8]) == 8
    with pytest.raises(ValueError, match="exceeds the largest bucket 8"):
        next_bucket(9, [2, 4, 8])
    with pytest.raises(ValueError, match="n must be a positive int"):
        next_bucket(0, [2])
    x = torch.arange(6).view(2, 3)
    y = pad_to(x, 4, dim=0, value=-1)
    assert y.shape == (4, 3) and torch.equal(y[:2], x) and (y[2:] == -1).all()
    assert pad_to(x, 3, dim=1) is x
    assert pad_to(x, 5, dim=-1).shape == (2, 5)
    with pytest.raises(ValueError, match="smaller than dim 0"):
        pad_to(x, 1, dim=0)
    with pytest.raises(ValueError, match="out of range"):
        pad_to(x, 4, dim=2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        pad_to([1, 2], 4)


def test_bucketed_padding_is_exact_for_row_independent_functions():
    w = torch.randn(K, M)
    fn = lambda x, t: (torch.tanh(x @ w) * t, x.abs().sum())  # rows independent; the sum is not row-sized
    bucketed = BucketedGraphs(fn, [4, 16, 8], capture=False)
    assert bucketed.buckets == [4, 8, 16]
    for n in (1, 4, 5, 13):
        x, t = torch.randn(n, K), torch.randn(n, 1)
        y, s = bucketed(x, t)
        assert y.shape == (n, M)
        check_close(f"bucketed n={n}", y, fn(x, t)[0], tolerance(torch.float32))
        check_close(f"bucketed sum n={n}", s, x.abs().sum(), tolerance(torch.float32))  # zero padding adds 0
    assert bucketed.graphs == {}  # nothing captured without capture=True
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucketed(torch.randn(17, K), torch.randn(17, 1))
    with pytest.raises(ValueError, match="same size along dim 0"):
        bucketed(torch.randn(3, K), torch.randn(4, 1))
    with pytest.raises(ValueError, match="buckets must be positive ints"):
        BucketedGraphs(fn, [0, 4])
    with pytest.raises(TypeError, match="fn must be callable"):
        BucketedGraphs(None, [4])


def test_graphed_step_rejects_cpu_and_bad_arguments():
    with pytest.raises(ValueError, match="CUDA graphs need CUDA tensors"):
        GraphedStep(lambda x: x * 2, torch.randn(3))
    with pytest.raises(TypeError, match="input 0 must be a torch.Tensor"):
        GraphedStep(lambda x: x * 2, 3.0)
    with pytest.raises(ValueError, match="at least one example input"):
        GraphedStep(lambda: None)
    with pytest.raises(TypeError, match="fn must be callable"):
        GraphedStep("f", torch.randn(3))


@pytest.mark.gpu
def test_graphed_step_replays_new_inputs_on_cuda():
    w = torch.randn(K, M, device="cuda")
    fn = lambda x: torch.relu(x @ w) + 1
    g = GraphedStep(fn, torch.randn(N, K, device="cuda"))
    for _ in range(3):
        x = torch.randn(N, K, device="cuda")
        check_close("graph replay", g(x).clone(), fn(x), tolerance(torch.float32, tf32=True))
    with pytest.raises(ValueError, match="captured for"):
        g(torch.randn(N + 1, K, device="cuda"))
    bucketed = BucketedGraphs(fn, [8, 64])
    for n in (3, 8, 40):
        x = torch.randn(n, K, device="cuda")
        check_close("bucketed replay", bucketed(x).clone(), fn(x), tolerance(torch.float32, tf32=True))
    assert sorted(bucketed.graphs) == [8, 64]


class _EndRaises:
    """A context manager whose exit raises, as ``torch.cuda.graph`` does when ``capture_end`` fails."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture\nmore")


def test_try_capture_reports_the_first_error_and_rejects_bad_arguments():
    try:
        with _EndRaises():
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    except RuntimeError as exc:
        first, last = _first_and_last_error(exc)
    assert first == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert last == "RuntimeError: CUDA error: operation failed due to a previous error during capture"
    try:
        raise ValueError("alone")
    except ValueError as exc:
        assert _first_and_last_error(exc) == ("ValueError: alone", None)
    failed = CaptureAttempt(None, first, last, ("The CUDA Graph is empty",))
    assert not failed.ok and str(failed).startswith(first) and "ending the failed capture then raised" in str(failed)
    assert "torch warned: The CUDA Graph is empty" in str(failed)
    with pytest.raises(ValueError, match="CUDA graphs need CUDA tensors"):
        try_capture(lambda x: x * 2, torch.randn(3))
    with pytest.raises(TypeError, match="fn must be callable"):
        try_capture("f", torch.randn(3))


@pytest.mark.gpu
def test_try_capture_leaves_cuda_ready_after_a_failed_capture():
    x = torch.arange(4.0, device="cuda")
    caller = torch.cuda.current_stream()
    bad = try_capture(lambda t: t * torch.tensor([2.0], device="cuda"), x)  # host data copied inside capture
    assert not bad.ok and "pinned" in bad.error
    sync = try_capture(lambda t: t / t.sum().item(), x)  # a host sync inside capture
    assert not sync.ok and sync.error
    assert torch.cuda.current_stream() == caller
    good = try_capture(lambda t: t * 2, x)  # the next capture starts clean
    assert good.ok and good.step(x + 1).tolist() == [2.0, 4.0, 6.0, 8.0]
    assert torch.rand(2, device="cuda").shape == (2,)  # a completed capture leaves the RNG usable


def _mlp_and_batch(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, 32), torch.nn.ReLU(), torch.nn.Linear(32, M)).to(device)
    loss_fn = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    return model, loss_fn, (torch.randn(N, K, device=device), torch.randn(N, M, device=device))


def test_graphed_train_step_refuses_what_cannot_be_captured():
    model, loss_fn, batch = _mlp_and_batch("cpu")
    with pytest.raises(ValueError, match="capturable=True"):
        GraphedTrainStep(model, torch.optim.AdamW(model.parameters()), batch, loss_fn=loss_fn)
    opt = torch.optim.AdamW(model.parameters(), capturable=True)
    with pytest.raises(ValueError, match="CUDA graphs need CUDA tensors"):
        GraphedTrainStep(model, opt, batch, loss_fn=loss_fn)
    with pytest.raises(TypeError, match="optimizer must be"):
        GraphedTrainStep(model, "adam", batch, loss_fn=loss_fn)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        cuda_memory("cpu")


@pytest.mark.gpu
def test_graphed_train_step_trains_like_eager_on_cuda():
    model, loss_fn, batch = _mlp_and_batch("cuda")
    twin, _, _ = _mlp_and_batch("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    opt_twin = torch.optim.AdamW(twin.parameters(), lr=1e-2, capturable=True)

    def eager(b):
        opt_twin.zero_grad(set_to_none=True)
        loss = loss_fn(twin, *b)
        loss.backward()
        opt_twin.step()
        return loss.detach()

    before = cuda_memory("cuda")
    step = GraphedTrainStep(model, opt, batch, loss_fn=loss_fn, warmup=3)
    assert cuda_memory("cuda")["reserved"] >= before["reserved"]  # the graph keeps its pool
    for _ in range(3):  # the same warm-up steps for the twin
        eager(batch)
    for _ in range(4):
        b = (torch.randn(N, K, device="cuda"), torch.randn(N, M, device="cuda"))
        check_close("graphed loss", step(b).clone(), eager(b), tolerance(torch.float32, tf32=True))
    for p, q in zip(model.parameters(), twin.parameters()):
        check_close("weights after training", p, q, tolerance(torch.float32, tf32=True))
    with pytest.raises(ValueError, match="captured for"):
        step((torch.randn(N + 1, K, device="cuda"), torch.randn(N + 1, M, device="cuda")))


Q = "'" * 3
SAMPLE_OUTPUT_CODE = f"""
triton_poi_fused_add_mul_0 = async_compile.triton('triton_poi_fused_add_mul_0', {Q}
import triton
@triton.jit
def triton_poi_fused_add_mul_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    pass
{Q}, device_str='cuda')

cpp_fused_silu_1 = async_compile.cpp_pybinding(['const float*', 'float*'], r{Q}
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {{}}
{Q})

def call(args):
    extern_kernels.mm(a, b, out=buf0)
    buf1 = torch.ops.aten._scaled_dot_product_flash_attention.default(q, k, v)
    assert_size_stride(buf1, (2,), (1,), 'torch.ops.aten._scaled_dot_product_flash_attention.default')
    triton_poi_fused_add_mul_0.run(buf0, buf2, 16, stream=stream0)
    extern_kernels.mm(c, d, out=buf3)
"""


def test_generated_kernels_and_library_calls_read_inductor_output():
    kernels = generated_kernels(SAMPLE_OUTPUT_CODE)
    assert list(kernels) == ["triton_poi_fused_add_mul_0", "cpp_fused_silu_1"]
    assert "@triton.jit" in kernels["triton_poi_fused_add_mul_0"]
    assert kernels["cpp_fused_silu_1"].strip().startswith('extern "C"')
    assert library_calls(SAMPLE_OUTPUT_CODE) == {
        "extern_kernels.mm": 2,
        "torch.ops.aten._scaled_dot_product_flash_attention": 1,
    }
    with pytest.raises(TypeError, match="code must be a str"):
        generated_kernels(None)


def test_try_compile_times_the_first_call_and_reports_failures(capsys):
    x = torch.randn(N, K) * 10
    ok = try_compile(clip_by_norm, lambda f: f(x), backend="eager", device="cpu")
    assert ok.ok and ok.error is None and ok.first_call_ms > 0
    check_close("try_compile output", ok.output, clip_by_norm(x), tolerance(torch.float32))
    check_close("try_compile run", ok.run(), clip_by_norm(x), tolerance(torch.float32))
    bad = try_compile(clip_by_norm, lambda f: f(x), backend="no_such_backend", device="cpu")
    assert not bad.ok and bad.run is None and "no_such_backend" in bad.error

    def broken(t):
        raise RuntimeError("unsupported thing\nsecond line")

    failed = try_compile(broken, lambda f: f(x), backend="eager", device="cpu")
    assert not failed.ok and failed.error.startswith("RuntimeError: unsupported thing")
    with pytest.raises(TypeError, match="callable"):
        try_compile(clip_by_norm, None)
    torch._dynamo.reset()
