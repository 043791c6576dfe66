"""The teaching kernels and helpers of notebook 03 (mahia.lessons.triton_tutorial), under TRITON_INTERPRET=1 on a CPU."""

import pytest
import torch

from mahia import ops
from mahia.lessons import triton_tutorial as tu
from mahia.measure.checks import compare_fn, tolerance
from mahia.measure.results import Recorder
from mahia.ops.rmsnorm import rms_norm_bwd_launch, rms_norm_eager, rms_norm_fwd_launch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["rms_norm"])
)


@needs_triton
@pytest.mark.parametrize("dw", tu.DW_STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(3, 37, 1000), (70, 33)], ids=str)
def test_v1_matches_reference(shape, dtype, dw):
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    w = torch.randn(shape[-1], device=DEVICE, dtype=dtype)
    cmp = compare_fn(lambda x, w: tu.rms_norm_v1(x, w, dw=dw), rms_norm_eager, [x, w], name=f"v1 {dw}")
    assert set(cmp.errors) == {"out0", "grad0", "grad1"}


@needs_triton
def test_v1_backward_strategies_agree_with_production():
    torch.manual_seed(1)
    x = torch.randn(67, 130, device=DEVICE)  # rows not a multiple of DW_BLOCK_M, columns not of DW_BLOCK_N
    w = torch.randn(130, device=DEVICE)
    dy = torch.randn_like(x)
    y, rstd = tu.rms_norm_v1_fwd(x, w)
    y_ref, _ = rms_norm_fwd_launch(x, w, None, 1e-6)
    torch.testing.assert_close(y, y_ref)
    # the production backward recomputes rstd from x: it must be the v1 forward's saved rstd
    torch.testing.assert_close(rstd, torch.rsqrt(x.pow(2).mean(-1) + 1e-6))
    dx_ref, dw_ref = rms_norm_bwd_launch(dy, x, w, 1e-6, None)
    for dw in tu.DW_STRATEGIES:
        dx, dwt = tu.rms_norm_v1_bwd(dy, x, w, rstd, dw=dw)
        torch.testing.assert_close(dx, dx_ref)
        torch.testing.assert_close(dwt, dw_ref, rtol=1e-5, atol=1e-4)
    dx, no_dw = tu.rms_norm_v1_bwd(dy, x, w, rstd, dw=None)  # dx only: times the reduction apart
    assert no_dw is None
    torch.testing.assert_close(dx, dx_ref)
    assert tu.dw_second_pass_programs(130) == 5


def test_v1_bad_inputs_raise_clear_errors(monkeypatch):
    x, w = torch.randn(4, 8, device=DEVICE), torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="dw must be one of"):
        tu.rms_norm_v1(x, w, dw="locks")
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        tu.rms_norm_v1_fwd(x, torch.ones(7, device=DEVICE))
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
        tu.rms_norm_v1_fwd(x.double(), w.double())
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        tu.rms_norm_v1_bwd(x[:2], x, w, torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match="rstd must be float32"):
        tu.rms_norm_v1_bwd(x, x, w, torch.ones(4, device=DEVICE, dtype=torch.float64))
    if DEVICE == "cpu":  # no interpreter, no CUDA: the teaching kernels refuse instead of falling back
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            tu.rms_norm_v1_fwd(x, w)


@needs_triton
def test_check_kernels_reports_every_kernel():
    rows = tu.check_kernels(
        DEVICE, torch.float32, rms_shape=(5, 130), swiglu_shape=(5, 130), rope_shape=(1, 5, 2, 1, 16)
    )
    assert [r["kernel"] for r in rows] == [
        "rms_norm_v1 (dw=atomic)",
        "rms_norm_v1 (dw=second_pass)",
        "rms_norm (production)",
        "add_rms_norm (production)",
        "swiglu",
        "rope",
    ]
    for r in rows:
        assert 0 < r["max_error"] <= r["tol"] == tolerance(torch.float32)
        assert any(k.startswith("grad") for k in r["errors"])


