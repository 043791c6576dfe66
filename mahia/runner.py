"""Execute the notebooks headlessly with papermill and write the run report.

Each notebook runs in its own process (``python -m papermill``) so that a per-notebook time limit
can stop it, a crash cannot take the runner down, and one GPU notebook's memory is gone before the
next starts. A failing or timed-out notebook is reported (with the failing cell) and the run goes
on; the exit code is non-zero at the end if any failed.

``run`` (``python -m mahia run``) writes records and figures to ``runs/results`` and ``runs/figures``
(git-ignored) and the executed notebooks and report to a folder of its own, ``runs/<date>-<time>-
<device>-<profile>/``. ``reference`` (``python -m mahia reference``) is the only writer of the
committed reference, ``data/results/<gpu>/`` and ``figures/<gpu>/``: full profile, on a GPU, from a
clean tree, in parts (a notebook, a benchmark suite) that resume: a part already recorded for this
commit (``parts/<part>.json`` in the results folder) is skipped unless ``force``; a notebook that
finishes is copied, trimmed by ``mahia.measure.executed``'s size policy, to ``notebooks/`` in the
results folder (what ``python -m mahia site`` renders). Every notebook and suite of one run gets the
commit the run started from (``MAHIA_COMMIT``) and its profile (``MAHIA_PROFILE``), which the records
carry.

Bad input (``--out``, ``--notebooks``, ``-p`` whose value does not match the type the notebook's
parameters cell declares) is refused before anything runs. Ctrl-C or SIGTERM stops the running part's
processes (papermill and the kernel it started in a session of its own), writes the report of what ran
and returns 130 or 143. A report is written for every run, also when nothing was recorded, with
``outcomes.json`` (each part's status and seconds) and ``run.json`` (device, profile, commit, start, end and
wall time: what ``python -m mahia readme --run-record`` commits as the run's record).
"""

from __future__ import annotations

import ast
import contextlib
import html
import importlib.util
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mahia.measure import files
from mahia.measure.executed import copy_executed
from mahia.measure.files import REPO_ROOT

__all__ = [
    "UsageError",
    "StopFlag",
    "list_notebooks",
    "select_notebooks",
    "run",
    "reference",
    "reference_commit",
    "recorded_parts",
    "new_run_dir",
    "declared_parameters",
    "notebook_parameters",
    "conforms",
    "notebook_is_clean",
    "clean_notebook",
    "strip_on_save",
]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NAME_RE = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


def list_notebooks(folder: Path = NOTEBOOK_DIR) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if NAME_RE.match(p.name))


def select_notebooks(spec: str | Sequence[str] | None, folder: Path | None = None) -> list[Path]:
    """``None`` or 'all' -> every notebook; else numbers ('00', '3') or name prefixes, comma-separated in
    one string or given as a list (``-n 00 -n 03``: the list is joined). Every item must name exactly
    one notebook: an empty item (``""``, ``","``, ``"00,"``) or an unknown one is refused."""
    folder = NOTEBOOK_DIR if folder is None else folder
    nbs = list_notebooks(folder)
    if not nbs:
        raise UsageError(f"no notebooks found in {folder}")
    if spec is None:
        return nbs
    given = ",".join([spec] if isinstance(spec, str) else spec)
    items = [s.strip() for s in given.split(",")]
    if not all(items):
        raise UsageError(
            f"--notebooks {given!r} has an empty name; give numbers or names, e.g. 00,03 or 03_triton_fusion (or all)"
        )
    if "all" in items:
        return nbs
    chosen: list[Path] = []
    for item in items:
        if item.isdigit():
            hits = [p for p in nbs if int(p.name[:2]) == int(item)]
        else:
            stem = item[:-6] if item.endswith(".ipynb") else item
            hits = [p for p in nbs if p.stem == stem or p.stem[3:] == stem or p.stem.startswith(stem)]
        if len(hits) != 1:
            names = ", ".join(p.stem for p in nbs)
            why = "matches nothing" if not hits else "is ambiguous"
            raise UsageError(f"notebook {item!r} {why}; available: {names}")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


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


# What nbstripout removes beside outputs and execution counts: the metadata each Python writes differently (its
# version). clean-notebooks and JupyterLab's save under make lab (strip_on_save) use the same keys.
STRIP_KEYS = "metadata.language_info"


