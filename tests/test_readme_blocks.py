"""The README's generated blocks (``python -m mahia readme``): the headline table with a column per GPU
folder of the reference, the run timings from each folder's ``parts/*.json``, and no drift: the committed
README holds what the committed data renders to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from mahia.__main__ import BEGIN, END
from mahia.__main__ import main as cli
from mahia.measure import files, results
from mahia.measure.report import RUNS_BEGIN, RUNS_END, parts_table, readme_tables, render_runs_block

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "data" / "results"
H100, H200 = "nvidia-h100-80gb-hbm3", "nvidia-h200"


# -- helpers ------------------------------------------------------------------------------------------------
def _summary(folder: Path, device: str, metrics: dict, *, stale=(), newest="bbb", older="aaa") -> Path:
    """A full-profile summary.json of the current format, written by hand: ``stale`` keys come from ``older``."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = {k: [older if k in stale else newest] for k, v in metrics.items() if v is not None}
    doc = {
        "device": device,
        "device_slug": folder.name,
        "profile": "full",
        "newest_record": "2026-11-24T10:00:00+00:00",
        "newest_commit": newest,
        "commits": sorted({c for cs in sources.values() for c in cs}),
        "stale": [k for k in metrics if k in stale],
        "metrics": {k: metrics.get(k) for k in results.HEADLINE_KEYS},
        "sources": sources,
    }
    (folder / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    return folder


def _row(table: str, key: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| `{key}` |"))
    return [c.strip() for c in line.strip("|").split("|")]


def _part(folder: Path, name: str, seconds: float, commit: str = "c1") -> None:
    doc = {"part": name, "status": "ok", "commit": commit, "profile": "full", "run_id": "r", "seconds": seconds}
    (folder / "parts").mkdir(parents=True, exist_ok=True)
    (folder / "parts" / f"{name}.json").write_text(json.dumps(doc))


def _block(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1 and text.count(end) == 1, f"README.md lost its {begin} markers"
    return text.split(begin, 1)[1].split(end, 1)[0].removeprefix("\n")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A checkout of its own: README.md with the two blocks and copies of both committed GPU folders (records,
    summaries, parts; not the executed notebooks)."""
    root = tmp_path / "repo"
    for slug in (H200, H100):
        shutil.copytree(REF / slug, root / "data" / "results" / slug, ignore=shutil.ignore_patterns("notebooks"))
    (root / "README.md").write_text(
        f"# r\n\nprose\n\n{RUNS_BEGIN}\nstale-x\n{RUNS_END}\n\n{BEGIN}\nstale-x\n{END}\n\nend\n"
    )
    monkeypatch.setattr(files, "REPO_ROOT", root)
    return root


def _one_line_exit_2(capsys, argv: list[str], root: Path) -> str:
    before = (root / "README.md").read_text()
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert (root / "README.md").read_text() == before
    return err


# -- the headline table: a column per GPU ---------------------------------------------------------------------
def test_two_folders_give_two_columns_each_graded(tmp_path):
    a = _summary(tmp_path / "nvidia-h200", "NVIDIA H200", {"amp_speedup": 5.343, "copy_gbps": 4248.0})
    b = _summary(tmp_path / "nvidia-h100-80gb-hbm3", "NVIDIA H100", {"amp_speedup": 1.5, "hybrid_loops_speedup": 565})
    table = readme_tables([b, a])
    assert "| metric | goal | NVIDIA H100 | NVIDIA H200 |" in table
    assert _row(table, "amp_speedup") == ["`amp_speedup`", ">= 3.0", "1.5 (missed)", "5.343 (met)"]
    assert _row(table, "copy_gbps") == ["`copy_gbps`", "", "not measured", "4248"]  # no goal: no grade
    assert _row(table, "hybrid_loops_speedup")[2] == "565"
    assert all(len(_row(table, k)) == 4 for k in results.HEADLINE_KEYS)
    head = " ".join(table.split("| metric |")[0].split())
    assert "_NVIDIA H100 (`nvidia-h100-80gb-hbm3`): records of 2026-11-24; full profile, commit bbb_" in head


def test_stale_marks_are_per_folder(tmp_path):
    a = _summary(tmp_path / "gpu-a", "GPU A", {"amp_speedup": 5.0, "sync_speedup": 2.0}, stale=["amp_speedup"])
    b = _summary(tmp_path / "gpu-b", "GPU B", {"amp_speedup": 4.0, "sync_speedup": 2.0}, stale=["sync_speedup"])
    table = readme_tables([a, b])
    assert _row(table, "amp_speedup")[2:] == ["5 † (met)", "4 (met)"]
    assert _row(table, "sync_speedup")[2:] == ["2", "2 †"]
    assert "† GPU A: made by an older commit (aaa) than its newest record (bbb)" in table
    assert "† GPU B: made by an older commit (aaa)" in table
    fresh = _summary(tmp_path / "gpu-c", "GPU C", {"amp_speedup": 4.0})
    assert "† GPU C" not in readme_tables([a, fresh]) and "†" not in _row(readme_tables([a, fresh]), "amp_speedup")[3]


def test_the_default_is_every_reference_folder_sorted_by_slug(repo, capsys):
    (repo / "data" / "results" / "cpu-old").mkdir()  # no summary: left out of the default, refused when named
    assert cli(["readme"]) == 0
    out = capsys.readouterr().out
    table = _block(out, BEGIN, END)
    assert "| metric | goal | NVIDIA H100 80GB HBM3 | NVIDIA H200 |" in table
    assert table.index(f"(`{H100}`)") < table.index(f"(`{H200}`)")
    assert cli(["readme", str(repo / "data" / "results" / H200)]) == 0
    assert "| metric | goal | NVIDIA H200 |" in capsys.readouterr().out
    err = _one_line_exit_2(capsys, ["readme", str(repo / "data" / "results" / "cpu-old")], repo)
    assert "has no full-profile summary" in err


def test_an_old_or_outdated_summary_is_one_line_and_exit_2(repo, capsys):
    folder = repo / "data" / "results" / H200
    doc = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({"metrics": doc["metrics"]}))
    assert "does not match its records" in _one_line_exit_2(capsys, ["readme", "--write", str(folder)], repo)
    doc["metrics"]["amp_speedup"] = 99.0  # a summary that no longer says what its records say
    (folder / "summary.json").write_text(json.dumps(doc))
    assert "does not match its records" in _one_line_exit_2(capsys, ["readme", "--write", str(folder)], repo)


# -- run timings -------------------------------------------------------------------------------------------------
def test_the_parts_block_sums_seconds_per_gpu(tmp_path):
    a = _summary(tmp_path / "gpu-a", "GPU A", {})
    for name, s, c in (("07_ckpt", 227.9, "c1"), ("bench_kernels", 544.0, "c2"), ("10_full_stack", 397.0, "c1")):
        _part(a, name, s, c)
    b = _summary(tmp_path / "gpu-b", "GPU B", {})
    _part(b, "07_ckpt", 100.0)
    none = _summary(tmp_path / "gpu-c", "GPU C", {})
    block = parts_table([a, b, none])
    assert "| part (full profile, s) | GPU A | GPU B |" in block
    assert "| **total** | **1169** (19 min 29 s) | **100** (1 min 40 s) |" in block  # 227.9 + 544 + 397
    assert "| `10_full_stack` | 397 | — |" in block
    rows = [ln.split("|")[1].strip() for ln in block.splitlines() if ln.startswith("| `")]
    assert rows == ["`07_ckpt`", "`10_full_stack`", "`bench_kernels`"]  # notebooks, then the suites
    assert "| commit(s) | 2 at c1, 1 at c2 | 1 at c1 |" in block
    assert "GPU C: no `parts/` in `gpu-c/`" in block
    assert "3 part(s) recorded (2 at c1, 1 at c2)" in " ".join(readme_tables([a]).split())
    assert "‡" not in block  # no records: nothing says the part was resumed


def test_a_part_resumed_over_several_runs_says_its_seconds_are_the_last_runs(tmp_path):
    a = _summary(tmp_path / "gpu-a", "GPU A", {})
    _part(a, "bench_kernels", 357.0, "c2")
    _part(a, "07_ckpt", 100.0, "c2")
    # the sweep's records of c2 come from three runs (an older commit's run does not count); 07's from one
    rows = [("c1", "r0"), ("c2", "r1"), ("c2", "r2"), ("c2", "r2"), ("c2", "r3")]
    pd.DataFrame(rows, columns=["commit", "run_id"]).to_csv(a / "bench_kernels.csv", index=False)
    pd.DataFrame([("c2", "r9")], columns=["commit", "run_id"]).to_csv(a / "07_ckpt.csv", index=False)
    block = parts_table([a])
    assert "| `bench_kernels` | 357 ‡ (3 runs) |" in block and "| `07_ckpt` | 100 |" in block
    assert "count its last run only" in " ".join(block.split())


def test_write_is_idempotent(repo, capsys):
    assert cli(["readme", "--write"]) == 0
    once = (repo / "README.md").read_text()
    assert cli(["readme", "--write"]) == 0
    assert (repo / "README.md").read_text() == once
    assert once.startswith("# r\n\n") and once.endswith(f"{END}\n\nend\n") and "\nprose\n" in once
    assert "stale-x" not in once
    table = _block(once, BEGIN, END)
    assert table == readme_tables([repo / "data" / "results" / H100, repo / "data" / "results" / H200])


def test_write_needs_every_marker(repo, capsys):
    text = (repo / "README.md").read_text()
    (repo / "README.md").write_text(text.replace(RUNS_BEGIN, ""))
    assert "<!-- runs:begin -->" in _one_line_exit_2(capsys, ["readme", "--write"], repo)


# -- the committed README ----------------------------------------------------------------------------------------
def test_the_committed_readme_blocks_are_what_the_committed_data_renders_to():
    """Regenerate them with `python -m mahia readme --write`."""
    text = (ROOT / "README.md").read_text()
    folders = sorted((f for f in REF.iterdir() if (f / "summary.json").exists()), key=lambda f: f.name)
    assert [f.name for f in folders] == [H100, H200]
    assert _block(text, BEGIN, END) == readme_tables(folders)
    assert _block(text, RUNS_BEGIN, RUNS_END) == render_runs_block(folders)


def test_the_readme_types_no_run_timing_outside_the_runs_block():
    text = (ROOT / "README.md").read_text()
    outside = text.split(RUNS_BEGIN)[0] + text.split(RUNS_END)[1]
    for typed in ("265 s", "466 s", "130 s"):
        assert typed not in outside, f"README.md types {typed!r}: the runs block is generated"
    results_section = text.split("## Results", 1)[1].split("### Read without a GPU", 1)[0]
    for slug in (H100, H200):
        assert f"(data/results/{slug}/)" in results_section and f"(data/results/{slug}/report.md)" in results_section
