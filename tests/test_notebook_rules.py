"""The rules every committed notebook keeps (CONTRIBUTING.md; issue 34's paragraph and word limits; outputs in
tests/test_notebooks.py). Each checker also fails on a bad example."""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
MAX_CELL_LINES = 40
MAX_PARAGRAPH_WORDS = 80
MAX_MARKDOWN_WORDS = 1500


def _code_cells(nb: dict) -> list[tuple[int, str]]:
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def long_cells(nb: dict) -> list[str]:
    return [f"cell {i}: {n} lines" for i, src in _code_cells(nb) if (n := len(src.splitlines())) > MAX_CELL_LINES]


# os.environ["MAHIA_..."] = / setdefault / update / __setitem__, os.putenv("MAHIA_...") and del os.environ["MAHIA_..."]
MAHIA_ENV_WRITE = re.compile(
    r"environ\[\s*['\"]MAHIA_\w*['\"]\s*\]\s*=[^=]|environ\.(?:setdefault|update|__setitem__)\([^)]*MAHIA_"
    r"|putenv\(\s*['\"]MAHIA_|del\s+(?:os\.)?environ\[\s*['\"]MAHIA_"
)


def mahia_env_writes(nb: dict) -> list[str]:
    return [f"cell {i}: {m.group(0)!r}" for i, src in _code_cells(nb) for m in MAHIA_ENV_WRITE.finditer(src)]


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def private_names(nb: dict) -> list[str]:
    """Private names of mahia that a notebook imports or reaches through an attribute of a name bound to mahia."""
    found, bound = [], {"mahia"}
    trees = []
    for i, src in _code_cells(nb):  # IPython syntax (%magic, !shell) blanked out, keeping line numbers
        trees.append((i, ast.parse("\n".join("" if re.match(r"\s*[%!]", ln) else ln for ln in src.splitlines()))))
    for i, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mahia":
                bound |= {a.asname or a.name for a in node.names}
                found += [
                    f"cell {i}: {node.module}.{a.name}" for a in node.names if _private(f"{node.module}.{a.name}")
                ]
            elif isinstance(node, ast.Import):
                mods = [a for a in node.names if a.name.split(".")[0] == "mahia"]
                bound |= {a.asname or "mahia" for a in mods}
                found += [f"cell {i}: {a.name}" for a in mods if _private(a.name)]
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
    """Lines of the ``parameters`` cell that papermill skips: more than one ``=`` (comment lines it skips anyway)."""
    src = next(("".join(c["source"]) for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])), "")
    lines = enumerate(src.splitlines(), 1)
    return [f"line {i}: {ln.strip()}" for i, ln in lines if ln.count("=") > 1 and not ln.strip().startswith("#")]


EXERCISE = re.compile(r"^## Exercises?\b", re.MULTILINE)
LEVEL2 = re.compile(r"^## ", re.MULTILINE)


def _is_hidden_solution(cell: dict) -> bool:
    meta = cell["metadata"]
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
    runs = itertools.groupby(src.splitlines(), lambda ln: ln.strip().startswith("#"))
    return [" ".join(ln.strip().lstrip("#") for ln in run) for comment, run in runs if comment]


def long_paragraphs(nb: dict) -> list[str]:
    """Paragraphs of markdown cells and comment runs of code cells over ``MAX_PARAGRAPH_WORDS`` words."""
    found = []
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"])
        texts = paragraphs(src) if c["cell_type"] == "markdown" else comment_runs(src)
        found += [
            f"cell {i}: {len(t.split())} words: {t[:60]!r}..." for t in texts if len(t.split()) > MAX_PARAGRAPH_WORDS
        ]
    return found