def _stripped(text: str) -> str:
    """``text`` (a notebook's JSON) as nbstripout leaves it: as it is committed."""
    import io

    import nbformat
    from nbstripout import strip_output

    nb = strip_output(nbformat.reads(text, as_version=nbformat.NO_CONVERT), False, False, False, STRIP_KEYS.split())
    out = io.StringIO()
    nbformat.write(nb, out, version=nbformat.NO_CONVERT)
    return out.getvalue()


def _git_view(path: Path) -> str:
    """The notebook as git sees it (the index), else the file."""
    r = subprocess.run(["git", "show", f":./{Path(path).name}"], cwd=Path(path).parent, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else Path(path).read_text()


def notebook_is_clean(path: Path) -> bool:
    """True when the notebook, as git sees it, is as nbstripout leaves it: no outputs, no execution counts, no
    per-machine metadata."""
    text = _git_view(path)
    return _stripped(text) == text


def clean_notebook(path: Path) -> bool:
    """Strip the file in place as it is committed; returns True if it changed."""
    text = Path(path).read_text()
    clean = _stripped(text)
    if clean != text:
        Path(path).write_text(clean)
    return clean != text


def strip_on_save(model: dict, path: str, **_) -> None:
    """JupyterLab's pre-save hook under ``make lab`` (``--ContentsManager.pre_save_hook``): a lesson notebook is
    saved as it is committed, so running it and autosaving leave ``git status`` clean on any Python. The outputs
    stay on screen; results and figures still land in runs/."""
    if model.get("type") != "notebook" or Path(path).name not in {p.name for p in list_notebooks()}:
        return
    import nbformat
    from nbstripout import strip_output

    model["content"] = strip_output(nbformat.from_dict(model["content"]), False, False, False, STRIP_KEYS.split())


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


def declared_parameters(path: Path) -> set[str]:
    """The names a notebook's cell tagged ``parameters`` assigns (empty without one)."""
    return set(notebook_parameters(path))


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


def _source_cells(nb: dict) -> Iterator[tuple[int, dict]]:
    """(number, cell) of the code cells of an executed notebook, numbered as in the source notebook:
    papermill's ``injected-parameters`` cell (after the parameters cell) is not counted."""
    number = 0
    for c in nb["cells"]:
        if c["cell_type"] != "code" or "injected-parameters" in c.get("metadata", {}).get("tags", []):
            continue
        number += 1
        yield number, c


def _failure(out_nb: Path) -> tuple[int | None, str]:
    """(code cell number in the source notebook, 'Error: message') of the first cell with an error output."""
    if not out_nb.exists():
        return None, "no output notebook was written"
    try:
        nb = _load(out_nb)
    except ValueError:
        return None, "output notebook is unreadable"
    for number, c in _source_cells(nb):
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                return number, f"{o.get('ename')}: {str(o.get('evalue'))[:300]}"
    return None, "the kernel stopped without an error cell (killed, or out of memory?)"


def slowest_cells(out_nb: Path, n: int = 3) -> list[dict]:
    """The ``n`` code cells that took longest (papermill's per-cell ``duration``), slowest first, numbered as in
    the source notebook: ``[{"cell": 33, "seconds": 26.9}, ...]``; ``[]`` when the notebook is unreadable. Kept
    with each part's outcome, so a run says where a notebook's time went (a profile that must fit a lease is
    cut there)."""
    try:
        nb = _load(out_nb)
    except (OSError, ValueError):
        return []
    took = [
        {"cell": number, "seconds": round(float(d), 1)}
        for number, c in _source_cells(nb)
        if isinstance(d := c.get("metadata", {}).get("papermill", {}).get("duration"), (int, float))
    ]
    return sorted(took, key=lambda r: -r["seconds"])[:n]


def _running_cell(out_nb: Path) -> int | None:
    """The code cell (source numbering) papermill had started and not finished when it was stopped."""
    try:
        nb = _load(out_nb)
    except (OSError, ValueError):
        return None
    running = [n for n, c in _source_cells(nb) if c.get("metadata", {}).get("papermill", {}).get("status") == "running"]
    return running[-1] if running else None


# Seconds a stopped part's processes get to exit after SIGTERM before SIGKILL.
KILL_GRACE_S = 10.0


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (Linux; elsewhere none are found and only the part's
    own process group is stopped)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])  # 'pid (comm) state ppid ...'
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_groups(groups: set[int], sig: int) -> None:
    for g in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, sig)


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # gone (or not Linux: the part's own wait covers it)
        if state not in ("Z", "X"):  # a zombie waits for its parent, it runs nothing
            return True
    return False


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and everything it started: its process group and the groups of its descendants (a
    Jupyter kernel runs in a session of its own): SIGTERM, then SIGKILL after ``KILL_GRACE_S``."""
    pids = [proc.pid] + _descendants(proc.pid)  # before any dies: an orphan loses its link to the part
    groups = {proc.pid}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(pid))
    groups.discard(os.getpgid(0))  # never the runner's own group
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or _alive(pids[1:])):
        time.sleep(0.1)
    if proc.poll() is None or _alive(pids[1:]):
        _signal_groups(groups, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def new_run_dir(stem: str, base: Path | None = None) -> Path:
    """A new folder ``<base>/<stem>`` (``<stem>-2``, ``-3``... when taken): no run overwrites another's."""
    base = Path(base) if base is not None else files.runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        folder = base / (stem if i == 1 else f"{stem}-{i}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _writable_dir(flag: str, path: str | Path) -> Path:
    """``path`` as a folder this process can write into, created if need be; else a UsageError naming
    ``flag`` (a file, a read-only place, a parent that is a file), before anything runs."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".mahia-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return path


def _out_dir(out: str | None, stem: str) -> Path:
    if not out:
        return new_run_dir(stem)
    out_path = _writable_dir("--out", out)
    # Never over an earlier run: its report and executed notebooks would be mixed with this run's. A
    # folder beside it instead (<out>-2, ...), so that a command repeated as it was (a reference part
    # resumed on the same machine) still runs.
    earlier = [n for n in ("outcomes.json", "report.md") if (out_path / n).exists()]
    if not earlier:
        return out_path
    folder = new_run_dir(out_path.name, out_path.parent)
    print(f"--out {out} holds an earlier run ({earlier[0]}): this run writes to {folder}")
    return folder


class StopFlag:
    """Set by SIGINT or SIGTERM while a run's parts run (the signal handler): the running part is stopped
    and no later part starts. A second signal while the run stops and writes its report changes nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, _frame=None) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Catch SIGINT and SIGTERM for the life of the block (only the main thread can; elsewhere they
        keep their handlers), restoring the previous handlers after it."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def bytecode_cache(env: dict, folder: Path, package_file: str | None = None) -> str | None:
    """Give the notebooks' processes a bytecode cache where Python would keep none; say why, or None.

    Python caches compiled bytecode beside the source (``__pycache__``) unless ``PYTHONDONTWRITEBYTECODE``
    is set or that folder is read-only. Then every process compiles every module it imports again:
    on the lent H100 (torch 2.11, Python 3.12) that was 11 s of each notebook's import cell, about a
    fifth of a quick run. Setting ``PYTHONPYCACHEPREFIX`` (Python >= 3.8) keeps the cache in ``folder``
    instead, outside the source tree, which is what ``PYTHONDONTWRITEBYTECODE`` protects. Only the runner's
    child processes get it, and a prefix the user set is kept. ``package_file`` (default torch's
    ``__init__.py``) stands for the installed packages: a cache beside it, or a writable folder for
    one, means Python caches by itself."""
    if env.get("PYTHONPYCACHEPREFIX"):
        return None
    if env.get("PYTHONDONTWRITEBYTECODE"):
        why = "PYTHONDONTWRITEBYTECODE is set"
    else:
        if package_file is None:
            import torch

            package_file = torch.__file__
        cached = Path(importlib.util.cache_from_source(package_file))
        where = cached.parent if cached.parent.exists() else cached.parent.parent
        if cached.exists() or os.access(where, os.W_OK):
            return None
        why = f"{Path(package_file).parent} has no bytecode cache and is read-only"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder)
    return (
        f"{why}: the notebooks keep their compiled bytecode in {folder} (PYTHONPYCACHEPREFIX), so that "
        "each one does not compile the Python source of torch and the rest again"
    )


