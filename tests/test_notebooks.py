"""Every notebook runs top to bottom through the runner: quick profile, on the CPU (or the GPU if any), and
what its cells print keeps the paragraph rule of the notebooks' text (tests/test_notebook_rules.py).

Results and figures go to a temporary folder so that a test run never mixes with committed results.
"""

import json
import os
from pathlib import Path

import pytest
from test_notebook_rules import MAX_PARAGRAPH_WORDS, paragraphs

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


def long_output_paragraphs(nb: dict, limit: int = MAX_PARAGRAPH_WORDS) -> list[str]:
    """Paragraphs over ``limit`` words in a notebook's outputs: rendered markdown by blank-line blocks and list
    items, printed text by lines (a printed table is many short lines). HTML (tables, listings) is not prose."""
    found = []
    for i, c in enumerate(nb["cells"]):
        for o in c.get("outputs", []):
            data = o.get("data", {})
            if "text/html" in data or "image/png" in data:
                continue
            md = "".join(data.get("text/markdown", ""))
            text = md or "".join(o.get("text", "")) or "".join(data.get("text/plain", ""))
            for p in paragraphs(md) if md else text.splitlines():
                if len(p.split()) > limit:
                    found.append(f"cell {i}: {len(p.split())} words: {p[:60]!r}...")
    return found


def test_output_paragraph_checker_fails_on_a_long_line_or_block():
    long, fine = " ".join(["w"] * 81), " ".join(["w"] * 80)
    out = [{"output_type": "stream", "text": f"{fine}\n{fine}\n"}, {"data": {"text/html": long}}]
    assert long_output_paragraphs({"cells": [{"outputs": out}]}) == []
    bad = [{"output_type": "stream", "text": long}, {"data": {"text/markdown": f"{fine}\nmore"}}]
    assert len(long_output_paragraphs({"cells": [{"outputs": bad}]})) == 2
