"""mahia.measure.report: a report a reader can follow (introduction, column meanings, rows grouped by notebook
and sorted, the run and commit of each row), with the cross-dtype pairs, a CPU run reported as one, and
fractions of a ceiling above 1 flagged."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from mahia.measure import files, hardware, results
from mahia.measure.report import (
    ABOVE_ONE,
    CPU_NOT_GRADED,
    _md_to_html,
    build_report,
    grade,
    readme_tables,
    report_pairs,
)
from mahia.measure.timing import Timing


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("MAHIA_COMMIT", "MAHIA_PROFILE", "MAHIA_RUN_ID", "MAHIA_RESULTS_DIR", "MAHIA_FIGURES_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv(files.REFERENCE_ENV, raising=False)


def _ceil(slug):
    return hardware.Ceilings(
        slug,
        copy_gbps=100.0,
        matmul_bf16_tflops=10.0,
        matmul_fp32_tflops=1.0,
        measured_at="2026-01-01T00:00:00+00:00",
        profile="full",
        commit="c0",
    )


def _rec(tmp_path, notebook, *, commit="abc123", run_id="run-1", ceilings=None):
    return results.Recorder(
        notebook, "cpu", results_dir=tmp_path, profile="full", commit=commit, run_id=run_id, ceilings=ceilings
    )


def _t(ms):
    return Timing(ms, 0.95 * ms, 1.05 * ms, 5)


def _as_gpu(folder, tmp_path):
    """The same records in a folder of a GPU's (its device slug rewritten): what a GPU run looks like."""
    gpu = tmp_path / "gpu" / "nvidia-h200"
    shutil.copytree(folder, gpu)
    for csv in gpu.glob("*.csv"):
        df = pd.read_csv(csv)
        df["device_slug"], df["device"] = "nvidia-h200", "NVIDIA H200"
        df.to_csv(csv, index=False)
    return gpu


def test_the_report_opens_with_what_it_is_and_what_its_columns_mean(tmp_path):
    rec = _rec(tmp_path, "01_sync")
    rec.timing("sync_loop", "baseline", "baseline", _t(2.0))
    rec.timing("sync_loop", "optimized", "optimized", _t(1.0))
    md = build_report(rec.folder)
    intro = md.index("no number here is typed in")
    assert intro < md.index("## Before / after")
    for column in ("**speedup [20–80%]**", "**fraction of limit**", "**rel. error**", "**date**, **run**, **commit**"):
        assert f"- {column}" in md
    assert "**value**" in md and "**goal**" in md  # the headline table's columns
    html = _md_to_html(md, "t")
    assert "<ul>" in html and "<li>" in html and "<h3>01_sync</h3>" in html


def test_rows_are_grouped_by_notebook_and_sorted_with_their_run_and_commit(tmp_path):
    late = _rec(tmp_path, "02_later", commit="bbb222", run_id="run-2")
    late.timing("z_exp", "eager", "baseline", _t(4.0), shape=(4, 1024))
    late.timing("z_exp", "fast", "optimized", _t(1.0), shape=(4, 1024))
    late.timing("z_exp", "eager", "baseline", _t(4.0), shape=(4, 256))
    late.timing("z_exp", "fast", "optimized", _t(2.0), shape=(4, 256))
    early = _rec(tmp_path, "01_first", commit="aaa111", run_id="run-1")
    early.timing("b_exp", "slow", "baseline", _t(3.0))
    early.timing("b_exp", "fast", "optimized", _t(1.0))
    early.timing("a_exp", "slow", "baseline", _t(3.0))
    early.timing("a_exp", "fast", "optimized", _t(1.5))
    md = build_report(early.folder)
    assert md.index("### 01_first") < md.index("### 02_later")
    assert md.index("| a_exp |") < md.index("| b_exp |")
    assert md.index("| z_exp | 4x256 |") < md.index("| z_exp | 4x1024 |")  # shapes in numeric order
    assert "| run-1 | aaa111 |" in md and "| run-2 | bbb222 |" in md
    ps = report_pairs(results.load_records(early.folder))
    assert [(p.notebook, p.experiment, p.shape) for p in ps] == [
        ("01_first", "a_exp", ""),
        ("01_first", "b_exp", ""),
        ("02_later", "z_exp", "4x256"),
        ("02_later", "z_exp", "4x1024"),
    ]


def test_a_baseline_from_another_run_is_named(tmp_path):
    old = _rec(tmp_path, "04_compile", commit="aaa111", run_id="run-1")
    old.timing("block", "eager", "baseline", _t(3.0))
    new = _rec(tmp_path, "04_compile", commit="bbb222", run_id="run-2")
    new.timing("block", "default", "optimized", _t(1.0))
    md = build_report(new.folder)
    assert "| run-2 (before: run-1) | bbb222 (before: aaa111) |" in md


