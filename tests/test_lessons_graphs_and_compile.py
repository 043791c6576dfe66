"""The step prediction, compile bookkeeping and CUDA-graph helpers of notebooks 04 and 05 (trace_ops, re-exported
there, is tested in test_measure_instruments.py)."""

import math
import sys
import warnings

import pytest
import torch

import mahia.lessons.graphs_and_compile as gcl

N, K, M = 37, 19, 11


def test_predict_step_is_max_or_sum_of_host_and_device():
    x, w = torch.randn(N, K), torch.randn(K, M)
    tr = gcl.trace_ops(lambda x, w: (x * 2 + 1).relu() @ w, x, w)
    kw = dict(launch_us=10.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0)
    p = gcl.predict_step(tr, **kw)
    assert p.kernels == 4 and math.isclose(p.cpu_ms, 0.04)
    assert math.isclose(p.gpu_ms, 4 * 2e-3)  # every kernel at the floor
    assert p.ms == max(p.cpu_ms, p.gpu_ms)
    f = gcl.predict_step(tr, **kw, fused=True)
    assert f.kernels == 2 and math.isclose(f.cpu_ms, 0.02)
    g = gcl.predict_step(tr, **kw, graphed=True)
    assert math.isclose(g.cpu_ms, 0.01) and g.ms == max(g.cpu_ms, p.gpu_ms)  # one launch, same kernels
    c = gcl.predict_step(tr, launch_us=10.0, bandwidth_gbps=1.0, matmul_tflops=1e-3, overlap=False)
    assert math.isclose(c.ms, c.cpu_ms + c.gpu_ms)


def test_timed_call_and_break_even():
    out, ms = gcl.timed_call(lambda: torch.ones(3).sum(), "cpu")
    assert out.item() == 3.0 and ms >= 0
    assert gcl.break_even_steps(1000.0, 3.0, 1.0) == 500.0
    assert gcl.break_even_steps(1000.0, 1.0, 1.0) == math.inf and gcl.break_even_steps(1000.0, 1.0, 2.0) == math.inf


@pytest.mark.gpu
def test_try_capture_leaves_cuda_ready_after_a_failed_capture():
    x = torch.arange(4.0, device="cuda")
    caller = torch.cuda.current_stream()
    bad = gcl.try_capture(lambda t: t * torch.tensor([2.0], device="cuda"), x)  # host data copied inside capture
    assert not bad.ok and "pinned" in bad.error
    sync = gcl.try_capture(lambda t: t / t.sum().item(), x)  # a host sync inside capture
    assert not sync.ok and "previous error during capture" not in sync.error  # the step's own error, first
    assert torch.cuda.current_stream() == caller
    good = gcl.try_capture(lambda t: t * 2, x)  # the next capture starts clean
    x.add_(1)  # the example inputs are the static inputs
    good.graph.replay()
    assert good.ok and good.outputs.tolist() == [2.0, 4.0, 6.0, 8.0]
    assert torch.rand(2, device="cuda").shape == (2,)  # a completed capture leaves the RNG usable


def test_graphed_train_step_refuses_what_cannot_be_captured():
    # (that it trains like eager is notebook 05's gate on a GPU: losses and weights against an eager twin)
    model = torch.nn.Linear(K, M)
    batch, loss_fn = (torch.randn(N, K), torch.randn(N, M)), lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    with pytest.raises(ValueError, match="capturable=True"):
        gcl.GraphedTrainStep(model, torch.optim.AdamW(model.parameters()), batch, loss_fn=loss_fn)


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
    kernels = gcl.generated_kernels(SAMPLE_OUTPUT_CODE)
    assert list(kernels) == ["triton_poi_fused_add_mul_0", "cpp_fused_silu_1"]
    assert "@triton.jit" in kernels["triton_poi_fused_add_mul_0"]
    assert kernels["cpp_fused_silu_1"].strip().startswith('extern "C"')
    assert gcl.library_calls(SAMPLE_OUTPUT_CODE) == {
        "extern_kernels.mm": 2,
        "torch.ops.aten._scaled_dot_product_flash_attention": 1,
    }


def test_collect_noise_keeps_warnings_logs_and_stderr_of_a_graph_break(capsys):
    def broken(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    torch._dynamo.reset()
    torch._logging.set_logs(graph_breaks=True)
    try:
        with gcl.collect_noise() as noise:
            warnings.warn("on purpose", stacklevel=1)
            print("to stderr", file=sys.stderr)
            torch.compile(broken, backend="eager")(torch.ones(3))
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    assert [str(w.message) for w in noise.warnings] == ["on purpose"]
    assert noise.stderr == ["to stderr"] and any(
        "graph_break" in r.getMessage().lower() or "Graph break" in r.getMessage() for r in noise.records
    )
    assert capsys.readouterr().err == ""
    assert noise.summary("compile").startswith("compile: 1 warnings, ")
