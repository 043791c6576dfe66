"""The README's two generated tables (``python -m mahia readme``): the results table, a column per GPU folder of the
reference, and the wall time of each part; the committed README holds what the committed data renders to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from mahia.__main__ import BEGIN, END
from mahia.__main__ import main as cli
from mahia.measure import files, summary
from mahia.measure.report import RUNS_BEGIN, RUNS_END, parts_table, readme_tables, render_runs_block

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "data" / "results"
H100, H200 = "nvidia-h100-80gb-hbm3", "nvidia-h200"


def _summary(folder: Path, device: str, metrics: dict, *, stale=()) -> Path:
    """A full-profile summary.json written by hand: ``stale`` keys come from commit aaa, the others from bbb."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = {k: ["aaa" if k in stale else "bbb"] for k, v in metrics.items() if v is not None}
    doc = {"device": device, "profile": "full", "newest_record": "2026-11-24T10:00:00+00:00", "newest_commit": "bbb"}
    doc |= {"commits": sorted({c for cs in sources.values() for c in cs}), "stale": list(stale), "sources": sources}
    doc["metrics"] = {k: metrics.get(k) for k in summary.HEADLINE_KEYS}
    (folder / "summary.json").write_text(json.dumps(doc))
    return folder


def _row(table: str, key: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| `{key}` |"))
    return [c.strip() for c in line.strip("|").split("|")]


def _block(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1 and text.count(end) == 1, f"README.md lost its {begin} markers"
    return text.split(begin, 1)[1].split(end, 1)[0].removeprefix("\n")


def test_the_results_table_has_a_graded_column_per_gpu_with_stale_marks(tmp_path):
    a = _summary(tmp_path / H200, "NVIDIA H200", {"amp_speedup": 5.343, "copy_gbps": 4248.0}, stale=["copy_gbps"])
    b = _summary(tmp_path / H100, "NVIDIA H100", {"amp_speedup": 1.5, "hybrid_loops_speedup": 565})
    table = readme_tables([b, a])
    assert "| metric | goal | NVIDIA H100 | NVIDIA H200 |" in table
    assert _row(table, "amp_speedup") == ["`amp_speedup`", ">= 3.0", "1.5 (missed)", "5.343 (met)"]
    assert _row(table, "copy_gbps") == ["`copy_gbps`", "", "not measured", "4248 †"]  # no goal: no grade
    assert "† NVIDIA H200: made by an older commit (aaa)" in " ".join(table.split())
    doc = json.loads((a / "summary.json").read_text()) | {"newest_commit": "ccc", "newest_record": "2026-11-20"}
    (a / "summary.json").write_text(json.dumps(doc))  # now an older reference than the H100's: the column is stale
    table = " ".join(readme_tables([b, a]).split())
    assert "| NVIDIA H100 | NVIDIA H200 (stale) |" in table and "(stale) NVIDIA H200: commit ccc, not the" in table


def test_the_parts_table_sums_seconds_per_gpu_and_marks_a_resumed_part(tmp_path):
    a, b = _summary(tmp_path / "gpu-a", "GPU A", {}), _summary(tmp_path / "gpu-b", "GPU B", {})
    for folder, name, s, c in (
        (a, "07_ckpt", 227.9, "c1"),
        (a, "bench_kernels", 544.0, "c2"),
        (b, "07_ckpt", 100.0, "c1"),
    ):
        (folder / "parts").mkdir(exist_ok=True)
        (folder / "parts" / f"{name}.json").write_text(json.dumps({"status": "ok", "commit": c, "seconds": s}))
    block = parts_table([a, b])
    assert "| part (full profile, s) | GPU A | GPU B |" in block and "| `07_ckpt` | 228 | 100 |" in block
    assert "| **total** | **772** (12 min 52 s) | **100** (1 min 40 s) |" in block  # 227.9 + 544
    # the sweep's records of c2 come from three runs (an older commit's run does not count)
    rows = [("c1", "r0"), ("c2", "r1"), ("c2", "r2"), ("c2", "r2"), ("c2", "r3")]
    pd.DataFrame(rows, columns=["commit", "run_id"]).to_csv(a / "bench_kernels.csv", index=False)
    assert "| `bench_kernels` | 544 ‡ (3 runs) |" in parts_table([a])


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A checkout of its own: README.md with the two blocks and copies of both committed GPU folders."""
    root = tmp_path / "repo"
    for slug in (H200, H100):
        shutil.copytree(REF / slug, root / "data" / "results" / slug, ignore=shutil.ignore_patterns("notebooks"))
    (root / "README.md").write_text(f"# r\n\n{RUNS_BEGIN}\nstale-x\n{RUNS_END}\n\n{BEGIN}\nstale-x\n{END}\n\nend\n")
    monkeypatch.setattr(files, "REPO_ROOT", root)
    return root


def test_write_replaces_both_blocks_idempotently_and_bad_input_changes_nothing(repo, capsys):
    assert cli(["readme", "--write"]) == 0
    once = (repo / "README.md").read_text()
    assert cli(["readme", "--write"]) == 0 and (repo / "README.md").read_text() == once
    assert once.startswith("# r\n\n") and once.endswith(f"{END}\n\nend\n") and "stale-x" not in once
    folders = [repo / "data" / "results" / H100, repo / "data" / "results" / H200]
    assert _block(once, BEGIN, END) == readme_tables(folders)
    path = folders[1] / "summary.json"
    doc = json.loads(path.read_text())
    doc["metrics"]["amp_speedup"] = 99.0  # a summary that no longer says what its records say
    path.write_text(json.dumps(doc))
    (repo / "data" / "results" / "cpu-old").mkdir()  # no summary
    (repo / "README.md").write_text(once.replace(RUNS_BEGIN, ""))
    for argv, message in (
        (["readme", "--write", str(folders[1])], "does not match its records"),
        (["readme", str(repo / "data" / "results" / "cpu-old")], "has no full-profile summary"),
        (["readme", "--write", str(folders[0])], RUNS_BEGIN),
    ):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and message in err, err
    assert (repo / "README.md").read_text() == once.replace(RUNS_BEGIN, "")


def test_the_committed_readme_tables_are_what_the_committed_data_renders_to():
    """Regenerate them with `python -m mahia readme --write`."""
    text = (ROOT / "README.md").read_text()
    folders = sorted((f for f in REF.iterdir() if (f / "summary.json").exists()), key=lambda f: f.name)
    assert [f.name for f in folders] == [H100, H200]
    assert _block(text, BEGIN, END) == readme_tables(folders)
    assert _block(text, RUNS_BEGIN, RUNS_END) == render_runs_block(folders)
