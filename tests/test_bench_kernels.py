"""mahia.bench.kernels: byte counts, a grid that keeps every case a key took its value at, the quick run, a wrong
variant left untimed, and the summary keys on synthetic records."""

import json

import pandas as pd
import pytest
import torch

from mahia.bench import kernels as bk
from mahia.bench.kernels import min_bytes
from mahia.measure import hardware, results, summary
from mahia.measure.checks import CorrectnessError
from mahia.ops.rmsnorm import rms_norm_eager


def _recorder(tmp_path):
    ceil = hardware.Ceilings(hardware.device_slug("cpu"), 10.0, 1.0, 1.0, measured_at="now")
    return results.Recorder("bench_kernels", "cpu", results_dir=tmp_path, ceilings=ceil, profile="quick", commit="c0")


def test_byte_counts_tensor_by_tensor():
    M, N, es = 3, 10, 2  # bf16
    x, w = M * N * es, N * es
    assert min_bytes("rmsnorm_fwd", (M, N), torch.bfloat16) == x + x + w  # x, y, w
    assert min_bytes("rmsnorm_fwdbwd", (M, N), torch.bfloat16) == (2 * x + w) + (3 * x + 2 * w)  # x dy dx w dw
    # add + RMSNorm: read x, r, w; write y, h | read dy, dh, h, w; write dx (= dr), dw
    assert min_bytes("add_rmsnorm_fwd", (M, N), torch.bfloat16) == 4 * x + w
    assert min_bytes("add_rmsnorm_fwdbwd", (M, N), torch.bfloat16) == (4 * x + w) + (4 * x + 2 * w)
    assert min_bytes("swiglu_fwd", (M, N), torch.float32) == 3 * M * N * 4
    assert min_bytes("swiglu_fwdbwd", (M, N), torch.float16) == 8 * M * N * 2
    B, T, Hq, Hkv, D = 2, 5, 4, 2, 8
    qk, tables = B * T * (Hq + Hkv) * D * 2, 2 * T * (D // 2) * 4  # cos and sin, float32, (T, D/2) each
    assert min_bytes("rope_fwd", (B, T, Hq, Hkv, D), torch.bfloat16) == 2 * qk + tables
    assert min_bytes("rope_fwdbwd", (B, T, Hq, Hkv, D), torch.bfloat16) == 2 * (2 * qk + tables)
    out, y, gates, index = 4 * 2 * 8 * 2, 4 * 8 * 2, 4 * 2 * 4, 4 * 2 * 8  # MoE: N=4, k=2, D=8, bf16
    fwd = out + y + gates + index  # read out, gates, index; write y
    assert min_bytes("moe_combine_fwd", (4, 2, 8), torch.bfloat16) == fwd
    assert min_bytes("moe_combine_fwdbwd", (4, 2, 8), torch.bfloat16) == 2 * fwd + out + gates  # + d_out, d_gates
    s, dt = (64, 1000), torch.bfloat16
    for name in ("rmsnorm_fwdbwd_eager", "rmsnorm_host_fwdbwd", "rmsnorm_fwdbwd_sweep"):  # 03's name too
        assert min_bytes(name, s, dt) == min_bytes("rmsnorm_fwdbwd", s, dt)
    with pytest.raises(ValueError, match="unknown experiment 'rmsnorm_bwd'"):
        min_bytes("rmsnorm_bwd", s, dt)
    assert bk.input_bytes("add_rmsnorm_fwd_eager", (4, 8), torch.float32) == 4 * 8 * 4
    assert bk.input_bytes("moe_combine", (16, 2, 100), torch.float32) == 16 * 2 * 100 * 4


# Issue 35: where each key took its value in the H100 sweeps of b34185d (first three lines) and 77c878d (last two).
# The grid keeps them all.
DECIDED = """rmsnorm 16384x4096 bfloat16, rmsnorm 16384x2048 float16, rmsnorm 1024x5120 bfloat16, rmsnorm 16384x5120 bfloat16,
swiglu 16384x11008 bfloat16, swiglu 4096x4096 float32, swiglu 1024x4096 float16,
rope 8x2048x32x8x128 bfloat16, rope 8x2048x64x8x128 float32, rope 2x2048x12x12x64 float16,
rmsnorm 4096x5120 float16, rmsnorm 4096x1000 bfloat16, rmsnorm 16384x4096 float16, swiglu 16384x11008 float32,
swiglu 1024x4096 bfloat16, rope 2x2048x12x12x64 float32, rope 2x2048x12x12x64 bfloat16"""


def test_the_grid_keeps_every_case_a_key_took_its_value_at():
    grid = {(k, bk._shape_str(s), bk._dtype_str(d)) for k in bk.KERNELS for s, d in bk.GRID[k]}
    decided = {tuple(case.split()) for case in DECIDED.split(",")}
    assert len(decided) == 17 and decided <= grid, decided - grid
    assert {(k, bk._shape_str(s), "bfloat16") for k, s in bk.HEADLINE.items()} <= grid
    assert all(bk.GRID[k] for k in bk.KERNELS) and len(grid) == sum(map(len, bk.GRID.values()))
    with pytest.raises(ValueError, match="unknown part 'rmsnrom'"):
        bk._select("rmsnrom")


def test_quick_run_records_device_eager_and_host_time_and_the_summary(tmp_path, capsys):
    rec = _recorder(tmp_path)
    bk.run(rec, rec.ceilings, quick=True, parts=["host", "rmsnorm"])
    out = capsys.readouterr().out
    assert "skipped: torch.compile" in out and "skipped: liger" in out
    df = rec.frame()
    variants = {"eager", "F.rms_norm", "mahia_triton"}  # the tests run Triton's interpreter
    for shape, _ in bk.cases("rmsnorm", quick=True):
        for exp in ("rmsnorm_fwd", "rmsnorm_fwd_eager", "rmsnorm_fwdbwd", "rmsnorm_fwdbwd_eager"):
            g = df[(df["experiment"] == exp) & (df["shape"] == bk._shape_str(shape))]
            assert set(g["variant"]) == variants, (exp, shape)
            assert (g["dtype"] == "float32").all() and (g["bytes"] == min_bytes(exp, shape, torch.float32)).all()
            assert g["notes"].str.startswith("timing=eager" if exp.endswith("_eager") else "timing=device").all()
            assert (g["rel_err"] <= 1e-5).all() and (g["median_ms"] > 0).all()
    host = df[df["experiment"].str.contains("_host_")]
    assert set(host["experiment"]) == {f"{k}_host_{p}" for k in bk.KERNELS for p in bk.PASSES}
    assert host["notes"].str.startswith("timing=eager").all()
    assert not df["experiment"].str.startswith("swiglu_fwd").any()  # not selected
    doc = json.loads((rec.folder / "bench_kernels_summary-quick.json").read_text())
    assert doc["metrics"]["rmsnorm_host_fwd_vs_native"] > 0 and doc["commits"] == ["c0"]
    bk.run(rec, None, quick=False, parts="list,rmsnorm")
    assert "plan (nothing measured)" in capsys.readouterr().out and len(rec.rows) == len(df)


def test_a_wrong_variant_is_not_timed_the_others_go_on_and_the_run_fails(tmp_path, monkeypatch, capsys):
    rec = _recorder(tmp_path)
    bad = bk.Variant("F.rms_norm", lambda x, w: rms_norm_eager(x, w) * 1.01)  # 1% off: over float32's 1e-5
    monkeypatch.setattr(bk, "_variants", lambda kernel, dev, liger: [bad, bk.Variant("eager", rms_norm_eager)])
    with pytest.raises(CorrectnessError, match="4 variant\\(s\\) failed their check"):  # 2 shapes x 2 passes
        bk.run(rec, None, quick=True, parts="rmsnorm")
    assert {r["variant"] for r in rec.rows} == {"eager"} and len(rec.rows) == 8  # and device, eager time
    assert "FAILED its check, not timed" in capsys.readouterr().out


def _row(exp, variant, shape, dtype, ms=None, frac=None, value=None, date="2026-01-01"):
    row = dict(experiment=exp, variant=variant, role=bk.ROLE.get(variant, "metric"), shape="x".join(map(str, shape)))
    return row | dict(dtype=dtype, median_ms=ms, frac_of_limit=frac, value=value, date=date)


def _peers(exp, shape, dtype, mahia, peers: dict, eager=10.0, frac=None):
    rows = [_row(exp, "eager", shape, dtype, eager), _row(exp, "mahia_triton", shape, dtype, mahia, frac=frac)]
    return rows + [_row(exp, v, shape, dtype, t) for v, t in peers.items()]


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
    # eager worst over inputs >= 16 MB: 1024x8192 bf16 is 16.8 MB (1.2 counts); 91x8192 fp32 is 3 MB (0.5 does not)
    rows += _peers("rmsnorm_fwdbwd_eager", (1024, 8192), bf, 1.0, {"F.rms_norm": 1.2})
    rows += _peers("rmsnorm_fwdbwd_eager", (91, 8192), fp, 1.0, {"F.rms_norm": 0.5})
    # the H100 sweep at b34185d, SwiGLU 4096x4096 fp32: eager PyTorch (role baseline) was the fastest call
    rows += _peers("swiglu_fwdbwd_eager", (4096, 4096), fp, 0.513, {"torch.compile": 0.5125}, eager=0.354)
    # device worst over fwd and fwd+bwd, inputs >= 8 MB: 4096x1000 bf16 (8.2 MB) fwd 0.9 counts; 1024x2048 bf16
    # (4.2 MB) 0.1 does not; an older mahia row (0.1 ms, ratio 9) is superseded
    rows += [_row("rmsnorm_fwd", "mahia_triton", (4096, 1000), bf, 0.1, date="2025-01-01")]
    rows += _peers("rmsnorm_fwd", (4096, 1000), bf, 1.0, {"F.rms_norm": 0.9, "torch.compile": 5.0}, frac=0.1)
    rows += _peers("rmsnorm_fwd", (1024, 2048), bf, 1.0, {"F.rms_norm": 0.1})
    # frac of copy at 16384x4096 bf16 fwd+bwd: mahia 0.72 of the ceiling, the same-bytes copy 0.9 -> 0.8
    rows += _peers("rmsnorm_fwdbwd", (16384, 4096), bf, 1.0, {"liger": 1.3}, eager=3.0, frac=0.72)
    rows += [_row("rmsnorm_fwdbwd", "copy_same_bytes", (16384, 4096), bf, value=0.9)]
    # fwd worst frac of copy over inputs >= 64 MB: 16384x4096 bf16 0.6 / 0.8 = 0.75; 4096x8192 fp32 0.9 / 0.9
    rows += [_row("rmsnorm_fwd", "mahia_triton", (16384, 4096), bf, 1.0, frac=0.6)]
    rows += [_row("rmsnorm_fwd", "copy_same_bytes", (16384, 4096), bf, value=0.8)]
    rows += [_row("rmsnorm_fwd", "mahia_triton", (4096, 8192), fp, 1.0, frac=0.9)]
    rows += [_row("rmsnorm_fwd", "copy_same_bytes", (4096, 8192), fp, value=0.9)]
    # swiglu device: the worst of fwd bf16 (1.1) and fwd+bwd fp32 (0.95)
    rows += _peers("swiglu_fwd", (16384, 11008), bf, 1.0, {"liger": 1.1})
    rows += _peers("swiglu_fwdbwd", (16384, 11008), fp, 2.0, {"torch.compile": 1.9})
    df = pd.DataFrame(rows)
    keys = bk.summary_keys(df)
    assert set(keys) == set(summary.SUITE_SUMMARIES[bk.SUMMARY_STEM])
    expect = {
        "rmsnorm_host_fwd_vs_native": 1.5,
        "rmsnorm_host_fwdbwd_vs_native": 1.5,
        "rmsnorm_fwdbwd_eager_vs_best_peer": 1.5,
        "swiglu_fwdbwd_eager_vs_best_peer": 1.5,
        "rope_fwdbwd_eager_vs_best_peer": 0.5,
        "rmsnorm_fwdbwd_eager_worst_vs_best_peer": 1.2,
        "swiglu_fwdbwd_eager_worst_vs_best_peer": 0.354 / 0.513,  # behind eager, not level with compile
        "rope_fwdbwd_eager_worst_vs_best_peer": 0.5,
        "rmsnorm_device_worst_vs_best_peer": 0.9,
        "swiglu_device_worst_vs_best_peer": 0.95,
        "rope_device_worst_vs_best_peer": None,
        "rmsnorm_fwdbwd_frac_of_copy": 0.8,
        "rmsnorm_fwd_worst_frac_of_copy": 0.75,
    }
    assert keys == {k: v if v is None else pytest.approx(v) for k, v in expect.items()}
    where = bk.summary_keys(df, where=True)["rmsnorm_device_worst_vs_best_peer"]
    assert where == {"value": pytest.approx(0.9), "experiment": "rmsnorm_fwd", "shape": "4096x1000", "dtype": bf}
    empty = bk.summary_keys(pd.DataFrame(columns=df.columns))
    assert set(empty) == set(keys) and all(v is None for v in empty.values())


def test_summary_keys_reach_the_folders_summary(tmp_path, monkeypatch):
    rows = _peers("rmsnorm_host_fwd", (4, 64), "bfloat16", 0.020, {"F.rms_norm": 0.030})
    rows += _peers("rmsnorm_host_fwd", (4, 64), "bfloat16", 0.010, {"F.rms_norm": 0.030})  # another notebook's
    rows += _peers("rmsnorm_host_fwdbwd", (4, 64), "bfloat16", 0.010, {"F.rms_norm": 0.030})  # an older sweep's
    df = pd.DataFrame(rows).assign(notebook=["bench_kernels"] * 3 + ["other"] * 3 + ["bench_kernels"] * 3,
                                   profile="full", commit=["abc1234"] * 6 + ["old"] * 3, date=["2"] * 6 + ["1"] * 3)  # fmt: skip
    monkeypatch.setattr(summary, "load_records", lambda folder: df)
    doc = json.loads(bk.write_summary(tmp_path, "full").read_text())
    assert doc["metrics"]["rmsnorm_host_fwd_vs_native"] == pytest.approx(1.5)  # not the other notebook's 3.0
    assert doc["commits"] == ["abc1234"] and doc["where"]["rmsnorm_host_fwd_vs_native"]["shape"] == "4x64"
    assert doc["metrics"]["rmsnorm_host_fwdbwd_vs_native"] is None  # a case the newest sweep dropped
    monkeypatch.undo()
    head = summary.headline(tmp_path, "full")
    assert head["metrics"]["rmsnorm_host_fwd_vs_native"] == pytest.approx(1.5)
    assert head["sources"]["rmsnorm_host_fwd_vs_native"] == ["abc1234"]
    assert summary.headline(tmp_path, "quick")["metrics"]["rmsnorm_host_fwd_vs_native"] is None