def test_op_traffic_counts_eager_rms_norm_bytes():
    M, N = 6, 50
    x, w = torch.randn(M, N), torch.randn(N)
    df = tu.op_traffic(rms_norm_eager, x, w)
    # float32: pow, mean, + eps, rsqrt, * rstd, * w -- no casts; every op is one pass or an (M,) one
    assert list(df["op"]) == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    total = df["read_bytes"].sum() + df["written_bytes"].sum()
    assert total == 4 * (2 * M * N + (M * N + M) + 2 * M + 2 * M + (M * N + M + M * N) + (M * N + N + M * N))
    # bfloat16 adds three casts to float32 and back
    assert (tu.op_traffic(rms_norm_eager, x.bfloat16(), w.bfloat16())["op"] == "_to_copy").sum() == 3
    # the backward adds its own ops; views are not counted
    assert len(tu.op_traffic(rms_norm_eager, x, w, backward=True)) > len(df)
    assert tu.op_traffic(lambda t: t.view(-1).t().expand(2, -1), x).empty


def test_min_bytes_and_flops():
    bf16 = torch.bfloat16
    assert tu.min_bytes("rmsnorm_fwd", (16384, 4096), bf16) == (2 * 16384 * 4096 + 4096) * 2
    assert tu.min_bytes("swiglu_fwdbwd", (3, 7), torch.float32) == 8 * 21 * 4
    assert tu.min_bytes("rope_fwdbwd", (8, 2048, 32, 8, 128), bf16) == 4 * 8 * 2048 * 40 * 128 * 2 + 2 * 2048 * 128 * 4
    assert tu.op_flops("rmsnorm_fwd", (10, 20)) == 800
    assert tu.op_flops("rope_fwdbwd", (1, 2, 3, 1, 8)) == 2 * 3 * 2 * 4 * 8
    with pytest.raises(ValueError, match="kind must be one of"):
        tu.min_bytes("layernorm_fwd", (2, 3), bf16)
    with pytest.raises(ValueError, match=r"shape must be \(B, T, Hq, Hkv, D\)"):
        tu.op_flops("rope_fwdbwd", (2, 3))
    with pytest.raises(ValueError, match=r"shape must be \(M, N\)"):
        tu.make_inputs("swiglu_fwd", (2, 0), "cpu", torch.float32)
    q, k, cos, sin = tu.make_inputs("rope_fwdbwd", (1, 5, 4, 2, 16), "cpu", torch.float32)
    assert q.shape == (1, 5, 4, 16) and k.shape == (1, 5, 2, 16) and cos.shape == sin.shape == (5, 8)


def test_measure_records_the_benchmark_rows(tmp_path):
    rec = Recorder("03_test", DEVICE, results_dir=tmp_path)
    df = tu.measure(rec, "swiglu_fwdbwd", (4, 40), torch.float32, experiment="swiglu_small", skip=("torch.compile",))
    assert set(df["experiment"]) == {"swiglu_small"}
    assert df.iloc[0]["variant"] == "eager" and df.iloc[0]["role"] == "baseline"
    assert (df["bytes"] == tu.min_bytes("swiglu_fwdbwd", (4, 40), torch.float32)).all()
    assert (df["rel_err"] <= tolerance(torch.float32)).all() and (df["median_ms"] > 0).all()
    with pytest.raises(ValueError, match="skip names unknown variants"):
        tu.measure(rec, "swiglu_fwd", (4, 40), torch.float32, skip=("cublas",))


def test_measure_returns_timings_not_metric_rows(tmp_path, monkeypatch):
    # Review 02/03 #10: on a GPU the benchmark also records the copy of the same bytes as a metric row, which
    # leaked into notebook 03's tables (a row of NaN) and its figures' legends (an entry with no line).
    from mahia.bench import kernels as bk

    real = bk._measure

    def with_metric(recorder, experiment, *args, **kwargs):
        real(recorder, experiment, *args, **kwargs)
        recorder.metric(experiment, "copy_same_bytes", 0.9, unit="fraction", shape=(4, 40), dtype=torch.float32)

    monkeypatch.setattr(bk, "_measure", with_metric)
    rec = Recorder("03_test", DEVICE, results_dir=tmp_path)
    df = tu.measure(rec, "swiglu_fwd", (4, 40), torch.float32, skip=("torch.compile",))
    assert "copy_same_bytes" not in set(df["variant"]) and (df["role"] != "metric").all() and len(df)
    assert any(r["variant"] == "copy_same_bytes" for r in rec.rows)  # still recorded


