"""mahia.bench.kernels: byte counts, the sweep and its parts, eager timing, the quick run (which resumes),
the summary keys on synthetic records, and the figures."""

import json
import math
import os

import pandas as pd
import pytest
import torch

from mahia.bench import kernels as bk
from mahia.bench.kernels import min_bytes
from mahia.bench.kernels.shapes import _grid
from mahia.bench.kernels.sweep import _copy_of_same_bytes, _measure
from mahia.measure import hardware, results
from mahia.measure.checks import CorrectnessError, compare_fn, rel_error
from mahia.measure.timing import Timing
from mahia.ops.rmsnorm import rms_norm_eager
from mahia.ops.rope import apply_rope_eager


def _ceilings():
    return hardware.Ceilings(
        hardware.device_slug("cpu"), copy_gbps=10.0, matmul_bf16_tflops=1.0, matmul_fp32_tflops=1.0, measured_at="now"
    )


def _recorder(tmp_path, commit="c0ffee"):
    return results.Recorder(
        "bench_kernels", "cpu", results_dir=tmp_path, ceilings=_ceilings(), profile="quick", commit=commit
    )


# -- bytes -----------------------------------------------------------------------------------------


def test_copy_of_same_bytes_records_the_limit_at_that_size(tmp_path):
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, ceilings=_ceilings())
    nbytes = min_bytes("rmsnorm_fwd", (64, 512), torch.bfloat16)
    _copy_of_same_bytes(rec, "rmsnorm_fwd", nbytes, (64, 512), torch.bfloat16, rep_ms=2, warmup_ms=1)
    (row,) = rec.rows
    assert row["experiment"] == "rmsnorm_fwd" and row["variant"] == "copy_same_bytes"
    assert row["role"] == "metric" and row["value"] > 0
    mb = int(nbytes) // 8 * 8 / 1e6
    assert f"{mb:.0f} MB moved" in row["notes"]


def test_moe_combine_byte_counts():
    """N=4 tokens, k=2, D=8 in bf16, gates float32, index int64, counted tensor by tensor."""
    out, y, gates, index = 4 * 2 * 8 * 2, 4 * 8 * 2, 4 * 2 * 4, 4 * 2 * 8
    fwd = out + y + gates + index  # read out, gates, index; write y
    bwd = y + out + out + gates + index + gates  # read dy, out, gates, index; write d_out, d_gates
    assert min_bytes("moe_combine_fwd", (4, 2, 8), torch.bfloat16) == fwd
    assert min_bytes("moe_combine_fwdbwd", (4, 2, 8), torch.bfloat16) == fwd + bwd