@dataclass
class _Session:
    """What every notebook and suite of one run shares."""

    dev: object
    slug: str
    profile: str
    run_id: str
    commit: str
    out_dir: Path
    res_root: Path
    fig_root: Path
    env: dict
    timeout: float
    seed: int
    stop: StopFlag
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def _session(
    dev,
    prof: str,
    *,
    out: str | None,
    res_root: Path,
    fig_root: Path,
    timeout: float,
    seed: int,
    label: str,
    commit: str | None = None,
    reference: bool = False,
) -> _Session:
    from mahia.measure import hardware

    slug = hardware.device_slug(dev)
    run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    commit = commit or files.run_commit()  # once, at the start: the whole run carries this commit
    out_dir = _out_dir(out, f"{datetime.now():%Y-%m-%d-%H%M%S}-{slug}-{label}")
    env = dict(
        os.environ,
        MAHIA_RUN_ID=run_id,
        MAHIA_COMMIT=commit,
        MAHIA_PROFILE=prof,
        MAHIA_HEADLESS="1",
        MAHIA_RESULTS_DIR=str(res_root),
        MAHIA_FIGURES_DIR=str(fig_root),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    # A notebook runs what a user's session would: the test suite's Triton interpreter (set by
    # tests/conftest.py on CPU machines) must not leak into the kernels the runner starts.
    env.pop("TRITON_INTERPRET", None)
    cache = bytecode_cache(env, REPO_ROOT / "runs" / ".pycache")
    if cache:
        print(f"note: {cache}", flush=True)
    if reference:
        env[files.REFERENCE_ENV] = "1"
    return _Session(dev, slug, prof, run_id, commit, out_dir, res_root, fig_root, env, timeout, seed, StopFlag())


def _spawn(cmd: list[str], log: Path, sess: _Session, cwd: Path | None = None) -> int | None:
    """Run ``cmd`` in its own process group, output to ``log``; its exit code, or None when it was stopped:
    after the ``--timeout`` limit, or because a signal set ``sess.stop``."""
    deadline = time.monotonic() + sess.timeout
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=sess.env, cwd=cwd, start_new_session=True
        )
        # Short waits, not one: a signal handler only sets the flag, and a blocking wait would not look at it.
        while sess.stop.signum is None and time.monotonic() < deadline:
            try:
                return proc.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                continue
        _kill_group(proc)
        return None


