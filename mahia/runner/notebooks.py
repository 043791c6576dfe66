"""A notebook's parameters (typed, checked before anything runs), its cells after a run, and its committed form."""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


RESERVED = ("device", "profile", "seed", "interactive", "results_dir")


def parse_params(items: Sequence[str]) -> dict:
    """``["batch=8", "modes=['default']"]`` -> ``{"batch": 8, "modes": ["default"]}``."""
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(f"--param expects NAME=VALUE with a Python identifier as NAME, got {item!r}")
        if name in RESERVED:
            raise UsageError(f"--param {name}=...: use the runner's own --{name.replace('_', '-')} option")
        try:
            value = json.loads(raw)
        except ValueError:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def strip(nb):
    """A notebook (nbformat's node) as it is committed: nbstripout's, without outputs, execution counts or the
    metadata each Python writes differently (``language_info``); what clean-notebooks writes and what JupyterLab
    saves under make lab (``strip_on_save``)."""
    from nbstripout import strip_output

    return strip_output(nb, keep_output=False, keep_count=False, keep_id=False, extra_keys=["metadata.language_info"])


def _stripped(text: str) -> str:
    import nbformat

    nb = strip(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
    return nbformat.writes(nb, version=nbformat.NO_CONVERT) + "\n"


def notebook_is_clean(path: Path) -> bool:
    """True when the notebook, as git sees it (the index, else the file), is as :func:`strip` leaves it."""
    r = subprocess.run(["git", "show", f":./{Path(path).name}"], cwd=Path(path).parent, capture_output=True, text=True)
    text = r.stdout if r.returncode == 0 else Path(path).read_text()
    return _stripped(text) == text


def clean_notebook(path: Path) -> None:
    """Strip the file in place as it is committed."""
    Path(path).write_text(_stripped(Path(path).read_text()))


def _has_parameters_cell(path: Path) -> bool:
    return any("parameters" in c.get("metadata", {}).get("tags", []) for c in _load(path)["cells"])


def notebook_parameters(path: Path) -> dict[str, str | None]:
    """The names a notebook's cell tagged ``parameters`` assigns, each with its declared type: the
    annotation (``n_experts: int | None = None``), else the type of a literal default (``probes = 3``:
    ``int``; ``modes = ("a", "b")``: ``tuple[str, ...]``), else None: a ``None`` default without an
    annotation says nothing about the values the notebook expects, so they are not checked."""
    found: dict[str, str | None] = {}
    for c in _load(path)["cells"]:
        if "parameters" not in c.get("metadata", {}).get("tags", []):
            continue
        try:
            tree = ast.parse("".join(c["source"]))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                ann = node.annotation
                quoted = isinstance(ann, ast.Constant) and isinstance(ann.value, str)  # x: "int | None"
                found[node.target.id] = ann.value if quoted else ast.unparse(ann)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        found[t.id] = _default_type(node.value)
    return found


def _default_type(node: ast.expr) -> str | None:
    try:
        return _type_of(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None  # not a literal (an expression, a call): nothing to infer


def _type_of(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bool, int, float, str)):
        return type(value).__name__
    if isinstance(value, (list, tuple)):
        inner = {_type_of(v) for v in value}
        if len(inner) != 1 or None in inner:
            return type(value).__name__
        (t,) = inner
        return f"tuple[{t}, ...]" if isinstance(value, tuple) else f"list[{t}]"
    return "dict" if isinstance(value, dict) else None


# What a value given with -p must be for each type name an annotation may use. Lists and tuples are one
# kind: -p values travel as JSON, which has no tuple. A name not listed here (Any, torch.dtype) is not checked.
_KINDS: dict[str, Callable[[object], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "None": lambda v: v is None,
    "NoneType": lambda v: v is None,
    **dict.fromkeys(("list", "tuple", "List", "Tuple", "Sequence"), lambda v: isinstance(v, (list, tuple))),
    **dict.fromkeys(("dict", "Dict", "Mapping"), lambda v: isinstance(v, dict)),
}


def _type_name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def conforms(value, annotation: str) -> bool:
    """Whether ``value`` (as ``parse_params`` reads it) matches a type annotation's text: ``int``,
    ``float`` (an int too), ``str``, ``bool``, ``None``, ``A | B``, ``Optional[A]``, ``Union[A, B]``,
    ``list[A]``, ``tuple[A, ...]``, ``tuple[A, B]``, ``dict[K, V]``, ``Literal[...]``; anything else passes."""
    return _conforms(value, ast.parse(annotation, mode="eval").body)


def _conforms(value, node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):  # a quoted annotation inside another
            return _conforms(value, ast.parse(node.value, mode="eval").body)
        return value is None if node.value is None else True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _conforms(value, node.left) or _conforms(value, node.right)
    if isinstance(node, (ast.Name, ast.Attribute)):
        check = _KINDS.get(_type_name(node))
        return check is None or check(value)
    if not isinstance(node, ast.Subscript):
        return True
    base = _type_name(node.value)
    args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base in ("Optional", "Union"):
        return (base == "Optional" and value is None) or any(_conforms(value, a) for a in args)
    if base == "Literal":
        return any(type(value) is type(a.value) and value == a.value for a in args if isinstance(a, ast.Constant))
    check = _KINDS.get(base)
    if check is None or not check(value):
        return check is None
    if isinstance(value, dict):
        return len(args) != 2 or all(_conforms(v, args[1]) for v in value.values())
    variadic = len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is ...  # tuple[int, ...]
    if base in ("tuple", "Tuple") and not variadic:
        return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args))
    return all(_conforms(v, args[0]) for v in value)