def long_output_paragraphs(nb: dict) -> list[str]:
    """Paragraphs over ``MAX_PARAGRAPH_WORDS`` words in a notebook's outputs: rendered markdown by blank-line blocks and list
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
                if len(p.split()) > MAX_PARAGRAPH_WORDS:
                    found.append(f"cell {i}: {len(p.split())} words: {p[:60]!r}...")
    return found


def markdown_words(nb: dict) -> int:
    return sum(
        len(p.split()) for c in nb["cells"] if c["cell_type"] == "markdown" for p in paragraphs("".join(c["source"]))
    )


def _cell(kind: str, source: str, **meta) -> dict:
    return {"cell_type": kind, "metadata": meta, "source": source}


def _cells(*cells: dict) -> dict:
    return {"cells": list(cells)}


def _nb(*sources: str) -> dict:
    return _cells(*(_cell("code", s, tags=["parameters"] if i == 0 else []) for i, s in enumerate(sources)))


EX, NEXT = _cell("markdown", "## Exercise\n\n1. Time it."), _cell("markdown", "## Next")
HINT = _cell("markdown", "### Hint")
SOLUTION = {"tags": ["solution"], "jupyter": {"source_hidden": True}}
LONG, FINE = " ".join(["word"] * 81), " ".join(["word"] * 80)
ENV_WRITES = 'os.environ["MAHIA_A"] = "1"\nos.environ.setdefault("MAHIA_B", "1")\nos.environ.update({"MAHIA_X": "1"})\n'
ENV_WRITES += 'os.putenv("MAHIA_Z", "1")\ndel os.environ["MAHIA_W"]'
PRIVATE = ["import mahia.ops._triton", "from mahia.lessons import tutorial as tu\nshow(tu._kernel.fn)", "mahia.ops._x"]
CASES = [  # (checker, notebook, how many it finds)
    (long_cells, _nb("x = 1\n" * 41), 1),
    (long_cells, _nb("x = 1\n" * 40), 0),
    (unparsable_parameter_lines, _nb("n: int = 2  # rows (M = n)\nseed: int = 0\n"), 1),
    (unparsable_parameter_lines, _nb("n: int = 2  # rows (M: n)\n# rows: M = n = 2\n"), 0),
    (mahia_env_writes, _nb(ENV_WRITES), 5),
    (mahia_env_writes, _nb('os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/x"\nv = os.environ.get("MAHIA_HEADLESS")'), 0),
    (private_names, _nb("from mahia.ops.rmsnorm import _fwd_config, rms_norm_eager", *PRIVATE), 4),
    (private_names, _nb("import torch\nfrom mahia.ops import f\ntorch._dynamo.reset()\n_x = f.__doc__"), 0),
    (exercises_without_solution, _cells(EX, _cell("code", "1", **SOLUTION), NEXT), 0),
    (exercises_without_solution, _cells(EX, _cell("code", "f()"), HINT, _cell("code", "1", **SOLUTION)), 0),
    (exercises_without_solution, _cells(EX, _cell("code", "1", tags=["solution"])), 1),
    (exercises_without_solution, _cells(EX, _cell("code", "1", jupyter={"source_hidden": True})), 1),
    (exercises_without_solution, _cells(EX, NEXT, _cell("code", "1", **SOLUTION)), 1),
    (exercises_without_solution, _cells(EX, _cell("markdown", "The answer", **SOLUTION)), 1),
    (exercises_without_solution, _cells(_cell("markdown", "## Why\n\ntext\n\n## Exercises\n\n1. Do.\n\n## Next")), 1),
    (exercises_without_solution, _cells(_cell("markdown", "### Exercise in a section")), 0),
    (long_paragraphs, _cells(_cell("markdown", f"{FINE}\n\n- {FINE}\n- {FINE}\n\n    {LONG}\n\n```\n{LONG}\n```")), 0),
    (long_paragraphs, _cells(_cell("markdown", f"| {LONG} |")), 0),  # a table row is not prose
    (long_paragraphs, _cells(_cell("markdown", f"intro\n\n- {FINE}\n  {FINE}")), 1),
    (long_paragraphs, _cells(_cell("markdown", f"{FINE}\nmore")), 1),
    (long_paragraphs, _cells(_cell("code", "\n".join(["# " + " ".join(["w"] * 20)] * 5) + "\nx = 1\n# short")), 1),
    (long_output_paragraphs, _cells({"outputs": [{"text": f"{FINE}\n{FINE}\n"}, {"data": {"text/html": LONG}}]}), 0),
    (long_output_paragraphs, _cells({"outputs": [{"text": LONG}, {"data": {"text/markdown": f"{FINE}\nmore"}}]}), 2),
]


@pytest.mark.parametrize("checker, nb, n", CASES)
def test_each_checker_finds_what_breaks_its_rule_and_only_that(checker, nb, n):
    assert len(checker(nb)) == n, checker(nb)


def test_markdown_words_count_prose_only():
    assert markdown_words(_cells(_cell("markdown", FINE), _cell("markdown", f"a b\n\n    {LONG}"))) == 82


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 11


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_keeps_the_rules(path):
    nb = json.loads(path.read_text())
    assert long_cells(nb) == mahia_env_writes(nb) == private_names(nb) == []
    assert unparsable_parameter_lines(nb) == exercises_without_solution(nb) == long_paragraphs(nb) == []
    assert markdown_words(nb) <= MAX_MARKDOWN_WORDS