def test_host_crossover_reads_a_rows_sweep():
    import pandas as pd

    def rows(variant, mode, times):
        exp = "rms_rows_eager" if mode == "eager" else "rms_rows"
        return [
            {"experiment": exp, "variant": variant, "shape": f"{m}x4096", "median_ms": t}
            for m, t in zip((8, 1024, 16384), times)
        ]

    df = pd.DataFrame(
        rows("mahia_triton", "eager", [0.30, 0.31, 0.40])
        + rows("F.rms_norm", "eager", [0.12, 0.20, 0.60])
        + rows("mahia_triton", "device", [0.01, 0.05, 0.39])
        + rows("F.rms_norm", "device", [0.02, 0.10, 0.59])
    )
    out = tu.host_crossover(df)
    assert out["rows"] == [8, 1024, 16384]
    assert out["floor_ms"] == {"F.rms_norm": 0.12, "mahia_triton": 0.30}
    assert out["crossover_rows"] == 16384  # mahia's eager time first at most F.rms_norm's there
    assert out["peer_over_mine"] == pytest.approx(1.5) and out["before"] == (1024, pytest.approx(0.20 / 0.31))
    # the H100 run of 03 (b34185d) said "first matches" where mahia was 1.62x faster: now it says by how much
    ahead = tu.host_crossover_sentence(out, 4096)
    assert "is first at most `F.rms_norm`'s at 16,384 rows × 4096, where it is already 1.50× faster" in ahead
    assert "(at 1,024 rows it was 1.55× slower: the two cross between those sizes)" in ahead
    assert out["host_bound_rows"] == {"F.rms_norm": 1024, "mahia_triton": 1024}
    never = tu.host_crossover(df[~((df["variant"] == "mahia_triton") & (df["shape"] == "16384x4096"))])
    assert never["crossover_rows"] is None
    with pytest.raises(ValueError, match="need columns"):
        tu.host_crossover(pd.DataFrame({"experiment": ["x"]}))


def _h100_rows_sweep():
    """NB03's rows sweep (N = 4096, bf16) of 7fed682's H100 run: (rows, variant, mode) -> median, p20, p80 ms."""
    import pandas as pd

    runs = {
        (8, "F.rms_norm", "device"): (0.020224, 0.019904, 0.020512),
        (8, "F.rms_norm", "eager"): (0.162767, 0.156123, 0.169763),
        (8, "mahia_triton", "device"): (0.011488, 0.010688, 0.047334),
        (8, "mahia_triton", "eager"): (0.574242, 0.461156, 0.672569),
        (4096, "F.rms_norm", "device"): (0.120768, 0.119840, 0.121805),
        (4096, "F.rms_norm", "eager"): (0.243556, 0.236334, 0.249381),
        (4096, "mahia_triton", "device"): (0.076032, 0.075258, 0.076544),
        (4096, "mahia_triton", "eager"): (0.625613, 0.580818, 0.730100),
        (16384, "F.rms_norm", "device"): (0.440832, 0.434304, 0.445254),
        (16384, "F.rms_norm", "eager"): (0.484468, 0.478364, 0.494733),
        (16384, "mahia_triton", "device"): (0.251488, 0.250656, 0.252224),
        (16384, "mahia_triton", "eager"): (0.485311, 0.463287, 0.511495),
    }
    cols = ("median_ms", "p20_ms", "p80_ms")
    return pd.DataFrame(
        [
            {"experiment": "rows" + ("_eager" if mode == "eager" else ""), "variant": v, "shape": f"{m}x4096"}
            | dict(zip(cols, t))
            for (m, v, mode), t in runs.items()
        ]
    )


def test_host_crossover_counts_overlapping_spreads_as_a_tie():
    # At 16,384 rows mahia's eager 0.4853 ms (0.463-0.511) against F.rms_norm's 0.4845 ms (0.478-0.495): a tie,
    # where mahia is still host-bound (1.93x its device time) and F.rms_norm no longer is (1.10x).
    df = _h100_rows_sweep()
    out = tu.host_crossover(df)
    assert out["crossover_rows"] == 16384 and out["tie"] == "spreads"
    assert out["host_bound_rows"] == {"F.rms_norm": 4096, "mahia_triton": 16384}
    text = tu.host_crossover_sentence(out, 4096)
    assert text.startswith("mahia's eager time first matches `F.rms_norm`'s at 16,384 rows × 4096 (a tie: their")
    assert "where mahia is still host-bound and `F.rms_norm` no longer is" in text and "stays above" not in text
    # without spreads, medians within TIE_FRACTION tie too; 4% apart do not
    medians = df.drop(columns=["p20_ms", "p80_ms"])
    assert tu.host_crossover(medians)["tie"] == "fraction"
    apart = medians.copy()
    apart.loc[(apart["variant"] == "mahia_triton") & (apart["experiment"] == "rows_eager"), "median_ms"] *= 1.04
    never = tu.host_crossover(apart)
    assert never["crossover_rows"] is None and "stays above" in tu.host_crossover_sentence(never, 4096)
    both = {**out, "host_bound_rows": {"F.rms_norm": 16384, "mahia_triton": 16384}}
    assert "where both are still host-bound" in tu.host_crossover_sentence(both, 4096)
    device = {**out, "tie": None, "host_bound_rows": {"F.rms_norm": None, "mahia_triton": 4096}}
    assert tu.host_crossover_sentence(device, 4096).endswith("× 4096: from there on the device decides.")


