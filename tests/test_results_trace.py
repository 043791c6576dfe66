"""Records stamped with profile and commit, summaries per profile, runs that write only to runs/, and the
committed reference written only by ``python -m mahia reference``: on a GPU, from a clean tree, in parts that resume."""

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
from mahia.measure import files, hardware, results, summary
from mahia.measure.report import reference_parts
from mahia.measure.timing import Timing

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "data" / "results" / "nvidia-h200"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd, *args):
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout


def _commit_all(repo):
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "one"]):
        _git(repo, *args)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("COMMIT", "PROFILE", "RUN_ID", "RESULTS_DIR", "FIGURES_DIR", "REFERENCE"):
        monkeypatch.delenv(f"MAHIA_{k}", raising=False)
    hardware._CACHE.clear()
    yield
    hardware._CACHE.clear()


def _ceil(slug, profile):
    return hardware.Ceilings(slug, 100.0, 10.0, 1.0, "2026-01-01T00:00:00+00:00", profile=profile, commit="c0")


def test_records_and_ceilings_carry_profile_and_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("MAHIA_COMMIT", "abc123")  # what the runner hands every notebook of a run
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, profile="quick")
    rec.metric("sync_count", "baseline", 7)
    row = pd.read_csv(rec.path).iloc[0]
    assert row["profile"] == "quick" and row["commit"] == "abc123"
    quick = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)
    full = hardware.ceilings("cpu", results_dir=tmp_path, quick=True, profile="full")  # small, named full
    assert (quick.profile, full.profile) == ("quick", "full") and quick.commit == full.commit == "abc123"
    assert json.loads((tmp_path / quick.device_slug / "ceilings.json").read_text())["profile"] == "full"
    monkeypatch.delenv("MAHIA_COMMIT")  # without it: git's description of this checkout
    monkeypatch.setattr(files, "git_commit", lambda: "f00d")
    monkeypatch.setenv("MAHIA_PROFILE", "full")  # set by the runner
    rec = results.Recorder("98_test", "cpu", results_dir=tmp_path)
    assert (rec.commit, rec.profile) == ("f00d", "full")


@needs_git
def test_describe_commit_says_dirty_only_for_tracked_changes_under_mahia_or_notebooks(tmp_path):
    repo = tmp_path / "repo"
    for name in ("mahia/a.py", "notebooks/00_a.ipynb", "README.md"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("{}\n")
    _commit_all(repo)
    sha = _git(repo, "rev-parse", "--short=12", "HEAD").strip()
    assert files.describe_commit(repo) == sha
    (repo / "mahia" / "new.py").write_text("")  # untracked: not part of the commit's code
    (repo / "README.md").write_text("changed\n")  # tracked, but outside mahia/ and notebooks/
    assert files.describe_commit(repo) == sha
    (repo / "notebooks" / "00_a.ipynb").write_text('{"cells": []}\n')
    assert files.describe_commit(repo) == f"{sha}-dirty"
    assert files.describe_commit(tmp_path / "not_a_repo") == "unknown"


def test_the_committed_h200_reference_is_the_full_profile_of_one_commit_and_its_summary_matches():
    df = summary.load_records(H200)
    commits = {p["commit"] for p in reference_parts(H200)}
    assert len(df) > 400 and set(df["profile"]) == {"full"} and len(commits) == 1 and set(df["commit"]) == commits
    doc = json.loads((H200 / "summary.json").read_text())
    assert doc["profile"] == "full" and doc["commits"] == sorted(commits) and doc["stale"] == []


def test_a_quick_run_never_changes_the_full_summary(tmp_path):
    slug = hardware.device_slug("cpu")
    folder = tmp_path / slug

    def sync(ceilings, commit, ms):
        rec = results.Recorder("01_sync", "cpu", results_dir=tmp_path, ceilings=ceilings, commit=commit)
        rec.timing("sync_loop", "baseline", "baseline", Timing(2.0, 2, 2, 3))
        rec.timing("sync_loop", "optimized", "optimized", Timing(ms, ms, ms, 3))
        return rec

    full = sync(_ceil(slug, "full"), "aaa", 1.0)
    hardware.ceilings("cpu", results_dir=tmp_path, quick=True, profile="full")
    assert full.summarize()["sync_speedup"] == pytest.approx(2.0)
    before = {p: (folder / p).read_bytes() for p in ("summary.json", "ceilings.json")}
    hardware._CACHE.clear()
    ceil = hardware.ceilings("cpu", results_dir=tmp_path, quick=True)  # a later quick run, ceilings and all
    assert sync(ceil, "bbb", 0.25).summarize()["sync_speedup"] == pytest.approx(8.0)
    assert cli(["report", str(folder)]) == 0
    assert {p: (folder / p).read_bytes() for p in before} == before
    assert json.loads((folder / "summary-quick.json").read_text())["metrics"]["sync_speedup"] == pytest.approx(8.0)


def test_a_metric_from_an_older_commit_is_marked_stale(tmp_path):
    old = results.Recorder("01_sync", "cpu", results_dir=tmp_path, profile="full", commit="aaa")
    old.metric("sync_count", "baseline", 7)
    old.metric("sync_count", "optimized", 0)  # a case the newer run of 01 below drops: not mixed into its keys
    df = pd.read_csv(old.path)
    df["date"] = "2000-01-01T00:00:00+00:00"
    old.path.write_text(df.to_csv(index=False))
    new = results.Recorder("06_amp", "cpu", results_dir=tmp_path, profile="full", commit="bbb")
    new.timing("amp_train_step", "fp32", "baseline", Timing(4.0, 4, 4, 3))
    new.timing("amp_train_step", "bf16", "optimized", Timing(1.0, 1, 1, 3))
    doc = summary.headline(old.folder, "full")
    assert doc["commits"] == ["aaa", "bbb"] and doc["stale"] == ["sync_count_baseline", "sync_count_optimized"]
    assert doc["sources"]["sync_count_baseline"] == ["aaa"] and doc["sources"]["amp_speedup"] == ["bbb"]
    newer = results.Recorder("01_sync", "cpu", results_dir=tmp_path, profile="full", commit="ccc")
    newer.metric("sync_count", "baseline", 5)
    assert summary.headline(old.folder, "full")["metrics"]["sync_count_optimized"] is None


@needs_git
def test_a_cpu_session_leaves_nothing_to_commit(tmp_path):
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "mahia", repo / "mahia", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "README.md").write_text("notebooks\n")
    _commit_all(repo)
    script = (
        "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
        "import mahia; from mahia.lessons.notebook import setup\n"
        "ctx = setup('99_trace', device='cpu', profile='quick', verbose=False)\n"
        "ctx.recorder.metric('sync_count', 'baseline', 7); ctx.recorder.summarize()\n"
        "fig, ax = plt.subplots(); ax.plot([1, 2]); ctx.save(fig, 'plot')\n"
        "print(mahia.__file__); print(ctx.recorder.path); print(ctx.figures)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAHIA_")}
    env |= {"PYTHONPATH": str(repo), "HOME": str(tmp_path)}
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
    # the reference command: not on a CPU, not from a dirty tree, not from a copy without git or MAHIA_COMMIT
    for commit, message in (
        ("abc123", "this run is on cpu"),
        ("abc-dirty", "uncommitted changes"),
        ("unknown", "MAHIA_COMMIT"),
    ):
        monkeypatch.setattr(files, "git_commit", lambda c=commit: c)
        with pytest.raises(runner.UsageError, match=message):
            runner.reference(device="cpu", notebooks="00")
    assert not ref.exists()
    monkeypatch.setenv(files.REFERENCE_ENV, "1")  # what `python -m mahia reference` gives its processes
    rec.metric("x", "y", 1.0)
    assert rec.path.exists()


