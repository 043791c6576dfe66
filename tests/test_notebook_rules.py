"""Rules every notebook in notebooks/ keeps, checked on the committed files (that they are committed clean, with a
``parameters`` cell, is tests/test_foundation.py's):

* no code cell over ``MAX_CELL_LINES`` lines; no ``MAHIA_*`` environment variable set (implementations are chosen
  by explicit arguments); only public names of ``mahia`` (``mahia.lessons.kernel_listings`` shows private code);
* every line of the ``parameters`` cell has at most one ``=`` (papermill skips, with a warning, a line whose help
  has another);
* every ``## Exercise`` is followed, before the next level-2 heading, by a hidden code cell tagged ``solution``;
* every paragraph a reader meets (a blank-line block or list item of markdown, a run of comment lines) is at most
  ``MAX_PARAGRAPH_WORDS`` words, a notebook's markdown at most ``MAX_MARKDOWN_WORDS`` (issue 34); what a cell
  prints is held to the same paragraph limit in tests/test_notebooks.py.

Each checker is also run on a bad example, so that every rule can fail.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
MAX_CELL_LINES = 40


def _code_cells(nb: dict) -> list[tuple[int, str]]:
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def _parse(src: str) -> ast.AST:
    # IPython syntax (%magic, !shell) is not Python: blank those lines out, keeping line numbers.
    lines = ["" if re.match(r"\s*[%!]", ln) else ln for ln in src.splitlines()]
    return ast.parse("\n".join(lines))


def long_cells(nb: dict, limit: int = MAX_CELL_LINES) -> list[str]:
    return [f"cell {i}: {len(src.splitlines())} lines" for i, src in _code_cells(nb) if len(src.splitlines()) > limit]


# os.environ["MAHIA_..."] = / setdefault / update / __setitem__, os.putenv("MAHIA_...") and del os.environ["MAHIA_..."]
MAHIA_ENV_WRITE = re.compile(
    r"environ\[\s*['\"]MAHIA_\w*['\"]\s*\]\s*=[^=]|environ\.(?:setdefault|update|__setitem__)\([^)]*MAHIA_"
    r"|putenv\(\s*['\"]MAHIA_|del\s+(?:os\.)?environ\[\s*['\"]MAHIA_"
)


def mahia_env_writes(nb: dict) -> list[str]:
    return [f"cell {i}: {m.group(0)!r}" for i, src in _code_cells(nb) for m in MAHIA_ENV_WRITE.finditer(src)]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names(nb: dict) -> list[str]:
    """Private names of mahia that a notebook imports or reaches through an attribute."""
    found, bound = [], {"mahia"}
    trees = [(i, _parse(src)) for i, src in _code_cells(nb)]
    for i, tree in trees:  # names bound to mahia modules or objects, in any cell
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mahia":
                bound |= {a.asname or a.name for a in node.names}
                if any(_private(p) for p in node.module.split(".")):
                    found.append(f"cell {i}: from {node.module} import ...")
                found += [f"cell {i}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "mahia":
                        bound.add(a.asname or "mahia")
                        if any(_private(p) for p in a.name.split(".")):
                            found.append(f"cell {i}: import {a.name}")
    for i, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in bound:
                    found.append(f"cell {i}, line {node.lineno}: {ast.unparse(node)}")
    return found


def unparsable_parameter_lines(nb: dict) -> list[str]:
    """Lines of the ``parameters`` cell that papermill cannot read (more than one ``=``)."""
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    src = "".join(cells[0]["source"]) if cells else ""
    return [
        f"line {i}: {line.strip()}"
        for i, line in enumerate(src.splitlines(), 1)
        if line.count("=") > 1 and not line.strip().startswith("#")  # papermill skips comment lines
    ]


EXERCISE = re.compile(r"^## Exercises?\b", re.MULTILINE)
LEVEL2 = re.compile(r"^## ", re.MULTILINE)


def _is_hidden_solution(cell: dict) -> bool:
    meta = cell.get("metadata", {})
    return (
        cell["cell_type"] == "code"
        and "solution" in meta.get("tags", [])
        and meta.get("jupyter", {}).get("source_hidden") is True
    )


def _not_level2(cell: dict) -> bool:
    return not (cell["cell_type"] == "markdown" and LEVEL2.search("".join(cell["source"])))


def exercises_without_solution(nb: dict) -> list[str]:
    """The ``## Exercise`` cells with no hidden ``solution`` code cell before the next level-2 heading."""
    found, cells = [], nb["cells"]
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        m = EXERCISE.search(src) if c["cell_type"] == "markdown" else None
        if m:
            section = [] if LEVEL2.search(src, m.end()) else itertools.takewhile(_not_level2, cells[i + 1 :])
            if not any(_is_hidden_solution(n) for n in section):
                found.append(f"cell {i}: an exercise without a hidden solution cell after it")
    return found