def test_measure_records_eager_time_beside_device_time(tmp_path):
    from mahia.measure import hardware
    from mahia.measure.results import Recorder

    ceil = hardware.Ceilings(hardware.device_slug("cpu"), copy_gbps=10.0, matmul_bf16_tflops=1.0,
                             matmul_fp32_tflops=1.0, measured_at="now")  # fmt: skip
    rec = Recorder("test_tu", "cpu", results_dir=tmp_path, ceilings=ceil, profile="quick", commit="c0ffee")
    df = tu.measure(rec, "rmsnorm_fwd", (8, 64), torch.float32, skip=["torch.compile"], eager_time=True)
    assert set(df["experiment"]) == {"rmsnorm_fwd", "rmsnorm_fwd_eager"}
    assert (df["median_ms"] > 0).all()


# --- the solutions of the notebook's exercises ------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_rms_norm_v1_matches_the_eager_pair(dtype):
    from mahia.ops.rmsnorm import add_rms_norm_eager

    torch.manual_seed(2)
    x, r = (torch.randn(3, 37, 300, device=DEVICE, dtype=dtype) for _ in range(2))
    w = torch.randn(300, device=DEVICE, dtype=dtype) * 0.1 + 1.0
    y, h = tu.add_rms_norm_v1_fwd(x, r, w)
    y_ref, h_ref = add_rms_norm_eager(x, r, w)
    # the sum is rounded to the input dtype before the norm, as eager rounds it: in float32 exactly the same;
    # in bf16 within one unit in the last place (Triton's interpreter truncates where a GPU rounds to nearest)
    torch.testing.assert_close(h, h_ref, rtol=0 if dtype == torch.float32 else 2**-7, atol=0)
    cmp = compare_fn(lambda x, r, w: tu.add_rms_norm_v1_fwd(x, r, w), add_rms_norm_eager, [x, r, w], grads=False)
    assert cmp.max_error <= tolerance(dtype)
    with pytest.raises(ValueError, match="residual"):
        tu.add_rms_norm_v1_fwd(x, r[:, :, :10], w)


@needs_triton
@pytest.mark.parametrize("programs", [None, 1, 7, 500])
def test_persistent_v1_backward_agrees_and_is_reproducible(programs):
    torch.manual_seed(3)
    x = torch.randn(67, 130, device=DEVICE)
    w = torch.randn(130, device=DEVICE)
    dy = torch.randn_like(x)
    _, rstd = tu.rms_norm_v1_fwd(x, w)
    dx_ref, dw_ref = rms_norm_bwd_launch(dy, x, w, 1e-6, None)
    dx, dw = tu.rms_norm_v1_bwd_persistent(dy, x, w, rstd, programs=programs)
    torch.testing.assert_close(dx, dx_ref)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(dw, tu.rms_norm_v1_bwd_persistent(dy, x, w, rstd, programs=programs)[1])
    with pytest.raises(ValueError, match="programs must be None or a positive int"):
        tu.rms_norm_v1_bwd_persistent(dy, x, w, rstd, programs=0)


@needs_triton
def test_v1_forward_takes_a_warp_count():
    x, w = torch.randn(5, 300, device=DEVICE), torch.randn(300, device=DEVICE)
    y4, _ = tu.rms_norm_v1_fwd(x, w)
    y8, _ = tu.rms_norm_v1_fwd(x, w, num_warps=8)
    torch.testing.assert_close(y8, y4)
    with pytest.raises(ValueError, match="num_warps must be None or a power of two"):
        tu.rms_norm_v1_fwd(x, w, num_warps=3)


