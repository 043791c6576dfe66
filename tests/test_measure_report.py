"""Records and the run report: headline metrics from the newest records; each optimized row paired with its
baseline, a spread that contains 1 marked, a fraction of a ceiling above 1 flagged, a CPU run not graded."""

from __future__ import annotations

import contextlib
import json
import shutil

import pandas as pd
import pytest
import torch

from mahia.measure import hardware, results, summary
from mahia.measure.report import ABOVE_ONE, CPU_NOT_GRADED, build_report, readme_tables
from mahia.measure.timing import Timing


def _ceil():
    return hardware.Ceilings(hardware.device_slug("cpu"), 100.0, 10.0, 1.0, "2026-01-01T00:00:00+00:00", profile="full")


def _rec(tmp_path, notebook, *, commit="abc123", run_id="run-1", ceilings=None):
    return results.Recorder(
        notebook, "cpu", results_dir=tmp_path, profile="full", commit=commit, run_id=run_id, ceilings=ceilings
    )


def _t(ms, spread=0.05):
    return Timing(ms, (1 - spread) * ms, (1 + spread) * ms, 5)


def test_a_recorder_writes_rows_and_derives_metrics_from_the_newest(tmp_path):
    rec = _rec(tmp_path, "08_moe", ceilings=_ceil())
    rec.timing("moe_fwd", "loop", "baseline", _t(4.0), shape=summary.MOE, dtype=torch.bfloat16, flops=2e9)
    row = rec.timing("moe_fwd", "grouped", "optimized", _t(1.0), shape=summary.MOE, dtype=torch.bfloat16, flops=2e9)
    rec.timing("moe_fwd", "grouped", "optimized", _t(0.1), shape=(16, 8), dtype=torch.bfloat16, flops=2e9)  # a sweep
    assert row["limit"] == "matmul_bf16" and [row["tflops"], row["frac_of_limit"]] == pytest.approx([2.0, 0.2])
    rec.metric("sync_count", "baseline", 7, unit="syncs")
    on_disk = pd.read_csv(rec.path)
    assert len(on_disk) == 4 and list(on_disk.columns) == summary.COLUMNS
    m = rec.summarize()
    assert m["moe_vs_loop"] == pytest.approx(4.0) and m["moe_fwd_tflops"] == pytest.approx(2.0)  # not the sweep's
    assert m["sync_count_baseline"] == 7 and m["amp_speedup"] is None  # not measured -> null, never invented
    assert set(json.loads((rec.folder / "summary.json").read_text())["metrics"]) == set(summary.HEADLINE_KEYS)
    later = _rec(tmp_path, "08_moe", run_id="run-2")  # the newest record wins; the history is kept
    later.timing("moe_fwd", "grouped", "optimized", _t(0.5), shape=summary.MOE, dtype=torch.bfloat16, flops=2e9)
    assert len(summary.load_records(rec.folder)) == 5 and later.summarize()["moe_vs_loop"] == pytest.approx(8.0)


def test_the_ladder_speedup_comes_only_from_the_ladder_that_starts_without_the_loops(tmp_path):
    rec = _rec(tmp_path, "10_full_stack")
    rec.timing("full_stack_train", "baseline", "baseline", _t(10.0), shape=(2, 64), dtype="float32")
    rec.timing("full_stack_train", "all", "optimized", _t(2.0), shape=(2, 64), dtype="bfloat16")
    assert rec.summarize()["full_stack_speedup"] is None  # the earlier ladder: its baseline was the naive step
    rec.metric("full_stack_tokens", "ladder", 128, unit="tokens per step", shape=(2, 64))
    assert rec.summarize()["full_stack_speedup"] == pytest.approx(5.0)


def test_gla_against_fla_is_the_worse_model_shape_and_needs_both(tmp_path):
    rec = _rec(tmp_path, "bench_meta")
    shapes = [dict(zip("BHTKV", s)) for s in ((16, 8, 1024, 64, 64), (8, 16, 2048, 64, 64))]
    for sh, (mine, fla) in zip(shapes, [(1.0, 1.2), (2.0, 1.6)]):
        shape = ",".join(f"{k}={v}" for k, v in sh.items())
        rec.timing("gla_fwd", "triton", "optimized", _t(mine), shape=shape, dtype=torch.bfloat16)
        assert rec.summarize()["gla_fwd_vs_fla"] is None  # one shape alone is no verdict
        rec.timing("gla_fwd", "fla", "peer", _t(fla), shape=shape, dtype=torch.bfloat16)
    assert rec.summarize()["gla_fwd_vs_fla"] == pytest.approx(0.8)  # 1.6 / 2.0, not 1.2 / 1.0


