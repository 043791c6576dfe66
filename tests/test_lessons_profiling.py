"""mahia.lessons.profiling: the profiler's account of a call, as tables (a CPU run here: host operators)."""

import re

import pandas as pd
import pytest
import torch

import mahia.lessons.profiling as pr


def _table(rows):
    """A Profile's table from (name, ms) rows, one call each."""
    t = pd.DataFrame(rows, columns=["name", "ms"]).set_index("name").assign(calls=1.0)
    return t.assign(share=t["ms"] / t["ms"].sum())


def _profile(rows, device="cpu", ops=None):
    top = _table(rows)
    return pr.Profile(device, 1.0, float(top["ms"].sum()), len(top), top, top if ops is None else _table(ops))


def test_a_cpu_profile_lists_the_operators_by_their_own_time():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    p = pr.profile_calls(lambda: (a @ b).relu().sum(), "cpu", calls=3)
    assert p.device == "cpu"
    assert 0 < p.busy_ms <= p.wall_ms * 1.05  # operators' own time fits in the wall time (timer granularity aside)
    assert p.launches == pytest.approx(3.0)  # matmul, relu, sum: the top-level operators of one call
    assert "aten::mm" in p.top.index and "aten::sum" in p.top.index
    assert p.top.loc["aten::mm", "calls"] == 1.0
    assert list(p.top["ms"]) == sorted(p.top["ms"], reverse=True)
    assert p.top["share"].sum() == pytest.approx(1.0) and p.ops is p.top  # a CPU: the operators are the work
    assert 0 < p.ms(pr.MATMUL_KERNELS) <= p.busy_ms and p.ms("no such kernel") == 0.0
    groups = p.by_group({"matmuls": pr.MATMUL_OPS})
    assert groups["matmuls"] > 0 and groups.sum() == pytest.approx(p.ops["ms"].sum())


def test_compare_lines_up_two_profiles_by_name():
    before = _profile([("aten::nonzero", 0.5), ("aten::mm", 1.0)])
    after = _profile([("aten::where", 0.2), ("aten::mm", 1.1)])
    t = pr.compare(before, after)
    assert list(t.index) == ["aten::nonzero", "aten::where", "aten::mm"]  # by the size of the difference
    assert t.loc["aten::nonzero", "after - before"] == -0.5 and t.loc["aten::where", "ms before"] == 0.0
    with pytest.raises(ValueError, match="different devices"):
        pr.compare(before, _profile([("k", 1.0)], device="cuda"))
    gpu = _profile(
        [("void pytorch_flash::flash_fwd_kernel<T<128> >(P)", 0.75), ("Memcpy DtoD (Device -> Device)", 0.25)], "cuda"
    )
    assert gpu.busy == 1.0 and gpu.summary()["launches"] == 2


def test_by_group_takes_the_first_matching_group_and_keeps_the_rest():
    # every SDPA backend's forward and backward is attention (cuDNN's is the default on an H100); the GLA scan's and
    # the grouped GEMM's autograd Functions, forward and backward, have groups of their own (an H100 profile of
    # notebook 06 at b34185d had them in "other", beside norms and the optimizer)
    ops = {"aten::mm": "matmuls", "aten::addmm": "matmuls", "_GroupedMMBackward": "matmuls",
           "mahia::moe_grouped_mm": "matmuls", "aten::_scaled_dot_product_flash_attention": "attention",
           "aten::_cudnn_attention_backward": "attention", "aten::_efficient_attention_forward": "attention",
           "_GLAFunctionBackward": "scan", "_GLAFunction": "scan", "aten::add": "other", "aten::_fused_adamw_": "other"}  # fmt: skip
    p = _profile([("k", 1.0)], "cuda", ops=[(n, 2.0**i) for i, n in enumerate(ops)])
    want = {g: sum(2.0**i for i, n in enumerate(ops) if ops[n] == g) for g in ("matmuls", "attention", "scan", "other")}
    assert p.by_group({"matmuls": pr.MATMUL_OPS, "attention": pr.ATTENTION_OPS, "scan": pr.SCAN_OPS}).to_dict() == want
    assert p.by_group({"mm": ("aten::mm",), "all": ("aten::",)})["mm"] == 1.0  # the first group that matches
    assert p.by_group({}).to_dict() == {"other": sum(want.values())}


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
    s = _profile([(n, 1.0) for n in MATMULS] + [(n, 100.0) for n in NOT_MATMULS], "cuda")
    assert s.ms(pr.MATMUL_KERNELS) == len(MATMULS)  # every matmul, none of the rest
    assert [n for n in MATMULS if not re.search(pr.MATMUL_KERNELS, n)] == []
    assert [n for n in NOT_MATMULS if re.search(pr.MATMUL_KERNELS, n)] == []


def test_tile_shape_reads_the_gemm_tile_from_the_kernel_name():
    assert pr.tile_shape("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1") == (128, 256)
    assert pr.tile_shape("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8") == (64, 64)
    assert pr.tile_shape("ampere_sgemm_128x64_tn") == (128, 64)
    assert pr.tile_shape("void at::native::vectorized_elementwise_kernel<4>") is None


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        pr.profile_calls(42, "cpu")
    with pytest.raises(ValueError, match="calls must be a positive int"):
        pr.profile_calls(lambda: None, "cpu", calls=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        pr.profile_calls(lambda: None, "cpu", warmup=-1)
