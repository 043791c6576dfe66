"""mahia.measure.cost: step time from launches, syncs, FLOPs and bytes; peak memory from byte counts."""

import math

import pytest

from mahia.measure.cost import Machine, activation_bytes, kernel_ms, step_time, training_peak_bytes, work_ms

# 100 TFLOP/s = 1e11 FLOP per ms; 1000 GB/s = 1e9 bytes per ms
GPU = Machine(launch_us=5.0, sync_us=20.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0)
CPU = Machine(launch_us=5.0, sync_us=20.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0, overlap=False)


def test_kernel_time_is_the_largest_of_floor_flops_and_bytes_and_work_their_sum():
    assert kernel_ms(0, 0, GPU) == pytest.approx(2e-3)  # the floor
    assert kernel_ms(1e11, 1e6, GPU) == pytest.approx(1.0)  # matmul-bound
    assert kernel_ms(1e11, 3e9, GPU) == pytest.approx(3.0)  # the slower of the two, not their sum
    assert kernel_ms(1e12, 1e12, Machine()) == 0.0  # nothing modelled: the work is free
    assert work_ms([(0, 0), (1e11, 0), (0, 3e9)], GPU) == pytest.approx(2e-3 + 1.0 + 3.0)
    # many small kernels cost their floors; the same work as one kernel does not
    assert work_ms([(0, 1e3)] * 100, GPU) == pytest.approx(100 * kernel_ms(0, 100 * 1e3, GPU))


def test_step_is_max_on_a_gpu_and_sum_on_a_cpu_and_syncs_add():
    launch_bound = step_time(GPU, launches=1000, work_ms=2.0)  # 5 ms of launches against 2 ms of work
    assert (launch_bound.launch_ms, launch_bound.ms) == pytest.approx((5.0, 5.0))
    assert step_time(GPU, launches=100, work_ms=2.0).ms == pytest.approx(2.0)
    assert step_time(CPU, launches=100, work_ms=2.0).ms == pytest.approx(2.5)
    synced = step_time(GPU, launches=100, work_ms=2.0, syncs=3)
    assert (synced.sync_ms, synced.ms) == pytest.approx((0.06, 2.06))
    assert step_time(CPU, launches=100, work_ms=2.0, syncs=3).ms == pytest.approx(2.56)
    assert step_time(GPU, launches=1, work_ms=0.1).ms == pytest.approx(0.1)  # a CUDA graph: one launch


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: Machine(launch_us=-1.0), ValueError, "Machine: launch_us"),
        (lambda: Machine(sync_us=math.inf), ValueError, "sync_us must be a finite"),
        (lambda: Machine(floor_us=float("nan")), ValueError, "floor_us"),
        (lambda: Machine(bandwidth_gbps=0.0), ValueError, "bandwidth_gbps must be a positive"),
        (lambda: Machine(matmul_tflops=True), ValueError, "matmul_tflops"),  # a bool is not a rate
        (lambda: Machine(overlap=1), TypeError, "overlap"),
        (lambda: kernel_ms(0, -1, GPU), ValueError, "kernel_ms: nbytes"),
        (lambda: kernel_ms(0, 0, "H100"), TypeError, "kernel_ms: machine must be a Machine"),
        (lambda: work_ms([(0, 0), 5], GPU), TypeError, "work_ms: kernel 1"),
        (lambda: step_time(GPU, launches=1, syncs=-1), ValueError, "step_time: syncs"),
        (lambda: step_time(GPU, launches=math.inf), ValueError, "launches"),
        (lambda: step_time(None, launches=1), TypeError, "Machine"),
        (lambda: activation_bytes([], block_input=1.0, checkpoint="some"), ValueError, "activation_bytes: checkpoint"),
    ],
)
def test_bad_input_names_the_function_and_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_activation_and_peak_bytes_per_checkpointing_policy():
    blocks = [(100.0, 60.0), (140.0, 70.0)]  # (kept without checkpointing, kept with selective), per block
    assert activation_bytes(blocks, block_input=10.0, head=5.0) == (245.0, 0.0)
    assert activation_bytes(blocks, block_input=10.0, head=5.0, checkpoint="full") == (25.0, 140.0)
    # selective: the largest part any one block recomputes (70), not a whole block (140), nor the mean (55)
    assert activation_bytes(blocks, block_input=10.0, head=5.0, checkpoint="selective") == (135.0, 70.0)
    assert activation_bytes([], block_input=10.0, checkpoint="full") == (0.0, 0.0)
    # keep_attention: every block keeps its input and attention output; the rerun misses that output
    kw = dict(block_input=10.0, head=5.0, attention=20.0, checkpoint="keep_attention")
    assert activation_bytes(blocks, **kw) == (65.0, 120.0)
    assert training_peak_bytes(activations=1000.5, recompute=200.0, gradients=300) == 1500
