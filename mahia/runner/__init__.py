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
wall time).
"""

from __future__ import annotations

import html
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
    _unchecked,
    clean_notebook,
    conforms,
    notebook_is_clean,
    notebook_parameters,
    parse_params,
    slowest_cells,
    strip,
)
from mahia.runner.session import (
    StopFlag,
    _bench_suites,
    _part_file,
    _Session,
    _session,
    _set_aside_unfinished,
    _spawn,
    _stopped,
    _writable_dir,
    new_run_dir,
    recorded_parts,
    reference_commit,
)

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
    "notebook_parameters",
    "conforms",
    "notebook_is_clean",
    "clean_notebook",
    "strip_on_save",
]

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
    its parts)."""
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


def _check_gpu(dev) -> None:
    if dev is None or dev.type != "cuda":
        where = "no CUDA GPU is available here" if dev is None else f"this run is on {dev}"
        raise UsageError(
            f"the reference is a GPU run and {where} (a CPU run is never the reference); "
            "`python -m mahia run` makes a run of your own"
        )


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
