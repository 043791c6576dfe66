"""Execute the notebooks headlessly with papermill and write the run report.

Each notebook runs in a papermill process of its own: a per-notebook limit can stop it, a crash cannot take the
runner down, and on SIGTERM papermill (nbclient) shuts its kernel down, so one GPU notebook's memory is gone
before the next starts. A failure is reported with its cell (numbered as in the source notebook), or without one
with papermill's last line, and the run goes on; a kernel that dies before its first cell is started once more.
``run`` writes records and figures to ``runs/results`` and ``runs/figures``, the executed notebooks, logs,
``outcomes.json``, ``run.json`` and the report to a folder of its own; ``reference`` is the only writer of the
committed ``data/results/<gpu>/`` and ``figures/<gpu>/``, in parts that resume. Every part of a run gets its
commit (``MAHIA_COMMIT``) and profile (``MAHIA_PROFILE``), which the records carry.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from mahia.measure import files
from mahia.measure.executed import copy_executed
from mahia.measure.files import REPO_ROOT
from mahia.runner.notebooks import (
    UsageError,
    _check_params,
    _failure,
    _has_parameters_cell,
    _running_cell,
    clean_notebook,
    conforms,
    last_line,
    notebook_is_clean,
    notebook_parameters,
    parse_params,
    slowest_cells,
    strip,
)
from mahia.runner.session import (
    StopFlag,
    _bench_suites,
    _Session,
    _session,
    _spawn,
    _stopped,
    _writable_dir,
    new_run_dir,
    recorded_parts,
    reference_commit,
)

__all__ = ["UsageError", "StopFlag", "list_notebooks", "select_notebooks", "run", "reference", "reference_commit"]
__all__ += ["recorded_parts", "new_run_dir", "notebook_parameters", "conforms", "notebook_is_clean", "clean_notebook"]
__all__ += ["strip_on_save"]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NAME_RE = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")


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


def strip_on_save(model: dict, path: str, **_) -> None:
    """JupyterLab's pre-save hook under ``make lab`` (``--ContentsManager.pre_save_hook``): a lesson notebook is
    saved as it is committed, so running it and autosaving leave ``git status`` clean on any Python. The outputs
    stay on screen; results and figures still land in runs/."""
    if model.get("type") != "notebook" or Path(path).name not in {p.name for p in list_notebooks()}:
        return
    import nbformat

    model["content"] = strip(nbformat.from_dict(model["content"]))


def _run_notebook(sess: _Session, nb: Path, mine: dict) -> dict:
    out_nb, log = sess.out_dir / nb.name, sess.out_dir / f"{nb.stem}.log"
    outcome = {"name": nb.stem, "output": str(out_nb), "log": str(log), "seconds": 0.0, "cell": None}
    if not _has_parameters_cell(nb):
        return outcome | {"status": "failed", "error": "no cell tagged 'parameters' (see CONTRIBUTING.md)"}
    cmd = [sys.executable, "-m", "papermill", str(nb), str(out_nb), "-k", "python3", "--cwd", str(nb.parent)]
    cmd += ["--log-output", "--no-progress-bar", "-p", "interactive", "False"]
    fixed = {"device": sess.dev, "profile": sess.profile, "seed": sess.seed, "results_dir": sess.res_root}
    cmd += [a for name, value in fixed.items() for a in ("-p", name, str(value))]
    cmd += ["-y", json.dumps(mine)]  # JSON is YAML: lists keep their type
    t0 = time.perf_counter()
    rc = _spawn(cmd, log, sess)
    if rc not in (0, None) and out_nb.exists() and _running_cell(out_nb) is None:
        # The kernel died before its first cell ("Kernel died before replying to kernel_info"), as kernels started
        # side by side can at start-up (papermill#239; once in CI, under two pytest workers). Nothing ran, so
        # nothing is lost by starting it once more; the log keeps both attempts.
        print(f"  {nb.stem}: the kernel died before its first cell ({last_line(log)}); starting it once more")
        rc = _spawn(cmd, log, sess, mode="a")
    outcome["seconds"] = time.perf_counter() - t0
    if rc == 0:
        outcome["status"] = "ok"
    elif rc is None:
        outcome.update(_stopped(sess, out_nb))
    else:
        cell, err = _failure(out_nb, log)
        outcome.update(status="failed", cell=cell, error=err)
    return outcome | {"slowest_cells": slowest_cells(out_nb)}


def _run_bench(sess: _Session, suite: str) -> dict:
    """One benchmark suite (``python -m mahia.bench SUITE``) as a part of the run."""
    log = sess.out_dir / f"bench_{suite}.log"
    cmd = [sys.executable, "-m", "mahia.bench", suite, "--device", str(sess.dev), "--results-dir", str(sess.res_root)]
    t0 = time.perf_counter()
    rc = _spawn(cmd + (["--quick"] if sess.profile == "quick" else []), log, sess, cwd=REPO_ROOT)
    outcome = {"name": f"bench_{suite}", "output": str(log), "log": str(log), "cell": None}
    outcome["seconds"] = time.perf_counter() - t0
    if rc == 0:
        return outcome | {"status": "ok"}
    if rc is None:
        return outcome | _stopped(sess)
    return outcome | {"status": "failed", "error": last_line(log)}


def _run_parts(sess: _Session, parts: list, progress: bool, on_ok: Callable[[dict], None] | None = None) -> list[dict]:
    """Run ``parts`` (name, callable) in turn, a line each; after a signal the rest are 'not run'."""
    from tqdm.auto import tqdm

    outcomes = []
    bar = tqdm(total=len(parts), unit="part", file=sys.stderr, disable=not progress)
    for name, part in parts:
        if sess.stop.signum is not None:
            outcomes.append({"name": name, "status": "not run", "seconds": 0.0, "error": "the run was stopped before"})
            continue
        bar.set_description(name)
        outcomes.append(o := part())
        if o["status"] == "ok" and on_ok is not None:
            on_ok(o)
        msg = f"  {name}: {o['status']} in {o['seconds']:.0f} s"
        if o.get("slowest_cells"):
            msg += (
                " (slowest cells: " + ", ".join(f"{r['cell']}: {r['seconds']:.0f} s" for r in o["slowest_cells"]) + ")"
            )
        if o["status"] != "ok":
            msg += f" — cell {o.get('cell')}: {o.get('error')} (log: {o.get('log')})"
        bar.write(msg)
        bar.update(1)
    bar.close()
    return outcomes


def _finish(sess: _Session, outcomes: list[dict]) -> int:
    """Write ``outcomes.json``, ``run.json`` and the report; the exit code: 0 all done, 1 a part failed, 128 +
    signal number when a signal stopped the run (one line on stderr says so)."""
    from mahia.measure import hardware
    from mahia.measure.report import write_report

    (sess.out_dir / "outcomes.json").write_text(json.dumps(outcomes, indent=2) + "\n")  # first: the report may fail
    rep, finished = hardware.device_report(str(sess.dev)), datetime.now(timezone.utc)
    run = {
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
    (sess.out_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    md = write_report(sess.res_root / sess.slug, sess.out_dir, outcomes, run_id=sess.run_id, head=sess.commit)
    print(f"report: {md} (and .html); results: {sess.res_root / sess.slug}; figures: {sess.fig_root / sess.slug}")
    done = sum(o["status"] == "ok" for o in outcomes)
    if sess.stop.signum is not None:
        stopped = [o for o in outcomes if o["status"] == "interrupted"]
        where = f"stopped {stopped[0]['name']}" if stopped else "stopped between parts"
        if stopped and stopped[0].get("cell") is not None:
            where += f" at cell {stopped[0]['cell']}"
        msg = f"interrupted by {sess.stop.name}: {where}; {done} of {len(outcomes)} part(s) done; report {md}"
        print(msg, file=sys.stderr)
        return 128 + sess.stop.signum
    failed = [f"{o['name']} ({o['status']})" for o in outcomes if o["status"] not in ("ok", "skipped")]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} part(s) did not finish: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(outcomes)} part(s) done (commit {sess.commit}, profile {sess.profile})")
    return 0


def _checked(timeout: float, params: Sequence[str], chosen: list[Path]) -> tuple[dict, dict]:
    """The -p values and each notebook's declared parameters, checked (UsageError) before anything runs."""
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive seconds, got {timeout}")
    extra = parse_params(params)
    declared = _check_params(chosen, extra)
    # mahia[notebooks]: papermill runs, nbconvert trims the copy a reference keeps, its mistune renders every run's
    # report.html (a lent GPU image lacked both: a bench-only reference failed after its suites had run, 2026-12-06)
    need = ("papermill", "nbconvert", "mistune") if chosen else ("mistune",)
    if missing := [m for m in need if importlib.util.find_spec(m) is None]:
        raise UsageError(f"{' and '.join(missing)} not installed: pip install 'mahia[notebooks]' (or use `make run`)")
    for n, nb in ((n, nb) for n in extra for nb, ps in declared.items() if n in ps and ps[n] is None):
        print(f"  note: -p {n} ({nb.stem}): not type-checked, its parameters cell has no annotation, a None default")
    return extra, {nb.stem: {k: v for k, v in extra.items() if k in declared[nb]} for nb in chosen}


