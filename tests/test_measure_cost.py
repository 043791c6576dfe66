"""mahia.measure.cost: step time from launches, syncs, FLOPs and bytes; peak memory from byte counts."""

import math

import pytest

from mahia.measure.cost import (
    CHECKPOINT_POLICIES,
    Machine,
    StepTime,
    activation_bytes,
    kernel_ms,
    step_time,
    training_peak_bytes,
    work_ms,
)

GPU = Machine(launch_us=5.0, sync_us=20.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0)
CPU = Machine(launch_us=5.0, sync_us=20.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0, overlap=False)


# --- the machine -----------------------------------------------------------------------------------


def test_machine_defaults_make_unused_resources_free_and_validate():
    m = Machine()
    assert (m.launch_us, m.sync_us, m.floor_us) == (0.0, 0.0, 0.0) and m.overlap
    assert m.bandwidth_gbps == m.matmul_tflops == math.inf
    assert kernel_ms(1e12, 1e12, m) == 0.0  # nothing modelled: the work is free
    with pytest.raises(ValueError, match="launch_us"):
        Machine(launch_us=-1.0)
    with pytest.raises(ValueError, match="sync_us"):
        Machine(sync_us=math.inf)
    with pytest.raises(ValueError, match="floor_us"):
        Machine(floor_us=float("nan"))
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        Machine(bandwidth_gbps=0.0)
    with pytest.raises(ValueError, match="matmul_tflops"):
        Machine(matmul_tflops=True)  # a bool is not a rate
    with pytest.raises(TypeError, match="overlap"):
        Machine(overlap=1)


# --- device time -----------------------------------------------------------------------------------


def test_kernel_time_is_the_largest_of_floor_flops_and_bytes():
    # 100 TFLOP/s = 1e11 FLOP per ms; 1000 GB/s = 1e9 bytes per ms
    assert kernel_ms(0, 0, GPU) == pytest.approx(2e-3)  # the floor
    assert kernel_ms(1e11, 1e6, GPU) == pytest.approx(1.0)  # matmul-bound
    assert kernel_ms(1e6, 3e9, GPU) == pytest.approx(3.0)  # bandwidth-bound
    assert kernel_ms(1e11, 3e9, GPU) == pytest.approx(3.0)  # the slower of the two, not their sum
    with pytest.raises(ValueError, match="nbytes"):
        kernel_ms(0, -1, GPU)
    with pytest.raises(TypeError, match="Machine"):
        kernel_ms(0, 0, "H100")


def test_work_is_the_sum_over_kernels():
    kernels = [(0, 0), (1e11, 0), (0, 3e9)]
    assert work_ms(kernels, GPU) == pytest.approx(2e-3 + 1.0 + 3.0)
    assert work_ms([], GPU) == 0.0
    # many small kernels cost their floors; the same work as one kernel does not
    assert work_ms([(0, 1e3)] * 100, GPU) == pytest.approx(100 * 2e-3)
    assert kernel_ms(0, 100 * 1e3, GPU) == pytest.approx(2e-3)  # the aggregate form: one floor
    with pytest.raises(TypeError, match="kernel 1"):
        work_ms([(0, 0), 5], GPU)


# --- step time -------------------------------------------------------------------------------------


def test_step_is_max_on_a_gpu_and_sum_on_a_cpu_and_syncs_add():
    launch_bound = step_time(GPU, launches=1000, work_ms=2.0)  # 5 ms of launches against 2 ms of work
    assert isinstance(launch_bound, StepTime)
    assert launch_bound.launch_ms == pytest.approx(5.0) and launch_bound.ms == pytest.approx(5.0)
    assert launch_bound.launch_bound and launch_bound.bound_by == "launches"
    device_bound = step_time(GPU, launches=100, work_ms=2.0)
    assert device_bound.ms == pytest.approx(2.0) and device_bound.bound_by == "device work"
    assert not device_bound.launch_bound
    assert step_time(CPU, launches=100, work_ms=2.0).ms == pytest.approx(2.5)
    synced = step_time(GPU, launches=100, work_ms=2.0, syncs=3)
    assert synced.sync_ms == pytest.approx(0.06) and synced.ms == pytest.approx(2.06)
    assert step_time(CPU, launches=100, work_ms=2.0, syncs=3).ms == pytest.approx(2.56)
    assert step_time(GPU, launches=0, syncs=1000).bound_by == "syncs"
    # a CUDA graph: one launch for the whole step
    assert step_time(GPU, launches=1, work_ms=0.1).ms == pytest.approx(0.1)
    with pytest.raises(ValueError, match="syncs"):
        step_time(GPU, launches=1, syncs=-1)
    with pytest.raises(ValueError, match="work_ms"):
        step_time(GPU, launches=1, work_ms=float("nan"))
    with pytest.raises(ValueError, match="launches"):
        step_time(GPU, launches=math.inf)
    with pytest.raises(TypeError, match="Machine"):
        step_time(None, launches=1)


def test_step_from_per_kernel_work_matches_the_lessons_formula():
    # 4 kernels at the floor (2 us each) launched at 10 us each: launch-bound, 40 us
    m = Machine(launch_us=10.0, bandwidth_gbps=1000.0, matmul_tflops=100.0, floor_us=2.0)
    t = step_time(m, launches=4, work_ms=work_ms([(0, 100)] * 4, m))
    assert math.isclose(t.launch_ms, 0.04) and math.isclose(t.work_ms, 4 * 2e-3)
    assert t.ms == max(t.launch_ms, t.work_ms)


# --- memory ----------------------------------------------------------------------------------------

BLOCKS = [(100.0, 60.0), (140.0, 70.0)]  # (kept without checkpointing, kept with selective), per block


def test_activation_bytes_per_checkpointing_policy():
    assert CHECKPOINT_POLICIES == (None, "full", "selective", "keep_attention")
    assert activation_bytes(BLOCKS, block_input=10.0, head=5.0) == (245.0, 0.0)
    assert activation_bytes(BLOCKS, block_input=10.0, head=5.0, checkpoint="full") == (25.0, 140.0)
    # selective: the largest part any one block recomputes (70), not a whole block (140), nor the mean (55)
    assert activation_bytes(BLOCKS, block_input=10.0, head=5.0, checkpoint="selective") == (135.0, 70.0)
    assert activation_bytes([], block_input=10.0, checkpoint="full") == (0.0, 0.0)
    # keep_attention: every block keeps its input and attention output; the rerun misses that output
    kw = dict(block_input=10.0, head=5.0, attention=20.0, checkpoint="keep_attention")
    assert activation_bytes(BLOCKS, **kw) == (65.0, 120.0)
    with pytest.raises(ValueError, match="checkpoint"):
        activation_bytes(BLOCKS, block_input=10.0, checkpoint="some")
    with pytest.raises(ValueError, match="block 1 keeps more"):
        activation_bytes([(10.0, 5.0), (10.0, 11.0)], block_input=1.0)
    with pytest.raises(TypeError, match="block 0"):
        activation_bytes([10.0], block_input=1.0)
    with pytest.raises(ValueError, match="block_input"):
        activation_bytes(BLOCKS, block_input=-1.0)


def test_training_peak_bytes():
    assert training_peak_bytes(activations=1000.5, recompute=200.0, gradients=300) == 1500
    with pytest.raises(ValueError, match="gradients"):
        training_peak_bytes(activations=1.0, recompute=0.0, gradients=-1)
