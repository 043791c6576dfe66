"""Records you can trace, and the committed reference written only on purpose.

* every record (CSV row, ceilings file) carries its profile and the commit of the code that made it;
* summaries are kept per profile: a quick run never changes the full profile's headline;
* runs, benchmarks and notebook sessions write to runs/ (git-ignored), never to data/results or figures;
* only ``python -m mahia reference`` writes those: on a GPU, from a clean tree, in parts that resume.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from mahia import runner
from mahia.__main__ import main as cli
from mahia.measure import files, hardware, results
from mahia.measure.report import readme_tables, reference_parts
from mahia.measure.timing import Timing

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "data" / "results" / "nvidia-h200"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd, *args):
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("MAHIA_COMMIT", "MAHIA_PROFILE", "MAHIA_RUN_ID", "MAHIA_RESULTS_DIR", "MAHIA_FIGURES_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv(files.REFERENCE_ENV, raising=False)
    hardware._CACHE.clear()
    yield
    hardware._CACHE.clear()


def _ceil(slug, profile):
    return hardware.Ceilings(slug, 100.0, 10.0, 1.0, "2026-01-01T00:00:00+00:00", profile=profile, commit="c0")


# -- records carry profile and commit ---------------------------------------------------------------------
def test_records_and_ceilings_carry_profile_and_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")  # what the runner hands every notebook of a run
    monkeypatch.setenv("MAHIA_RUN_ID", "run-a")
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, profile="quick")
    rec.metric("sync_count", "baseline", 7)
    row = pd.read_csv(rec.path).iloc[0]
    assert row["profile"] == "quick" and row["commit"] == "abc123"
    quick = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)
    full = hardware.ceilings("cpu", results_dir=tmp_path, quick=True, profile="full")  # small, named full
    assert (quick.profile, full.profile) == ("quick", "full") and quick.commit == full.commit == "abc123"
    saved = json.loads((tmp_path / quick.device_slug / "ceilings-quick.json").read_text())
    assert saved["run_id"] == "run-a" and saved["profile"] == "quick"
    assert json.loads((tmp_path / quick.device_slug / "ceilings.json").read_text())["profile"] == "full"
    hardware._CACHE.clear()  # a new process of the same run reads the file instead of measuring
    assert hardware.ceilings("cpu", results_dir=tmp_path, quick=True) == quick

    # without MAHIA_COMMIT: git's description of this checkout, asked once per process
    monkeypatch.delenv("MAHIA_COMMIT")
    calls = []
    monkeypatch.setattr(files, "describe_commit", lambda root=files.REPO_ROOT: calls.append(root) or "f00d")
    files.git_commit.cache_clear()
    try:
        monkeypatch.setenv("MAHIA_PROFILE", "full")  # set by the runner
        rec = results.Recorder("98_test", "cpu", results_dir=tmp_path)
        assert (rec.commit, rec.profile) == ("f00d", "full") and files.run_commit() == "f00d" and len(calls) == 1
    finally:
        files.git_commit.cache_clear()
    assert (
        results.Recorder("97_test", "cpu", results_dir=tmp_path, ceilings=_ceil(rec.slug, "quick")).profile == "quick"
    )
    monkeypatch.delenv("MAHIA_PROFILE")
    assert results.Recorder("96_test", "cpu", results_dir=tmp_path).profile == "unknown"
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")
    assert cli(["commit"]) == 0


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


def test_the_committed_h200_reference_is_the_full_profile_of_one_commit_and_its_summary_matches():
    df = results.load_records(H200)
    commits = {p["commit"] for p in reference_parts(H200)}
    assert len(df) > 400 and set(df["profile"]) == {"full"} and len(commits) == 1 and set(df["commit"]) == commits
    summary = json.loads((H200 / "summary.json").read_text())
    assert summary["profile"] == "full" and summary["commits"] == sorted(commits) and summary["stale"] == []
    assert {k: summary[k] for k in ("metrics", "sources", "stale")} == {
        k: v for k, v in results.headline(H200, "full").items() if k in ("metrics", "sources", "stale")
    }
    assert f"full profile, commit {commits.pop()}" in " ".join(readme_tables([H200]).split())


# -- summaries per profile, and stale metrics ----------------------------------------------------------------
def test_a_quick_run_never_changes_the_full_summary(tmp_path, monkeypatch, capsys):
    slug = hardware.device_slug("cpu")
    folder = tmp_path / slug
    full = results.Recorder("01_sync", "cpu", results_dir=tmp_path, ceilings=_ceil(slug, "full"), commit="aaa")
    full.timing("sync_loop", "baseline", "baseline", Timing(2.0, 2, 2, 3))
    full.timing("sync_loop", "optimized", "optimized", Timing(1.0, 1, 1, 3))
    hardware.ceilings("cpu", results_dir=tmp_path, quick=True, profile="full")
    assert full.summarize()["sync_speedup"] == pytest.approx(2.0)
    before = {p: (folder / p).read_bytes() for p in ("summary.json", "ceilings.json")}
    hardware._CACHE.clear()
    ceil = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)  # a later quick run, ceilings and all
    quick = results.Recorder("01_sync", "cpu", results_dir=tmp_path, ceilings=ceil, commit="bbb")
    quick.timing("sync_loop", "baseline", "baseline", Timing(2.0, 2, 2, 3))
    quick.timing("sync_loop", "optimized", "optimized", Timing(0.25, 0.25, 0.25, 3))
    assert quick.summarize()["sync_speedup"] == pytest.approx(8.0)
    assert cli(["report", str(folder)]) == 0
    assert {p: (folder / p).read_bytes() for p in before} == before
    assert json.loads((folder / "summary-quick.json").read_text())["metrics"]["sync_speedup"] == pytest.approx(8.0)
    assert "summary.json, summary-quick.json" in capsys.readouterr().out
    assert "| `sync_speedup` | 2 |" in (folder / "report.md").read_text()  # the folder's report: full


def test_a_metric_from_an_older_commit_is_marked_stale(tmp_path):
    old = results.Recorder("01_sync", "cpu", results_dir=tmp_path, profile="full", commit="aaa")
    old.metric("sync_count", "baseline", 7)
    df = pd.read_csv(old.path)
    df["date"] = "2000-01-01T00:00:00+00:00"
    old.path.write_text(df.to_csv(index=False))
    new = results.Recorder("06_amp", "cpu", results_dir=tmp_path, profile="full", commit="bbb")
    new.timing("amp_train_step", "fp32", "baseline", Timing(4.0, 4, 4, 3))
    new.timing("amp_train_step", "bf16", "optimized", Timing(1.0, 1, 1, 3))
    doc = results.headline(old.folder, "full")
    assert (
        doc["newest_commit"] == "bbb" and doc["commits"] == ["aaa", "bbb"] and doc["stale"] == ["sync_count_baseline"]
    )
    assert doc["sources"]["sync_count_baseline"] == ["aaa"] and doc["sources"]["amp_speedup"] == ["bbb"]
    results.write_summary(old.folder, "full")
    table = " ".join(readme_tables([old.folder]).split())
    assert "| `sync_count_baseline` | | 7 † |" in table and "older commit (aaa)" in table
    assert "| `amp_speedup` | >= 3.0 | 4 (" in table


# -- where runs write ---------------------------------------------------------------------------------------
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAHIA_")} | {
        "PYTHONPATH": str(repo),
        "HOME": str(tmp_path),
    }
    out = subprocess.run([sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    where, csv, figs = (Path(x) for x in out.stdout.split("\n")[-4:-1])
    assert where.is_relative_to(repo)  # the copy's package ran, so its paths are the copy's
    assert csv.is_relative_to(repo / "runs" / "results") and csv.exists()
    assert figs.is_relative_to(repo / "runs" / "figures") and any(figs.glob("99_trace_plot.*"))
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_only_the_reference_command_writes_the_reference_on_a_gpu_from_a_clean_tree(tmp_path, monkeypatch, capsys):
    ref = tmp_path / "data" / "results"
    monkeypatch.setattr(files, "reference_results_dir", lambda: ref)
    monkeypatch.setattr(files, "reference_figures_dir", lambda: tmp_path / "figures")
    rec = results.Recorder("99_test", "cpu", results_dir=ref, profile="full")
    with pytest.raises(RuntimeError, match="committed reference"):
        rec.metric("x", "y", 1.0)
    with pytest.raises(RuntimeError, match="committed reference"):
        hardware.ceilings("cpu", results_dir=ref, quick=True)
    for kw in ({"results_dir": str(ref)}, {"figures_dir": str(tmp_path / "figures" / "x")}):
        with pytest.raises(runner.UsageError, match="committed reference"):
            runner.run(device="cpu", notebooks="00", progress=False, **kw)
    from mahia.bench.__main__ import main as bench

    assert bench(["kernels", "--quick", "--device", "cpu", "--results-dir", str(ref)]) == 2
    assert "committed reference" in capsys.readouterr().err and not ref.exists()
    monkeypatch.setattr(files, "git_commit", lambda: "abc123")  # the reference command: not on a CPU
    with pytest.raises(runner.UsageError, match="this run is on cpu"):
        runner.reference(device="cpu", notebooks="00")
    monkeypatch.setattr(files, "git_commit", lambda: "abc123-dirty")
    with pytest.raises(runner.UsageError, match="uncommitted changes"):
        runner.reference(device="cpu", notebooks="00")
    assert runner.reference_commit(allow_dirty=True) == "abc123-dirty"
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")  # whoever starts the run says which code it is
    assert runner.reference_commit() == "abc123"
    monkeypatch.setattr(files, "git_commit", lambda: "unknown")  # a copied tree without git
    monkeypatch.delenv("MAHIA_COMMIT")
    with pytest.raises(runner.UsageError, match="MAHIA_COMMIT"):
        runner.reference(device="cpu")
    assert not ref.exists()
    monkeypatch.setenv(files.REFERENCE_ENV, "1")  # what `python -m mahia reference` gives its processes
    rec.metric("x", "y", 1.0)
    assert rec.path.exists()


# -- the reference command ------------------------------------------------------------------------------------
def test_reference_runs_in_parts_that_resume(tmp_path, monkeypatch):
    ref = tmp_path / "data" / "results"
    monkeypatch.setattr(files, "reference_results_dir", lambda: ref)
    monkeypatch.setattr(files, "reference_figures_dir", lambda: tmp_path / "figures")
    monkeypatch.setattr(files, "git_commit", lambda: "abc123")
    monkeypatch.setattr(runner, "_check_gpu", lambda dev: None)  # the CPU stands in for the GPU here
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    params = nbformat.v4.new_code_cell(
        "device = 'auto'\nprofile = 'quick'\nseed = 0\ninteractive = True\nresults_dir = None\nbatch = 1"
    )
    params.metadata["tags"] = ["parameters"]
    record = (
        "assert profile == 'full' and batch == 2\nfrom mahia.measure.results import Recorder\n"
        "Recorder('01_rec', device, results_dir=results_dir).metric('sync_count', 'baseline', 7)"
    )
    for name, cells in (
        ("01_rec", [params, nbformat.v4.new_code_cell(record)]),
        ("02_broken", [nbformat.v4.new_code_cell("x = 1")]),
    ):
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, nbdir / f"{name}.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbdir)
    folder = ref / hardware.device_slug("cpu")

    def go(**kw):
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        rc = runner.reference(device="cpu", progress=False, timeout=300, out=str(out), params=["batch=2"], **kw)
        return rc, {o["name"]: o for o in json.loads((out / "outcomes.json").read_text())}

    with pytest.raises(runner.UsageError, match="no suite 'nope'"):
        runner.reference(device="cpu", bench="nope")
    rc, outcomes = go(notebooks="all")
    assert rc == 1 and outcomes["01_rec"]["status"] == "ok" and outcomes["02_broken"]["status"] == "failed"
    row = pd.read_csv(folder / "01_rec.csv").iloc[0]
    assert (row["profile"], row["commit"]) == ("full", "abc123")
    marker = json.loads((folder / "parts" / "01_rec.json").read_text())
    assert marker["commit"] == "abc123" and marker["params"] == {"batch": 2} and marker["seconds"] > 0
    assert runner.recorded_parts(folder, "abc123").keys() == {"01_rec"} and runner.recorded_parts(folder, "d") == {}
    # the executed notebook that finished is committed beside the records; the failed one is not
    assert [p.name for p in (folder / "notebooks").iterdir()] == ["01_rec.ipynb"]
    assert "| 01_rec | ok |" in (tmp_path / "out0" / "report.md").read_text()

    rc, outcomes = go(notebooks="all")  # resumes: only the part not recorded for this commit runs
    assert outcomes["01_rec"]["status"] == "skipped" and outcomes["02_broken"]["status"] == "failed"
    assert len(pd.read_csv(folder / "01_rec.csv")) == 1
    rc, outcomes = go(notebooks="01", force=True)
    assert rc == 0 and outcomes["01_rec"]["status"] == "ok" and len(pd.read_csv(folder / "01_rec.csv")) == 2