def _source_cells(out_nb: Path) -> list[tuple[int, dict]]:
    """(number, cell) of the code cells of an executed notebook, numbered as in the source notebook (papermill's
    ``injected-parameters`` cell is not counted); [] when the notebook is missing or unreadable."""
    try:
        cells = _load(out_nb)["cells"]
    except (OSError, ValueError):
        return []
    tags = lambda c: c.get("metadata", {}).get("tags", [])  # noqa: E731
    return list(enumerate((c for c in cells if c["cell_type"] == "code" and "injected-parameters" not in tags(c)), 1))


def last_line(log: Path) -> str:
    """The last non-empty line a part's process wrote to its log: papermill's or a suite's final error."""
    lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    return lines[-1][:300] if lines else "no output"


def _failure(out_nb: Path, log: Path) -> tuple[int | None, str]:
    """(code cell number in the source notebook, 'Error: message') of the first cell with an error output; else
    (None, the log's last line): the kernel died (killed, out of memory, or never started) and left no error."""
    if not out_nb.exists():
        return None, f"no output notebook was written: {last_line(log)}"
    for number, c in _source_cells(out_nb):
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                return number, f"{o.get('ename')}: {str(o.get('evalue'))[:300]}"
    return None, f"no error cell (the kernel died: killed, or out of memory?): {last_line(log)}"


def slowest_cells(out_nb: Path, n: int = 3) -> list[dict]:
    """The ``n`` code cells that took longest (papermill's per-cell ``duration``), slowest first, numbered as in
    the source notebook: ``[{"cell": 33, "seconds": 26.9}, ...]``, so a run says where a notebook's time went."""
    took = [
        {"cell": number, "seconds": round(float(d), 1)}
        for number, c in _source_cells(out_nb)
        if isinstance(d := c.get("metadata", {}).get("papermill", {}).get("duration"), (int, float))
    ]
    return sorted(took, key=lambda r: -r["seconds"])[:n]


def _running_cell(out_nb: Path) -> int | None:
    """The code cell (source numbering) papermill was running when it was stopped: the last one it started."""
    started = [n for n, c in _source_cells(out_nb) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def _check_params(chosen: list[Path], extra: dict) -> dict[Path, dict[str, str | None]]:
    """Each selected notebook's parameters with their declared types (``notebook_parameters``). A -p NAME
    that no selected notebook declares would be injected and then ignored (a typo, or the wrong notebook),
    and a value of the wrong type would fail minutes later inside the notebook: both are refused now.
    Each notebook gets only the names its parameters cell declares."""
    declared = {nb: notebook_parameters(nb) for nb in chosen}
    names = set().union(*(set(d) for d in declared.values()))
    unknown = sorted(set(extra) - names)
    if unknown:
        valid = ", ".join(sorted(names - set(RESERVED))) or "none but the runner's own options"
        raise UsageError(f"--param {', '.join(unknown)}: no selected notebook has such a parameter; theirs: {valid}")
    for name, value in extra.items():
        for nb, params in declared.items():
            kind = params.get(name)
            if name in params and kind is not None and not conforms(value, kind):
                raise UsageError(
                    f"--param {name}={value!r}: {nb.stem} declares `{name}: {kind}`; "
                    f"{value!r} (a {type(value).__name__}) is not one"
                )
    return declared
