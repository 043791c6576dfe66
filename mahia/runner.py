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
commit (``parts/<part>.json`` in the results folder) is skipped unless ``force``. Every notebook and
suite of one run gets the commit the run started from (``MAHIA_COMMIT``) and its profile
(``MAHIA_PROFILE``), which the records carry.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mahia.measure import files
from mahia.measure.files import REPO_ROOT

__all__ = [
    "UsageError",
    "list_notebooks",
    "select_notebooks",
    "run",
    "reference",
    "reference_commit",
    "recorded_parts",
    "new_run_dir",
    "notebook_is_clean",
    "clean_notebook",
]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NAME_RE = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


def list_notebooks(folder: Path = NOTEBOOK_DIR) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if NAME_RE.match(p.name))


def select_notebooks(spec: str | None, folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """``None``/'all' -> every notebook; else comma-separated numbers ('00,3') or name prefixes."""
    nbs = list_notebooks(folder)
    if not nbs:
        raise UsageError(f"no notebooks found in {folder}")
    if spec in (None, "", "all"):
        return nbs
    chosen: list[Path] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
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


def notebook_is_clean(path: Path) -> bool:
    """True when no code cell has outputs or an execution count."""
    nb = _load(path)
    return not any(c.get("outputs") or c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code")


def clean_notebook(path: Path) -> bool:
    """Strip outputs and execution counts in place; returns True if the file changed."""
    nb = _load(path)
    changed = False
    for c in nb["cells"]:
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count")):
            c["outputs"], c["execution_count"] = [], None
            changed = True
    if changed:
        Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def _has_parameters_cell(path: Path) -> bool:
    return any("parameters" in c.get("metadata", {}).get("tags", []) for c in _load(path)["cells"])


def declared_parameters(path: Path) -> set[str]:
    """The names a notebook's cell tagged ``parameters`` assigns (empty without one)."""
    names: set[str] = set()
    for c in _load(path)["cells"]:
        if "parameters" in c.get("metadata", {}).get("tags", []):
            try:
                tree = ast.parse("".join(c["source"]))
            except SyntaxError:
                continue
            names |= {
                t.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name)
            }
    return names


def _failure(out_nb: Path) -> tuple[int | None, str]:
    """(cell number, 'Error: message') of the first cell with an error output."""
    if not out_nb.exists():
        return None, "no output notebook was written"
    try:
        nb = _load(out_nb)
    except ValueError:
        return None, "output notebook is unreadable"
    code_idx = 0
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        code_idx += 1
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                tags = c.get("metadata", {}).get("tags", [])
                if "injected-parameters" in tags:
                    continue
                return code_idx, f"{o.get('ename')}: {str(o.get('evalue'))[:300]}"
    return None, "the kernel stopped without an error cell (killed, or out of memory?)"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
    if out:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        out_dir = new_run_dir(f"{datetime.now():%Y-%m-%d-%H%M%S}-{slug}-{label}")
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
    if reference:
        env[files.REFERENCE_ENV] = "1"
    return _Session(dev, slug, prof, run_id, commit, out_dir, res_root, fig_root, env, timeout, seed)


def _spawn(cmd: list[str], log: Path, env: dict, timeout: float, cwd: Path | None = None) -> int | None:
    """Run ``cmd`` in its own process group, output to ``log``; the exit code, None when it timed out."""
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None


def _run_notebook(sess: _Session, nb: Path, mine: dict) -> dict:
    out_nb, log = sess.out_dir / nb.name, sess.out_dir / f"{nb.stem}.log"
    outcome = {"name": nb.stem, "output": str(out_nb)}
    if not _has_parameters_cell(nb):
        outcome.update(
            status="failed", seconds=0.0, cell=None, error="no cell tagged 'parameters' (see CONTRIBUTING.md)"
        )
        return outcome
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
    t0 = time.perf_counter()
    rc = _spawn(cmd, log, sess.env, sess.timeout)
    secs = time.perf_counter() - t0
    if rc == 0:
        outcome.update(status="ok", seconds=secs)
    elif rc is None:
        cell, _ = _failure(out_nb)
        outcome.update(
            status="timeout", seconds=secs, cell=cell, error=f"stopped after the {sess.timeout:.0f} s limit (--timeout)"
        )
    else:
        cell, err = _failure(out_nb)
        outcome.update(status="failed", seconds=secs, cell=cell, error=err)
    outcome["log"] = str(log)
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
    rc = _spawn(cmd, log, sess.env, sess.timeout, cwd=REPO_ROOT)
    secs = time.perf_counter() - t0
    outcome = {"name": name, "output": str(log), "log": str(log), "seconds": secs, "cell": None}
    if rc == 0:
        outcome["status"] = "ok"
    elif rc is None:
        outcome.update(status="timeout", error=f"stopped after the {sess.timeout:.0f} s limit (--timeout)")
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
        if bar is not None:
            bar.set_description(name)
        outcome = part()
        outcomes.append(outcome)
        if outcome["status"] == "ok" and on_ok is not None:
            on_ok(outcome)
        msg = f"  {name}: {outcome['status']} in {outcome['seconds']:.0f} s"
        if outcome["status"] != "ok":
            msg += f" — cell {outcome.get('cell')}: {outcome.get('error')} (log: {outcome.get('log')})"
        (bar.write if bar is not None else print)(msg)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return outcomes


def _finish(sess: _Session, outcomes: list[dict]) -> int:
    from mahia.measure.report import write_report

    folder = sess.res_root / sess.slug
    if folder.exists():
        md, html = write_report(folder, sess.out_dir, outcomes, run_id=sess.run_id, head=sess.commit)
        print(f"report: {md} and {html}; results: {folder}; figures: {sess.fig_root / sess.slug}")
    (sess.out_dir / "outcomes.json").write_text(json.dumps(outcomes, indent=2) + "\n")
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


def _check_params(chosen: list[Path], extra: dict) -> dict[Path, set[str]]:
    # A -p NAME that no selected notebook declares would be injected and then ignored (a typo, or the
    # wrong notebook): refuse it. Each notebook gets only the names its parameters cell declares.
    declared = {nb: declared_parameters(nb) for nb in chosen}
    unknown = sorted(set(extra) - set().union(*declared.values()))
    if unknown:
        valid = sorted(set().union(*declared.values()) - set(RESERVED))
        raise UsageError(
            f"--param {', '.join(unknown)}: no selected notebook has such a parameter; theirs: {', '.join(valid)}"
        )
    return declared


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
    notebooks: str | None = None,
    out: str | None = None,
    timeout: float = 1800,
    results_dir: str | None = None,
    figures_dir: str | None = None,
    seed: int = 0,
    progress: bool = True,
    params: Sequence[str] = (),
) -> int:
    """Execute notebooks; returns the exit code (0 all ok, 1 some failed).

    Records and figures go to ``runs/results`` and ``runs/figures`` unless ``results_dir`` /
    ``figures_dir`` say otherwise (never the committed reference: that is ``reference``'s); executed
    notebooks, logs and the report to ``out``, by default a new ``runs/<date>-<time>-<device>-<profile>/``.
    ``params`` are extra ``NAME=VALUE`` settings injected into every selected notebook's
    parameters cell (VALUE is read as JSON or a Python literal, else kept as a string)."""
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

    sess = _session(dev, prof, out=out, res_root=res_root, fig_root=fig_root, timeout=timeout, seed=seed, label=prof)
    print(
        f"mahia run {sess.run_id}: {len(chosen)} notebook(s), device={dev}, profile={prof}, "
        f"commit {sess.commit} -> {sess.out_dir}",
        flush=True,
    )
    parts = [
        (nb.stem, lambda nb=nb: _run_notebook(sess, nb, {k: v for k, v in extra.items() if k in declared[nb]}))
        for nb in chosen
    ]
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
    done = {}
    for path in sorted((Path(folder) / "parts").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if doc.get("commit") == commit and doc.get("status") == "ok":
            done[path.stem] = doc
    return done


def _bench_suites(spec: str | None) -> list[str]:
    from mahia.bench import SUITES

    if spec in (None, "", "none"):
        return []
    names = sorted(SUITES) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in SUITES]
    if bad:
        raise UsageError(f"--bench {', '.join(bad)}: no such suite; choose from {', '.join(sorted(SUITES))} or all")
    return list(dict.fromkeys(names))


def reference(
    *,
    notebooks: str | None = None,
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
    several machines."""
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
    chosen = select_notebooks(notebooks) if notebooks not in (None, "", "none") else []
    suites = _bench_suites(bench)
    declared = _check_params(chosen, extra) if extra else {nb: set() for nb in chosen}
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

    outcomes = _run_parts(sess, parts, progress, on_ok=mark) if parts else []
    return _finish(sess, skipped + outcomes)
