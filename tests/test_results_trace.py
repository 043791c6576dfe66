"""Records you can trace, and the committed reference written only on purpose.

* every record (CSV row, ceilings file) carries its profile and the commit of the code that made it;
* summaries are kept per profile: a quick run never changes the full profile's headline;
* a metric made by another commit than the newest record is marked stale;
* runs, benchmarks and notebook sessions write to runs/ (git-ignored), never to data/results or figures;
* only ``python -m mahia reference`` writes those: on a GPU, from a clean tree, in parts that resume;
* every runner run gets a folder of its own.
"""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from mahia import runner
from mahia.__main__ import main as cli
from mahia.measure import files, hardware, results
from mahia.measure.report import build_report, readme_tables, reference_parts
from mahia.measure.timing import Timing

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "data" / "results" / "nvidia-h200"
HAS_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAS_GIT, reason="git is not installed")


def _git(cwd, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def _clean_env(monkeypatch):
    for k in (
        "MAHIA_COMMIT",
        "MAHIA_PROFILE",
        "MAHIA_RUN_ID",
        "MAHIA_RESULTS_DIR",
        "MAHIA_FIGURES_DIR",
        files.REFERENCE_ENV,
    ):
        monkeypatch.delenv(k, raising=False)


def _ceil(slug, profile):
    return hardware.Ceilings(
        slug,
        copy_gbps=100.0,
        matmul_bf16_tflops=10.0,
        matmul_fp32_tflops=1.0,
        measured_at="2026-01-01T00:00:00+00:00",
        profile=profile,
        commit="c0",
    )


def _set_dates(path: Path, date: str):
    df = pd.read_csv(path)
    df["date"] = date
    path.write_text(df.to_csv(index=False))


# -- records carry profile and commit ---------------------------------------------------------------------
def test_records_carry_profile_and_commit(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")  # what the runner hands every notebook of a run
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, profile="quick")
    rec.metric("sync_count", "baseline", 7)
    row = pd.read_csv(rec.path).iloc[0]
    assert row["profile"] == "quick" and row["commit"] == "abc123"

    # without MAHIA_COMMIT: git's description of this checkout (or "unknown"), asked once per process
    monkeypatch.delenv("MAHIA_COMMIT")
    monkeypatch.setenv("MAHIA_PROFILE", "full")  # set by the runner
    rec = results.Recorder("98_test", "cpu", results_dir=tmp_path)
    rec.metric("x", "y", 1.0)
    row = pd.read_csv(rec.path, dtype={"commit": str}).iloc[0]  # a sha of digits only stays text
    assert row["commit"] == files.git_commit() and row["profile"] == "full"
    # setup() measures the ceilings for its profile; the recorder takes the profile from them
    rec = results.Recorder("97_test", "cpu", results_dir=tmp_path, ceilings=_ceil(rec.slug, "quick"))
    assert rec.profile == "quick"
    monkeypatch.delenv("MAHIA_PROFILE")
    assert results.Recorder("96_test", "cpu", results_dir=tmp_path).profile == "unknown"


def test_commit_is_asked_of_git_once_per_process(monkeypatch):
    monkeypatch.delenv("MAHIA_COMMIT", raising=False)
    calls = []
    monkeypatch.setattr(files, "describe_commit", lambda root=files.REPO_ROOT: calls.append(root) or "f00d")
    files.git_commit.cache_clear()
    try:
        assert files.run_commit() == "f00d" and files.run_commit() == "f00d" and files.git_commit() == "f00d"
        assert len(calls) == 1
        monkeypatch.setenv("MAHIA_COMMIT", "beef")  # the runner's commit wins
        assert files.run_commit() == "beef"
    finally:
        files.git_commit.cache_clear()


@needs_git
def test_describe_commit_says_dirty_only_for_tracked_changes_under_mahia_or_notebooks(tmp_path):
    repo = tmp_path / "repo"
    (repo / "mahia").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    (repo / "mahia" / "a.py").write_text("x = 1\n")
    (repo / "notebooks" / "00_a.ipynb").write_text("{}\n")
    (repo / "README.md").write_text("hello\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    sha = _git(repo, "rev-parse", "--short=12", "HEAD").strip()
    assert files.describe_commit(repo) == sha
    (repo / "mahia" / "new.py").write_text("")  # untracked: not part of the commit's code
    (repo / "README.md").write_text("changed\n")  # tracked, but outside mahia/ and notebooks/
    assert files.describe_commit(repo) == sha
    (repo / "notebooks" / "00_a.ipynb").write_text('{"cells": []}\n')
    assert files.describe_commit(repo) == f"{sha}-dirty"
    assert files.describe_commit(tmp_path / "not_a_repo") == "unknown"


def test_ceilings_carry_profile_and_commit_and_a_file_per_profile(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")
    monkeypatch.setenv("MAHIA_RUN_ID", "run-trace")
    hardware._CACHE.clear()
    quick = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)
    full = hardware.ceilings("cpu", results_dir=tmp_path, quick=True, profile="full")  # small, named full
    assert (quick.profile, full.profile) == ("quick", "full") and quick.commit == full.commit == "abc123"
    folder = tmp_path / quick.device_slug
    assert json.loads((folder / "ceilings.json").read_text())["profile"] == "full"
    assert json.loads((folder / "ceilings-quick.json").read_text())["profile"] == "quick"
    hardware._CACHE.clear()


# -- old records ------------------------------------------------------------------------------------------
def _part_commits(folder: Path) -> set[str]:
    return {p["commit"] for p in reference_parts(folder)}


def test_committed_h200_records_are_the_full_profile_of_one_commit():
    # The H200 reference of 2026-11-29 (b0bf60d) replaced the run of 2026-11-22, whose records predate the profile
    # and commit columns (that loading rule: test_old_records_keep_their_rows_when_new_ones_are_appended)
    df = results.load_records(H200)
    commits = _part_commits(H200)
    assert len(df) > 400 and set(df["profile"]) == {"full"}
    assert len(commits) == 1 and set(df["commit"]) == commits


def test_old_records_keep_their_rows_when_new_ones_are_appended(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    slug = hardware.device_slug("cpu")
    folder = tmp_path / slug
    folder.mkdir()
    old_cols = [c for c in results.COLUMNS if c not in ("profile", "commit")]
    old = pd.DataFrame(
        [
            {
                "notebook": "99_test",
                "experiment": "sync_count",
                "variant": "baseline",
                "role": "metric",
                "value": 5.0,
                "device_slug": "nvidia-h200",
                "notes": "",
                "date": "2026-01-01T00:00:00+00:00",
            },
            {
                "notebook": "99_test",
                "experiment": "sync_count",
                "variant": "optimized",
                "role": "metric",
                "value": 1.0,
                "device_slug": "nvidia-h200",
                "notes": "a quick profile smoke run",
                "date": "2026-01-01T00:00:00+00:00",
            },
            {
                "notebook": "99_test",
                "experiment": "sync_loop",
                "variant": "x",
                "role": "metric",
                "value": 1.0,
                "device_slug": slug,
                "notes": "",
                "date": "2026-01-01T00:00:00+00:00",
            },
        ],
        columns=old_cols,
    )
    (folder / "99_test.csv").write_text(old.to_csv(index=False))
    df = results.load_records(folder)
    assert set(df["profile"]) == set(df["commit"]) == {"unknown"}
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, profile="quick", commit="abc123")
    rec.metric("sync_count", "baseline", 3)
    on_disk = pd.read_csv(folder / "99_test.csv")
    pd.testing.assert_frame_equal(
        on_disk.iloc[:3][old_cols], pd.read_csv(io.StringIO(old.to_csv(index=False))), check_dtype=False
    )
    assert list(results.load_records(folder)["profile"]) == ["unknown", "unknown", "unknown", "quick"]


def test_committed_summary_is_the_full_profile_and_matches_its_records():
    summary = json.loads((H200 / "summary.json").read_text())
    (commit,) = _part_commits(H200)
    assert summary["profile"] == "full" and summary["commits"] == [commit] and summary["stale"] == []
    assert summary["metrics"] == results.summarize(H200, "full")
    assert set(summary["sources"]) == {k for k, v in summary["metrics"].items() if v is not None}
    table = " ".join(readme_tables([H200]).split())
    assert f"full profile, commit {commit}" in table and "NVIDIA H200" in table


# -- summaries per profile ----------------------------------------------------------------------------------
def test_a_quick_run_never_changes_the_full_summary(tmp_path, monkeypatch, capsys):
    _clean_env(monkeypatch)
    slug = hardware.device_slug("cpu")
    folder = tmp_path / slug
    full = results.Recorder("01_sync", "cpu", results_dir=tmp_path, ceilings=_ceil(slug, "full"), commit="aaa")
    full.timing("sync_loop", "baseline", "baseline", Timing(2.0, 2, 2, 3))
    full.timing("sync_loop", "optimized", "optimized", Timing(1.0, 1, 1, 3))
    hardware._CACHE.clear()
    monkeypatch.setenv("MAHIA_RUN_ID", "full-run")
    hardware.ceilings("cpu", results_dir=tmp_path, quick=True, profile="full")
    assert full.summarize()["sync_speedup"] == pytest.approx(2.0)
    before = {p: (folder / p).read_bytes() for p in ("summary.json", "ceilings.json")}

    # a later quick run of the same experiment, ceilings and all, then every summary rebuilt
    monkeypatch.setenv("MAHIA_RUN_ID", "quick-run")
    ceil = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)
    quick = results.Recorder("01_sync", "cpu", results_dir=tmp_path, ceilings=ceil, commit="bbb")
    quick.timing("sync_loop", "baseline", "baseline", Timing(2.0, 2, 2, 3))
    quick.timing("sync_loop", "optimized", "optimized", Timing(0.25, 0.25, 0.25, 3))
    assert quick.summarize()["sync_speedup"] == pytest.approx(8.0)
    assert cli(["report", str(folder)]) == 0
    hardware._CACHE.clear()
    assert {p: (folder / p).read_bytes() for p in before} == before
    q = json.loads((folder / "summary-quick.json").read_text())
    assert q["profile"] == "quick" and q["metrics"]["sync_speedup"] == pytest.approx(8.0)
    assert "summary.json, summary-quick.json" in capsys.readouterr().out
    assert "| `sync_speedup` | 2 |" in (folder / "report.md").read_text()  # the folder's report: full


def test_prune_keeps_the_commit_each_part_names_and_refuses_a_folder_without_parts(tmp_path, monkeypatch, capsys):
    _clean_env(monkeypatch)
    folder = tmp_path / hardware.device_slug("cpu")
    for commit, ms in (("1707490", 4.0), ("aaa", 3.0), ("bbb", 2.0)):  # a numeric-looking sha, then two more
        rec = results.Recorder("01_sync", "cpu", results_dir=tmp_path, profile="full", commit=commit)
        rec.timing("sync_loop", "baseline", "baseline", Timing(8.0, 8, 8, 3))
        rec.timing("sync_loop", "optimized", "optimized", Timing(ms, ms, ms, 3))
    quick = results.Recorder("01_sync", "cpu", results_dir=tmp_path, profile="quick", commit="aaa")
    quick.timing("sync_loop", "optimized", "optimized", Timing(1.0, 1, 1, 3))
    csv_before = (folder / "01_sync.csv").read_bytes()

    # no part file: nothing to keep, so nothing is dropped and the command says why
    assert cli(["report", str(folder), "--prune"]) == 2
    assert "no parts/<part>.json" in capsys.readouterr().err
    assert (folder / "01_sync.csv").read_bytes() == csv_before
    # a part file naming a commit with no full-profile row: refused, nothing dropped
    (folder / "parts").mkdir()
    (folder / "parts" / "01_sync.json").write_text(json.dumps({"part": "01_sync", "commit": "ccc"}))
    assert cli(["report", str(folder), "--prune"]) == 2
    assert (folder / "01_sync.csv").read_bytes() == csv_before

    # the part names the oldest commit, a sha pandas would read as a number: its rows are the ones kept
    (folder / "parts" / "01_sync.json").write_text(json.dumps({"part": "01_sync", "commit": "1707490"}))
    assert cli(["report", str(folder), "--prune"]) == 0
    kept = pd.read_csv(folder / "01_sync.csv", dtype={"commit": str})
    assert set(kept["commit"]) == {"1707490"} and set(kept["profile"]) == {"full"} and len(kept) == 2
    assert "5 record(s) of other commits dropped" in capsys.readouterr().out
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["metrics"]["sync_speedup"] == pytest.approx(2.0) and summary["stale"] == []
    assert results.keep_part_commits(folder) == {"01_sync.csv": 0}  # a second prune drops nothing
    assert cli(["report", "--prune"]) == 2  # prune needs a folder named


def test_prune_derives_the_kernel_keys_again_from_the_records_it_keeps(tmp_path, monkeypatch, capsys):
    from mahia.bench import kernels

    _clean_env(monkeypatch)
    folder = tmp_path / hardware.device_slug("cpu")
    # the host rows of two sweeps: the older commit's kernel was 2x slower than F.rms_norm, the newer's 1.25x faster
    for commit, ms in (("old", 2.0), ("new", 0.8)):
        rec = results.Recorder("bench_kernels", "cpu", results_dir=tmp_path, profile="full", commit=commit)
        for variant, t in (("F.rms_norm", 1.0), ("mahia_triton", ms)):
            rec.timing("rmsnorm_host_fwd", variant, "baseline", Timing(t, t, t, 3), shape="4x64", dtype="bfloat16")
    kernels.write_summary(folder, "full")  # what the sweep left: keys over both commits, the newest row wins
    (folder / "bench_kernels_summary-quick.json").write_text("{}")  # a quick sweep's keys: prune drops its rows
    (folder / "parts").mkdir()
    (folder / "parts" / "bench_kernels.json").write_text(json.dumps({"part": "bench_kernels", "commit": "old"}))

    assert cli(["report", str(folder), "--prune"]) == 0
    assert "bench_kernels_summary.json: written again" in capsys.readouterr().out
    doc = json.loads((folder / "bench_kernels_summary.json").read_text())
    assert doc["commits"] == ["old"] and doc["metrics"]["rmsnorm_host_fwd_vs_native"] == pytest.approx(0.5)
    assert not (folder / "bench_kernels_summary-quick.json").exists()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["metrics"]["rmsnorm_host_fwd_vs_native"] == pytest.approx(0.5)


def test_a_metric_from_an_older_commit_is_marked_stale(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    old = results.Recorder("01_sync", "cpu", results_dir=tmp_path, profile="full", commit="aaa")
    old.metric("sync_count", "baseline", 7)
    old.metric("sync_count", "optimized", 0)
    _set_dates(old.path, "2000-01-01T00:00:00+00:00")
    new = results.Recorder("06_amp", "cpu", results_dir=tmp_path, profile="full", commit="bbb")
    new.timing("amp_train_step", "fp32", "baseline", Timing(4.0, 4, 4, 3))
    new.timing("amp_train_step", "bf16", "optimized", Timing(1.0, 1, 1, 3))
    folder = old.folder
    doc = results.headline(folder, "full")
    assert doc["newest_commit"] == "bbb" and doc["commits"] == ["aaa", "bbb"]
    assert doc["sources"]["sync_count_baseline"] == ["aaa"] and doc["sources"]["amp_speedup"] == ["bbb"]
    assert sorted(doc["stale"]) == ["sync_count_baseline", "sync_count_optimized"]
    md = build_report(folder)
    assert "| aaa (stale) |" in md and "| bbb |" in md
    assert "| bbb (not HEAD) |" in build_report(folder, head="ccc")
    results.write_summary(folder, "full")
    table = " ".join(readme_tables([folder]).split())
    assert "commit aaa, bbb" in table and "| `sync_count_baseline` | | 7 † |" in table
    assert "| `amp_speedup` | >= 3.0 | 4 (" in table and "older commit (aaa)" in table


# -- where runs write ---------------------------------------------------------------------------------------
@needs_git
def test_default_dirs_are_under_runs_and_git_ignored(monkeypatch):
    _clean_env(monkeypatch)
    assert files.in_checkout()
    res, fig = files.default_results_dir(), files.default_figures_dir()
    assert res == ROOT / "runs" / "results" and fig == ROOT / "runs" / "figures"

    def ignored(path: Path) -> bool:
        rel = path.relative_to(ROOT)
        r = subprocess.run(["git", "check-ignore", "-q", str(rel)], cwd=ROOT, timeout=30, check=False)
        return r.returncode == 0

    assert ignored(res / "some-device" / "00_x.csv") and ignored(fig / "some-device" / "00_x.png")
    assert not ignored(files.reference_results_dir() / "some-device" / "00_x.csv")  # the reference is tracked


@needs_git
def test_a_cpu_session_leaves_nothing_to_commit(tmp_path):
    """setup() with its defaults, one record, a summary and a figure in a checkout: git sees nothing new."""
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "mahia", repo / "mahia", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "README.md").write_text("notebooks\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "checkout")
    script = (
        "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
        "import mahia; from mahia.lessons.notebook import setup\n"
        "ctx = setup('99_trace', device='cpu', profile='quick', verbose=False)\n"
        "ctx.recorder.metric('sync_count', 'baseline', 7); ctx.recorder.summarize()\n"
        "fig, ax = plt.subplots(); ax.plot([1, 2]); ctx.save(fig, 'plot')\n"
        "print(mahia.__file__); print(ctx.recorder.path); print(ctx.figures)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAHIA_")}
    env.update(PYTHONPATH=str(repo), HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert out.returncode == 0, out.stderr
    where, csv, figs = (Path(x) for x in out.stdout.split("\n")[-4:-1])
    assert where.is_relative_to(repo)  # the copy's package ran, so its paths are the copy's
    assert csv.is_relative_to(repo / "runs" / "results") and csv.exists()
    assert figs.is_relative_to(repo / "runs" / "figures") and any(figs.glob("99_trace_plot.*"))
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_nothing_but_the_reference_command_writes_the_reference(tmp_path, monkeypatch, capsys):
    _clean_env(monkeypatch)
    ref = tmp_path / "data" / "results"
    monkeypatch.setattr(files, "reference_results_dir", lambda: ref)
    monkeypatch.setattr(files, "reference_figures_dir", lambda: tmp_path / "figures")
    rec = results.Recorder("99_test", "cpu", results_dir=ref, profile="full")
    with pytest.raises(RuntimeError, match="committed reference"):
        rec.metric("x", "y", 1.0)
    hardware._CACHE.clear()
    with pytest.raises(RuntimeError, match="committed reference"):
        hardware.ceilings("cpu", results_dir=ref, quick=True)
    assert not ref.exists()
    for kw in ({"results_dir": str(ref)}, {"figures_dir": str(tmp_path / "figures" / "x")}):
        with pytest.raises(runner.UsageError, match="committed reference"):
            runner.run(device="cpu", notebooks="00", progress=False, **kw)
    from mahia.bench.__main__ import main as bench

    assert bench(["kernels", "--quick", "--device", "cpu", "--results-dir", str(ref)]) == 2
    assert "committed reference" in capsys.readouterr().err
    assert not ref.exists()
    monkeypatch.setenv(files.REFERENCE_ENV, "1")  # what `python -m mahia reference` gives its processes
    rec.metric("x", "y", 1.0)
    assert rec.path.exists()


# -- the reference command ------------------------------------------------------------------------------------
def test_reference_refuses_on_a_cpu():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    env = dict(os.environ, MAHIA_COMMIT="abc123")  # where git is missing (an installed copy)
    r = subprocess.run(
        [sys.executable, "-m", "mahia", "reference", "--allow-dirty", "-n", "00"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]  # (a line before it says git disagrees with MAHIA_COMMIT)
    assert last.startswith("error: ") and "never the reference" in last


def test_reference_refuses_the_cpu_even_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "git_commit", lambda: "abc123")
    monkeypatch.setattr(files, "reference_results_dir", lambda: tmp_path / "data" / "results")
    with pytest.raises(runner.UsageError, match="this run is on cpu .a CPU run is never the reference"):
        runner.reference(device="cpu", notebooks="00")
    assert not (tmp_path / "data").exists()


def test_reference_refuses_a_dirty_tree_and_an_unknown_commit(monkeypatch):
    monkeypatch.delenv("MAHIA_COMMIT", raising=False)
    monkeypatch.setattr(files, "git_commit", lambda: "abc123-dirty")
    with pytest.raises(runner.UsageError, match="uncommitted changes"):
        runner.reference(device="cpu", notebooks="00")
    assert runner.reference_commit(allow_dirty=True) == "abc123-dirty"
    # whoever starts the run says which code it is: a copied tree's .git can be another commit's
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")
    assert runner.reference_commit() == "abc123"
    monkeypatch.setattr(files, "git_commit", lambda: "unknown")  # a copied tree without git
    monkeypatch.delenv("MAHIA_COMMIT")
    with pytest.raises(runner.UsageError, match="MAHIA_COMMIT"):
        runner.reference(device="cpu")
    monkeypatch.setenv("MAHIA_COMMIT", "abc123-dirty")
    with pytest.raises(runner.UsageError, match="uncommitted changes"):
        runner.reference_commit()
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")
    assert runner.reference_commit() == "abc123"


def test_reference_runs_in_parts_that_resume(tmp_path, monkeypatch):
    import nbformat

    _clean_env(monkeypatch)
    ref, figs = tmp_path / "data" / "results", tmp_path / "figures"
    monkeypatch.setattr(files, "reference_results_dir", lambda: ref)
    monkeypatch.setattr(files, "reference_figures_dir", lambda: figs)
    monkeypatch.setattr(files, "git_commit", lambda: "abc123")
    monkeypatch.setattr(runner, "_check_gpu", lambda dev: None)  # the CPU stands in for the GPU here
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell(
        "device = 'auto'\nprofile = 'quick'\nseed = 0\ninteractive = True\nresults_dir = None\nbatch = 1"
    )
    p.metadata["tags"] = ["parameters"]
    nb.cells = [
        p,
        nbformat.v4.new_code_cell(
            "assert profile == 'full' and batch == 2\n"
            "from mahia.measure.results import Recorder\n"
            "Recorder('01_rec', device, results_dir=results_dir).metric('sync_count', 'baseline', 7)"
        ),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbdir / "01_rec.ipynb")
    broken = nbformat.v4.new_notebook()
    broken.cells = [nbformat.v4.new_code_cell("x = 1")]  # no parameters cell: fails at once
    nbformat.write(broken, nbdir / "02_broken.ipynb")
    half = nbformat.v4.new_notebook()  # records a row, then fails: its row must not stay in the reference
    half.cells = [
        p,
        nbformat.v4.new_code_cell(
            "from mahia.measure.results import Recorder\n"
            "Recorder('03_half', device, results_dir=results_dir).metric('sync_count', 'baseline', 5)"
        ),
        nbformat.v4.new_code_cell("raise RuntimeError('stopped halfway')"),
    ]
    half.metadata["kernelspec"] = nb.metadata["kernelspec"]
    nbformat.write(half, nbdir / "03_half.ipynb")
    nbs = sorted(nbdir.glob("*.ipynb"))
    monkeypatch.setattr(
        runner,
        "select_notebooks",
        lambda spec, folder=nbdir: nbs if spec == "all" else [n for n in nbs if n.stem[:2] == spec],
    )
    slug = hardware.device_slug("cpu")
    csv, parts = ref / slug / "01_rec.csv", ref / slug / "parts"

    def go(**kw):
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        rc = runner.reference(device="cpu", progress=False, timeout=300, out=str(out), params=["batch=2"], **kw)
        go.out = out
        return rc, {o["name"]: o for o in json.loads((out / "outcomes.json").read_text())}

    with pytest.raises(runner.UsageError, match="no such suite"):
        runner.reference(device="cpu", bench="nope")
    rc, outcomes = go(notebooks="all")
    assert rc == 1 and outcomes["01_rec"]["status"] == "ok" and outcomes["02_broken"]["status"] == "failed"
    row = pd.read_csv(csv).iloc[0]
    assert (row["profile"], row["commit"]) == ("full", "abc123")
    marker = json.loads((parts / "01_rec.json").read_text())
    assert marker["commit"] == "abc123" and marker["params"] == {"batch": 2}
    assert not (parts / "02_broken.json").exists()  # a part that failed is run again next time
    # what the unfinished part recorded left the reference for the run's folder
    assert outcomes["03_half"]["status"] == "failed" and not (parts / "03_half.json").exists()
    assert pd.read_csv(ref / slug / "03_half.csv").empty
    moved = pd.read_csv(go.out / "03_half.unfinished.csv", dtype={"commit": str})
    assert len(moved) == 1 and moved["value"].iloc[0] == 5 and moved["commit"].iloc[0] == "abc123"
    # The executed notebook that finished is committed beside the records (trimmed); the failed one is not.
    assert sorted(p.name for p in (ref / slug / "notebooks").iterdir()) == ["01_rec.ipynb"]
    executed = json.loads((ref / slug / "notebooks" / "01_rec.ipynb").read_text())
    assert all(c.get("execution_count") for c in executed["cells"] if c["cell_type"] == "code")
    assert runner.recorded_parts(ref / slug, "abc123").keys() == {"01_rec"}
    assert runner.recorded_parts(ref / slug, "def456") == {}

    rc, outcomes = go(notebooks="all")  # resumes: only the part not recorded for this commit runs
    assert outcomes["01_rec"]["status"] == "skipped" and outcomes["02_broken"]["status"] == "failed"
    assert len(pd.read_csv(csv)) == 1 and pd.read_csv(ref / slug / "03_half.csv").empty
    rc, outcomes = go(notebooks="01", force=True)
    assert rc == 0 and outcomes["01_rec"]["status"] == "ok" and len(pd.read_csv(csv)) == 2


# -- each run its own folder ------------------------------------------------------------------------------------
def test_each_run_gets_its_own_folder(tmp_path, monkeypatch):
    import nbformat

    _clean_env(monkeypatch)
    a, b = runner.new_run_dir("same", tmp_path), runner.new_run_dir("same", tmp_path)
    assert a != b and a.is_dir() and b.is_dir()
    monkeypatch.setattr(files, "runs_dir", lambda: tmp_path / "runs")
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]  # no parameters cell: reported at once, no kernel
    nbformat.write(nb, nbdir / "01_quick.ipynb")
    monkeypatch.setattr(runner, "select_notebooks", lambda spec, folder=nbdir: [nbdir / "01_quick.ipynb"])
    for _ in range(2):
        assert runner.run(device="cpu", profile="quick", progress=False) == 1
    folders = sorted(p for p in (tmp_path / "runs").iterdir() if p.name not in ("results", "figures"))
    assert len(folders) == 2 and all((f / "outcomes.json").exists() for f in folders)
    assert all(f.name.endswith(f"{hardware.device_slug('cpu')}-quick") or f.name.endswith("-quick-2") for f in folders)


def test_commit_command_prints_the_commit(monkeypatch, capsys):
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")
    assert cli(["commit"]) == 0 and capsys.readouterr().out.strip() == "abc123"


def test_a_short_sha_is_the_same_commit_as_its_longer_form_and_dirty_is_not_clean():
    assert files.same_commit("0dea75a", "0dea75a99445") and files.same_commit("0dea75a99445", "0dea75a")
    assert files.same_commit("abc1234-dirty", "abc1234567-dirty")
    assert not files.same_commit("0dea75a", "0dea75b99445")
    assert not files.same_commit("0dea75a", "0dea75a99445-dirty")  # a dirty tree is not the commit
    assert not files.same_commit("0dea", "0dea75a99445")  # too short to name a commit
    assert not files.same_commit("unknown", "unknown0")
