"""Rules every notebook in notebooks/ keeps, checked on the committed files (no notebook is run here).

* no code cell over ``MAX_CELL_LINES`` lines: long plotting or prose code belongs in a tested helper;
* no ``MAHIA_*`` environment variable set by the notebook: implementations are chosen through explicit
  arguments (``HybridConfig(kernels=...)``, ``impl=``, ``mahia.model.apply``), not the environment;
* only public names of ``mahia``: no ``from mahia.x import _y``, no ``import mahia.x._y``, no ``m._y``
  on a name bound to a mahia import (``mahia.lessons.kernel_listings`` shows private code by name);
* committed clean: no outputs, no execution counts, and the first code cell is tagged ``parameters``.

Each checker is also run on a bad example, so that every rule can fail.
"""

from __future__ import annotations

import ast
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


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _mahia_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("MAHIA_")


def mahia_env_writes(nb: dict) -> list[str]:
    """``os.environ["MAHIA_..."] = ...``, ``os.environ.setdefault("MAHIA_...", ...)``, ``.update(MAHIA_...=)``,
    ``os.putenv("MAHIA_...", ...)`` and ``del os.environ["MAHIA_..."]``."""
    found = []
    for i, src in _code_cells(nb):
        for node in ast.walk(_parse(src)):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and _is_environ(t.value) and _mahia_str(t.slice):
                    found.append(f"cell {i}, line {node.lineno}: os.environ[{t.slice.value!r}]")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                f = node.func
                on_environ = _is_environ(f.value) and f.attr in ("setdefault", "update", "__setitem__")
                putenv = f.attr == "putenv" and isinstance(f.value, ast.Name) and f.value.id == "os"
                if on_environ or putenv:
                    keys = [a for a in node.args if _mahia_str(a)]
                    keys += [k for a in node.args if isinstance(a, ast.Dict) for k in a.keys if _mahia_str(k)]
                    keys += [kw for kw in node.keywords if kw.arg and kw.arg.startswith("MAHIA_")]
                    if keys:
                        found.append(f"cell {i}, line {node.lineno}: {f.attr} of a MAHIA_ variable")
    return found


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


def dirty_cells(nb: dict) -> list[str]:
    return [
        f"cell {i}"
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]


def first_code_cell_tagged(nb: dict) -> bool:
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return bool(code) and "parameters" in code[0].get("metadata", {}).get("tags", [])


# ---------------------------------------------------------------------------------------------------
# The checkers can fail
# ---------------------------------------------------------------------------------------------------


def _nb(*sources: str, outputs=None, count=None, tags=("parameters",)) -> dict:
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s} for s in sources
    ]
    cells[0]["metadata"] = {"tags": list(tags)} if tags else {}
    cells[-1]["outputs"] = outputs or []
    cells[-1]["execution_count"] = count
    return {"cells": cells}


def test_long_cell_checker_fails_on_41_lines_and_passes_40():
    assert long_cells(_nb("x = 1\n" * 41)) == ["cell 0: 41 lines"]
    assert long_cells(_nb("x = 1\n" * 40)) == []


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


def test_clean_checker_fails_on_outputs_counts_and_a_missing_tag():
    assert dirty_cells(_nb("x = 1", outputs=[{"output_type": "stream", "text": "1"}])) == ["cell 0"]
    assert dirty_cells(_nb("x = 1", count=3)) == ["cell 0"]
    assert dirty_cells(_nb("x = 1")) == []
    assert not first_code_cell_tagged(_nb("x = 1", tags=()))
    assert first_code_cell_tagged(_nb("x = 1"))


# ---------------------------------------------------------------------------------------------------
# The notebooks keep them
# ---------------------------------------------------------------------------------------------------


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 11


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.stem)
def notebook(request) -> dict:
    return json.loads(request.param.read_text())


def test_no_long_code_cell(notebook):
    assert long_cells(notebook) == []


def test_no_mahia_environment_variable_set(notebook):
    assert mahia_env_writes(notebook) == []


def test_only_public_mahia_names(notebook):
    assert private_names(notebook) == []


def test_committed_clean_with_a_parameters_cell(notebook):
    assert dirty_cells(notebook) == []
    assert first_code_cell_tagged(notebook)
