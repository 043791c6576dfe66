"""mahia.lessons.profiler_summary: the profiler evidence notebooks 00-04 show (a CPU run here: host operators)."""

import re

import pandas as pd
import pytest
import torch

from mahia.lessons.profiler_summary import (
    MATMUL_KERNELS,
    ProfileSummary,
    compare,
    duration,
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
    # no timing without the profiler given: its wall time is named as the profiler's, not read as idle device time
    assert (
        "2 kernels and copies per call ran 1 ms of device time, in 2 ms of profiled wall time (50%; that wall" in text
    )
    assert "device busy" not in text
    # the H100 review of 02 (b34185d): 0.475 ms of kernels in 8.13 ms profiled, against 0.522 ms timed by bench
    timed = s.sentence("SDPA", measured_ms=1.1)
    assert "device busy 91% of the 1.1 ms the call takes without the profiler" in timed
    assert "busy throughout" in s.sentence("SDPA", measured_ms=0.8)
    assert "more than the 800 µs the call takes" in s.sentence("SDPA", measured_ms=0.8)
    # 00-9: a short copy's device time in µs, as the prose beside it gives it, not "0.00104 ms"
    short = ProfileSummary("cuda", 20, wall_ms=0.137, busy_ms=0.00104, launches=1, top=top)
    assert "1 kernel or copy per call ran 1.04 µs of device time, in 137 µs of profiled wall" in short.sentence("copy")
    # 01-5: a copy is not a kernel; the profiler's device rows hold both
    copy_only = ProfileSummary("cuda", 20, wall_ms=0.137, busy_ms=0.00104, launches=1, top=top.iloc[1:])
    assert "1 copy per call ran" in copy_only.sentence("copy")
    kernels = ProfileSummary("cuda", 3, wall_ms=2.0, busy_ms=1.0, launches=3, top=top.iloc[:1])
    assert "3 kernels per call ran" in kernels.sentence("x")
    cpu = ProfileSummary("cpu", 20, wall_ms=0.0051, busy_ms=0.00202, launches=1, top=top).sentence("copy")
    assert "the operators spent 2.02 µs of their own time in 5.1 µs of wall time per call" in cpu
    assert duration(2.64) == "2.64 ms" and duration(0.9996) == "1,000 µs"
    with pytest.raises(ValueError, match="need a time in ms"):
        duration(float("nan"))
    with pytest.raises(ValueError, match="measured_ms"):
        s.sentence("SDPA", measured_ms=0.0)
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


# Kernel names as the profiler reports them on an H100 (torch 2.11): cuBLAS's bf16 GEMMs are the nvjet family.
MATMULS = [
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
    "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NNT",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
    "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8_warpspecialized_cooperative_epi_tma",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)",
    "ampere_sgemm_128x64_tn",
    "triton_tem_fused_mm_0",
    "triton_tem_fused_addmm_relu_1",
    "aten::mm",
    "aten::baddbmm",
]
NOT_MATMULS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
    "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
    "triton_poi_fused_add_mul_0",
    "triton_red_fused__softmax_0",
    "Memcpy DtoD (Device -> Device)",
    "aten::softmax",
    # attention, kept apart although its kernels run matrix products (and name cutlass or wgmma)
    "flash_fwd_kernel",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>,"
    " false, true>(pytorch_flash::Flash_fwd_params)",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)",
]


def test_matmul_kernels_match_cublas_cutlass_and_inductor_gemms_only():
    top = pd.DataFrame({"name": MATMULS + NOT_MATMULS, "ms": [1.0] * len(MATMULS) + [100.0] * len(NOT_MATMULS)})
    s = ProfileSummary("cuda", 1, wall_ms=1.0, busy_ms=1.0, launches=1, top=top.assign(calls=1.0, share=0.0))
    assert s.ms_matching(MATMUL_KERNELS) == len(MATMULS)  # every matmul, none of the rest
    assert [n for n in MATMULS if not re.search(MATMUL_KERNELS, n)] == []
    assert [n for n in NOT_MATMULS if re.search(MATMUL_KERNELS, n)] == []


def test_short_names_of_templated_kernels_name_the_function_and_what_it_computes():
    copy_lambda = (
        "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
        "{lambda()#7}::operator()() const::{lambda(float)#1}"
    )
    nocast = f"at::native::gpu_kernel_impl_nocast<{copy_lambda}>(at::TensorIteratorBase&, {copy_lambda} const&)"
    calc, cast = "TrivialOffsetCalculator<1, unsigned int>", "at::native::memory::{}WithCast<1>"
    cases = {
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
        "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)": "vectorized_elementwise_kernel<CUDAFunctor_add>",
        f"void at::native::elementwise_kernel<128, 2, {nocast}::{{lambda(int)#1}}>(int, {nocast}::{{lambda(int)#1}})": (
            "elementwise_kernel<direct_copy_kernel_cuda>"
        ),
        f"void at::native::unrolled_elementwise_kernel<{copy_lambda}, std::array<char*, 2ul>, 4, {calc}, {calc}, "
        f"{cast.format('Load')}, {cast.format('Store')} >(int, {copy_lambda}, std::array<char*, 2ul>, {calc}, "
        f"{calc}, {cast.format('Load')}, {cast.format('Store')})": "unrolled_elementwise_kernel<direct_copy_kernel_cuda>",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
        "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)": (
            "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8"
        ),
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
        "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, std::array<char*, 3ul>)": (
            "vectorized_elementwise_kernel<MulFunctor>"  # the innermost functor
        ),
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)": "cunn_SoftMaxForward",
    }
    for name, short in cases.items():
        assert short_kernel_name(name, width=200) == short, name
        assert not short_kernel_name(name).endswith(")")  # no stub of a parameter list


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        profile_calls(42, "cpu")
    with pytest.raises(ValueError, match="calls must be a positive int"):
        profile_calls(lambda: None, "cpu", calls=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        profile_calls(lambda: None, "cpu", warmup=-1)