@pytest.mark.parametrize("kind", sorted(tu.KINDS))
def test_min_traffic_splits_min_bytes(kind):
    shape = (2, 16, 4, 2, 64) if kind.startswith("rope") else (48, 200)
    for dtype in (torch.float32, torch.bfloat16):
        read, written = tu.min_traffic(kind, shape, dtype)
        assert read + written == tu.min_bytes(kind, shape, dtype) and read >= written > 0
    assert tu.min_traffic("swiglu_fwd", (4, 8), torch.float32) == (2 * 4 * 8 * 4, 4 * 8 * 4)


def test_sweep_worst_cases_reads_where_a_peer_wins_and_why(tmp_path):
    import json

    import pandas as pd

    # the H100 sweep at b34185d: three worst cases as they were recorded there
    keys = {
        "rmsnorm_fwdbwd_eager_worst_vs_best_peer": (0.367, "rmsnorm_fwdbwd_eager", "16384x2048", "float16"),
        "rmsnorm_device_worst_vs_best_peer": (0.797, "rmsnorm_fwd", "1024x5120", "bfloat16"),
        "swiglu_fwdbwd_eager_worst_vs_best_peer": (0.690, "swiglu_fwdbwd_eager", "4096x4096", "float32"),
        "rope_device_worst_vs_best_peer": (0.98, "rope_fwd", "2x2048x12x12x64", "float16"),
        "rmsnorm_fwdbwd_eager_vs_best_peer": (1.496, "rmsnorm_fwdbwd_eager", "16384x4096", "bfloat16"),
    }
    doc = {
        "profile": "full",
        "commits": ["b34185deecfd"],
        "metrics": {k: v[0] for k, v in keys.items()},
        "where": {k: {"experiment": e, "shape": s, "dtype": d} for k, (_, e, s, d) in keys.items()},
    }
    (tmp_path / "bench_kernels_summary.json").write_text(json.dumps(doc))
    rows = [
        ("rmsnorm_fwdbwd_eager", "16384x2048", "float16", "mahia_triton", 0.644),
        ("rmsnorm_fwdbwd_eager", "16384x2048", "float16", "F.rms_norm", 0.236),
        ("rmsnorm_fwdbwd_eager", "16384x2048", "float16", "torch.compile", 0.9),
        ("rmsnorm_fwdbwd", "16384x2048", "float16", "mahia_triton", 0.136),
        ("rmsnorm_fwd", "1024x5120", "bfloat16", "mahia_triton", 0.0140),
        ("rmsnorm_fwd", "1024x5120", "bfloat16", "torch.compile", 0.0112),
        ("rmsnorm_fwd", "1024x5120", "bfloat16", "copy_same_bytes", 0.0069),  # not a peer
        ("swiglu_fwdbwd_eager", "4096x4096", "float32", "mahia_triton", 0.513),
        ("swiglu_fwdbwd_eager", "4096x4096", "float32", "eager", 0.354),  # plain PyTorch: a peer too
        ("swiglu_fwdbwd_eager", "4096x4096", "float32", "torch.compile", 0.5125),
        ("swiglu_fwdbwd", "4096x4096", "float32", "mahia_triton", 0.187),
    ]
    df = pd.DataFrame(rows, columns=["experiment", "shape", "dtype", "variant", "median_ms"]).assign(profile="full")
    df["role"] = df["variant"].map({"mahia_triton": "optimized", "copy_same_bytes": "metric", "eager": "baseline"})
    df["role"] = df["role"].fillna("peer")
    df.to_csv(tmp_path / "bench_kernels.csv", index=False)
    text = tu.sweep_worst_cases(tmp_path)
    assert "(commit b34185deecfd)" in text
    assert "mahia 644 µs, F.rms_norm 236 µs; its kernels take 136 µs of it: host-bound" in text
    assert "mahia 14.0 µs, torch.compile 11.2 µs: 2.8 µs (20% of mahia's kernel) behind" in text
    assert "mahia 513 µs, eager 354 µs; its kernels take 187 µs of it: host-bound" in text
    assert text.endswith("Within 3% (a tie): `rope_device_worst_vs_best_peer` 0.980.")
    assert "rmsnorm_fwdbwd_eager_vs_best_peer" not in text  # a headline key, and mahia leads there
    assert "No kernel benchmark" in tu.sweep_worst_cases(tmp_path / "nowhere")