def _stopped(sess: _Session, out_nb: Path | None = None) -> dict:
    """Status, cell and error of a part that ``_spawn`` stopped."""
    cell = _running_cell(out_nb) if out_nb is not None else None
    if sess.stop.signum is not None:
        return {"status": "interrupted", "cell": cell, "error": f"stopped by {sess.stop.name}"}
    return {"status": "timeout", "cell": cell, "error": f"stopped after the {sess.timeout:.0f} s limit (--timeout)"}


def _papermill_cmd(sess: _Session, nb: Path, out_nb: Path, mine: dict) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "papermill",
        str(nb),
        str(out_nb),
        "-k",
        "python3",
        "--cwd",
        str(nb.parent),
        "--log-output",
        "--no-progress-bar",
        "-p",
        "device",
        str(sess.dev),
        "-p",
        "profile",
        sess.profile,
        "-p",
        "seed",
        str(sess.seed),
        "-p",
        "interactive",
        "False",
        "-p",
        "results_dir",
        str(sess.res_root),
    ]
    if mine:
        cmd += ["-y", json.dumps(mine)]  # JSON is YAML: lists and tuples keep their type
    return cmd


def _run_notebook(sess: _Session, nb: Path, mine: dict) -> dict:
    out_nb, log = sess.out_dir / nb.name, sess.out_dir / f"{nb.stem}.log"
    outcome = {"name": nb.stem, "output": str(out_nb)}
    if not _has_parameters_cell(nb):
        outcome.update(
            status="failed", seconds=0.0, cell=None, error="no cell tagged 'parameters' (see CONTRIBUTING.md)"
        )
        return outcome
    t0 = time.perf_counter()
    rc = _spawn(_papermill_cmd(sess, nb, out_nb, mine), log, sess)
    outcome["seconds"] = time.perf_counter() - t0
    if rc == 0:
        outcome["status"] = "ok"
    elif rc is None:
        outcome.update(_stopped(sess, out_nb))
    else:
        cell, err = _failure(out_nb)
        outcome.update(status="failed", cell=cell, error=err)
    outcome["log"] = str(log)
    outcome["slowest_cells"] = slowest_cells(out_nb)
    return outcome


def _run_bench(sess: _Session, suite: str) -> dict:
    """One benchmark suite (``python -m mahia.bench SUITE``) as a part of the run."""
    name, log = f"bench_{suite}", sess.out_dir / f"bench_{suite}.log"
    cmd = [
        sys.executable,
        "-m",
        "mahia.bench",
        suite,
        "--device",
        str(sess.dev),
        "--results-dir",
        str(sess.res_root),
    ] + (["--quick"] if sess.profile == "quick" else [])
    t0 = time.perf_counter()
    rc = _spawn(cmd, log, sess, cwd=REPO_ROOT)
    secs = time.perf_counter() - t0
    outcome = {"name": name, "output": str(log), "log": str(log), "seconds": secs, "cell": None}
    if rc == 0:
        outcome["status"] = "ok"
    elif rc is None:
        outcome.update(_stopped(sess))
    else:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["no output"]
        outcome.update(status="failed", error=tail[0][:300])
    return outcome


