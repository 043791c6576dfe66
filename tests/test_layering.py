"""The package's floors hold: no import circle, no private name used across packages.

The floor order itself (lessons, entry points, model, layers, ops, measure) is import-linter's contract
in pyproject.toml, checked by ``make lint`` (part of ``make test``); these tests check what that
contract does not: circles between the modules of one floor, and private names crossing packages.
"""

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mahia"


def find_cycles(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first search meets in a directed graph (each as a closed list of nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(adjacency.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for node in sorted(adjacency):
        if node not in state:
            visit(node, [])
    return cycles


def test_find_cycles_finds_a_circle_and_accepts_a_tree():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_between_modules():
    graph = grimp.build_graph("mahia")  # imports inside functions count too
    adjacency = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert find_cycles(adjacency) == []


def _package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def private_imports(source: str, module: str) -> list[str]:
    """``from mahia.x.y import _name`` (or ``import mahia.x._y``) where mahia.x is not ``module``'s package."""
    found = []
    here = _package_of(module)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mahia"):
            names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            path_private = any(p.startswith("_") and not p.startswith("__") for p in node.module.split("."))
            if _package_of(node.module) != here and (names or path_private):
                found.append(f"from {node.module} import {', '.join(names) or '...'}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if (
                    parts[0] == "mahia"
                    and _package_of(alias.name) != here
                    and any(p.startswith("_") and not p.startswith("__") for p in parts)
                ):
                    found.append(f"import {alias.name}")
    return found


def test_private_import_checker_catches_both_forms():
    src = "from mahia.ops.rmsnorm import _fwd_config\nimport mahia.ops._triton\nfrom mahia.ops import rms_norm\n"
    assert private_imports(src, "mahia.layers.norm") == [
        "from mahia.ops.rmsnorm import _fwd_config",
        "import mahia.ops._triton",
    ]
    assert private_imports(src, "mahia.ops.swiglu") == []  # inside its own package: allowed


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_imported_across_packages(path):
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    assert private_imports(path.read_text(), module) == []