def _notebook_parts(sess: _Session, chosen: list[Path], mine: dict) -> list:
    return [(nb.stem, lambda nb=nb: _run_notebook(sess, nb, mine[nb.stem])) for nb in chosen]


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
    """Execute notebooks; returns the exit code (0 all ok, 1 some failed, 130 / 143 stopped by SIGINT / SIGTERM).

    Records and figures go to ``runs/results`` and ``runs/figures`` unless ``results_dir`` / ``figures_dir``
    say otherwise (never the committed reference); executed notebooks, logs and the report to ``out``
    (``<out>-2``... where it holds an earlier run), by default a new ``runs/<date>-<time>-<device>-<profile>/``.
    ``notebooks``: see ``select_notebooks``. ``params``: ``NAME=VALUE`` settings for every selected notebook
    that declares NAME (VALUE read as JSON or a Python literal, else a string, of the type it declares)."""
    from mahia.measure import hardware

    if profile not in ("auto", "quick", "full"):
        raise UsageError(f"--profile must be auto, quick or full, got {profile!r}")
    try:
        dev = hardware.resolve_device(device)
    except (RuntimeError, ValueError) as e:
        raise UsageError(str(e)) from None
    prof = profile if profile != "auto" else ("full" if dev.type == "cuda" else "quick")
    chosen = select_notebooks(notebooks)
    _, mine = _checked(timeout, params, chosen)
    res_root = Path(results_dir).resolve() if results_dir else files.default_results_dir()
    fig_root = Path(figures_dir).resolve() if figures_dir else files.default_figures_dir()
    for flag, d in (("--results-dir", res_root), ("--figures-dir", fig_root)):
        if files.is_reference(d):
            raise UsageError(f"{flag} {d} is the committed reference: only `python -m mahia reference` writes it")
        _writable_dir(flag, d)
    sess = _session(dev, prof, out=out, res_root=res_root, fig_root=fig_root, timeout=timeout, seed=seed, label=prof)
    print(
        f"mahia run {sess.run_id}: {len(chosen)} notebook(s), device={dev}, profile={prof}, commit {sess.commit} -> {sess.out_dir}",
        flush=True,
    )
    with sess.stop.installed():
        return _finish(sess, _run_parts(sess, _notebook_parts(sess, chosen, mine), progress))