def _run_parts(
    sess: _Session,
    parts: list[tuple[str, Callable[[], dict]]],
    progress: bool,
    on_ok: Callable[[dict], None] | None = None,
) -> list[dict]:
    outcomes = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(parts), unit="part", file=sys.stderr)
    for name, part in parts:
        if sess.stop.signum is not None:  # stopped: the report lists what did not start
            outcomes.append(
                {"name": name, "status": "not run", "seconds": 0.0, "cell": None, "error": "the run was stopped before"}
            )
            continue
        if bar is not None:
            bar.set_description(name)
        outcome = part()
        outcomes.append(outcome)
        if outcome["status"] == "ok" and on_ok is not None:
            on_ok(outcome)
        msg = f"  {name}: {outcome['status']} in {outcome['seconds']:.0f} s"
        if outcome.get("slowest_cells"):
            msg += (
                " (slowest cells: "
                + ", ".join(f"{r['cell']}: {r['seconds']:.0f} s" for r in outcome["slowest_cells"])
                + ")"
            )
        if outcome["status"] != "ok":
            msg += f" — cell {outcome.get('cell')}: {outcome.get('error')} (log: {outcome.get('log')})"
        (bar.write if bar is not None else print)(msg)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return outcomes


def _write_report(sess: _Session, outcomes: list[dict]) -> Path:
    """The run's report.md and report.html in ``sess.out_dir``; with the records it made, also the device
    folder's summaries and report (``write_report``). A run that recorded nothing (every part failed or
    was stopped early, a bad parameter) still gets a report that says so and lists its parts."""
    from mahia.measure.report import build_report, write_report
    from mahia.measure.results import load_records

    folder = sess.res_root / sess.slug
    records = load_records(folder)
    if not records.empty and (records["run_id"] == sess.run_id).any():
        return write_report(folder, sess.out_dir, outcomes, run_id=sess.run_id, head=sess.commit)[0]
    title, _, rest = build_report(folder, outcomes, run_id=sess.run_id, head=sess.commit).partition("\n")
    note = f"No notebook or suite of run {sess.run_id} recorded anything: see each part's status and log below."
    md = f"{title}\n\n_{note}_\n{rest}"
    files.atomic_write_text(sess.out_dir / "report.md", md)
    page = f"<!doctype html><meta charset='utf-8'><title>mahia run report</title><pre>{html.escape(md)}</pre>\n"
    files.atomic_write_text(sess.out_dir / "report.html", page)
    return sess.out_dir / "report.md"


def _write_run(sess: _Session, outcomes: list[dict]) -> None:
    """``run.json`` beside ``outcomes.json``: what the run was (device, profile, commit, dates, wall time,
    its parts), so that ``python -m mahia readme --run-record`` can commit its timing."""
    from mahia.measure import hardware

    rep = hardware.device_report(str(sess.dev))
    finished = datetime.now(timezone.utc)
    doc = {
        "device": rep.get("gpu") or f"{rep.get('cpu')} ({rep.get('cpu_count')} cores)",
        "device_slug": sess.slug,
        "profile": sess.profile,
        "kind": "reference" if sess.env.get(files.REFERENCE_ENV) == "1" else "run",
        "commit": sess.commit,
        "run_id": sess.run_id,
        "started": sess.started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "seconds": round((finished - sess.started).total_seconds(), 1),
        "parts": [o["name"] for o in outcomes],
    }
    (sess.out_dir / "run.json").write_text(json.dumps(doc, indent=2) + "\n")