MAX_PARAGRAPH_WORDS = 80
MAX_MARKDOWN_WORDS = 1500
LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)\s")


def paragraphs(text: str) -> list[str]:
    """The paragraphs a reader meets in markdown (or in text output): blank-line blocks, each list item its own.
    Fenced and indented code and table rows are not prose and are left out."""
    text = re.sub(r"```.*?```", "\n\n", text, flags=re.DOTALL)
    found, cur = [], []
    for ln in text.splitlines() + [""]:
        code = ln.startswith(("    ", "\t")) and not cur or ln.lstrip().startswith("|")
        if not ln.strip() or code or LIST_ITEM.match(ln):
            if cur:
                found.append(" ".join(cur))
            cur = [LIST_ITEM.sub("", ln, count=1)] if LIST_ITEM.match(ln) else []
        else:
            cur.append(ln)
    return found


def comment_runs(src: str) -> list[str]:
    """Runs of consecutive comment lines in a code cell: a paragraph each."""
    runs, cur = [], []
    for ln in src.splitlines() + [""]:
        if ln.strip().startswith("#"):
            cur.append(ln.strip().lstrip("#"))
        elif cur:
            runs.append(" ".join(cur))
            cur = []
    return runs


def long_paragraphs(nb: dict, limit: int = MAX_PARAGRAPH_WORDS) -> list[str]:
    """Paragraphs of markdown cells and comment runs of code cells over ``limit`` words."""
    found = []
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"])
        texts = paragraphs(src) if c["cell_type"] == "markdown" else comment_runs(src)
        found += [f"cell {i}: {len(t.split())} words: {t[:60]!r}..." for t in texts if len(t.split()) > limit]
    return found


def markdown_words(nb: dict) -> int:
    return sum(
        len(p.split()) for c in nb["cells"] if c["cell_type"] == "markdown" for p in paragraphs("".join(c["source"]))
    )


# ---------------------------------------------------------------------------------------------------
# The checkers can fail
# ---------------------------------------------------------------------------------------------------


def _nb(*sources: str) -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "source": s} for s in sources]
    cells[0]["metadata"] = {"tags": ["parameters"]}
    return {"cells": cells}


def test_long_cell_checker_fails_on_41_lines_and_passes_40():
    assert long_cells(_nb("x = 1\n" * 41)) == ["cell 0: 41 lines"]
    assert long_cells(_nb("x = 1\n" * 40)) == []


def test_parameter_line_checker_fails_on_a_second_equals_sign():
    assert unparsable_parameter_lines(_nb("n: int = 2  # rows (M = n)\nseed: int = 0\n")) == [
        "line 1: n: int = 2  # rows (M = n)"
    ]
    assert unparsable_parameter_lines(_nb("n: int = 2  # rows (M: n)\n# rows: M = n = 2\n")) == []


def test_env_checker_fails_on_every_way_of_setting_a_mahia_variable():
    bad = _nb(
        'import os\nos.environ["MAHIA_DISABLE_TRITON"] = "1"',
        'os.environ.setdefault("MAHIA_DISABLE_TRITON", "1")',
        'os.environ.update({"MAHIA_X": "1"})\nos.environ.update(MAHIA_Y="1")',
        'os.putenv("MAHIA_Z", "1")\ndel os.environ["MAHIA_W"]',
    )
    assert len(mahia_env_writes(bad)) == 6
    fine = _nb(
        'import os\nos.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/x"',
        'env = {**os.environ, "TRITON_INTERPRET": "1"}\nv = os.environ.get("MAHIA_HEADLESS")',
    )
    assert mahia_env_writes(fine) == []