def test_reference_runs_in_parts_that_resume(tmp_path, monkeypatch, bare_notebook_dir):
    ref = tmp_path / "data" / "results"
    monkeypatch.setattr(files, "reference_results_dir", lambda: ref)
    monkeypatch.setattr(files, "reference_figures_dir", lambda: tmp_path / "figures")
    monkeypatch.setattr(files, "git_commit", lambda: "abc123")
    monkeypatch.setattr(runner, "_check_gpu", lambda dev: None)  # the CPU stands in for the GPU here
    params = nbformat.v4.new_code_cell(
        "device = 'auto'\nprofile = 'quick'\nseed = 0\ninteractive = True\nresults_dir = None\nbatch = 1"
    )
    params.metadata["tags"] = ["parameters"]
    record = (
        "assert profile == 'full' and batch == 2\nfrom mahia.measure.results import Recorder\n"
        "Recorder('02_rec', device, results_dir=results_dir).metric('sync_count', 'baseline', 7)"
    )
    nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(record)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, bare_notebook_dir / "02_rec.ipynb")  # beside 01_bare, which fails at once
    folder = ref / hardware.device_slug("cpu")

    def go(**kw):
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        rc = runner.reference(device="cpu", progress=False, timeout=300, out=str(out), params=["batch=2"], **kw)
        return rc, {o["name"]: o for o in json.loads((out / "outcomes.json").read_text())}

    with pytest.raises(runner.UsageError, match="no suite 'nope'"):
        runner.reference(device="cpu", bench="nope")
    rc, outcomes = go(notebooks="all")
    assert rc == 1 and outcomes["02_rec"]["status"] == "ok" and outcomes["01_bare"]["status"] == "failed"
    row = pd.read_csv(folder / "02_rec.csv").iloc[0]
    assert (row["profile"], row["commit"]) == ("full", "abc123")
    marker = json.loads((folder / "parts" / "02_rec.json").read_text())
    assert marker["commit"] == "abc123" and marker["params"] == {"batch": 2} and marker["seconds"] > 0
    assert runner.recorded_parts(folder, "abc123").keys() == {"02_rec"} and runner.recorded_parts(folder, "d") == {}
    # the executed notebook that finished is committed beside the records; the failed one is not
    assert [p.name for p in (folder / "notebooks").iterdir()] == ["02_rec.ipynb"]

    rc, outcomes = go(notebooks="all")  # resumes: only the part not recorded for this commit runs
    assert outcomes["02_rec"]["status"] == "skipped" and outcomes["01_bare"]["status"] == "failed"
    assert len(pd.read_csv(folder / "02_rec.csv")) == 1
    rc, outcomes = go(notebooks="02", force=True)
    assert rc == 0 and outcomes["02_rec"]["status"] == "ok" and len(pd.read_csv(folder / "02_rec.csv")) == 2