def _finish(sess: _Session, outcomes: list[dict]) -> int:
    """Write the outcomes and the report; the exit code: 0 all done, 1 a part failed, 128 + signal number
    when a signal stopped the run (one line on stderr says so)."""
    (sess.out_dir / "outcomes.json").write_text(json.dumps(outcomes, indent=2) + "\n")  # first: the report may fail
    _write_run(sess, outcomes)
    md = _write_report(sess, outcomes)
    print(f"report: {md} (and .html); results: {sess.res_root / sess.slug}; figures: {sess.fig_root / sess.slug}")
    if sess.stop.signum is not None:
        stopped = [o for o in outcomes if o["status"] == "interrupted"]
        where = f"stopped {stopped[0]['name']}" if stopped else "stopped between parts"
        if stopped and stopped[0].get("cell") is not None:
            where += f" at cell {stopped[0]['cell']}"
        done = sum(o["status"] == "ok" for o in outcomes)
        print(
            f"interrupted by {sess.stop.name}: {where}; {done} of {len(outcomes)} part(s) done; report {md}",
            file=sys.stderr,
        )
        return 128 + sess.stop.signum
    failed = [o for o in outcomes if o["status"] not in ("ok", "skipped")]
    if failed:
        print(
            f"{len(failed)} of {len(outcomes)} part(s) did not finish: "
            + ", ".join(f"{o['name']} ({o['status']})" for o in failed),
            file=sys.stderr,
        )
        return 1
    print(f"all {len(outcomes)} part(s) done (commit {sess.commit}, profile {sess.profile})")
    return 0


def _check_params(chosen: list[Path], extra: dict) -> dict[Path, dict[str, str | None]]:
    """Each selected notebook's parameters with their declared types (``notebook_parameters``). A -p NAME
    that no selected notebook declares would be injected and then ignored (a typo, or the wrong notebook),
    and a value of the wrong type would fail minutes later inside the notebook: both are refused now.
    Each notebook gets only the names its parameters cell declares."""
    declared = {nb: notebook_parameters(nb) for nb in chosen}
    names = set().union(*(set(d) for d in declared.values()))
    unknown = sorted(set(extra) - names)
    if unknown:
        valid = sorted(names - set(RESERVED))
        raise UsageError(
            f"--param {', '.join(unknown)}: no selected notebook has such a parameter; theirs: {', '.join(valid)}"
        )
    for name, value in extra.items():
        for nb, params in declared.items():
            kind = params.get(name)
            if name in params and kind is not None and not conforms(value, kind):
                raise UsageError(
                    f"--param {name}={value!r}: {nb.stem} declares `{name}: {kind}`; "
                    f"{value!r} (a {type(value).__name__}) is not one"
                )
    return declared


def _unchecked(declared: dict[Path, dict[str, str | None]], extra: dict) -> list[str]:
    """'name (notebook)' of each -p value no type could be checked against: say so rather than imply it was."""
    return [f"{n} ({nb.stem})" for n in extra for nb, params in declared.items() if n in params and params[n] is None]


def _need_papermill() -> None:
    try:
        import papermill  # noqa: F401
    except ImportError:
        raise UsageError("papermill is not installed: pip install 'mahia[notebooks]' (or use `make run`)") from None


def _device(device: str):
    from mahia.measure import hardware

    try:
        return hardware.resolve_device(device)
    except (RuntimeError, ValueError) as e:
        raise UsageError(str(e)) from None


def run(
    *,
    profile: str = "auto",
    device: str = "auto",
    notebooks: str | Sequence[str] | None = None,
    out: str | None = None,
    timeout: float = 1800,
    results_dir: str | None = None,
    figures_dir: str | None = None,
    seed: int = 0,
    progress: bool = True,
    params: Sequence[str] = (),
) -> int:
    """Execute notebooks; returns the exit code (0 all ok, 1 some failed, 130 / 143 stopped by SIGINT /
    SIGTERM: the running notebook's processes are stopped and the report of what ran is written).

    Records and figures go to ``runs/results`` and ``runs/figures`` unless ``results_dir`` /
    ``figures_dir`` say otherwise (never the committed reference: that is ``reference``'s); executed
    notebooks, logs and the report to ``out`` (``<out>-2``... where it holds an earlier run), by default a
    new ``runs/<date>-<time>-<device>-<profile>/``. ``notebooks``: see ``select_notebooks``. ``params`` are
    extra ``NAME=VALUE`` settings injected into every selected notebook that declares NAME (VALUE is read
    as JSON or a Python literal, else kept as a string, and must match the type the notebook declares).
    Bad input raises UsageError before anything runs."""
    if profile not in ("auto", "quick", "full"):
        raise UsageError(f"--profile must be auto, quick or full, got {profile!r}")
    dev = _device(device)
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive seconds, got {timeout}")
    prof = profile if profile != "auto" else ("full" if dev.type == "cuda" else "quick")
    extra = parse_params(params)
    chosen = select_notebooks(notebooks)
    declared = _check_params(chosen, extra)
    _need_papermill()
    res_root = Path(results_dir).resolve() if results_dir else files.default_results_dir()
    fig_root = Path(figures_dir).resolve() if figures_dir else files.default_figures_dir()
    for flag, d in (("--results-dir", res_root), ("--figures-dir", fig_root)):
        if files.is_reference(d):
            raise UsageError(
                f"{flag} {d} is the committed reference: only `python -m mahia reference` "
                "writes it (a GPU, a clean tree, the full profile)"
            )
        _writable_dir(flag, d)

    sess = _session(dev, prof, out=out, res_root=res_root, fig_root=fig_root, timeout=timeout, seed=seed, label=prof)
    print(
        f"mahia run {sess.run_id}: {len(chosen)} notebook(s), device={dev}, profile={prof}, "
        f"commit {sess.commit} -> {sess.out_dir}",
        flush=True,
    )
    for item in _unchecked(declared, extra):
        print(f"  note: -p {item}: not type-checked, its parameters cell gives no annotation and a None default")
    parts = [
        (nb.stem, lambda nb=nb: _run_notebook(sess, nb, {k: v for k, v in extra.items() if k in declared[nb]}))
        for nb in chosen
    ]
    with sess.stop.installed():
        return _finish(sess, _run_parts(sess, parts, progress))


