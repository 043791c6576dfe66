"""mahia.lessons.profile_evidence: the profiler's account of a call, as numbers and as sentences."""

import math

import pytest
import torch

from mahia.lessons.profile_evidence import (
    ATTENTION_OPS,
    MATMUL_OPS,
    SCAN_OPS,
    group_sentence,
    op_changes,
    ops_outside,
    profile_call,
    profile_sentence,
    time_by_group,
    top_ops,
)
from mahia.profile import StepReport


def _report(kernel_ms=None):
    top = [
        {"name": "aten::mm", "calls": 4.0, "ms": 3.0},
        {"name": "aten::_scaled_dot_product_flash_attention", "calls": 2.0, "ms": 2.0},
        {"name": "aten::add", "calls": 10.0, "ms": 1.0},
        {"name": "aten::addmm", "calls": 1.0, "ms": 0.5},
    ]
    return StepReport("cuda:0" if kernel_ms else "cpu", 10.0, kernel_ms, 17 if kernel_ms else None, top)


def test_profile_call_sees_the_matmul_of_a_cpu_call():
    a = torch.randn(192, 192)
    rep = profile_call(lambda: (a @ a).relu().sum(), "cpu", steps=2, warmup=1)
    assert rep.kernel_ms is None and rep.wall_ms > 0  # a CPU: host times only
    names = [r["name"] for r in rep.top]
    assert "aten::mm" in names
    groups = time_by_group(rep, {"matmuls": MATMUL_OPS})
    assert groups["matmuls"] > 0 and math.isclose(sum(groups.values()), sum(r["ms"] for r in rep.top))
    with pytest.raises(TypeError, match="callable"):
        profile_call(3, "cpu")


def test_profile_sentence_states_the_numbers_and_marks_cpu_evidence():
    gpu = profile_sentence(_report(kernel_ms=6.0), "the step")
    assert gpu.startswith("The step under `torch.profiler`: 10 ms of wall time per call, of which 6 ms are kernels (17")
    assert "busy" not in gpu and "ran kernels 60% of the profiled time and waited 40%" in gpu
    # against the benchmark's time, which has no profiler cost per operator in it
    bench = profile_sentence(_report(kernel_ms=6.0), "the step", measured_ms=8.0)
    assert "ran kernels 60% of the profiled time, and 75% of the 8 ms the benchmark measured" in bench
    assert bench.endswith(
        "without the profiler's cost per operator. Busiest operators by device time: "
        + top_ops(_report(kernel_ms=6.0), 3)
        + "."
    )
    # review 05-6: the benchmark's time above the profiled wall time is not "without the profiler's cost"
    slower = profile_sentence(_report(kernel_ms=6.0), "the step", measured_ms=11.0)
    assert "of the 11 ms the benchmark measured without the profiler (more than the profiled call took" in slower
    assert "cost per operator" not in slower
    faster = profile_sentence(_report(kernel_ms=6.0), "the step", measured_ms=5.0)
    assert "the benchmark measured 5 ms without the profiler, less than the kernels' summed time" in faster
    tiny = profile_sentence(_report(kernel_ms=0.04), "the step")
    assert "ran kernels 0.4% of the profiled time and waited 100%" in tiny  # never a "0%" for a nonzero share
    for bad in (0, -1.0, "8"):
        with pytest.raises(ValueError, match="measured_ms"):
            profile_sentence(_report(kernel_ms=6.0), "the step", measured_ms=bad)
    assert "`aten::mm` 3 ms (4×)" in gpu and "`aten::add`" in gpu and "addmm" not in gpu  # the top 3 only
    cpu = profile_sentence(_report(), "the step")
    assert cpu.startswith("*CPU evidence* (the step") and "by host time" in cpu and "kernels" not in cpu
    with pytest.raises(TypeError, match="StepReport"):
        profile_sentence({"wall_ms": 1}, "x")
    # 7fed682's H100 run of NB05: "88.2 ms are kernels (45861 launches)" and "`aten::mm` 18.8 ms (5706×)"
    many = StepReport("cuda:0", 1970.0, 88.2, 45861, [{"name": "aten::mm", "calls": 5706.0, "ms": 18.8}])
    assert "88.2 ms are kernels (45,861 launches)" in profile_sentence(many, "the eager generation")
    assert top_ops(many) == "`aten::mm` 18.8 ms (5,706×)"


def test_time_by_group_takes_the_first_matching_group_and_keeps_the_rest():
    groups = time_by_group(_report(), {"matmuls": MATMUL_OPS, "attention": ATTENTION_OPS})
    assert groups == {"matmuls": 3.5, "attention": 2.0, "other": 1.0}
    assert time_by_group(_report(), {}) == {"other": 6.5}
    # every SDPA backend's forward and backward counts as attention (cuDNN's is the default on an H100)
    names = [
        "aten::_cudnn_attention_forward",
        "aten::_cudnn_attention_backward",
        "aten::_flash_attention_backward",
        "aten::_efficient_attention_forward",
        "aten::_scaled_dot_product_cudnn_attention",
    ]
    rep = StepReport("cuda", 9.0, 5.0, 5, [{"name": n, "calls": 1.0, "ms": 1.0} for n in names])
    assert time_by_group(rep, {"attention": ATTENTION_OPS}) == {"attention": 5.0, "other": 0.0}