def test_pairs_across_dtypes_are_included_and_a_same_dtype_baseline_comes_first(tmp_path):
    rec = _rec(tmp_path, "06_amp")
    rec.timing("amp_train_step", "fp32", "baseline", _t(4.0), shape=(8, 64), dtype="float32")
    rec.timing("amp_train_step", "tf32", "peer", _t(3.0), shape=(8, 64), dtype="tf32")
    rec.timing("amp_train_step", "bf16", "optimized", _t(1.0), shape=(8, 64), dtype="bfloat16")
    ladder = _rec(tmp_path, "10_full_stack")
    ladder.timing("full_stack_train", "baseline", "baseline", _t(10.0), shape=(2, 64), dtype="float32")
    ladder.timing("full_stack_train", "all", "optimized", _t(1.0), shape=(2, 64), dtype="bfloat16")
    both = _rec(tmp_path, "02_attn")  # a baseline in each dtype: each optimized row gets its own dtype's
    for dt, base_ms in (("float32", 8.0), ("bfloat16", 4.0)):
        both.timing("attention", "manual", "baseline", _t(base_ms), shape=(1, 2), dtype=dt)
        both.timing("attention", "sdpa", "optimized", _t(1.0), shape=(1, 2), dtype=dt)
    # pairs across dtypes: the AMP pair and the ladder are kept
    ps = {(p.experiment, p.dtype): p for p in report_pairs(results.load_records(rec.folder))}
    amp = ps[("amp_train_step", "bfloat16")]
    assert (amp.base_dtype, amp.baseline, amp.speedup) == ("float32", "fp32", pytest.approx(4.0))
    assert ps[("full_stack_train", "bfloat16")].speedup == pytest.approx(10.0)
    assert ps[("attention", "float32")].speedup == pytest.approx(8.0)
    assert ps[("attention", "bfloat16")].speedup == pytest.approx(4.0)
    md = build_report(rec.folder)
    assert "| amp_train_step | 8x64 | float32 → bfloat16 | fp32 → bf16 | 4.00×" in md
    assert "| full_stack_train | 2x64 | float32 → bfloat16 | baseline → all | 10.00×" in md
    assert "| attention | 1x2 | bfloat16 | manual → sdpa | 4.00×" in md


def test_a_cpu_run_is_reported_as_one_and_not_graded(tmp_path):
    rec = _rec(tmp_path, "06_amp")
    rec.timing("amp_train_step", "fp32", "baseline", _t(1.2))
    rec.timing("amp_train_step", "bf16", "optimized", _t(1.0))  # 1.2x: far from the GPU goal
    results.write_summary(rec.folder, "full")
    assert rec.folder.name.startswith("cpu")
    md = build_report(rec.folder)
    assert "**A CPU run.**" in md and "(a CPU run" in md
    assert f"| `amp_speedup` | 1.2 | >= 3.0 | {CPU_NOT_GRADED} |" in md and "| missed |" not in md
    assert "| `moe_layer_over_gemms` | not measured | <= 1.3 | not measured |" in md
    assert f"| `amp_speedup` | >= 3.0 | 1.2 ({CPU_NOT_GRADED}) |" in readme_tables([rec.folder])
    gpu = _as_gpu(rec.folder, tmp_path)  # the same numbers from a GPU are graded
    results.write_summary(gpu, "full")
    assert "| `amp_speedup` | 1.2 | >= 3.0 | missed |" in build_report(gpu)
    assert "**A CPU run.**" not in build_report(gpu)
    assert grade("amp_speedup", 5.0, cpu=False) == "met" and grade("amp_speedup", 5.0, cpu=True) == CPU_NOT_GRADED
    assert grade("copy_gbps", 5.0, cpu=True) == ""  # no goal, nothing to grade
    assert grade("amp_speedup", None, cpu=True) == "not measured"


def test_a_fraction_of_a_ceiling_above_one_is_flagged_and_explained(tmp_path):
    rec = _rec(tmp_path, "03_fusion", ceilings=_ceil(hardware.device_slug("cpu")))
    # 2e8 bytes in 1 ms = 200 GB/s against a 100 GB/s ceiling: 2.0 of copy
    rec.timing("norm", "eager", "baseline", _t(4.0), bytes=2e8, limit="copy")
    rec.timing("norm", "fused", "optimized", _t(1.0), bytes=2e8, limit="copy")
    rec.timing("act", "eager", "baseline", _t(4.0), bytes=2e7, limit="copy")
    rec.timing("act", "fused", "optimized", _t(1.0), bytes=2e7, limit="copy")  # 0.2 of copy
    md = build_report(rec.folder)
    assert "| 2.000 ↑ of copy |" in md and "| 0.20 of copy |" in md
    assert ABOVE_ONE in md
    below = _rec(tmp_path / "other", "03_fusion", ceilings=_ceil(hardware.device_slug("cpu")))
    below.timing("act", "eager", "baseline", _t(4.0), bytes=2e7, limit="copy")
    below.timing("act", "fused", "optimized", _t(1.0), bytes=2e7, limit="copy")
    assert ABOVE_ONE not in build_report(below.folder) and "↑ of" not in build_report(below.folder)


def test_the_notebooks_table_says_where_each_notebook_spent_its_time(tmp_path):
    rec = _rec(tmp_path, "06_amp")
    rec.timing("amp_train_step", "fp32", "baseline", _t(1.2))
    outcomes = [
        {"name": "06_amp", "status": "ok", "seconds": 44.2, "slowest_cells": [{"cell": 25, "seconds": 13.4}]},
        {"name": "07_ckpt", "status": "failed", "seconds": 3.0, "cell": 4, "error": "ValueError: planted"},
    ]
    md = build_report(rec.folder, outcomes)
    assert "| notebook | status | time (s) | slowest cells (s) | where it failed |" in md
    assert "| 06_amp | ok | 44 | 25: 13 |  |" in md
    assert "| 07_ckpt | failed | 3 |  | cell 4: ValueError: planted |" in md