# -- the committed reference ---------------------------------------------------------------------------
def reference_commit(allow_dirty: bool = False) -> str:
    """The commit a reference run records: ``MAHIA_COMMIT`` when set (a lent machine gets a copy of the
    working tree whose ``.git`` can be another commit's: whoever starts the run says which code it is,
    ``python -m mahia commit`` in the checkout prints it), else git's. Refuses a tree with uncommitted
    changes under mahia/ or notebooks/ (a commit ending in ``-dirty``) unless ``allow_dirty``."""
    given = os.environ.get("MAHIA_COMMIT")
    git = files.git_commit()
    if given:
        commit = given
        if git not in (files.UNKNOWN, given):
            print(f"commit {given} from MAHIA_COMMIT (git here says {git})", file=sys.stderr)
    elif git == files.UNKNOWN:
        raise UsageError(
            "cannot tell which commit this code is (no git checkout here): set MAHIA_COMMIT to "
            "the commit this tree is a copy of (`python -m mahia commit` prints it where git is)"
        )
    else:
        commit = git
    if commit.endswith("-dirty") and not allow_dirty:
        raise UsageError(
            f"the working tree has uncommitted changes under mahia/ or notebooks/ ({commit}): the "
            "reference must say which code made it; commit first (or pass --allow-dirty)"
        )
    return commit


def _check_gpu(dev) -> None:
    if dev is None or dev.type != "cuda":
        where = "no CUDA GPU is available here" if dev is None else f"this run is on {dev}"
        raise UsageError(
            f"the reference is a GPU run and {where} (a CPU run is never the reference); "
            "`python -m mahia run` makes a run of your own"
        )


def _part_file(folder: Path, name: str) -> Path:
    return folder / "parts" / f"{name}.json"


def recorded_parts(folder: Path, commit: str) -> dict[str, dict]:
    """The parts (notebooks, ``bench_<suite>``) of a reference folder last finished at ``commit``."""
    from mahia.measure.report import reference_parts

    return {p["part"]: p for p in reference_parts(folder) if p.get("commit") == commit and p.get("status") == "ok"}


def _bench_suites(spec: str | None) -> list[str]:
    from mahia.bench import SUITES

    if spec in (None, "none"):
        return []
    names = sorted(SUITES) if spec == "all" else [n.strip() for n in spec.split(",")]
    if not all(names):
        raise UsageError(f"--bench {spec!r} has an empty name; choose from {', '.join(sorted(SUITES))}, all or none")
    bad = [n for n in names if n not in SUITES]
    if bad:
        raise UsageError(f"--bench {', '.join(bad)}: no such suite; choose from {', '.join(sorted(SUITES))} or all")
    return list(dict.fromkeys(names))