def test_group_sentence_and_top_ops():
    before = {"matmuls": 4.0, "other": 2.0}
    after = {"matmuls": 1.0, "other": 0.0}
    assert group_sentence(before, after, ["matmuls"]) == "matmuls 4 → 1 ms (×4), other 2 → 0 ms (—)"
    assert top_ops(_report(), 1) == "`aten::mm` 3 ms (4×)"
    long = StepReport("cpu", 1.0, None, None, [{"name": "x" * 80, "calls": 1.0, "ms": 1.0}])
    assert "…" in top_ops(long) and len(top_ops(long)) < 80


def test_profiler_bookkeeping_is_no_operator_and_a_replay_says_its_kernels_belong_to_none():
    top = [
        {"name": "aten::copy_", "calls": 1.0, "ms": 0.001},
        {"name": "Activity Buffer Request", "calls": 0.0, "ms": 0.0003},
        {"name": "ProfilerStep#3", "calls": 1.0, "ms": 0.0002},
    ]
    replay = StepReport("cuda:0", 2.0, 0.7, 296, top)
    assert top_ops(replay) == "`aten::copy_` 0.001 ms (1×)"
    text = profile_sentence(replay, "the graph replay")
    assert "Operators own 0.001 ms of those kernels' time: the rest ran outside any operator" in text
    assert "Busiest operators" not in text and "Activity Buffer" not in text
    eager = profile_sentence(_report(kernel_ms=6.0), "the eager step")  # operators own 6.5 of 6 ms: listed
    assert "Busiest operators by device time: `aten::mm` 3 ms (4×)" in eager and "outside any operator" not in eager


def test_ops_outside_lists_the_rest_without_the_drivers_marker():
    # notebook 06 (7fed682, H100): the fp32 step's "other" listed `Command Buffer Full` 26.3 ms among its
    # operators' drops; the driver's full-queue marker is no operator's work, and time_by_group leaves it out
    top = [
        {"name": "_GLAFunctionBackward", "calls": 8.0, "ms": 102.0},
        {"name": "Command Buffer Full", "calls": 30.0, "ms": 26.3},
        {"name": "_GLAFunction", "calls": 8.0, "ms": 30.9},
        {"name": "aten::mm", "calls": 291.0, "ms": 300.0},
        {"name": "ProfilerStep#2", "calls": 1.0, "ms": 0.1},
    ]
    rep = StepReport("cuda:0", 620.0, 610.0, 2000, top)
    rest = ops_outside(rep, {"matmuls": MATMUL_OPS})
    assert rest == {"_GLAFunctionBackward": 102.0, "_GLAFunction": 30.9}
    assert sum(rest.values()) == pytest.approx(time_by_group(rep, {"matmuls": MATMUL_OPS})["other"])
    with pytest.raises(TypeError, match="StepReport"):
        ops_outside({"top": top}, {})


def test_op_changes_lists_the_largest_changes_either_way():
    before = _report(kernel_ms=6.0)
    top = [
        {"name": "aten::mm", "calls": 4.0, "ms": 0.5},  # -2.5
        {"name": "aten::_scaled_dot_product_flash_attention", "calls": 2.0, "ms": 2.1},  # +0.1
        {"name": "aten::copy_", "calls": 8.0, "ms": 1.5},  # new: +1.5
        {"name": "ProfilerStep#1", "calls": 1.0, "ms": 9.0},  # bookkeeping: left out
    ]
    after = StepReport("cuda:0", 5.0, 4.0, 20, top)
    assert op_changes(before, after) == "`aten::mm` 3 → 0.5 ms, `aten::copy_` 0 → 1.5 ms, `aten::add` 1 → 0 ms"
    assert op_changes(before, after, n=1) == "`aten::mm` 3 → 0.5 ms"
    with pytest.raises(TypeError, match="StepReport"):
        op_changes(before, {"top": []})


def test_the_scan_and_the_grouped_gemms_backward_are_grouped_by_their_profiler_names():
    # the operator names an H100 profile of notebook 06's fp32 step gave (b34185d): the scan's and the grouped
    # GEMM's backward kernels had gone to "other", beside norms and the optimizer
    top = [
        {"name": "_GLAFunctionBackward", "calls": 8.0, "ms": 102.0},
        {"name": "_GLAFunction", "calls": 8.0, "ms": 30.9},
        {"name": "GeneratedBackwardFor_mahia_moe_grouped_mm_default", "calls": 16.0, "ms": 20.2},
        {"name": "mahia::moe_grouped_mm", "calls": 16.0, "ms": 10.0},
        {"name": "aten::mm", "calls": 40.0, "ms": 300.0},
        {"name": "aten::_fused_adamw_", "calls": 1.0, "ms": 5.0},
    ]
    rep = StepReport("cuda:0", 500.0, 468.1, 900, top)
    groups = time_by_group(rep, {"matmuls": MATMUL_OPS, "scan": SCAN_OPS})
    assert groups == pytest.approx({"matmuls": 330.2, "scan": 132.9, "other": 5.0})
