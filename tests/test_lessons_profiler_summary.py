"""mahia.lessons.profiler_summary: the profiler evidence notebooks 00-04 show (a CPU run here: host operators)."""

import pandas as pd
import pytest
import torch

from mahia.lessons.profiler_summary import (
    MATMUL_KERNELS,
    ProfileSummary,
    compare,
    profile_calls,
    short_kernel_name,
    tile_shape,
)


def test_a_cpu_profile_lists_the_operators_and_says_it_is_cpu_evidence():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    s = profile_calls(lambda: (a @ b).relu().sum(), "cpu", calls=3)
    assert s.device == "cpu" and not s.cuda and s.calls == 3
    assert 0 < s.busy_ms <= s.wall_ms * 1.05  # operators' own time fits in the wall time (timer granularity aside)
    assert s.launches == pytest.approx(3.0)  # matmul, relu, sum: the top-level operators of one call
    names = list(s.top["name"])
    assert "aten::mm" in names and "aten::sum" in names
    assert list(s.top["ms"]) == sorted(s.top["ms"], reverse=True)
    assert s.top["share"].sum() == pytest.approx(1.0)
    assert 0 < s.ms_matching(MATMUL_KERNELS) <= s.busy_ms
    assert s.ms_matching("no such kernel") == 0.0
    t = s.table(rows=2)
    assert list(t.columns) == ["operator (CPU)", "calls", "ms per call", "share of busy time"] and len(t) == 2
    text = s.sentence("a matmul")
    assert text.startswith("Profiler, a matmul (CPU run: host operators, not GPU kernels)") and "`aten::mm`" in text


def test_a_gpu_summary_speaks_of_kernels_and_device_time():
    top = pd.DataFrame(
        {
            "name": ["void pytorch_flash::flash_fwd_kernel<T<128> >(P)", "Memcpy DtoD (Device -> Device)"],
            "calls": [1.0, 1.0],
            "ms": [0.75, 0.25],
        }
    )
    top["share"] = top["ms"]
    s = ProfileSummary("cuda", 3, wall_ms=2.0, busy_ms=1.0, launches=2, top=top)
    assert s.busy == 0.5
    text = s.sentence("SDPA")
    assert "2 kernel launch(es) per call ran 1 ms of device time in 2 ms of wall time (device busy 50%)" in text
    assert "`flash_fwd_kernel` (75%)" in text and "`Memcpy DtoD (Device -> Device)` (25%)" in text
    assert list(s.table().columns)[0] == "kernel"


def test_compare_lines_up_two_profiles_by_name():
    def summary(rows, device="cpu"):
        top = pd.DataFrame(rows, columns=["name", "ms"]).assign(calls=1.0, share=0.0)
        return ProfileSummary(device, 1, 1.0, float(top["ms"].sum()), len(top), top)

    before = summary([("aten::nonzero", 0.5), ("aten::mm", 1.0)])
    after = summary([("aten::where", 0.2), ("aten::mm", 1.1)])
    t = compare(before, after)
    assert list(t.index) == ["aten::nonzero", "aten::where", "aten::mm"]  # by the size of the difference
    assert t.loc["aten::nonzero", "after - before"] == -0.5 and t.loc["aten::where", "ms before"] == 0.0
    assert t.index.name == "operator (CPU)"
    with pytest.raises(ValueError, match="different devices"):
        compare(before, summary([("k", 1.0)], device="cuda"))


def test_names_and_tiles():
    assert short_kernel_name("void at::native::vectorized_elementwise_kernel<4, F>(int, F)") == (
        "vectorized_elementwise_kernel"
    )
    assert short_kernel_name("cunn_SoftMaxForward<4, float>(float*, int)") == "cunn_SoftMaxForward"
    assert short_kernel_name("## Call CompiledFxGraph fx ##") == "## Call CompiledFxGraph fx ##"  # not a signature
    assert short_kernel_name("aten::_scaled_dot_product_flash_attention_for_cpu") == (
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    )
    assert short_kernel_name("x" * 80, width=10) == "x" * 9 + "…"
    assert tile_shape("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1") == (128, 256)
    assert tile_shape("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8") == (64, 64)
    assert tile_shape("ampere_sgemm_128x64_tn") == (128, 64)
    assert tile_shape("void at::native::vectorized_elementwise_kernel<4>") is None


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        profile_calls(42, "cpu")
    with pytest.raises(ValueError, match="calls must be a positive int"):
        profile_calls(lambda: None, "cpu", calls=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        profile_calls(lambda: None, "cpu", warmup=-1)