def reference(
    *,
    notebooks: str | Sequence[str] | None = None,
    bench: str | None = None,
    device: str = "cuda",
    timeout: float = 1800,
    seed: int = 0,
    progress: bool = True,
    params: Sequence[str] = (),
    force: bool = False,
    allow_dirty: bool = False,
    out: str | None = None,
) -> int:
    """Write the committed reference ``data/results/<gpu>/`` and ``figures/<gpu>/``: the benchmark
    suites (``bench``: 'all' or 'kernels,moe') then the notebooks (``notebooks``: as for ``run``), full
    profile, on a GPU, from a clean tree. Neither given: every suite and every notebook. A part already
    recorded for this commit is skipped unless ``force``; each part that finishes writes
    ``parts/<part>.json`` (commit, run, date, parameters), so a reference can be made in parts, on
    several machines, and a notebook that finishes is copied to ``notebooks/`` beside the records,
    trimmed (``mahia.measure.executed.copy_executed``; each trim is printed)."""
    from mahia.measure import hardware

    commit = reference_commit(allow_dirty)
    try:
        dev = hardware.resolve_device(device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except RuntimeError:  # cuda asked for, none here
        dev = None
    _check_gpu(dev)
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive seconds, got {timeout}")
    extra = parse_params(params)
    if notebooks is None and bench is None:
        notebooks, bench = "all", "all"
    chosen = [] if notebooks is None or notebooks in ("none", ["none"]) else select_notebooks(notebooks)
    suites = _bench_suites(bench)
    declared = _check_params(chosen, extra) if extra else {nb: {} for nb in chosen}
    if chosen:
        _need_papermill()
    res_root, fig_root = files.reference_results_dir(), files.reference_figures_dir()
    sess = _session(
        dev,
        "full",
        out=out,
        res_root=res_root,
        fig_root=fig_root,
        timeout=timeout,
        seed=seed,
        label="reference",
        commit=commit,
        reference=True,
    )
    folder = res_root / sess.slug
    done = recorded_parts(folder, commit)
    parts, skipped = [], []
    for name, part in [(f"bench_{s}", lambda s=s: _run_bench(sess, s)) for s in suites] + [
        (nb.stem, lambda nb=nb: _run_notebook(sess, nb, {k: v for k, v in extra.items() if k in declared[nb]}))
        for nb in chosen
    ]:
        if name in done and not force:
            skipped.append(
                {
                    "name": name,
                    "status": "skipped",
                    "seconds": 0.0,
                    "cell": None,
                    "error": f"recorded for {commit} on {done[name].get('finished', '?')[:10]} (--force runs it again)",
                }
            )
        else:
            parts.append((name, part))
    print(
        f"mahia reference {sess.run_id}: {len(parts)} part(s) to run, {len(skipped)} already recorded for "
        f"commit {commit}; device={dev} -> {folder}, {fig_root / sess.slug}; log {sess.out_dir}",
        flush=True,
    )
    for o in skipped:
        print(f"  {o['name']}: skipped, {o['error']}")
    for item in _unchecked(declared, extra):
        print(f"  note: -p {item}: not type-checked, its parameters cell gives no annotation and a None default")
    mine = {nb.stem: {k: v for k, v in extra.items() if k in declared[nb]} for nb in chosen}

    def mark(outcome: dict) -> None:
        doc = {
            "part": outcome["name"],
            "status": "ok",
            "commit": commit,
            "profile": "full",
            "run_id": sess.run_id,
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(outcome["seconds"], 1),
            "params": mine.get(outcome["name"], {}),
        }
        files.atomic_write_text(_part_file(folder, outcome["name"]), json.dumps(doc, indent=2) + "\n")
        if str(outcome.get("output", "")).endswith(".ipynb"):  # a notebook: its executed copy, trimmed
            for note in copy_executed([Path(outcome["output"])], folder / "notebooks"):
                print(f"  committed copy: {note}")

    with sess.stop.installed():
        outcomes = _run_parts(sess, parts, progress, on_ok=mark) if parts else []
        _set_aside_unfinished(sess, folder, [o for o in outcomes if o["name"] in mine])
        return _finish(sess, skipped + outcomes)


def _set_aside_unfinished(sess: _Session, folder: Path, outcomes: list[dict]) -> None:
    """A notebook part that did not finish leaves the reference only what finished parts wrote: the rows its
    cells recorded before it stopped go to the run's folder (``<part>.unfinished.csv``). The kernel suite is
    left alone: it records each of its parts whole and resumes from them."""
    from mahia.measure.results import set_aside_run

    for o in outcomes:
        if o["status"] in ("ok", "skipped", "not run"):
            continue
        to = sess.out_dir / f"{o['name']}.unfinished.csv"
        n = set_aside_run(folder / f"{o['name']}.csv", sess.run_id, to)
        if n:
            print(
                f"  {o['name']}: {n} record(s) of this unfinished part moved out of the reference to {to}; "
                f"figures it drew before it stopped stay in {sess.fig_root / sess.slug} until it runs again"
            )
