"""Measurement helpers, results contract, report and runner command line."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from mahia import runner
from mahia.measure import checks, hardware, results
from mahia.measure.instruments import count_syncs
from mahia.measure.report import build_report, report_pairs
from mahia.measure.timing import Timing, bench

ROOT = Path(__file__).resolve().parent.parent


# -- timing ------------------------------------------------------------------------------------------
def test_bench_orders_percentiles_reports_first_call_and_sees_more_work():
    small, big = torch.randn(32, 32), torch.randn(1024, 1024)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine, spinning worker threads swamp a tiny matmul
    try:
        t_small = bench(lambda: small @ small, device="cpu", rep_ms=20)
        t_big = bench(lambda: big @ big, device="cpu", rep_ms=20)
    finally:
        torch.set_num_threads(threads)
    assert t_small.n >= 5 and t_small.device == "cpu" and 0 < t_small.p20_ms <= t_small.median_ms <= t_small.p80_ms
    assert t_small.first_call_ms > 0 and t_small.peak_mem_bytes is None  # no allocator peak on the CPU
    assert t_big.median_ms > 5 * t_small.median_ms  # 32768 times the FLOPs


# -- correctness -------------------------------------------------------------------------------------
def test_rel_error_and_tolerance_per_dtype():
    a = torch.randn(100, dtype=torch.float64)
    assert checks.rel_error(a, a) == 0.0
    assert checks.rel_error(a * (1 + 1e-3), a) == pytest.approx(1e-3, rel=1e-6)
    assert checks.rel_error(torch.full((3,), float("nan")), torch.ones(3)) == float("inf")
    with pytest.raises(ValueError, match="shape mismatch"):
        checks.rel_error(torch.ones(3), torch.ones(4))
    assert checks.tolerance(torch.float32) < checks.tolerance(torch.float16) < checks.tolerance(torch.bfloat16)
    with pytest.raises(ValueError, match="no tolerance"):
        checks.tolerance(torch.int32)


def test_compare_fn_passes_a_correct_path_and_stops_a_wrong_one():
    x = torch.randn(7, 33)
    good = checks.compare_fn(lambda t: torch.tanh(t) * 2, lambda t: 2 * torch.tanh(t), [x])
    assert good.max_error < 1e-6 and {"out0", "grad0"} <= set(good.errors)
    with pytest.raises(checks.CorrectnessError, match="output 0"):
        checks.compare_fn(lambda t: torch.tanh(t) * 2.01, lambda t: 2 * torch.tanh(t), [x])
    # right output, wrong gradient: only the backward check can see it
    wrong_grad = lambda t: t.detach() * 3 + (t - t.detach()) * 2  # noqa: E731
    with pytest.raises(checks.CorrectnessError, match="gradient of input 0"):
        checks.compare_fn(wrong_grad, lambda t: t * 3, [x])


# -- syncs -------------------------------------------------------------------------------------------
def test_count_syncs_sees_the_usual_suspects_and_not_sync_free_code():
    x = torch.randn(100)
    with count_syncs() as r:
        x.sum().item()  # 1
        if x.max() > 0:  # 2
            pass
        x[x > 0]  # 3 boolean-mask index
        torch.nonzero(x > 1)  # 4
    assert r.count == 4, str(r)
    assert r.ops["aten.nonzero"] == 1 and r.ops["boolean-mask index"] == 1
    assert str(r).startswith("4 sync(s) — ") and "aten.nonzero ×1" in str(r)
    assert any("test_foundation.py" in w for w in r.where)
    with count_syncs() as r:
        torch.where(x > 0, x, torch.zeros_like(x)).sum()
        torch.topk(x, 5)
    assert r.count == 0, str(r)


# -- hardware ----------------------------------------------------------------------------------------
def test_resolve_device_errors():
    assert hardware.resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="device must be"):
        hardware.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            hardware.resolve_device("cuda")


def test_device_report_and_slug():
    rep = hardware.device_report("cpu")
    assert rep["torch"] == torch.__version__
    assert rep["device_slug"].startswith("cpu-") and " " not in rep["device_slug"]


def test_device_report_gives_the_l2_cache_in_mib_under_a_mib_key(monkeypatch):
    # 00-11: the value is L2_cache_size / 2**20, so its key says MiB (a fake H100's properties, no GPU needed)
    import types

    props = types.SimpleNamespace(
        name="Fake GPU", major=9, minor=0, multi_processor_count=132, total_memory=80 * 2**30, L2_cache_size=50 * 2**20
    )
    monkeypatch.setattr(hardware, "resolve_device", lambda d="auto": torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: props.name)
    monkeypatch.setattr(hardware, "_driver_version", lambda: None)
    hardware.device_report.cache_clear()
    try:
        rep = hardware.device_report("cuda")
    finally:
        hardware.device_report.cache_clear()
    assert rep["l2_cache_mib"] == 50.0 and "l2_cache_mb" not in rep


def test_ceilings_cached_per_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MAHIA_RUN_ID", "run-a")
    hardware._CACHE.clear()
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")
    c1 = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)
    assert c1.copy_gbps > 0 and c1.matmul_fp32_tflops > 0
    # a quick measurement never lands in ceilings.json, the full profile's (the reference headline's)
    assert not (tmp_path / c1.device_slug / "ceilings.json").exists()
    saved = json.loads((tmp_path / c1.device_slug / "ceilings-quick.json").read_text())
    assert saved["run_id"] == "run-a" and saved["profile"] == "quick" and saved["commit"] == "abc123"
    hardware._CACHE.clear()  # a new process of the same run reads the file instead of measuring
    assert hardware.ceilings("cpu", results_dir=tmp_path, quick=True) == c1
    with pytest.raises(ValueError, match="unknown limit"):
        c1.limit("flops")


# -- results -----------------------------------------------------------------------------------------
def _ceil(slug):
    return hardware.Ceilings(
        slug, copy_gbps=100.0, matmul_bf16_tflops=10.0, matmul_fp32_tflops=1.0, measured_at="2026-01-01T00:00:00+00:00"
    )


def test_recorder_writes_rows_and_derives_metrics(tmp_path):
    slug = hardware.device_slug("cpu")
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, ceilings=_ceil(slug), profile="full")
    t_base = Timing(4.0, 3.9, 4.1, 10)
    t_opt = Timing(1.0, 0.95, 1.05, 10)
    rec.timing("moe_fwd", "loop", "baseline", t_base, shape=results.MOE, dtype=torch.bfloat16, flops=2e9)
    row = rec.timing(
        "moe_fwd", "grouped", "optimized", t_opt, shape=results.MOE, dtype=torch.bfloat16, flops=2e9, rel_err=1e-3
    )
    # a sweep point at another shape never becomes the headline
    rec.timing(
        "moe_fwd", "grouped", "optimized", Timing(0.1, 0.1, 0.1, 3), shape=(16, 8), dtype=torch.bfloat16, flops=2e9
    )
    assert row["tflops"] == pytest.approx(2.0) and row["limit"] == "matmul_bf16"
    assert row["frac_of_limit"] == pytest.approx(0.2)
    rec.metric("sync_count", "baseline", 7, unit="syncs")
    on_disk = pd.read_csv(tmp_path / slug / "99_test.csv")
    assert len(on_disk) == 4 and set(results.COLUMNS) == set(on_disk.columns)
    m = rec.summarize()
    assert m["moe_vs_loop"] == pytest.approx(4.0)
    assert m["moe_fwd_tflops"] == pytest.approx(2.0)
    assert m["sync_count_baseline"] == 7
    assert m["amp_speedup"] is None  # not measured -> null, never invented
    summary = json.loads((tmp_path / slug / "summary.json").read_text())
    assert set(summary["metrics"]) == set(results.HEADLINE_KEYS)


def test_ladder_speedup_only_from_the_ladder_that_starts_without_the_loops(tmp_path):
    slug = hardware.device_slug("cpu")
    rec = results.Recorder("10_full_stack", "cpu", results_dir=tmp_path, ceilings=_ceil(slug), profile="full")
    rec.timing("full_stack_train", "baseline", "baseline", Timing(10.0, 9.9, 10.1, 5), shape=(2, 64), dtype="float32")
    rec.timing("full_stack_train", "all", "optimized", Timing(2.0, 1.9, 2.1, 5), shape=(2, 64), dtype="bfloat16")
    assert rec.summarize()["full_stack_speedup"] is None  # the earlier ladder: its baseline was the naive step
    rec.metric("full_stack_tokens", "ladder", 128, unit="tokens per step", shape=(2, 64))
    assert rec.summarize()["full_stack_speedup"] == pytest.approx(5.0)


def test_goal_status():
    assert results.goal_status("moe_layer_over_gemms", 1.2) == "met"
    assert results.goal_status("moe_layer_over_gemms", 1.5) == "missed"
    assert results.goal_status("moe_vs_loop", 16.0) == ""  # reported, no goal (issue 14)
    assert results.goal_status("checkpoint_overhead", 0.3) == "missed"
    assert results.goal_status("checkpoint_overhead", None) == "not measured"
    assert results.goal_status("copy_gbps", 1.0) == ""


def test_latest_record_wins_and_history_is_kept(tmp_path):
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, run_id="r1", profile="quick")
    rec.timing("sync_loop", "baseline", "baseline", Timing(2.0, 2, 2, 3))
    rec.timing("sync_loop", "optimized", "optimized", Timing(1.0, 1, 1, 3))
    rec2 = results.Recorder("99_test", "cpu", results_dir=tmp_path, run_id="r2", profile="quick")
    rec2.timing("sync_loop", "optimized", "optimized", Timing(0.5, 0.5, 0.5, 3))
    df = results.load_records(tmp_path / rec.slug)
    assert len(df) == 3
    assert results.summarize(tmp_path / rec.slug, "quick")["sync_speedup"] == pytest.approx(4.0)


def test_recorder_refuses_another_devices_folder(tmp_path):
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path)
    (tmp_path / rec.slug).mkdir(parents=True)
    (tmp_path / rec.slug / "device.json").write_text(json.dumps({"device": "cuda", "gpu": "Other GPU"}))
    with pytest.raises(RuntimeError, match="another device"):
        rec.metric("x", "y", 1.0)
    assert not (tmp_path / rec.slug / "99_test.csv").exists()


def test_recorder_rejects_bad_role(tmp_path):
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path)
    with pytest.raises(ValueError, match="role must be"):
        rec.timing("e", "v", "fast", Timing(1, 1, 1, 1))


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "f.txt"
    results.atomic_write_text(target, "one")

    with pytest.raises(TypeError):
        results.atomic_write_text(target, 12345)  # write fails midway
    assert target.read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_pairs_mark_overlapping_spread_not_significant(tmp_path):
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path)
    rec.timing("a", "slow", "baseline", Timing(1.00, 0.90, 1.10, 5))
    rec.timing("a", "fast", "optimized", Timing(0.98, 0.90, 1.05, 5))
    rec.timing("b", "slow", "baseline", Timing(3.0, 2.9, 3.1, 5))
    rec.timing("b", "fast", "optimized", Timing(1.0, 0.95, 1.05, 5))
    ps = {p.experiment: p for p in report_pairs(results.load_records(tmp_path / rec.slug))}
    assert not ps["a"].significant and ps["b"].significant
    md = build_report(tmp_path / rec.slug)
    assert "(not significant)" in md and "3.00×" in md and "CPU run" in md


# -- runner and command line ---------------------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mahia", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--profile", "fast"], "--profile must be"),
        (["run", "--device", "tpu"], "device must be"),
        (["run", "--notebooks", "no_such_notebook"], "matches nothing"),
        (["run", "--timeout", "0"], "--timeout must be positive"),
        (["run", "--param", "no-equals-sign"], "--param expects NAME=VALUE"),
        (["run", "--param", "device=cuda"], "use the runner's own --device"),
        (["run", "--notebooks", "00", "--param", "batchsize=8"], "no selected notebook has such a parameter"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_cuda_without_gpu_exits_2():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    r = _cli("run", "--device", "cuda")
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr


def test_parse_params_types():
    assert runner.parse_params(["batch=8", "lr=1e-3", "name=small", "modes=('a', 'b')", "flag=true"]) == {
        "batch": 8,
        "lr": 1e-3,
        "name": "small",
        "modes": ["a", "b"],
        "flag": True,
    }


def test_select_notebooks_by_number_and_name():
    all_nbs = runner.list_notebooks()
    assert all_nbs and all(runner.NAME_RE.match(p.name) for p in all_nbs)
    assert runner.select_notebooks("0")[0].name.startswith("00_")
    assert runner.select_notebooks("00_environment_and_roofline")[0] == all_nbs[0]


def test_failing_notebook_is_reported_with_its_cell_and_the_run_goes_on(tmp_path, monkeypatch):
    import nbformat

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()

    def make(name, body, declares="extra = None"):
        nb = nbformat.v4.new_notebook()
        p = nbformat.v4.new_code_cell(
            f"device = 'auto'\nprofile = 'quick'\nseed = 0\ninteractive = True\nresults_dir = None\n{declares}"
        )
        p.metadata["tags"] = ["parameters"]
        nb.cells = [p, nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(body)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, nbdir / name)

    make("01_breaks.ipynb", "raise ValueError('planted failure')")
    make("02_fine.ipynb", "assert profile == 'quick' and interactive is False and extra == [1, 2]")
    # A notebook that does not declare a -p name is run without it (not handed a stray variable).
    make("03_other.ipynb", "assert 'extra' not in globals() and other == 3", declares="other = 3")
    assert set(runner.notebook_parameters(nbdir / "03_other.ipynb")) == {
        "device",
        "profile",
        "seed",
        "interactive",
        "results_dir",
        "other",
    }
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbdir)
    monkeypatch.setattr(runner, "list_notebooks", lambda folder=nbdir: sorted(nbdir.glob("*.ipynb")))
    monkeypatch.setattr(runner, "select_notebooks", lambda spec, folder=nbdir: sorted(nbdir.glob("*.ipynb")))
    rc = runner.run(
        device="cpu",
        out=str(tmp_path / "out"),
        results_dir=str(tmp_path / "res"),
        figures_dir=str(tmp_path / "fig"),
        progress=False,
        timeout=300,
        params=["extra=[1, 2]"],
    )
    assert rc == 1
    outcomes = {o["name"]: o for o in json.loads((tmp_path / "out" / "outcomes.json").read_text())}
    assert outcomes["01_breaks"]["status"] == "failed"
    assert outcomes["01_breaks"]["cell"] == 3  # parameters, x = 1, the raise: papermill's injected cell not counted
    assert "planted failure" in outcomes["01_breaks"]["error"]
    assert outcomes["02_fine"]["status"] == "ok"
    assert outcomes["03_other"]["status"] == "ok", outcomes["03_other"]


def test_committed_notebooks_are_clean_and_have_parameters():
    for nb in runner.list_notebooks():
        assert runner.notebook_is_clean(nb), f"{nb.name} is committed with outputs"
        assert runner._has_parameters_cell(nb), f"{nb.name} has no cell tagged 'parameters'"
        meta = json.loads(nb.read_text())["metadata"]
        assert meta["kernelspec"]["name"] == "python3", nb.name


def test_check_int_and_check_float_dtype():
    check_int, check_float_dtype = checks.check_int, checks.check_float_dtype
    assert check_int("f", "n", 3) == 3 and check_int("f", "n", 0, minimum=0) == 0
    for bad in (0, -1, 2.0, True, "3", None):
        with pytest.raises(ValueError, match=r"^f: n must be a positive int, got "):
            check_int("f", "n", bad)
    with pytest.raises(ValueError, match=r"^f: n must be an int >= 0, got -1$"):
        check_int("f", "n", -1, minimum=0)
    assert check_float_dtype("f", torch.bfloat16) is torch.bfloat16
    for bad in (torch.int64, "float32", None):
        with pytest.raises(TypeError, match=r"^f: dtype must be a floating torch.dtype"):
            check_float_dtype("f", bad)
