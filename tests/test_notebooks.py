"""Every notebook runs top to bottom through the runner: quick profile, on the CPU (or the GPU if any).

Results and figures go to a temporary folder so that a test run never mixes with committed results.
"""

import json
import os

import pytest

from mahia import runner

pytestmark = pytest.mark.notebooks


def test_all_notebooks_run_headless(tmp_path):
    rc = runner.run(
        profile="quick",
        device="auto",
        out=str(tmp_path / "run"),
        results_dir=str(tmp_path / "results"),
        figures_dir=str(tmp_path / "figures"),
        progress=False,
        timeout=float(os.environ.get("MAHIA_NOTEBOOK_TIMEOUT", 900)),
    )
    outcomes = json.loads((tmp_path / "run" / "outcomes.json").read_text())
    failed = [
        f"{o['name']}: {o['status']} at cell {o.get('cell')}: {o.get('error')}" for o in outcomes if o["status"] != "ok"
    ]
    assert rc == 0 and not failed, "\n".join(failed)
    assert len(outcomes) == len(runner.list_notebooks())
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "report.html").exists()
    assert any((tmp_path / "figures").rglob("*.png")), "no figure was written"