def test_private_name_checker_fails_on_imports_and_attributes():
    bad = _nb(
        "from mahia.ops.rmsnorm import _fwd_config, rms_norm_eager",
        "import mahia.ops._triton\nfrom mahia.ops._triton import IMPORT_ERROR",
        "from mahia.lessons import triton_tutorial as tu\nshow(tu._rms_norm_v1_kernel.fn)",
        "from mahia.model.moe import MoE\nshow(MoE._forward_loop)\nimport mahia\nmahia.ops._x",
    )
    assert sorted(private_names(bad)) == [
        "cell 0: from mahia.ops.rmsnorm import _fwd_config",
        "cell 1: from mahia.ops._triton import ...",
        "cell 1: import mahia.ops._triton",
        "cell 2, line 2: tu._rms_norm_v1_kernel",
        "cell 3, line 2: MoE._forward_loop",
        "cell 3, line 4: mahia.ops._x",
    ]
    fine = _nb(
        "import torch\nfrom mahia.ops import rms_norm\ntorch._dynamo.reset()\n"
        "_local = 1\nprint(type(rms_norm).__name__, rms_norm.__doc__)"
    )
    assert private_names(fine) == []


def _cell(kind: str, source: str, **meta) -> dict:
    return {"cell_type": kind, "metadata": meta, "source": source}


SOLUTION = {"tags": ["solution"], "jupyter": {"source_hidden": True}}


def test_solution_checker_fails_without_a_hidden_solution_before_the_next_section():
    ex = _cell("markdown", "## Exercise\n\n1. Time it.")
    good = {"cells": [ex, _cell("code", "print(1)", **SOLUTION), _cell("markdown", "## Next")]}
    assert exercises_without_solution(good) == []
    later = {"cells": [ex, _cell("code", "explorer()"), _cell("markdown", "### Hint"), _cell("code", "x", **SOLUTION)]}
    assert exercises_without_solution(later) == []  # a level-3 heading does not end the section
    shown = {"cells": [ex, _cell("code", "print(1)", tags=["solution"])]}  # not hidden
    untagged = {"cells": [ex, _cell("code", "print(1)", jupyter={"source_hidden": True})]}
    too_late = {"cells": [ex, _cell("markdown", "## Next"), _cell("code", "print(1)", **SOLUTION)]}
    markdown_only = {"cells": [ex, _cell("markdown", "The answer is ...", **SOLUTION)]}
    none = {"cells": [_cell("markdown", "## When it doesn't help\n\ntext\n\n## Exercises\n\n1. Do.\n\n## Next")]}
    for bad in (shown, untagged, too_late, markdown_only, none):
        assert exercises_without_solution(bad) == ["cell 0: an exercise without a hidden solution cell after it"]
    assert exercises_without_solution({"cells": [_cell("markdown", "### Exercise in a section")]}) == []


def test_length_checkers_fail_on_a_long_paragraph_item_or_comment_run():
    long = " ".join(["word"] * 81)
    fine = " ".join(["word"] * 80)
    md = f"{fine}\n\n- {fine}\n- {fine}\n\n    {long}\n\n```\n{long}\n```\n\n| {long} |"
    assert long_paragraphs({"cells": [_cell("markdown", md)]}) == []
    assert len(long_paragraphs({"cells": [_cell("markdown", f"intro\n\n- {fine}\n  {fine}")]})) == 1
    assert len(long_paragraphs({"cells": [_cell("markdown", f"{fine}\nmore")]})) == 1
    code = "\n".join(["# " + " ".join(["w"] * 20)] * 5) + "\nx = 1\n# short"
    assert len(long_paragraphs({"cells": [_cell("code", code)]})) == 1
    assert markdown_words({"cells": [_cell("markdown", fine), _cell("markdown", f"a b\n\n    {long}")]}) == 82


# ---------------------------------------------------------------------------------------------------
# The notebooks keep them
# ---------------------------------------------------------------------------------------------------


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 11


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.stem)
def notebook(request) -> dict:
    return json.loads(request.param.read_text())


def test_notebook_keeps_the_rules(notebook):
    assert long_cells(notebook) == []
    assert mahia_env_writes(notebook) == []
    assert private_names(notebook) == []
    assert unparsable_parameter_lines(notebook) == []
    assert exercises_without_solution(notebook) == []
    assert long_paragraphs(notebook) == []
    assert markdown_words(notebook) <= MAX_MARKDOWN_WORDS