def test_a_recorder_refuses_another_devices_folder_and_a_bad_role_and_writes_atomically(tmp_path):
    rec = _rec(tmp_path, "99_test")
    with pytest.raises(ValueError, match="role must be"):
        rec.timing("e", "v", "fast", _t(1))
    rec.folder.mkdir(parents=True)
    (rec.folder / "device.json").write_text(json.dumps({"device": "cuda", "gpu": "Other GPU"}))
    with pytest.raises(RuntimeError, match="another device"):
        rec.metric("x", "y", 1.0)
    assert not rec.path.exists()
    same_gpu = {k: rec.report.get(k) for k in ("device", "device_slug", "gpu")}
    (rec.folder / "device.json").write_text(json.dumps({**same_gpu, "cpu": "another host", "cpu_count": 999}))
    with contextlib.nullcontext() if rec.report.get("gpu") else pytest.raises(RuntimeError, match="another device"):
        rec.metric("x", "y", 1.0)  # another host of the same GPU writes; of the same CPU device it may not
    results.atomic_write_text(tmp_path / "f.txt", "one")
    with pytest.raises(TypeError):
        results.atomic_write_text(tmp_path / "f.txt", 12345)  # the write fails midway
    assert (tmp_path / "f.txt").read_text() == "one" and not list(tmp_path.glob(".f.txt*"))


def test_pairs_are_marked_and_paired_across_dtypes(tmp_path):
    early = _rec(tmp_path, "01_first", commit="aaa111")
    early.timing("a_exp", "slow", "baseline", _t(1.00, 0.1))
    early.timing("a_exp", "fast", "optimized", _t(0.98, 0.1))  # within the spread: not significant
    early.timing("amp", "fp32", "baseline", _t(4.0), shape=(8, 64), dtype="float32")
    early.timing("amp", "tf32", "peer", _t(3.0), shape=(8, 64), dtype="tf32")
    early.timing("amp", "bf16", "optimized", _t(1.0), shape=(8, 64), dtype="bfloat16")
    for dt, base_ms in (("float32", 8.0), ("bfloat16", 4.0)):  # a baseline in each dtype: each pair its own
        early.timing("attention", "manual", "baseline", _t(base_ms), shape=(1, 2), dtype=dt)
        early.timing("attention", "sdpa", "optimized", _t(1.0), shape=(1, 2), dtype=dt)
    md = build_report(early.folder)
    assert "| a_exp | — | — | slow → fast | 1.02× [0.83, 1.25] (not significant) |" in md
    assert "| amp | 8x64 | float32 → bfloat16 | fp32 → bf16 | 4.00×" in md
    assert (
        "| attention | 1x2 | bfloat16 | manual → sdpa | 4.00×" in md
        and "| attention | 1x2 | float32 | manual → sdpa | 8.00×" in md
    )


def test_goals_are_graded_and_a_cpu_run_is_reported_as_one_and_not_graded(tmp_path):
    rec = _rec(tmp_path, "06_amp")
    rec.timing("amp_train_step", "fp32", "baseline", _t(1.2))
    rec.timing("amp_train_step", "bf16", "optimized", _t(1.0))  # 1.2x: far from the GPU goal
    summary.write_summary(rec.folder, "full")
    md = build_report(rec.folder)
    assert "**A CPU run.**" in md and f"| `amp_speedup` | 1.2 | >= 3.0 | {CPU_NOT_GRADED} |" in md
    assert "| missed |" not in md and f"| 1.2 ({CPU_NOT_GRADED}) |" in readme_tables([rec.folder])
    gpu = tmp_path / "gpu" / "nvidia-h200"  # the same numbers from a GPU are graded
    shutil.copytree(rec.folder, gpu)
    df = pd.read_csv(gpu / "06_amp.csv")
    df["device_slug"], df["device"] = "nvidia-h200", "NVIDIA H200"
    df.to_csv(gpu / "06_amp.csv", index=False)
    md = build_report(gpu)
    assert "| `amp_speedup` | 1.2 | >= 3.0 | missed |" in md and "**A CPU run.**" not in md


def test_a_fraction_of_a_ceiling_above_one_is_flagged_and_explained(tmp_path):
    rec = _rec(tmp_path, "03_fusion", ceilings=_ceil())
    for exp, nbytes in (("norm", 2e8), ("act", 2e7)):  # 200 GB/s and 20 GB/s against a 100 GB/s ceiling
        rec.timing(exp, "eager", "baseline", _t(4.0), bytes=nbytes, limit="copy")
        rec.timing(exp, "fused", "optimized", _t(1.0), bytes=nbytes, limit="copy")
    md = build_report(rec.folder)
    assert "| 2.000 ↑ of copy |" in md and "| 0.20 of copy |" in md and ABOVE_ONE in md