def _check_gpu(dev) -> None:
    if dev is None or dev.type != "cuda":
        where = "no CUDA GPU is available here" if dev is None else f"this run is on {dev}"
        raise UsageError(f"the reference is a GPU run and {where}; `python -m mahia run` makes a run of your own")


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
    """Write the committed reference ``data/results/<gpu>/`` and ``figures/<gpu>/``: the benchmark suites
    (``bench``: 'all' or 'kernels,moe') then the notebooks (as for ``run``), full profile, on a GPU, from a clean
    tree; neither given: all of both. A part recorded for this commit is skipped unless ``force``; each part that
    finishes writes ``parts/<part>.json`` (commit, run, date, seconds, parameters), and a notebook's executed
    copy goes to ``notebooks/`` beside the records, trimmed (``mahia.measure.executed.copy_executed``)."""
    from mahia.measure import hardware

    commit = reference_commit(allow_dirty)
    try:
        dev = hardware.resolve_device(device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except RuntimeError:  # cuda asked for, none here
        dev = None
    _check_gpu(dev)
    if notebooks is None and bench is None:
        notebooks, bench = "all", "all"
    chosen = [] if notebooks in (None, "none", ["none"]) else select_notebooks(notebooks)
    suites = _bench_suites(bench)
    _, mine = _checked(timeout, params, chosen)
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
    for name, part in [(f"bench_{s}", lambda s=s: _run_bench(sess, s)) for s in suites] + _notebook_parts(
        sess, chosen, mine
    ):
        if name in done and not force:
            why = f"recorded for {commit} on {done[name].get('finished', '?')[:10]} (--force runs it again)"
            skipped.append({"name": name, "status": "skipped", "seconds": 0.0, "error": why})
            print(f"  {name}: skipped, {why}")
        else:
            parts.append((name, part))
    print(
        f"mahia reference {sess.run_id}: {len(parts)} part(s) to run, {len(skipped)} already recorded for commit {commit}; device={dev} -> {folder}; log {sess.out_dir}",
        flush=True,
    )

    def mark(outcome: dict) -> None:
        doc = {"part": outcome["name"], "status": "ok", "commit": commit, "profile": "full", "run_id": sess.run_id}
        doc |= {"finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        doc |= {"seconds": round(outcome["seconds"], 1), "params": mine.get(outcome["name"], {})}
        files.atomic_write_text(folder / "parts" / f"{outcome['name']}.json", json.dumps(doc, indent=2) + "\n")
        if outcome["output"].endswith(".ipynb"):  # a notebook: its executed copy, trimmed
            for note in copy_executed([Path(outcome["output"])], folder / "notebooks"):
                print(f"  committed copy: {note}")

    with sess.stop.installed():
        return _finish(sess, skipped + _run_parts(sess, parts, progress, on_ok=mark))
