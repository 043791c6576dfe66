"""The package's floors hold: no import circle, no private name used across packages.

The floor order itself (lessons, entry points, model, layers, ops, measure) is import-linter's contract
in pyproject.toml, checked by ``make lint`` (part of ``make test``); these tests check what that
contract does not: circles between the modules of one floor, and private names crossing packages.
"""

import ast
import graphlib
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mahia"


def test_no_import_circle_between_modules():
    graph = grimp.build_graph("mahia")  # imports inside functions count too
    sorter = graphlib.TopologicalSorter({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})
    sorter.prepare()  # raises CycleError naming the circle


def _package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def private_imports(source: str, module: str) -> list[str]:
    """``from mahia.x.y import _name`` (or ``import mahia.x._y``) where mahia.x is not ``module``'s package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mahia"):
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("mahia")]
        else:
            continue
        found += [
            name
            for name in names
            if _package_of(name) != _package_of(module)
            and any(p.startswith("_") and not p.startswith("__") for p in name.split("."))
        ]
    return found


def test_private_import_checker_catches_both_forms():
    src = "from mahia.ops.rmsnorm import _fwd_config\nimport mahia.ops._triton\nfrom mahia.ops import rms_norm\n"
    assert private_imports(src, "mahia.layers.norm") == ["mahia.ops.rmsnorm._fwd_config", "mahia.ops._triton"]
    assert private_imports(src, "mahia.ops.swiglu") == []  # inside its own package: allowed


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_imported_across_packages(path):
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    assert private_imports(path.read_text(), module) == []