def test_norm_swiglu_rope_byte_counts_tensor_by_tensor():
    M, N, es = 3, 10, 2  # bf16
    x = M * N * es
    w = N * es
    assert min_bytes("rmsnorm_fwd", (M, N), torch.bfloat16) == x + x + w  # x, y, w
    assert min_bytes("rmsnorm_fwdbwd", (M, N), torch.bfloat16) == (2 * x + w) + (3 * x + 2 * w)  # x dy dx w dw
    # add + RMSNorm: read x, r, w; write y, h | read dy, dh, h, w; write dx (= dr), dw
    assert min_bytes("add_rmsnorm_fwd", (M, N), torch.bfloat16) == 4 * x + w
    assert min_bytes("add_rmsnorm_fwdbwd", (M, N), torch.bfloat16) == (4 * x + w) + (4 * x + 2 * w)
    assert min_bytes("swiglu_fwd", (M, N), torch.float32) == 3 * M * N * 4
    assert min_bytes("swiglu_fwdbwd", (M, N), torch.float16) == 8 * M * N * 2
    B, T, Hq, Hkv, D = 2, 5, 4, 2, 8
    qk = B * T * (Hq + Hkv) * D * 2
    tables = 2 * T * (D // 2) * 4  # cos and sin, float32, (T, D/2) each
    assert min_bytes("rope_fwd", (B, T, Hq, Hkv, D), torch.bfloat16) == 2 * qk + tables
    assert min_bytes("rope_fwdbwd", (B, T, Hq, Hkv, D), torch.bfloat16) == 2 * (2 * qk + tables)


def test_min_bytes_reads_timing_modes_and_refuses_unknown_experiments():
    s, dt = (64, 1000), torch.bfloat16
    assert min_bytes("rmsnorm_fwdbwd_eager", s, dt) == min_bytes("rmsnorm_fwdbwd", s, dt)
    assert min_bytes("rmsnorm_host_fwd", s, dt) == min_bytes("rmsnorm_fwd", s, dt)
    assert min_bytes("add_rmsnorm_host_fwdbwd", s, dt) == min_bytes("add_rmsnorm_fwdbwd", s, dt)
    assert min_bytes("rmsnorm_fwd_sweep", s, dt) == min_bytes("rmsnorm_fwd", s, dt)  # notebook 03's name
    with pytest.raises(ValueError, match="unknown experiment"):
        min_bytes("rmsnorm_bwd", s, dt)
    assert bk.timing_mode("rmsnorm_fwdbwd") == "device"
    assert bk.timing_mode("rmsnorm_fwdbwd_eager") == bk.timing_mode("rmsnorm_host_fwd") == "eager"


def test_input_bytes_is_the_size_of_x_a_q_and_k_or_out():
    assert bk.input_bytes("rmsnorm", (16384, 4096), torch.bfloat16) == 16384 * 4096 * 2
    assert bk.input_bytes("add_rmsnorm_fwd_eager", (4, 8), torch.float32) == 4 * 8 * 4
    assert bk.input_bytes("swiglu_fwdbwd", (16384, 11008), torch.float16) == 16384 * 11008 * 2
    assert bk.input_bytes("rope_fwd", (8, 2048, 32, 8, 128), torch.bfloat16) == 8 * 2048 * 40 * 128 * 2
    assert bk.input_bytes("moe_combine_fwd", (16, 2, 100), torch.float32) == 16 * 2 * 100 * 4


# -- the sweep and its parts -----------------------------------------------------------------------


def test_grid_covers_rows_hidden_sizes_and_headlines():
    for k in bk.KERNELS:
        shapes = bk.GRID[k]
        rows = {s[0] * s[1] if k == "rope" else s[0] for s in shapes}
        widths = {s[2:] if k == "rope" else s[-1] for s in shapes}
        assert len(rows) >= 4 and len(widths) >= 5 and len(shapes) == len(rows) * len(widths), k
        assert any(r & (r - 1) for r in rows), f"{k}: a row count that is not a power of two"
        assert min(rows) < 128, f"{k}: a small shape"
    assert any(n & (n - 1) for _, n in bk.GRID["rmsnorm"])
    for k, shape in bk.HEADLINE.items():
        assert tuple(shape) in bk.GRID[k]
    dtypes = {p.dtype for p in bk.PARTS if p.kernel == "rmsnorm"}
    assert dtypes == {torch.bfloat16, torch.float16, torch.float32}


def test_parts_are_selected_by_name_kernel_or_dtype():
    assert [p.name for p in bk.select_parts("rmsnorm-bf16")] == ["rmsnorm-bf16"]
    assert {p.name for p in bk.select_parts(["rope"])} == {"rope-bf16", "rope-fp16", "rope-fp32"}
    assert {p.kernel for p in bk.select_parts("fp16")} == set(bk.KERNELS)
    assert [p.name for p in bk.select_parts("swiglu-fp32,host")] == ["host", "swiglu-fp32"]  # PARTS order
    assert bk.select_parts(None) == bk.PARTS == bk.select_parts("all")
    with pytest.raises(ValueError, match="unknown part 'rmsnrom'"):
        bk.select_parts("rmsnrom")
    assert bk.parse_args(["--part", "rope-bf16", "--part", "host,swiglu"]) == {
        "parts": ["rope-bf16", "host,swiglu"],
        "resume": True,
    }
    assert bk.parse_args(["--fresh"]) == {"parts": None, "resume": False}


# -- checking ----------------------------------------------------------------------------------------


def test_the_check_before_timing_catches_a_wrong_gradient():
    x, w = bk.make_inputs("rmsnorm", (7, 100), torch.float32, "cpu")
    q, k, cos, sin = bk.make_inputs("rope", (1, 3, 2, 1, 8), torch.bfloat16, "cpu")
    assert (
        compare_fn(
            apply_rope_eager,
            apply_rope_eager,
            [q, k, cos, sin],
            grads=False,
            grad_inputs=[0, 1],
            tol=2e-2,
            name="t",
        ).max_error
        < 1e-2
    )
    with pytest.raises(CorrectnessError, match="gradient of input 1"):  # dw off by 1%

        class Wrong(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return rms_norm_eager(x, w)

            @staticmethod
            def backward(ctx, dy):
                x, w = ctx.saved_tensors
                with torch.enable_grad():
                    x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()
                    dx, dw = torch.autograd.grad(rms_norm_eager(x_, w_), (x_, w_), dy)
                return dx, dw * 1.01

        compare_fn(Wrong.apply, rms_norm_eager, [x, w], grads=True, grad_inputs=[0, 1], tol=1e-5, name="t")
    nan = torch.full((3,), float("nan"))
    assert rel_error(nan, torch.ones(3)) == math.inf and rel_error(torch.zeros(2), torch.zeros(2)) == 0.0


# -- eager timing ----------------------------------------------------------------------------------


def test_eager_bench_times_back_to_back_calls():
    calls = []

    def fn():
        calls.append(1)
        sum(range(2000))

    info = {}
    t = bk.eager_bench(fn, device="cpu", warmup_ms=1, rep_ms=5, sample_ms=0.5, min_calls=4, info=info)
    assert isinstance(t, Timing) and t.median_ms > 0
    assert t.p20_ms <= t.median_ms <= t.p80_ms and t.n >= 5 and t.first_call_ms > 0
    assert info["calls"] >= 4 and info["samples"] == t.n
    assert len(calls) >= 1 + info["calls"] * t.n  # the first call, then samples of N calls each


def test_eager_bench_interleaves_the_samples_of_its_steps():
    """Each round takes one sample of every step, forward on even rounds and backward on odd ones, so a
    drift of the host slows all steps alike."""
    order = []
    steps = {n: (lambda n=n: order.append(n) or sum(range(300))) for n in ("a", "b", "c")}
    info = {}
    t = bk.eager_bench_interleaved(steps, device="cpu", warmup_ms=0.5, rep_ms=3, sample_ms=0.2, min_calls=2, info=info)
    rounds = info["a"]["samples"]
    assert set(t) == set(steps) and rounds >= 5
    assert all(x.n == rounds and info[k]["samples"] == rounds and x.first_call_ms > 0 for k, x in t.items())
    tail = order[len(order) - rounds * sum(info[k]["calls"] for k in steps) :]
    seq, i = [], 0
    while i < len(tail):  # one sample: calls[k] calls of one step k in a row
        k = tail[i]
        assert tail[i : i + info[k]["calls"]] == [k] * info[k]["calls"]
        seq.append(k)
        i += info[k]["calls"]
    assert seq == [n for r in range(rounds) for n in (["a", "b", "c"] if r % 2 == 0 else ["c", "b", "a"])]
    with pytest.raises(ValueError, match="at least one step"):
        bk.eager_bench_interleaved({})


# -- the quick run -----------------------------------------------------------------------------------


def test_quick_run_records_device_and_eager_time_and_resumes(tmp_path, capsys):
    rec = _recorder(tmp_path)
    bk.run(rec, rec.ceilings, quick=True, parts=["host", "rmsnorm"])
    out = capsys.readouterr().out
    assert "skipped: torch.compile" in out and "skipped: liger" in out
    assert "s (checks incl. compiling" in out and "eager time" in out  # where each shape's seconds went
    df = rec.frame()
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    variants = {"eager", "F.rms_norm"} | ({"mahia_triton"} if interp else set())
    for shape in _grid("rmsnorm", quick=True):
        sh = "x".join(map(str, shape))
        for exp in ("rmsnorm_fwd", "rmsnorm_fwd_eager", "rmsnorm_fwdbwd", "rmsnorm_fwdbwd_eager"):
            g = df[(df["experiment"] == exp) & (df["shape"] == sh)]
            assert set(g["variant"]) == variants, (exp, sh)
            assert (g["dtype"] == "float32").all() and (g["bytes"] == min_bytes(exp, shape, torch.float32)).all()
            mode = bk.timing_mode(exp)
            assert g["notes"].str.startswith(f"timing={mode}").all()
            if mode == "eager":  # every variant's samples taken side by side
                assert g["notes"].str.contains(f"samples interleaved with {len(variants) - 1} other").all()
            assert (g["rel_err"] <= 1e-5).all() and (g["median_ms"] > 0).all()
    host = df[df["experiment"].str.contains("_host_")]
    assert set(host["experiment"]) == {f"{k}_host_{p}" for k in bk.KERNELS for p in bk.PASSES}
    assert host["notes"].str.startswith("timing=eager").all()
    assert not df["experiment"].isin(["swiglu_fwd", "swiglu_fwd_eager", "rope_fwdbwd"]).any()  # not selected
    n = len(pd.read_csv(rec.path))
    if interp:
        keys = bk.summary_keys(df)
        assert keys["rmsnorm_host_fwd_vs_native"] > 0 and keys["rmsnorm_host_fwdbwd_vs_native"] > 0
    # resume: the same commit measures nothing again; another commit measures afresh
    again = _recorder(tmp_path)
    bk.run(again, again.ceilings, quick=True, parts="rmsnorm")
    assert again.rows == [] and len(pd.read_csv(rec.path)) == n
    assert "already recorded" in capsys.readouterr().out


def test_quick_run_lists_the_plan_without_measuring(tmp_path, capsys):
    rec = _recorder(tmp_path)
    bk.run(rec, rec.ceilings, quick=False, parts="list,rmsnorm-bf16")
    out = capsys.readouterr().out
    assert "rmsnorm-bf16" in out and "20 shapes" in out and "nothing measured" in out
    assert rec.rows == []


# -- summary keys -------------------------------------------------------------------------------------


def _row(exp, variant, shape, dtype, ms=None, role=None, frac=None, value=None, date="2026-01-01"):
    return {
        "experiment": exp,
        "variant": variant,
        "role": role or bk.ROLE.get(variant, "metric"),
        "shape": "x".join(map(str, shape)),
        "dtype": dtype,
        "median_ms": ms,
        "frac_of_limit": frac,
        "value": value,
        "date": date,
    }


def _peers(exp, shape, dtype, mahia, peers: dict, eager=10.0, frac=None):
    rows = [_row(exp, "eager", shape, dtype, eager), _row(exp, "mahia_triton", shape, dtype, mahia, frac=frac)]
    rows += [_row(exp, v, shape, dtype, t) for v, t in peers.items()]
    return rows


def _copy(exp, shape, dtype, value):
    return [_row(exp, "copy_same_bytes", shape, dtype, value=value)]


def test_summary_keys_on_synthetic_records():
    bf, fp = "bfloat16", "float32"
    rows = []
    # host: F.rms_norm 30 us, mahia 20 us (fwd); 90 / 60 (fwd+bwd); a float32 row that must not be used
    rows += _peers("rmsnorm_host_fwd", (4, 64), bf, 0.020, {"F.rms_norm": 0.030, "torch.compile": 0.010})
    rows += _peers("rmsnorm_host_fwd", (4, 64), fp, 0.001, {"F.rms_norm": 0.100})
    rows += _peers("rmsnorm_host_fwdbwd", (4, 64), bf, 0.060, {"F.rms_norm": 0.090})
    # headline eager fwd+bwd: the best peer is the fastest (liger 1.5); mahia 1.0 -> 1.5
    rows += _peers("rmsnorm_fwdbwd_eager", (16384, 4096), bf, 1.0, {"F.rms_norm": 2.0, "liger": 1.5})
    rows += _peers("swiglu_fwdbwd_eager", (16384, 11008), bf, 2.0, {"torch.compile": 3.0})
    rows += _peers("rope_fwdbwd_eager", (8, 2048, 32, 8, 128), bf, 4.0, {"liger": 2.0})
    # eager worst over inputs >= 16 MB: 1024x8192 bf16 is 16.8 MB (ratio 1.2 counts); 91x8192 fp32 is
    # 3 MB (ratio 0.5, too small: ignored)
    rows += _peers("rmsnorm_fwdbwd_eager", (1024, 8192), bf, 1.0, {"F.rms_norm": 1.2})
    rows += _peers("rmsnorm_fwdbwd_eager", (91, 8192), fp, 1.0, {"F.rms_norm": 0.5})
    # device worst over fwd and fwd+bwd, inputs >= 8 MB: 4096x1000 bf16 (8.2 MB) fwd 0.9 counts;
    # 1024x2048 bf16 (4.2 MB) 0.1 does not; an older mahia row (0.1 ms, ratio 9) is superseded
    rows += [_row("rmsnorm_fwd", "mahia_triton", (4096, 1000), bf, 0.1, date="2025-01-01")]
    rows += _peers("rmsnorm_fwd", (4096, 1000), bf, 1.0, {"F.rms_norm": 0.9, "torch.compile": 5.0}, frac=0.1)
    rows += _peers("rmsnorm_fwd", (1024, 2048), bf, 1.0, {"F.rms_norm": 0.1})
    rows += _peers("rmsnorm_fwdbwd", (16384, 4096), bf, 1.0, {"liger": 1.3}, eager=3.0, frac=0.72)
    # frac of copy at 16384x4096 bf16 fwd+bwd: mahia 0.72 of the ceiling, the same-bytes copy 0.9 -> 0.8
    rows += _copy("rmsnorm_fwdbwd", (16384, 4096), bf, 0.9)
    # fwd worst frac of copy over inputs >= 64 MB: 16384x4096 bf16 (134 MB) 0.6 / 0.8 = 0.75;
    # 4096x8192 fp32 (134 MB) 0.9 / 0.9 = 1; 4096x1000 bf16 (8 MB) 0.1 / 0.9: too small
    rows += [_row("rmsnorm_fwd", "mahia_triton", (16384, 4096), bf, 1.0, frac=0.6)]
    rows += _copy("rmsnorm_fwd", (16384, 4096), bf, 0.8)
    rows += [_row("rmsnorm_fwd", "mahia_triton", (4096, 8192), fp, 1.0, frac=0.9)]
    rows += _copy("rmsnorm_fwd", (4096, 8192), fp, 0.9)
    rows += _copy("rmsnorm_fwd", (4096, 1000), bf, 0.9)
    # swiglu device: the worst of fwd bf16 (1.1) and fwd+bwd fp32 (0.95)
    rows += _peers("swiglu_fwd", (16384, 11008), bf, 1.0, {"liger": 1.1})
    rows += _peers("swiglu_fwdbwd", (16384, 11008), fp, 2.0, {"torch.compile": 1.9})
    df = pd.DataFrame(rows)
    keys = bk.summary_keys(df)
    assert set(keys) == set(results.SUITE_SUMMARIES[bk.SUMMARY_STEM])
    expect = {
        "rmsnorm_host_fwd_vs_native": 1.5,
        "rmsnorm_host_fwdbwd_vs_native": 1.5,
        "rmsnorm_fwdbwd_eager_vs_best_peer": 1.5,
        "swiglu_fwdbwd_eager_vs_best_peer": 1.5,
        "rope_fwdbwd_eager_vs_best_peer": 0.5,
        "rmsnorm_fwdbwd_eager_worst_vs_best_peer": 1.2,
        "swiglu_fwdbwd_eager_worst_vs_best_peer": 1.5,
        "rope_fwdbwd_eager_worst_vs_best_peer": 0.5,
        "rmsnorm_device_worst_vs_best_peer": 0.9,
        "swiglu_device_worst_vs_best_peer": 0.95,
        "rope_device_worst_vs_best_peer": None,
        "rmsnorm_fwdbwd_frac_of_copy": 0.8,
        "rmsnorm_fwd_worst_frac_of_copy": 0.75,
    }
    for k, v in expect.items():
        if v is None:
            assert keys[k] is None, k
        else:
            assert keys[k] == pytest.approx(v), (k, keys[k])
    detail = bk.summary_keys(df, where=True)
    assert detail["rmsnorm_device_worst_vs_best_peer"] == {
        "value": pytest.approx(0.9),
        "experiment": "rmsnorm_fwd",
        "shape": "4096x1000",
        "dtype": bf,
    }
    assert detail["rmsnorm_fwd_worst_frac_of_copy"]["shape"] == "16384x4096"
    empty = bk.summary_keys(pd.DataFrame(columns=df.columns))
    assert all(v is None for v in empty.values()) and set(empty) == set(results.SUITE_SUMMARIES[bk.SUMMARY_STEM])


def test_eager_pytorch_counts_as_a_peer():
    # The H100 sweep at b34185d, SwiGLU fwd+bwd 4096x4096 float32, eager time: plain PyTorch (role "baseline")
    # was the fastest call, so mahia is behind it (0.690), not level with the slower "peer" rows (0.999).
    rows = _peers("swiglu_fwdbwd_eager", (4096, 4096), "float32", 0.513, {"torch.compile": 0.5125}, eager=0.354)
    detail = bk.summary_keys(pd.DataFrame(rows), where=True)["swiglu_fwdbwd_eager_worst_vs_best_peer"]
    assert detail["value"] == pytest.approx(0.354 / 0.513) and detail["shape"] == "4096x4096"
    assert "baseline" in bk.PEER_ROLES and "optimized" not in bk.PEER_ROLES


def test_summary_key_without_mahia_or_peer_is_none():
    rows = [
        _row("rmsnorm_fwdbwd_eager", "eager", (16384, 4096), "bfloat16", 5.0),
        _row("rmsnorm_fwdbwd_eager", "F.rms_norm", (16384, 4096), "bfloat16", 1.0),
    ]
    assert bk.summary_keys(pd.DataFrame(rows))["rmsnorm_fwdbwd_eager_vs_best_peer"] is None


# -- figures ------------------------------------------------------------------------------------------


def test_plot_draws_a_figure_per_kernel_and_the_host_cost(tmp_path):
    rows = []
    for m in (91, 1024):
        shape = (m, 1000)
        for exp in ("rmsnorm_fwd", "rmsnorm_fwd_eager", "rmsnorm_fwdbwd", "rmsnorm_fwdbwd_eager"):
            for v, t in (("eager", 2.0), ("mahia_triton", 1.0)):
                nb = min_bytes(exp, shape, torch.bfloat16)
                r = _row(exp, v, shape, "bfloat16", t, frac=nb / t / 1e6 / 3000)
                rows.append({**r, "gbps": nb / t / 1e6})
        rows.append(_row("rmsnorm_fwd", "copy_same_bytes", shape, "bfloat16", value=0.7))
    rows += _peers("rmsnorm_host_fwd", (4, 64), "bfloat16", 0.02, {"F.rms_norm": 0.03})
    paths = bk.plot(pd.DataFrame(rows), tmp_path)
    names = sorted(p.name for p in paths)
    assert names == [
        "bench_kernels_host.png",
        "bench_kernels_host.svg",
        "bench_kernels_rmsnorm.png",
        "bench_kernels_rmsnorm.svg",
    ]
    assert all(p.stat().st_size > 0 for p in paths)
    assert math.isclose(bk.input_bytes("rmsnorm", (91, 1000), torch.bfloat16), 182000)


def test_a_wrong_variant_is_not_timed_and_the_others_go_on(tmp_path, capsys):
    rec = _recorder(tmp_path)
    good = bk.Variant("eager", rms_norm_eager)
    bad = bk.Variant("F.rms_norm", lambda x, w: rms_norm_eager(x, w) * 1.01)  # 1% off: over float32's 1e-5

    def make():
        return bk.make_inputs("rmsnorm", (5, 100), torch.float32, "cpu")

    kw = {
        "backward": False,
        "grad_inputs": [0, 1],
        "nbytes": 1000,
        "shape": (5, 100),
        "dtype": torch.float32,
        "budget": bk.QUICK_BUDGET,
    }
    with pytest.raises(CorrectnessError):
        _measure(rec, "rmsnorm_fwd", [bad, good], make, rms_norm_eager, **kw)
    assert rec.rows == []  # nothing timed before the failure
    failures = []
    _measure(
        rec,
        "rmsnorm_fwd",
        [bad, good],
        make,
        rms_norm_eager,
        failures=failures,
        modes={"device": "rmsnorm_fwd", "eager": "rmsnorm_fwd_eager"},
        **kw,
    )
    assert len(failures) == 1 and "F.rms_norm" in failures[0]
    assert [(r["experiment"], r["variant"]) for r in rec.rows] == [
        ("rmsnorm_fwd", "eager"),
        ("rmsnorm_fwd_eager", "eager"),
    ]
    assert "FAILED its check, not timed" in capsys.readouterr().out


def test_summary_keys_reach_the_folders_summary(tmp_path, monkeypatch):
    """The suite writes its keys to bench_kernels_summary.json; results.headline merges them into the
    folder's summary, with the records' commit as their source, per profile."""
    from mahia.measure import results

    rows = _peers("rmsnorm_host_fwd", (4, 64), "bfloat16", 0.020, {"F.rms_norm": 0.030})
    rows += _peers("rmsnorm_host_fwd", (4, 64), "bfloat16", 0.010, {"F.rms_norm": 0.030})  # another notebook's
    df = pd.DataFrame(rows)
    df["notebook"] = ["bench_kernels"] * 3 + ["other"] * 3
    df["profile"], df["commit"] = "full", "abc1234"
    monkeypatch.setattr(results, "load_records", lambda folder: df)
    path = bk.write_summary(tmp_path, "full")
    doc = json.loads(path.read_text())
    assert doc["metrics"]["rmsnorm_host_fwd_vs_native"] == pytest.approx(1.5)  # not the other notebook's 3.0
    assert doc["commits"] == ["abc1234"] and doc["where"]["rmsnorm_host_fwd_vs_native"]["shape"] == "4x64"
    monkeypatch.undo()
    head = results.headline(tmp_path, "full")
    assert head["metrics"]["rmsnorm_host_fwd_vs_native"] == pytest.approx(1.5)
    assert head["sources"]["rmsnorm_host_fwd_vs_native"] == ["abc1234"]
    assert results.goal_status("rmsnorm_host_fwd_vs_native", 1.5) == "met"
    assert results.headline(tmp_path, "quick")["metrics"]["rmsnorm_host_fwd_vs_native"] is None
