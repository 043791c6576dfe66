"""Every notebook runs top to bottom through the runner (quick profile, on the CPU or the GPU if any), into a
temporary folder, and what its cells print keeps the paragraph rule (test_notebook_rules.long_output_paragraphs)."""

import json
import os
from pathlib import Path

import pytest
from test_notebook_rules import long_output_paragraphs

from mahia import runner

pytestmark = pytest.mark.notebooks


@pytest.mark.parametrize("name", [nb.stem for nb in runner.list_notebooks()])
def test_notebook_runs_headless(name, tmp_path):
    rc = runner.run(
        profile="quick",
        device="auto",
        notebooks=name,
        out=str(tmp_path / "run"),
        results_dir=str(tmp_path / "results"),
        figures_dir=str(tmp_path / "figures"),
        progress=False,
        timeout=float(os.environ.get("MAHIA_NOTEBOOK_TIMEOUT", 900)),
    )
    (outcome,) = json.loads((tmp_path / "run" / "outcomes.json").read_text())
    assert rc == 0 and outcome["status"] == "ok", (
        f"{name}: {outcome['status']} at cell {outcome.get('cell')}: {outcome.get('error')}"
    )
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "report.html").exists()
    assert any((tmp_path / "figures").rglob("*.png")), "no figure was written"
    assert long_output_paragraphs(json.loads(Path(outcome["output"]).read_text())) == []
